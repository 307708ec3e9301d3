"""Workarounds for aibrix-kvcache 0.8 defects that a connector can see.

Timeouts release memory before the request is stopped. In 0.8.0,
`BaseKVCacheManager._acquire_impl` runs `L2Cache.get` with
`asyncio.run_coroutine_threadsafe` and waits `future.result(timeout=...)`;
on a timeout its `finally` releases the memory regions first and cancels the
future after. A coroutine the loop had already queued then runs on regions
that are freed (double free) or already handed to the next request (its KV
overwritten). `order_timeouts` makes the cache manager's futures give up in
the safe order: mark the request abandoned (request_guard), cancel it, wait
for a coroutine that had started to end, and only then let AIBrix's
`finally` release. Only requests to an L2Cache whose backend is one of our
connectors are ordered; every other manager in the process gets asyncio's
own future, so it times out exactly as stock AIBrix. Opt out with
AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING=1. Details and the upstream report:
docs/operations.md.

Token-validation layout (AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED=1): a
block's value is [block bytes | magic | footer(prefix_len, query_len) |
prefix+query tokens]. `ManagedMemoryRegion.unpack_tokens` in 0.8.0 reads the
footer bytes as the prefix and the first query_len tokens as the query, so
every block that has a prefix fails L2Cache's token check and only the first
block of a sequence ever loads from L2. We parse the tokens correctly after a
get and cache them on the region, which is where unpack_tokens looks first;
L2Cache then checks the real tokens against the real key.
"""

import asyncio
import logging
import os
import sys
import types
import weakref
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future

import numpy as np
import torch
from aibrix_kvcache import TokenListView
from aibrix_kvcache.memory import ManagedMemoryRegion, MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from .request_guard import CURRENT_GUARD, RequestGuard

logger = logging.getLogger(__name__)

DISABLE_TIMEOUT_ORDERING_ENV = "AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING"
CACHE_MANAGER_MODULE = "aibrix_kvcache.cache_manager"
# How long a timed-out caller waits for a started coroutine to see its
# cancellation. Only a stalled event loop makes this wait; past it AIBrix
# releases anyway, and the connector's own references still keep the memory
# out of the allocator while an SDK call may touch it.
DRAIN_TIMEOUT_S = 5.0

_INT32 = np.dtype(np.int32).itemsize
_MAGIC = ManagedMemoryRegion.MAGIC
_FOOTER_NBYTES = 2 * _INT32


class KeyWithTokens(bytes):
    """A cache key that remembers the tokens it stands for (prefix and
    block), so the connector can check a loaded block's own tokens against
    them: L2Cache hands `mget` the cache keys only."""

    tokens: TokenListView


def with_tokens(real_key, cache_key: bytes) -> bytes:
    if not isinstance(real_key, TokenListView):
        return cache_key
    tagged = KeyWithTokens(cache_key)
    tagged.tokens = real_key
    return tagged


def restore_packed_tokens(mr: ManagedMemoryRegion) -> np.ndarray | None:
    """Parse the tokens a get brought in, cache them on `mr`, and return them
    (prefix then block).

    None when the value does not hold a well-formed footer of exactly the
    region's size, in which case the block must not be reported loaded.
    """
    block_nbytes = getattr(mr, "_block_nbytes", -1)
    if block_nbytes <= 0:
        return None
    start = mr.addr + block_nbytes
    header_end = start + _INT32 + _FOOTER_NBYTES
    if header_end > mr.addr + mr.length:
        return None
    header = mr.slab[start:header_end].view(torch.int32).cpu().numpy()  # .cpu(): the slab may be on a GPU
    magic, prefix_len, query_len = int(header[0]), int(header[1]), int(header[2])
    if magic != _MAGIC or prefix_len < 0 or query_len <= 0:
        return None
    if ManagedMemoryRegion.calculate_size(block_nbytes, prefix_len + query_len) != mr.length:
        return None
    tokens_end = header_end + _INT32 * (prefix_len + query_len)
    all_tokens = mr.slab[header_end:tokens_end].view(torch.int32).cpu().numpy().copy()
    # Views of one array: L2Cache concatenates them with `+`, which
    # TokenListView allows only for adjacent views of the same data.
    mr._prefix = TokenListView(all_tokens, 0, prefix_len) if prefix_len else None
    mr._query = TokenListView(all_tokens, prefix_len, prefix_len + query_len)
    return all_tokens


def tokens_belong(loaded: np.ndarray, key: bytes, previous: np.ndarray | None) -> bool:
    """Whether a loaded block's tokens are the ones its request asked for:
    equal to the key's tokens when the key carries them (with_tokens), and in
    any case an extension of the previous block's, so a block from another
    sequence cannot sit inside a loaded prefix."""
    expected = getattr(key, "tokens", None)
    if expected is not None and not np.array_equal(loaded, expected.to_numpy()):
        return False
    return previous is None or (len(loaded) > len(previous) and np.array_equal(loaded[: len(previous)], previous))


