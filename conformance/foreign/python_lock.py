"""A Python recipe's lock, driven line by line from stdin by tenure's interop tests
(`tenure_conformance::foreign`), run by Debian's /usr/bin/python3.

Usage:
  python_lock.py kazoo HOSTS SESSION_TIMEOUT_MS PATH [EXTRA_LOCK_PATTERN...]
  python_lock.py redis-py REDIS_URL NAME TIMEOUT_MS   (0: the lock never expires)
Prints `ready` once connected. Commands: `acquire MILLIS` -> `acquired` | `timeout`;
`release` -> `released`.
"""
import sys


def kazoo_lock(hosts, session_ms, path, *patterns):
    from kazoo.client import KazooClient
    from kazoo.exceptions import LockTimeout

    zk = KazooClient(hosts=hosts, timeout=int(session_ms) / 1000)
    zk.start(timeout=30)
    held = []

    def acquire(seconds):
        # A Lock per use, as docs/interop.md advises: a Lock makes its path once, and the
        # server removes a container path (Curator's, tenure's) once it is empty.
        lock = zk.Lock(path, "kazoo-worker", extra_lock_patterns=patterns)
        try:
            acquired = lock.acquire(timeout=seconds)
        except LockTimeout:
            acquired = False
        if acquired:
            held.append(lock)
        return acquired

    def release():
        held.pop().release()

    return acquire, release


def redis_py_lock(url, name, timeout_ms):
    import redis

    client = redis.Redis.from_url(url)
    timeout = int(timeout_ms) / 1000 or None
    lock = client.lock(name, timeout=timeout, sleep=0.05, thread_local=False)
    client.ping()
    return (lambda seconds: lock.acquire(blocking_timeout=seconds)), lock.release


RECIPES = {"kazoo": kazoo_lock, "redis-py": redis_py_lock}

acquire, release = RECIPES[sys.argv[1]](*sys.argv[2:])
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "acquire":
        print("acquired" if acquire(int(command[1]) / 1000) else "timeout", flush=True)
    elif command[0] == "release":
        release()
        print("released", flush=True)
    else:
        print(f"unknown command {command[0]!r}", flush=True)
