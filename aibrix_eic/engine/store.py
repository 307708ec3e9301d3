"""The embedded engine's storage: bytes under (namespace, key), LRU, TTL.

Thread model: one lock guards the index and the byte accounting; the data
itself moves outside the lock with ctypes.memmove, which releases the GIL, so
several threads copy at once; caller buffers in device memory (on_device)
are copied with torch instead (device.py). A value being read is pinned; eviction or
overwrite of a pinned value only unlinks it, and its buffer is recycled when
the last reader unpins it. A value being written is published only after its
copy finished, so readers never see a half-written value.

Memory (StoreBuffers, store_memory.py): every buffer the store owns counts in
`held_bytes` (published values, values being written, unlinked-but-pinned
values, freed buffers kept for reuse, and pages kept faulted ahead of
allocation, store_pages.py). Allocation keeps `held_bytes <= capacity` by
recycling freed buffers, then carving ready pages, then dropping freed
buffers of other sizes and ready pages, then evicting LRU values; a write
that still does not fit fails with OUT_OF_CAPACITY. Only set_capacity can
leave it above capacity, by what pinned reads and in-flight writes hold until
they finish. Per value the bookkeeping (value object, numpy header, index
entry, key) is about 420 bytes; benchmarks/bench_engine.py measures it.
"""

import ctypes
import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine import device
from .enums import StatusCode
from .faults import Faults
from .store_memory import StoreBuffers, _Value
from .store_pages import ReadyPages, Refiller, default_prefault

_memmove = ctypes.memmove


@dataclass
class StoreStats:
    """Counters, read by tests, the CLI and benchmarks."""

    puts: int = 0
    gets: int = 0
    hits: int = 0
    misses: int = 0
    exists: int = 0
    deletes: int = 0
    evictions: int = 0
    expirations: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    allocations: int = 0
    prefaulted: int = 0  # allocations carved from ready pages (prefault=)
    damaged: int = 0  # shared store: stored values that failed their checksum, read as misses


# The largest value a store takes unless `max_value=` says otherwise. Large enough for what public EIC callers write as one value (an
# LMCache chunk of an 8B model is 32 MiB, the bytedance-iaas model loader's
# values reach 20 MiB), small enough to catch a runaway size; `max_value=4MiB`
# models the agents that split at 4 MiB. docs/engine.md gives the evidence.
DEFAULT_MAX_VALUE_BYTES = 64 * 1024**2
# Pages kept faulted ahead of the store's writes unless `prefault=` says
# otherwise (store_pages.py; docs/engine.md gives the measured trade-off).
DEFAULT_PREFAULT_BYTES = 1024**3


