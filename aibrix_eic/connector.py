"""EICConnector: AIBrix's L2 `Connector` interface over an EIC SDK module:
the requests AIBrix makes, routed to their path (its construction and
lifecycle are in lifecycle.py). docs/architecture.md draws the paths:

- mget: checks -> the write-behind table for keys it holds (writes/) ->
  request/direct.py for the rest -> request/dispatch.py (SDK calls of at
  most `batch_keys` keys and `batch_bytes` bytes on the link's pools) ->
  request/statuses.py -> a prefix-closed Status list.
- mput: put_mode direct -> request/direct.py as above; write_behind or
  coalesce -> writes/write_behind.py (queued in writes/table.py, sent by
  writes/flusher.py and writes/rounds.py).
- exists: the write-behind table, else the mexists of one event-loop tick
  (request/exists.py). delete: direct, or ordered after a pending write.

What it guarantees, and why:

- No exception and no `exit()` reaches AIBrix; every method returns Status.
- mget results are prefix-closed: after the first block that did not load,
  no block is reported OK. `get_batches` returns one batch per request, so
  this holds across the whole request (L2Cache adds up the OKs of every batch
  and the cache manager reads the sum as a loaded prefix).
- mput reports success as a list of OKs only when every block was stored;
  otherwise one error Status (a list with holes crashes L2Cache 0.8.0).
- Memory regions are ref-counted while an SDK call may touch them, so a call
  that outlives its deadline never reads or writes memory AIBrix reused.
- Per-operation deadlines, bounded retries of failed keys, and a circuit
  breaker that turns a down EIC into fast misses until a probe sees it back.
"""

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from .aibrix_compat.tokens import restore_tokens, with_tokens
from .lifecycle import ConnectorLifecycle
from .request.checks import InvalidRequest, check_lengths, eic_keys
from .request.statuses import DELETE_SKIPPED, FAST_MISS, PUT_SKIPPED, request_outcome

# The requests the metrics count, by their name there; get() and put() go
# through mget() and mput(), so each request is counted once. exists() is
# counted by the exists batcher (request/exists.py), the one owner of its series.
METRIC_OPS = {"mget": "get", "mput": "put", "delete": "delete"}


