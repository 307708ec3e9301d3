"""Batched L1 -> L2 ingestion for aibrix-kvcache 0.8.0's cache manager.

With L1 on and synchronous ingestion (AIBrix's default), L1's eviction
policy calls the manager's `_l2_ingestion_callback` once per block from
inside `L1Cache.acquire` (`HOT`: a block's first hit) or `L1Cache.put`
(`ALL`), under L1's lock; each call is one `run_coroutine_threadsafe`
round trip to the manager's event loop and a one-block `L2Cache.put`,
waited for. Here, for managers whose L2 backend is one of our connectors,
the `HOT`/`ALL` callbacks of one `acquire`/`put` call are collected instead
and, when the call returns, sent as one `L2Cache.put` per run of adjacent
blocks of one token sequence, all in one round trip that the caller still
waits for (the synchronous semantics are kept: every block is handed to
L2 before `acquire`/`put` returns).

Kept as stock AIBrix does: the references L1 took for the callback are
dropped once each, after the put that reads them (the manager's own
`_release`); regions are sealed by L1 before a callback sees them; the L2
keys are the ones the per-block puts would have built. Unlike stock, a put
that fails or raises only loses cache entries (counted in the connector's
`ingestion_lost`), the puts run after L1's lock is released, and a block
that the same L1 call evicts is freed after the put instead of during the
call (so another thread's allocation may see up to one call's blocks more
in use meanwhile). `EVICTED`
ingestion (whose release lets L1's allocation retry succeed) and AIBrix's
asynchronous ingestion (`..._INGESTION_MAX_INFLIGHT_TOKENS` > 0, counted in
its in-flight quota) are left alone. registry.py installs it, on
aibrix-kvcache 0.8.0 only (opt out with AIBRIX_EIC_PATCH_INGESTION=0);
docs/aibrix-upstream-reports.md has the report this works around.
"""

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from aibrix_kvcache.cache_hashable import BlockHashes, TokenListView
from aibrix_kvcache.status import Status

from ..util.rate_limited_log import RateLimitedLogger
from .backends import backend_of

logger = logging.getLogger(__name__)
_rate_log = RateLimitedLogger(logger)  # at most one failure warning per 10 s

OPT_OUT_ENV = "AIBRIX_EIC_PATCH_INGESTION"  # registry.INGESTION.opt_out (a test holds them equal)
BATCHED_LOG_LINE = "AIBrix's synchronous L1 ingestion is batched"  # the start-up log; benchmarks/serve.py looks for it

# The connectors whose managers get batched ingestion (batch_ingestion adds them).
_BATCHED_BACKENDS: "weakref.WeakSet[object]" = weakref.WeakSet()
_COUNTERS: "weakref.WeakKeyDictionary[object, Any]" = weakref.WeakKeyDictionary()  # connector -> its Counters


def batch_ingestion(connector: object, counters: Any = None) -> bool:
    """Batch the synchronous HOT/ALL ingestion of the cache managers whose
    L2 backend is `connector` (built from now on: the manager registers its
    L1 callbacks after it built its L2Cache, and so us). `counters` gets
    the ingestion counts. True: it is in place. Idempotent: L1Cache is
    patched once per process (registry.install_all calls this under its lock)."""
    from aibrix_kvcache.l1.l1_cache import L1Cache

    for setter in ("set_on_hot_access_callback", "set_on_put_callback"):
        original = getattr(L1Cache, setter)
        if not getattr(original, "_aibrix_eic_batching", False):
            setattr(L1Cache, setter, _batching_setter(original))
    if counters is not None:
        _COUNTERS[connector] = counters
    _BATCHED_BACKENDS.add(connector)
    return True


# L1Cache.set_on_*_callback(l1, functor); functor(key, mr) -> Status.
Setter = Callable[[Any, Callable[[Any, Any], Status]], None]


def _batching_setter(original: Setter) -> Setter:
    def set_callback(l1: Any, functor: Callable[[Any, Any], Status]) -> None:
        manager = getattr(functor, "__self__", None)
        backend = _our_backend(manager)
        if backend is None or getattr(manager, "_l2_inflight_quota", 1) != 0:
            original(l1, functor)
            return
        batcher = IngestionBatcher(manager, functor, _COUNTERS.get(backend))
        batcher.wrap(l1)
        original(l1, batcher.on_ingest)
        logger.info(
            "EIC: %s: one L2Cache.put per run of adjacent blocks per L1 call (%s=0 turns it off)",
            BATCHED_LOG_LINE,
            OPT_OUT_ENV,
        )

    set_callback._aibrix_eic_batching = True  # type: ignore[attr-defined]
    set_callback.__wrapped__ = original  # type: ignore[attr-defined]
    return set_callback


def _our_backend(manager: object) -> object | None:
    """The manager's L2 backend if it is one of the connectors batch_ingestion was given."""
    if getattr(manager, "_l2_ingestion_callback", None) is None:
        return None
    return backend_of(manager, _BATCHED_BACKENDS)


class _Scope(threading.local):
    pending: list[tuple[Any, Any]] | None = None  # (key, mr) per callback