def restore_tokens(keys: Sequence[bytes], mrs: Sequence[MemoryRegion], statuses: list[Status], loaded: int) -> int:
    """After a get in the token-validation layout: hand L2Cache correctly
    parsed tokens, and end the loaded prefix at a block without a well-formed
    footer or whose tokens are not the ones asked for (L2Cache skips such a
    block but counts the ones after it): that block becomes NOT_FOUND.
    Returns the new prefix length; the caller closes the statuses after it."""
    previous = None
    for i in range(loaded):
        mr = mrs[i]
        if not isinstance(mr, ManagedMemoryRegion):
            continue
        block_tokens = restore_packed_tokens(mr)
        if block_tokens is None:
            reason = "stored value has no valid token footer"
        elif not tokens_belong(block_tokens, keys[i], previous):
            reason = "stored tokens are not this request's (another sequence's block)"
        else:
            previous = block_tokens
            continue
        statuses[i] = Status(StatusCodes.NOT_FOUND, f"block {i}: {reason}")
        return i
    return loaded


class _OrderedTimeoutFuture:
    """A cache manager's view of its request: `result(timeout)` that times
    out only once the request can no longer touch its memory."""

    __slots__ = ("_future", "_guard")

    def __init__(self, future: Future, guard: RequestGuard) -> None:
        self._future = future
        self._guard = guard

    def result(self, timeout: float | None = None):
        try:
            return self._future.result(timeout)
        except TimeoutError:
            started = self._guard.abandon()
            self._future.cancel()
            if started and not self._guard.finished.wait(DRAIN_TIMEOUT_S):
                logger.warning(
                    "EIC: a timed-out AIBrix request did not stop within %gs (event loop stalled?)", DRAIN_TIMEOUT_S
                )
            raise

    def __getattr__(self, name: str):
        return getattr(self._future, name)


async def _guarded(coro, guard: RequestGuard):
    with guard.lock:
        if guard.abandoned:
            coro.close()
            raise CancelledError()
        guard.started = True
    CURRENT_GUARD.set(guard)  # this task's own context
    try:
        return await coro
    finally:
        guard.finished.set()


# The connectors whose managers get ordered timeouts (order_timeouts adds them).
_ORDERED_BACKENDS: "weakref.WeakSet[object]" = weakref.WeakSet()


def _l2_cache_of(coro) -> object | None:
    """The L2Cache a cache manager's request goes to. AIBrix passes
    `self._l2_cache.<op>(...)`: the L2Cache is the coroutine's `self`, or
    `args[0]` under AIBrix's nvtx_range wrapper, or another local of a
    wrapper. None when no local has a backend."""
    frame = getattr(coro, "cr_frame", None)
    if frame is None:
        return None
    local = frame.f_locals
    args = local.get("args")
    candidates = [local.get("self"), *(args if isinstance(args, tuple) else ()), *local.values()]
    return next((obj for obj in candidates if obj is not None and hasattr(obj, "_backend")), None)


def _wants_ordering(coro) -> bool:
    """Whether a cache manager's request goes to one of our connectors.
    A request whose L2Cache cannot be found is ordered: safe for ours, and
    only a later AIBrix could make that happen."""
    l2_cache = _l2_cache_of(coro)
    if l2_cache is None:
        return True
    backend = getattr(l2_cache, "_backend", None)
    if backend in _ORDERED_BACKENDS:
        return True
    members = getattr(backend, "members", None) or ()  # AIBrix's Placement (cluster mode)
    return any(getattr(member, "conn", None) in _ORDERED_BACKENDS for member in members)


class _AsyncioWithOrderedTimeouts(types.ModuleType):
    """What the cache manager module sees as `asyncio`: the real module but
    for run_coroutine_threadsafe, which orders the timeouts of requests to
    our connectors and passes every other request to asyncio unchanged."""

    def __init__(self) -> None:
        super().__init__("asyncio")

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    @staticmethod
    def run_coroutine_threadsafe(coro, loop):
        if not _wants_ordering(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop)
        guard = RequestGuard()
        return _OrderedTimeoutFuture(asyncio.run_coroutine_threadsafe(_guarded(coro, guard), loop), guard)


def order_timeouts(connector: object, environ=os.environ) -> bool:
    """Order the timeouts of the cache managers whose L2 backend is
    `connector`, if AIBrix's cache manager module is loaded and the operator
    did not opt out; True when it is in place."""
    module = sys.modules.get(CACHE_MANAGER_MODULE)
    if module is None:
        return False
    if not isinstance(getattr(module, "asyncio", None), _AsyncioWithOrderedTimeouts):
        if environ.get(DISABLE_TIMEOUT_ORDERING_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            return False
        setattr(module, "asyncio", _AsyncioWithOrderedTimeouts())  # noqa: B010  (the module's own global)
    _ORDERED_BACKENDS.add(connector)
    return True
