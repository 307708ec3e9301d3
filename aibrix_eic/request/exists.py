"""Exists coalescing: the exists() calls of one event-loop tick share mexist
calls. L2Cache asks for up to op_batch keys at once, one exists() each, so
without this every key would be its own round trip.

Answers come back through call_soon_threadsafe, or as TIMEOUT from a loop
timer; no task or future chain sits in between, which keeps a round of
L2Cache.exists close to one SDK round trip.

A key whose mexist failed (a per-key TIMEOUT or a failed call, not a
miss) is asked once more, while the request's deadline and the breaker
allow, before it counts as a miss: on a real EIC cluster one retry
recovered 99.4 % of the keys lost to per-key timeouts, and mexist flapped
318 times in 173k probes (bytedance-iaas/sglang #772). `retry_attempts: 0`
turns it off with the other retries.

This module owns the exists() request metrics: the answers of a mexist round
are counted in bulk per round, and every other answer (a fast failure, a
refusal, one the write-behind table gave) through `count`.
"""

import asyncio
import functools
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from aibrix_kvcache.status import Status, StatusCodes

from ..link.calls import failed
from ..link.link import Session
from ..link.resilience import Deadline
from ..link.runtime import Runtime
from ..link.sdk import FAIL, HIT, MISS, CallResult
from .statuses import FAST_MISS, NOT_FOUND, OK, request_outcome

if TYPE_CHECKING:
    from ..observability.metrics import ConnectorMetrics, NoMetrics


class ExistsBatcher:
    def __init__(self, rt: Runtime) -> None:
        self._config = rt.config
        self._link = rt.link
        self._counters = rt.counters
        self._pending: dict[asyncio.AbstractEventLoop, tuple[list[str], list[asyncio.Future[Status]]]] = {}

    def count(self, status: Status) -> Status:
        """Count one exists() answered without a mexist round; returns it."""
        self._counters.metrics.count_requests("exists", request_outcome("exists", status), 1)
        return status

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
            usable = self._link.usable("meta")
            if usable is None:
                self._counters.metrics.count_requests("exists", "fast_fail", sum(1 for w in waiters if not w.done()))
                answer(waiters, 0, len(waiters), FAST_MISS)
                return
            session, pool = usable
            timeout_ms = self._config.exists_timeout_ms
            deadline = Deadline(timeout_ms / 1000)
            step = self._config.batch_keys
            spans = [(start, min(start + step, len(eic_keys))) for start in range(0, len(eic_keys), step)]
            futures: list[Future[CallResult]] = []
            timer = loop.call_later(timeout_ms / 1000, self._timed_out, waiters, futures, timeout_ms)
            unanswered = [len(spans)]
            metrics, sent = self._counters.metrics, time.perf_counter()

            def deliver(start: int, end: int, future: Future[CallResult]) -> None:  # on the loop
                metrics.exists_seconds(time.perf_counter() - sent)
                count_round(metrics, waiters, start, end, future)
                answer_exists(waiters, start, end, future)
                unanswered[0] -= 1
                if unanswered[0] == 0:
                    timer.cancel()

            def on_done(future: Future[CallResult], start: int, end: int) -> None:  # on a pool thread
                try:
                    loop.call_soon_threadsafe(deliver, start, end, future)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits any more

            for start, end in spans:
                future = pool.submit(self._mexist, session, eic_keys[start:end], deadline)
                future.add_done_callback(functools.partial(on_done, start=start, end=end))
                futures.append(future)
            self._counters.add(exists=len(eic_keys), exists_calls=len(spans))
        except BaseException as e:
            self._counters.metrics.count_requests("exists", "error", sum(1 for w in waiters if not w.done()))
            answer(waiters, 0, len(waiters), Status(StatusCodes.ERROR, f"exists failed internally: {e!r}"))

    def _mexist(self, session: Session, eic_keys: list[str], deadline: Deadline) -> CallResult:
        """One mexist, then its failed keys once more if the deadline, the
        breaker and `retry_attempts` allow. A key failed in a call that
        answered others is a miss, as mexist's per-key codes always read."""
        result = self._link.call("exists", session.client.mexist, eic_keys, True)
        again = failed(result.outcomes)
        if again and self._config.retry_attempts and not self._link.breaker.tripped and not deadline.expired():
            second = self._link.call("exists", session.client.mexist, [eic_keys[i] for i in again], True)
            outcomes = list(result.outcomes)
            for j, i in enumerate(again):
                outcomes[i] = second.outcomes[j]
            still = second.outcomes.count(FAIL)
            self._counters.add(exists_calls=1, exists_recovered=len(again) - still, exists_failed_again=still)
            whole = second.whole_call_failed and len(again) == len(eic_keys)
            result = CallResult(
                outcomes, whole, second.detail if whole else f"{result.detail}; asked again: {second.detail}"
            )
        if result.whole_call_failed:
            return result
        return CallResult([MISS if o == FAIL else o for o in result.outcomes], False, result.detail)

    def _timed_out(
        self, waiters: list[asyncio.Future[Status]], futures: list[Future[CallResult]], timeout_ms: float
    ) -> None:
        if all(waiter.done() for waiter in waiters):
            return
        for future in futures:
            future.cancel()
        self._counters.metrics.count_requests("exists", "timeout", sum(1 for w in waiters if not w.done()))
        self._link.deadline_passed("exists", timeout_ms)
        answer(
            waiters, 0, len(waiters), Status(StatusCodes.TIMEOUT, f"exists exceeded exists_timeout_ms={timeout_ms:g}")
        )


