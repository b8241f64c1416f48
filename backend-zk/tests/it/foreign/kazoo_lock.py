"""kazoo's Lock recipe, driven line by line from stdin by tenure's interop tests.

Usage: kazoo_lock.py HOSTS SESSION_TIMEOUT_MS PATH [EXTRA_LOCK_PATTERN...]
Commands: `acquire MILLIS` -> `acquired` | `timeout`; `release` -> `released`.
"""
import sys

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

hosts, session_ms, path, *patterns = sys.argv[1:]
zk = KazooClient(hosts=hosts, timeout=int(session_ms) / 1000)
zk.start(timeout=30)
lock = zk.Lock(path, "kazoo-worker", extra_lock_patterns=patterns)
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "acquire":
        try:
            got = lock.acquire(timeout=int(command[1]) / 1000)
        except LockTimeout:
            got = False
        print("acquired" if got else "timeout", flush=True)
    elif command[0] == "release":
        lock.release()
        print("released", flush=True)
    else:
        print(f"unknown command {command[0]!r}", flush=True)
zk.stop()
