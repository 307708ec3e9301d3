"""Dispatch: a request's keys split into SDK calls (chunks) of at most
`batch_keys` keys and `batch_bytes` bytes, run concurrently on the link's
pools under one deadline, with bounded retries of failed keys.

Memory safety: a chunk holds a reference on each memory region it may touch
from the moment it is built until its SDK call has returned, however late.
Chunks still queued at the deadline are cancelled and never touch memory.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from aibrix_kvcache.memory import MemoryRegion

from ..config import EICConfig
from ..link.pool import GET_PRIORITY, PUT_PRIORITY
from ..link.resilience import Deadline, ExponentialBackoff
from ..link.runtime import Runtime
from ..link.sdk import FAIL, CallResult, Outcome, SdkClient
from .statuses import failed, failed_before_first_miss


class Chunk:
    """One SDK call's share of a request, and the memory it may touch."""

    __slots__ = ("keys", "buffers", "mrs", "outcomes", "detail")

    def __init__(self, keys: list[str], buffers: list, mrs: Sequence[MemoryRegion]):
        self.keys = keys
        self.buffers = buffers
        self.mrs = mrs
        self.outcomes: list[Outcome] | None = None  # set once the SDK answered
        self.detail = ""
        for mr in mrs:
            mr.ref_up()

    def release(self) -> None:
        mrs, self.mrs = self.mrs, ()
        for mr in mrs:
            mr.ref_down()

    def release_if_cancelled(self, future: Future) -> None:
        # A cancelled future never ran, so its thread will not release.
        if future.cancelled():
            self.release()


SdkCall = Callable[[SdkClient, list[str], list], CallResult]
OutlivedCall = Callable[[list[str], Future], None]


@dataclass(frozen=True)
class Operation:
    """How one kind of request is dispatched."""

    name: str  # "get", "put", "delete": also the `<name>_timeout_ms` key
    call: SdkCall
    retryable: Callable[[list[Outcome]], list[int]]
    metadata: bool = False  # on the small metadata pool, not the data pool
    priority: int = GET_PRIORITY
    resend_unregistered: bool = False  # keys refused with GDR_TRANSFER_ERROR go again unregistered

    def timeout_ms(self, config: EICConfig) -> float:
        return getattr(config, f"{self.name}_timeout_ms")


GET = Operation("get", lambda client, keys, buffers: client.mget(keys, buffers), failed_before_first_miss)
PUT = Operation(
    "put",
    lambda client, keys, buffers: client.mset(keys, buffers),
    failed,
    priority=PUT_PRIORITY,
    resend_unregistered=True,
)
DELETE = Operation("delete", lambda client, keys, _: client.mdel(keys), failed, metadata=True)


