"""Workaround for an aibrix-kvcache 0.8 defect: timeouts release memory
before the request is stopped (the token half is in tokens.py). In 0.8.0,
`BaseKVCacheManager._acquire_impl` runs `L2Cache.get` with
`asyncio.run_coroutine_threadsafe` and waits `future.result(timeout=...)`;
on a timeout its `finally` releases the memory regions first and cancels the
future after. A coroutine the loop had already queued then runs on regions
that are freed (double free) or already handed to the next request (its KV
overwritten). `order_timeouts` makes the cache manager's futures give up in
the safe order: mark the request abandoned (RequestGuard, checked by
request/checks.py's hold), cancel it, wait for a coroutine that had started
to end, and only then let AIBrix's `finally` release. Only requests to an
L2Cache whose backend is one of our connectors are ordered; every other
manager in the process gets asyncio's own future, so it times out exactly
as stock AIBrix. registry.py installs it (opt out with
AIBRIX_EIC_PATCH_TIMEOUTS=0). Details and the upstream report:
docs/operations.md.
"""

import asyncio
import contextvars
import logging
import sys
import threading
import types
import weakref
from collections.abc import Coroutine
from concurrent.futures import CancelledError, Future
from typing import Any

logger = logging.getLogger(__name__)

CACHE_MANAGER_MODULE = "aibrix_kvcache.cache_manager"
# How long a timed-out caller waits for a started coroutine to see its
# cancellation. Only a stalled event loop makes this wait; past it AIBrix
# releases anyway, and the connector's own references still keep the memory
# out of the allocator while an SDK call may touch it.
DRAIN_TIMEOUT_S = 5.0


class RequestGuard:
    """Shared by one AIBrix request's caller thread and its coroutine."""

    __slots__ = ("lock", "abandoned", "started", "finished")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.started = False  # the coroutine began running
        self.finished = threading.Event()  # ...and has ended

    def abandon(self) -> bool:
        """The caller gives up; True when the coroutine had started."""
        with self.lock:
            self.abandoned = True
            return self.started


CURRENT_GUARD: contextvars.ContextVar[RequestGuard | None] = contextvars.ContextVar("aibrix_eic_guard", default=None)


class _OrderedTimeoutFuture:
    """A cache manager's view of its request: `result(timeout)` that times
    out only once the request can no longer touch its memory."""

    __slots__ = ("_future", "_guard")

    def __init__(self, future: Future[Any], guard: RequestGuard) -> None:
        self._future = future
        self._guard = guard

    def result(self, timeout: float | None = None) -> Any:
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


async def _guarded(coro: Coroutine[Any, Any, Any], guard: RequestGuard) -> Any:
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


def _l2_cache_of(coro: Coroutine[Any, Any, Any]) -> object | None:
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


def _wants_ordering(coro: Coroutine[Any, Any, Any]) -> bool:
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

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    def run_coroutine_threadsafe(coro, loop):
        if not _wants_ordering(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop)
        guard = RequestGuard()
        return _OrderedTimeoutFuture(asyncio.run_coroutine_threadsafe(_guarded(coro, guard), loop), guard)


def order_timeouts(connector: object) -> bool:
    """Order the timeouts of the cache managers whose L2 backend is
    `connector`, if AIBrix's cache manager module is loaded; True when it is
    in place. Idempotent; registry.install_all calls it under its lock."""
    module = sys.modules.get(CACHE_MANAGER_MODULE)
    if module is None:
        return False
    if not isinstance(getattr(module, "asyncio", None), _AsyncioWithOrderedTimeouts):
        setattr(module, "asyncio", _AsyncioWithOrderedTimeouts())  # noqa: B010  (the module's own global)
    _ORDERED_BACKENDS.add(connector)
    return True