def never_raises(op: str) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Turn any exception of an async op into a Status (bad input INVALID,
    a bug ERROR), and count the request in the metrics."""
    metric_op = METRIC_OPS.get(op)

    def decorate(method):
        @functools.wraps(method)
        async def wrapper(self, *args, **kwargs):
            started = time.perf_counter() if metric_op is not None else 0.0
            try:
                result = await method(self, *args, **kwargs)
            except asyncio.CancelledError:
                raise
            except InvalidRequest as e:
                self._counters.add(invalid=1)
                result = Status(StatusCodes.INVALID, f"{op}: {e}")
                if op == "exists":
                    self._exists.count(result)
            except BaseException as e:  # AssertionError too: nothing escapes
                self._rate_log.log(f"{op}-internal", logging.ERROR, "EIC %s failed internally: %r", op, e)
                result = Status(StatusCodes.ERROR, f"{op} failed internally: {e!r}")
                if op == "exists":
                    self._exists.count(result)
            if metric_op is not None:
                try:
                    seconds = time.perf_counter() - started
                    if self._metrics.enabled:
                        outcome = request_outcome(metric_op, result)
                        self._metrics.record_request(metric_op, outcome, result, args, seconds)
                    if metric_op == "get":
                        self._note_reuse(args, result, seconds)
                except Exception as e:  # metrics never cost a request its answer
                    self._rate_log.log("metrics", logging.WARNING, "EIC metrics failed: %r", e)
            return result

        return wrapper

    return decorate


class EICConnector(ConnectorLifecycle):
    """AIBrix L2 connector for EIC (or the embedded engine)."""

    def _note_reuse(self, args: tuple[Any, ...], result: Any, seconds: float) -> None:
        """A get request's reuse line (observability/reuse.py)."""
        if isinstance(result, Status) or len(args) < 2 or not result:
            return  # refused before it was a request
        loaded = sum(1 for status in result if status.is_ok())  # a prefix
        self._reuse.get(len(result), loaded, loaded * args[1][0].length if loaded else 0, seconds)

    # ------------------------------------------------------- request checks
    def _refusal(self) -> Status | None:
        """Why no request can run now, or None."""
        if self._config_error is not None:
            return Status(StatusCodes.INVALID, str(self._config_error))
        if not self._link.is_open:
            return Status(StatusCodes.INVALID, "the EIC connector is closed (call open() first)")
        return None

    # ------------------------------------------------------------ batching
    def get_batches(
        self,
        keys: Sequence[Any],
        mrs: Sequence[MemoryRegion | Sequence[MemoryRegion]],
        batch_size: int,
    ) -> Sequence[Sequence[tuple[bytes, MemoryRegion | Sequence[MemoryRegion]]]]:
        """One batch for the whole request; mget/mput split it into SDK calls.

        L2Cache sums OKs across batches and keeps going after a short one,
        which would count a block after a hole as loaded; with one batch our
        prefix-closed statuses are all it sees.
        """
        try:
            if not MemoryRegion.use_compact_layout():
                # Token-validation layout: keep each block's tokens with its key (see mget).
                keys = [(real_key, with_tokens(real_key, cache_key)) for real_key, cache_key in keys]
            pairs = list(zip(keys, mrs))
        except Exception as e:  # bad input: no batch, so L2Cache sends nothing
            self._rate_log.log("get_batches", logging.WARNING, "EIC get_batches: unusable request: %r", e)
            return []
        return [pairs] if pairs else []

    # ------------------------------------------------------------- reading
    @never_raises("mget")
    async def mget(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        check_lengths(keys, mrs)
        if self._write_behind.active:  # accepted writes not yet in EIC are read from their regions
            self._blocks.buffers(mrs, False)  # INVALID names the caller's index, not a sub-request's
            return await self._write_behind.mget(
                eic_keys(self._codec, keys), keys, mrs, self._direct.mget, restore_tokens
            )
        return await self._direct.mget(keys, mrs)

    @never_raises("get")
    async def get(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mget([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @never_raises("exists")
    async def exists(self, key: bytes) -> Status:
        """Concurrent exists() calls of one event-loop tick share one mexist
        (L2Cache issues up to op_batch of them at once)."""
        refusal = self._refusal()
        if refusal is not None:
            return self._exists.count(refusal)
        eic_key = eic_keys(self._codec, [key])[0]
        if self._write_behind.active:
            known = self._write_behind.exists(eic_key)
            if known is not None:
                return self._exists.count(known)
        if self._link.usable("meta") is None:
            return self._exists.count(FAST_MISS)
        return await self._exists.exists(eic_key)

    # ------------------------------------------------------------- writing
    @never_raises("mput")
    async def mput(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        check_lengths(keys, mrs)
        usable = self._link.usable("data")
        if usable is None:
            return PUT_SKIPPED  # nothing is queued while the circuit is open
        if self._write_behind.enabled:
            buffers = self._blocks.buffers(mrs, True)  # the flusher applies the session's registration
            return await self._write_behind.mput(eic_keys(self._codec, keys), buffers, mrs)
        return await self._direct.mput(usable[0], keys, mrs)

    @never_raises("put")
    async def put(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mput([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @never_raises("delete")
    async def delete(self, key: bytes) -> Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        eic_key = eic_keys(self._codec, [key])[0]
        usable = self._link.usable("meta")
        if usable is None:
            return DELETE_SKIPPED
        if self._write_behind.enabled:  # ordered after a write of the key in flight
            self._counters.add(deletes=1)
            return await self._write_behind.delete(eic_key, usable[0])
        return await self._direct.delete(usable[0], eic_key)
