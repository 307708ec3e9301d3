"""Exists coalescing: the exists() calls of one event-loop tick share mexist
calls. L2Cache asks for up to op_batch keys at once, one exists() each, so
without this every key would be its own round trip.

Answers come back through call_soon_threadsafe, or as TIMEOUT from a loop
timer; no task or future chain sits in between, which keeps a round of
L2Cache.exists close to one SDK round trip.
"""

import asyncio
import functools
import logging
import time
from concurrent.futures import Future

from aibrix_kvcache.status import Status, StatusCodes

from .config import EICConfig
from .counters import Counters
from .link import Link, Session
from .logs import RateLimitedLogger
from .metrics import FAST_MISS
from .outcomes import answer, answer_exists
from .sdk import CallResult


class ExistsBatcher:
    def __init__(self, config: EICConfig, link: Link, counters: Counters, rate_log: RateLimitedLogger):
        self._config = config
        self._link = link
        self._counters = counters
        self._rate_log = rate_log
        self._pending: dict[asyncio.AbstractEventLoop, tuple[list[str], list[asyncio.Future]]] = {}

    def pending_loops(self) -> int:
        """Event loops with keys waiting for their flush."""
        return len(self._pending)

    async def exists(self, eic_key: str) -> Status:
        loop = asyncio.get_running_loop()
        batch = self._pending.get(loop)
        if batch is None:
            self._forget_closed_loops()
            batch = self._pending[loop] = ([], [])
            loop.call_soon(self._flush, loop)
        waiter = loop.create_future()
        batch[0].append(eic_key)
        batch[1].append(waiter)
        return await waiter

    def _forget_closed_loops(self) -> None:
        """A loop closed before its flush ran leaves its batch behind; nobody
        can be answered on a closed loop, so let go of it and its waiters."""
        for loop in [loop for loop in self._pending if loop.is_closed()]:
            self._pending.pop(loop, None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the keys of this loop tick as mexist calls."""
        batch = self._pending.pop(loop, None)
        if batch is None:
            return
        eic_keys, waiters = batch
        try:
            link = self._link
            session, pool = link.session, link.meta_pool
            if link.breaker.tripped or session is None or pool is None:
                self._counters.add(fast_fails=1)
                answer(waiters, 0, len(waiters), FAST_MISS)
                return
            timeout_ms = self._config.exists_timeout_ms
            step = self._config.batch_keys
            spans = [(start, min(start + step, len(eic_keys))) for start in range(0, len(eic_keys), step)]
            futures: list[Future] = []
            timer = loop.call_later(timeout_ms / 1000, self._timed_out, waiters, futures, timeout_ms)
            unanswered = [len(spans)]
            metrics, sent = self._counters.metrics, time.perf_counter()

            def deliver(start: int, end: int, future: Future) -> None:  # on the loop
                metrics.exists_round(waiters, start, end, future, time.perf_counter() - sent)
                answer_exists(waiters, start, end, future)
                unanswered[0] -= 1
                if unanswered[0] == 0:
                    timer.cancel()

            def on_done(future: Future, start: int, end: int) -> None:  # on a pool thread
                try:
                    loop.call_soon_threadsafe(deliver, start, end, future)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits any more

            for start, end in spans:
                future = pool.submit(self._mexist, session, eic_keys[start:end])
                future.add_done_callback(functools.partial(on_done, start=start, end=end))
                futures.append(future)
            self._counters.add(exists=len(eic_keys), exists_calls=len(spans))
        except BaseException as e:
            self._counters.metrics.count_requests("exists", "error", sum(1 for w in waiters if not w.done()))
            answer(waiters, 0, len(waiters), Status(StatusCodes.ERROR, f"exists failed internally: {e!r}"))

    def _mexist(self, session: Session, eic_keys: list[str]) -> CallResult:
        metrics = self._counters.metrics
        metrics.call_started("exists")
        try:
            result = session.client.mexist(eic_keys)
        finally:
            metrics.call_finished()
        self._link.observe(result)
        return result

    def _timed_out(self, waiters: list[asyncio.Future], futures: list[Future], timeout_ms: float) -> None:
        if all(waiter.done() for waiter in waiters):
            return
        for future in futures:
            future.cancel()
        self._counters.add(timeouts=1)
        self._counters.metrics.count_requests("exists", "timeout", sum(1 for w in waiters if not w.done()))
        self._link.breaker.record_failure(f"exists exceeded exists_timeout_ms={timeout_ms:g}")
        self._rate_log.log("exists-timeout", logging.WARNING, "EIC exists exceeded exists_timeout_ms=%g", timeout_ms)
        answer(
            waiters, 0, len(waiters), Status(StatusCodes.TIMEOUT, f"exists exceeded exists_timeout_ms={timeout_ms:g}")
        )
