"""A small thread pool whose queue is ordered by priority, and which works
around calls that hang.

Reads are on vLLM's critical path (time to first token); writes are not. With
a plain FIFO pool a burst of puts would queue every get behind it, so the
connector submits gets at a higher priority than puts.

A call stuck in the SDK holds its thread until the SDK returns it, which for a
hung EIC can be long after EIC recovered. So a thread busy for longer than
`stuck_after_s` (past any caller's deadline) no longer counts as a worker: the
pool starts a replacement, up to `max_threads` in all, and a thread that comes
back from a stuck call retires if the pool has enough workers without it.
Threads are daemons: a stuck call must not hold up interpreter exit.
"""

import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..util.teardown import OwnThread

T = TypeVar("T")

GET_PRIORITY = 0
PUT_PRIORITY = 1
PROBE_PRIORITY = -1  # ahead of every request: it decides whether requests run at all
_STOP_PRIORITY = -2


class PriorityThreadPool:
    def __init__(self, max_workers: int, name: str, stuck_after_s: float | None = None, max_threads: int | None = None):
        self.max_workers = max_workers
        self.max_threads = max(max_workers, max_threads or max_workers)
        self._stuck_after_s = stuck_after_s
        self._name = name
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._shutdown = False
        self._busy_since: dict[threading.Thread, float | None] = {}  # every live thread
        try:
            with self._lock:
                for _ in range(max_workers):
                    self._start_thread_unsafe()
        except BaseException:
            self.shutdown()
            raise

    @property
    def threads(self) -> int:
        return len(self._busy_since)

    def longest_busy_s(self) -> float:
        """How long the pool's longest-running task has run (0 when idle)."""
        now = time.monotonic()
        with self._lock:
            return max((now - since for since in self._busy_since.values() if since is not None), default=0.0)

    def submit(self, fn: Callable[..., T], *args: Any, priority: int = GET_PRIORITY) -> Future[T]:
        """Run fn(*args) on a pool thread; lower priority values run first."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name} pool is shut down")
            self._queue.put((priority, next(self._order), (future, fn, args)))
            self._replace_stuck_unsafe()
        return future

    def waiting_ahead_of(self, priority: int) -> bool:
        """Whether a task that runs before `priority` is queued (a hint, for a
        long task that yields its thread between steps)."""
        with self._queue.mutex:
            heap = self._queue.queue
            return bool(heap) and heap[0][0] < priority

    def shutdown(self) -> None:
        """Stop taking work; cancel what has not started. Running calls finish."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            nthreads = len(self._busy_since)
        while True:
            try:
                _, _, item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(nthreads):
            self._queue.put((_STOP_PRIORITY, next(self._order), None))

    def _start_thread_unsafe(self) -> None:
        thread = OwnThread(self._work, f"{self._name}_{next(self._names)}")
        thread.start()
        self._busy_since[thread] = None

    def _healthy_unsafe(self, now: float, excluding: threading.Thread | None = None) -> int:
        limit = self._stuck_after_s
        return sum(
            1
            for thread, since in self._busy_since.items()
            if thread is not excluding and (since is None or limit is None or now - since <= limit)
        )

    def _replace_stuck_unsafe(self) -> None:
        if self._stuck_after_s is None or len(self._busy_since) >= self.max_threads:
            return
        healthy = self._healthy_unsafe(time.monotonic())
        while healthy < self.max_workers and len(self._busy_since) < self.max_threads:
            self._start_thread_unsafe()
            healthy += 1

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            _, _, item = self._queue.get()
            if item is None:
                with self._lock:
                    self._busy_since.pop(me, None)
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._busy_since[me] = time.monotonic()
            try:
                result = fn(*args)
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(result)
            with self._lock:
                self._busy_since[me] = None
                if self._healthy_unsafe(time.monotonic(), excluding=me) >= self.max_workers:
                    del self._busy_since[me]  # a replacement took this thread's place
                    return