class IngestionBatcher:
    """One manager's L1 ingestion: collects the callbacks of one L1 call on
    its thread, then hands them to L2."""

    def __init__(self, manager: Any, stock_callback: Callable[[Any, Any], Status], counters: Any) -> None:
        self._manager = weakref.proxy(manager)  # the manager owns L1, which owns us
        self._stock = stock_callback
        self._counters = counters
        self._scope = _Scope()

    def wrap(self, l1: Any) -> None:
        """Give this L1Cache instance acquire/put that batch their callbacks."""
        for name in ("acquire", "put"):
            setattr(l1, name, self._scoped(getattr(l1, name)))

    def _scoped(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            scope = self._scope
            if scope.pending is not None:  # re-entered: the outer call sends
                return method(*args, **kwargs)
            pending: list[tuple[Any, Any]] = []
            scope.pending = pending
            try:
                return method(*args, **kwargs)
            finally:
                scope.pending = None
                if pending:
                    self._send(pending)

        call.__wrapped__ = method  # type: ignore[attr-defined]
        return call

    def on_ingest(self, key: Any, mr: Any) -> Status:
        """L1's HOT/ALL callback: L1 took a reference on mr for us."""
        pending = self._scope.pending
        if pending is None:  # not inside a wrapped call: as stock
            return self._stock(key, mr)
        pending.append((key, mr))
        return Status.ok(len(key.query))

    def _send(self, pending: list[tuple[Any, Any]]) -> None:
        """One round trip for every run; each reference dropped once, after
        the put that reads it ended. Never raises an Exception."""
        runs = group_runs(pending)
        stored = 0
        manager = self._manager
        coro = _put_runs(manager, runs)
        try:
            future = asyncio.run_coroutine_threadsafe(coro, manager._event_loop)
        except Exception as e:  # the loop is closed, or the manager gone: nothing was sent
            coro.close()
            _log_failure(e)
        else:
            try:
                stored = future.result()  # _put_runs does not raise; only a cancelled task ends this way
            except Exception as e:
                _log_failure(e)
            # A BaseException (KeyboardInterrupt) propagates without releasing:
            # the put may still read the regions, so their references leak.
        regions = [mr for _, mr in pending]
        try:
            manager._release(regions)  # as AIBrix's _l2_put_sync releases
        except ReferenceError:  # the manager is gone: drop the references directly
            for mr in regions:
                mr.ref_down()
        if self._counters is not None:
            self._counters.add(
                ingestion_puts=len(runs), ingestion_blocks=len(pending), ingestion_lost=len(pending) - stored
            )


async def _put_runs(manager: Any, runs: Sequence[tuple[Any, Any, list[Any]]]) -> int:
    """Every run's L2Cache.put, in order; how many blocks were stored."""
    stored = 0
    for prefix, query, mrs in runs:
        try:
            status = await manager._l2_cache.put(prefix, query, mrs)
        except Exception as e:
            _log_failure(e)
            continue
        if status.is_ok():
            stored += status.get()
        else:
            _log_failure(status)
    return stored


def _log_failure(what: object) -> None:
    _rate_log.log(
        "ingestion", logging.WARNING, "EIC: a batched L1 ingestion put failed; its blocks are not in L2: %s", what
    )


def group_runs(pending: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any, list[Any]]]:
    """(prefix, query, regions) per run of consecutive callbacks whose keys
    are adjacent blocks of one token sequence: L2Cache.put builds from them
    the same keys as from each block's own (prefix, query)."""
    # (first key, queries, regions, hashes up to the run's end: BlockHashes' running length)
    runs: list[tuple[Any, list[Any], list[Any], list[int]]] = []
    for key, mr in pending:
        if runs and _follows(runs[-1][0], runs[-1][1], runs[-1][3][0], key):
            runs[-1][1].append(key.query)
            runs[-1][2].append(mr)
            runs[-1][3][0] += _nhashes(key.query)
        else:
            runs.append((key, [key.query], [mr], [_nhashes(key.prefix) + _nhashes(key.query)]))
    return [(first.prefix, _joined(queries), mrs) for first, queries, mrs, _ in runs]


def _nhashes(part: Any) -> int:
    """Block hashes in a BlockHashes prefix or query (0 for anything else)."""
    return len(part._data) if type(part) is BlockHashes else 0


def _follows(first: Any, queries: list[Any], nhashes: int, key: Any) -> bool:
    """Whether key is the block right after queries[-1] in the sequence
    whose prefix is first's; `nhashes`: the block hashes up to queries[-1]."""
    prefix, query, last = key.prefix, key.query, queries[-1]
    if prefix is None or type(query) is not type(last):
        return False
    if type(query) is TokenListView:  # views of one array (L1 slices one `prefix + query`)
        data = query._data
        start = first.prefix._start if first.prefix is not None else first.query._start
        return (
            prefix._data is data
            and last._data is data
            and prefix._start == start
            and prefix._stop == last._stop == query._start
        )
    if type(query) is BlockHashes:  # AIBrix's equality: the last hash and the length
        return (
            query.block_ntokens == last.block_ntokens == prefix.block_ntokens
            and len(prefix._data) == nhashes
            and prefix._data[-1] == last._data[-1]
        )
    return False


def _joined(queries: list[Any]) -> Any:
    if len(queries) == 1:
        return queries[0]
    if type(queries[0]) is TokenListView:
        first, last = queries[0], queries[-1]
        return TokenListView(first._data, first._start, last._stop, meta=first._meta_)
    return BlockHashes([h for q in queries for h in q._data], queries[0].block_ntokens)
