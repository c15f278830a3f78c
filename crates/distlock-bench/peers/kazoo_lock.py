"""kazoo's Lock recipe, uncontended acquire+release, timed per operation.

Usage: kazoo_lock.py HOST:PORT N   -> prints "p50_us p99_us"
"""
import logging
import sys
import time

from kazoo.client import KazooClient

logging.basicConfig(level=logging.ERROR)
hosts, n = sys.argv[1], int(sys.argv[2])
zk = KazooClient(hosts=hosts)
zk.start()
lock = zk.Lock("/bench/peer/kazoo", "bench")
times = []
for i in range(n + n // 10):
    start = time.perf_counter()
    if not lock.acquire(blocking=False):
        sys.exit("lock busy")
    lock.release()
    if i >= n // 10:
        times.append((time.perf_counter() - start) * 1e6)
zk.stop()
times.sort()
print(int(times[len(times) // 2]), int(times[min(len(times) - 1, len(times) * 99 // 100)]))
