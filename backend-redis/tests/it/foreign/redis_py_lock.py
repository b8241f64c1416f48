"""redis-py's Lock, driven line by line from stdin by tenure's interop tests.

Usage: redis_py_lock.py REDIS_URL NAME TIMEOUT_MS (0: the lock never expires)
Commands: `acquire MILLIS` -> `acquired` | `timeout`; `release` -> `released`.
"""
import sys

import redis

url, name, timeout_ms = sys.argv[1:]
client = redis.Redis.from_url(url)
timeout = int(timeout_ms) / 1000 or None
lock = client.lock(name, timeout=timeout, sleep=0.05, thread_local=False)
client.ping()
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "acquire":
        got = lock.acquire(blocking_timeout=int(command[1]) / 1000)
        print("acquired" if got else "timeout", flush=True)
    elif command[0] == "release":
        lock.release()
        print("released", flush=True)
    else:
        print(f"unknown command {command[0]!r}", flush=True)
