"""redis-py's Lock, uncontended acquire+release, timed per operation.

Usage: redis_py_lock.py URL N   -> prints "p50_us p99_us"
"""
import sys
import time

import redis

url, n = sys.argv[1], int(sys.argv[2])
r = redis.Redis.from_url(url)
times = []
for i in range(n + n // 10):
    start = time.perf_counter()
    lock = r.lock("bench/peer/redis-py", timeout=30)
    if not lock.acquire(blocking=False):
        sys.exit("lock busy")
    lock.release()
    if i >= n // 10:
        times.append((time.perf_counter() - start) * 1e6)
times.sort()
print(int(times[len(times) // 2]), int(times[min(len(times) - 1, len(times) * 99 // 100)]))
