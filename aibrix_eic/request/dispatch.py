"""Dispatch: a request's keys split into SDK calls (chunks) of at most
`batch_keys` keys and `batch_bytes` bytes, run concurrently on the link's
pools under one deadline; each call takes the link's one path with its
bounded retries of failed keys (`Link.send`, link/calls.py).

Memory safety: a chunk holds a reference on each memory region it may touch
from the moment it is built until its SDK call has returned, however late.
Chunks still queued at the deadline are cancelled and never touch memory.
"""

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from aibrix_kvcache.memory import MemoryRegion

from ..link.calls import Operation
from ..link.resilience import Deadline
from ..link.runtime import Runtime
from ..link.sdk import Outcome, SdkBuffer, SdkClient


class Chunk:
    """One SDK call's share of a request, and the memory it may touch."""

    __slots__ = ("keys", "buffers", "mrs", "outcomes", "detail")

    def __init__(self, keys: list[str], buffers: list[SdkBuffer], mrs: Sequence[MemoryRegion]):
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

    def release_if_cancelled(self, future: Future[None]) -> None:
        # A cancelled future never ran, so its thread will not release.
        if future.cancelled():
            self.release()


OutlivedCall = Callable[[list[str], Future[None]], None]


class Dispatcher:
    def __init__(self, rt: Runtime) -> None:
        self._config = rt.config
        self._link = rt.link

    def chunks(
        self, eic_keys: list[str], buffers: list[SdkBuffer] | None, mrs: Sequence[MemoryRegion] | None
    ) -> list[Chunk]:
        step = self._link.keys_per_call(buffers[0][1] if buffers else 0)
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

    def _run_chunk(self, op: Operation, client: SdkClient, chunk: Chunk, deadline: Deadline) -> None:
        try:
            result = self._link.send(op, client, chunk.keys, chunk.buffers, deadline)
            chunk.detail = result.detail
            chunk.outcomes = list(result.outcomes)  # last: readers take outcomes as "call finished"
        finally:
            chunk.release()