class Store(StoreBuffers):
    """A capacity-bounded byte store shared by every Client bound to it."""

    # How absent keys shape mexist's top-level status (docs/engine.md):
    # "success" keeps it SUCCESS with KEY_NOT_EXIST per key, the reply public
    # callers are written for; "failed" counts misses as failed keys
    # (PARTIAL_FAILED, FAILED when every key misses). A class default, so a
    # test can run everything under the other reading.
    mexist_miss: str = "success"
    # Bytes of pages kept faulted ahead of allocation when neither
    # `prefault` nor AIBRIX_EIC_ENGINE_PREFAULT says: a class default.
    default_prefault: int = DEFAULT_PREFAULT_BYTES

    def __init__(
        self,
        name: str = "default",
        capacity: int = 4 * 1024**3,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        namespaces: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefault: int | None = None,
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.max_value_bytes = max_value_bytes
        # None means any namespace is accepted; otherwise only these exist.
        self.namespaces: frozenset[str] | None = None if namespaces is None else frozenset(namespaces)
        self.clock = clock
        self.faults = Faults()
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[tuple[str, str], _Value] = OrderedDict()
        self._free: dict[int, list[tuple[np.ndarray, int]]] = {}  # nbytes -> (buf, addr)
        self._free_bytes = 0
        self._held_bytes = 0
        self._live_bytes = 0
        self._expiry_heap: list[tuple[float, int, tuple[str, str], _Value]] = []
        self._expiry_seq = itertools.count()
        self._pages = ReadyPages()
        self._refiller: Refiller | None = None
        self._refill_paused = False
        self.prefault = 0
        self.set_prefault(default_prefault(self.default_prefault) if prefault is None else prefault)

    # ------------------------------------------------------------------ info
    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @property
    def live_bytes(self) -> int:
        """Bytes of published values."""
        return self._live_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of every buffer the store owns, reusable ones included."""
        return self._held_bytes

    def has_namespace(self, ns: str) -> bool:
        return self.namespaces is None or ns in self.namespaces

    def value_size(self, ns: str, key: str) -> int | None:
        """Size of the unexpired value under (ns, key), or None."""
        with self._lock:
            value = self._lookup_unsafe((ns, key), self.clock())
            return None if value is None else value.nbytes

    def keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._index.keys())

    def clear(self) -> StatusCode:
        """Drop every value and every reusable buffer (always SUCCESS)."""
        with self._lock:
            for value in self._index.values():
                value.linked = False
                if value.pins == 0:
                    value.buf = None  # type: ignore[assignment]
                    self._held_bytes -= value.nbytes
            self._index.clear()
            self._expiry_heap.clear()
            self._live_bytes = 0
            self._held_bytes -= self._free_bytes
            self._free.clear()
            self._free_bytes = 0
            self._held_bytes -= self._pages.clear()
            # Until the next write: a store cleared and left (a benchmark's,
            # a test's) must not hold the process's prefault budget.
            self._refill_paused = True
            # Pinned values keep their bytes counted until their last reader
            # recycles them; values being written until they are published.
        return StatusCode.SUCCESS

    def close(self) -> None:
        """clear(), and stop keeping pages ready (reset_stores does this)."""
        self.set_prefault(0)
        self.clear()

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            self.capacity = capacity
            self._make_room_unsafe(0)

    # ------------------------------------------------------------ data path
    def put_many(
        self,
        ns: str,
        keys: Sequence[str],
        sources: Sequence[tuple[int, int]],
        ttl_second: int,
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]:
        """Store each (addr, nbytes) source under its key; one code per key.
        `on_device[i]`: source i is device memory."""
        codes: list[StatusCode] = [StatusCode.SUCCESS] * len(keys)
        reserved: list[tuple[int, _Value]] = []
        with self._lock:
            self._expire_due_unsafe()
            for i, (_addr, nbytes) in enumerate(sources):
                value = self._allocate_unsafe(nbytes)
                if value is None:
                    codes[i] = StatusCode.OUT_OF_CAPACITY
                else:
                    reserved.append((i, value))
        for i, value in reserved:
            if on_device is not None and on_device[i]:
                device.copy_from_device(value.buf, sources[i][0])
            else:
                _memmove(value.addr, sources[i][0], value.nbytes)
        expires_at = None
        if ttl_second > 0:
            expires_at = self.clock() + ttl_second
        with self._lock:
            for i, value in reserved:
                key = (ns, keys[i])
                old = self._index.pop(key, None)
                if old is not None:
                    self._unlink_unsafe(old)
                value.expires_at = expires_at
                value.linked = True
                self._index[key] = value
                self._live_bytes += value.nbytes
                if expires_at is not None:
                    heapq.heappush(
                        self._expiry_heap,
                        (expires_at, next(self._expiry_seq), key, value),
                    )
                self.stats.bytes_in += value.nbytes
            self.stats.puts += len(keys)
        return codes

    def get_many(
        self,
        ns: str,
        keys: Sequence[str],
        destinations: Sequence[tuple[int, int]],
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]:
        """Copy each stored value into its (addr, nbytes) destination
        (`on_device[i]`: destination i is device memory).

        A destination whose size differs from the stored value is left
        untouched and gets BUFFER_SIZE_MISMATCH: never a partial fill.
        """
        codes: list[StatusCode] = [StatusCode.KEY_NOT_EXIST] * len(keys)
        pinned: list[tuple[int, _Value]] = []
        with self._lock:
            now = self.clock()
            for i, key in enumerate(keys):
                value = self._lookup_unsafe((ns, key), now)
                if value is None:
                    continue
                if value.nbytes != destinations[i][1]:
                    codes[i] = StatusCode.BUFFER_SIZE_MISMATCH
                    continue
                value.pins += 1
                self._index.move_to_end((ns, key))
                pinned.append((i, value))
            self.stats.gets += len(keys)
            self.stats.hits += len(pinned)
            self.stats.misses += len(keys) - len(pinned)
        try:
            for i, value in pinned:
                if on_device is not None and on_device[i]:
                    device.copy_to_device(destinations[i][0], value.buf)
                else:
                    _memmove(destinations[i][0], value.addr, value.nbytes)
                codes[i] = StatusCode.SUCCESS
        finally:
            with self._lock:
                for _, value in pinned:
                    value.pins -= 1
                    self.stats.bytes_out += value.nbytes
                    if value.pins == 0 and not value.linked:
                        self._recycle_unsafe(value)
        return codes

    def exist_many(self, ns: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key holds an unexpired value. Does not touch LRU."""
        with self._lock:
            now = self.clock()
            found = [self._lookup_unsafe((ns, key), now) is not None for key in keys]
            self.stats.exists += len(keys)
        return found

    def delete_many(self, ns: str, keys: Sequence[str]) -> list[StatusCode]:
        """Remove each key: SUCCESS where a value was there to remove, else KEY_NOT_EXIST."""
        with self._lock:
            now = self.clock()
            codes = []
            for key in keys:
                value = self._lookup_unsafe((ns, key), now)
                if value is not None:
                    del self._index[(ns, key)]
                    self._unlink_unsafe(value)
                codes.append(StatusCode.KEY_NOT_EXIST if value is None else StatusCode.SUCCESS)
            self.stats.deletes += len(keys)
        return codes

    # ------------------------------------------------------------- internals
    def _lookup_unsafe(self, key: tuple[str, str], now: float) -> _Value | None:
        value = self._index.get(key)
        if value is None:
            return None
        if value.expires_at is not None and value.expires_at <= now:
            del self._index[key]
            self._unlink_unsafe(value)
            self.stats.expirations += 1
            return None
        return value

    def _expire_due_unsafe(self) -> None:
        heap = self._expiry_heap
        if not heap:
            return
        now = self.clock()
        while heap and heap[0][0] <= now:
            _, _, key, value = heapq.heappop(heap)
            if value.linked and self._index.get(key) is value:
                del self._index[key]
                self._unlink_unsafe(value)
                self.stats.expirations += 1

    def _unlink_unsafe(self, value: _Value) -> None:
        """Forget a published value; recycle its buffer unless pinned."""
        value.linked = False
        self._live_bytes -= value.nbytes
        if value.pins == 0:
            self._recycle_unsafe(value)