def count_round(
    metrics: "ConnectorMetrics | NoMetrics",
    waiters: Sequence[asyncio.Future[Status]],
    start: int,
    end: int,
    future: Future[CallResult],
) -> None:
    """The outcome of each exists() one mexist round answers (those the
    deadline has not answered already), counted in bulk, not per call."""
    try:
        outcomes = future.result(timeout=0).outcomes  # done: it is delivered from its callback
    except BaseException:  # cancelled, or the call raised
        metrics.count_requests("exists", "error", sum(1 for w in waiters[start:end] if not w.done()))
        return
    if not waiters[start].done() and not waiters[end - 1].done():  # the usual case: none answered yet
        hits, misses = outcomes.count(HIT), outcomes.count(MISS)
        metrics.count_requests("exists", "hit", hits)
        metrics.count_requests("exists", "miss", misses)
        metrics.count_requests("exists", "error", len(outcomes) - hits - misses)
        return
    for waiter, outcome in zip(waiters[start:end], outcomes):
        if not waiter.done():
            metrics.count_requests("exists", "hit" if outcome == HIT else "miss" if outcome == MISS else "error", 1)


def answer(waiters: Sequence[asyncio.Future[Status]], start: int, end: int, status: Status) -> None:
    for waiter in waiters[start:end]:
        if not waiter.done():  # AIBrix may have cancelled it
            waiter.set_result(status)


def answer_exists(waiters: Sequence[asyncio.Future[Status]], start: int, end: int, future: Future[CallResult]) -> None:
    """Answer waiters[start:end] from a finished mexist future."""
    if future.cancelled():
        # By the timeout (its waiters are answered, and skipped here) or by
        # close() shutting the pool down, which must not leave anyone waiting.
        answer(waiters, start, end, Status(StatusCodes.CANCELLED, "exists cancelled: the connector was closed"))
        return
    error = future.exception()
    if error is not None:
        answer(waiters, start, end, Status(StatusCodes.ERROR, f"exists failed internally: {error!r}"))
        return
    result: CallResult = future.result()
    failure = None
    for waiter, outcome in zip(waiters[start:end], result.outcomes):
        if waiter.done():
            continue
        if outcome == HIT:
            waiter.set_result(OK)
        elif outcome == MISS:
            waiter.set_result(NOT_FOUND)
        else:
            failure = failure or Status(StatusCodes.ERROR, f"exists: {result.detail}")
            waiter.set_result(failure)
