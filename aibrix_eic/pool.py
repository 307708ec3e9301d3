"""A small thread pool whose queue is ordered by priority.

Reads are on vLLM's critical path (time to first token); writes are not. With
a plain FIFO pool a burst of puts would queue every get behind it, so the
connector submits gets at a higher priority than puts. Threads are daemons:
a call stuck in the SDK must not hold up interpreter exit.
"""

import itertools
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

GET_PRIORITY = 0
PUT_PRIORITY = 1


class PriorityThreadPool:
    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self._queue: "queue.PriorityQueue[tuple[int, int, Any]]" = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._shutdown = False
        # Started up front: idle threads cost little, and it keeps submit simple.
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(max_workers)
        ]
        for thread in self._threads:
            thread.start()
        self._name = name

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = GET_PRIORITY) -> Future:
        """Run fn(*args) on a pool thread; lower priority values run first."""
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name} pool is shut down")
            self._queue.put((priority, next(self._order), (future, fn, args)))
        return future

    def shutdown(self) -> None:
        """Stop taking work; cancel what has not started. Running calls finish."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
        while True:
            try:
                _, _, item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._queue.put((-1, next(self._order), None))  # wakes and stops a worker

    def _work(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(result)