class Dispatcher:
    def __init__(self, rt: Runtime) -> None:
        self._config = rt.config
        self._link = rt.link
        self._counters = rt.counters
        self._rate_log = rt.rate_log
        config = rt.config
        self._backoff = ExponentialBackoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)

    def chunks(self, eic_keys: list[str], buffers: list | None, mrs: Sequence[MemoryRegion] | None) -> list[Chunk]:
        step = self._config.batch_keys
        if buffers:
            # Big blocks: several calls, so their copies run on several threads.
            step = max(1, min(step, self._config.batch_bytes // buffers[0][1]))
        return [
            Chunk(
                eic_keys[start : start + step],
                buffers[start : start + step] if buffers is not None else [],
                mrs[start : start + step] if mrs is not None else (),
            )
            for start in range(0, len(eic_keys), step)
        ]

    async def run(
        self, op: Operation, client: SdkClient, chunks: list[Chunk], outlived: OutlivedCall | None = None
    ) -> float:
        """Run the chunks concurrently; leaves each chunk's outcomes set, or
        None where the deadline came first. Returns the timeout in ms.
        `outlived(keys, future)` hears of each call still running at the
        deadline (calls still queued are cancelled and never run)."""
        timeout_ms = op.timeout_ms(self._config)
        deadline = Deadline(timeout_ms / 1000)
        pool = self._link.meta_pool if op.metadata else self._link.data_pool
        if pool is None:
            for chunk in chunks:
                chunk.release()
            raise RuntimeError("the connector was closed during the request")
        futures = []
        try:
            for chunk in chunks:
                future = pool.submit(self._run_chunk, op, client, chunk, deadline, priority=op.priority)
                future.add_done_callback(chunk.release_if_cancelled)
                futures.append(future)
        except RuntimeError:  # pool shut down by close()
            for chunk in chunks[len(futures) :]:
                chunk.release()
            for future in futures:
                future.cancel()
            raise
        loop = asyncio.get_running_loop()
        waiters = [asyncio.wrap_future(future, loop=loop) for future in futures]
        try:
            _, pending = await asyncio.wait(waiters, timeout=deadline.remaining())
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        if pending:
            for chunk, future in zip(chunks, futures):
                if not future.cancel() and not future.done() and outlived is not None:
                    outlived(chunk.keys, future)
            self._link.deadline_passed(op.name, timeout_ms)
        return timeout_ms

    def run_here(self, op: Operation, client: SdkClient, chunk: Chunk, deadline: Deadline) -> None:
        """Run one chunk, with its retries, on the calling thread (a pool
        thread already: the write-behind flusher's tasks)."""
        self._run_chunk(op, client, chunk, deadline)

    def _run_chunk(self, op: Operation, client: SdkClient, chunk: Chunk, deadline: Deadline) -> None:
        try:
            self._call_with_retry(op, client, chunk, deadline)
        except BaseException as e:  # a bug here must still yield an answer
            self._rate_log.log("chunk-internal", logging.ERROR, "EIC call failed internally: %r", e)
            chunk.detail = f"internal error {e!r}"
            chunk.outcomes = [FAIL] * len(chunk.keys)
        finally:
            chunk.release()

    def _call_with_retry(self, op: Operation, client: SdkClient, chunk: Chunk, deadline: Deadline) -> None:
        """Run one SDK call, then re-send keys it failed (never misses) while
        the retry budget, the deadline and the breaker allow."""
        link = self._link
        result = link.call(op.name, op.call, client, chunk.keys, chunk.buffers)
        if result.gdr_refused and op.resend_unregistered:
            result = self._resend_unregistered(op, client, chunk, None, result, deadline)
        outcomes, detail = list(result.outcomes), result.detail
        for attempt in range(1, self._config.retry_attempts + 1):
            again = op.retryable(outcomes)
            if not again or link.breaker.tripped:
                break
            delay = self._backoff.compute(attempt)
            if deadline.remaining() <= delay:
                break
            time.sleep(delay)
            self._counters.add(retries=len(again))
            buffers = [chunk.buffers[i] for i in again] if chunk.buffers else []
            result = link.call(op.name, op.call, client, [chunk.keys[i] for i in again], buffers)
            if result.gdr_refused and op.resend_unregistered:
                result = self._resend_unregistered(op, client, chunk, again, result, deadline)
            for j, i in enumerate(again):
                outcomes[i] = result.outcomes[j]
            detail = result.detail
        chunk.detail = detail
        chunk.outcomes = outcomes  # last: readers take outcomes as "call finished"

    def _resend_unregistered(
        self,
        op: Operation,
        client: SdkClient,
        chunk: Chunk,
        sent: list[int] | None,
        result: CallResult,
        deadline: Deadline,
    ) -> CallResult:
        """Send again, at once and unregistered, the registered writes of
        `result` (for the chunk's keys at `sent`, None for all) that EIC
        refused with GDR_TRANSFER_ERROR: the registered transfer path failed,
        not the store. Their later retries stay unregistered too."""
        positions = []  # into result
        for j in result.gdr_refused:
            i = j if sent is None else sent[j]
            addr, nbytes, registered = chunk.buffers[i]
            if registered:
                chunk.buffers[i] = (addr, nbytes, False)
                positions.append(j)
        if not positions or self._link.breaker.tripped or deadline.expired():
            return result
        indices = positions if sent is None else [sent[j] for j in positions]
        self._counters.add(gdr_resends=len(indices))
        self._rate_log.log(
            "gdr-resend",
            logging.WARNING,
            "EIC refused %d registered writes with GDR_TRANSFER_ERROR; re-sending them unregistered "
            "(put_registered: false skips the registered attempt)",
            len(indices),
        )
        resent = self._link.call(
            op.name, op.call, client, [chunk.keys[i] for i in indices], [chunk.buffers[i] for i in indices]
        )
        outcomes = list(result.outcomes)
        for k, j in enumerate(positions):
            outcomes[j] = resent.outcomes[k]
        detail = f"{result.detail}; re-sent unregistered: {resent.detail}"
        return CallResult(outcomes, result.whole_call_failed and resent.whole_call_failed, detail)
