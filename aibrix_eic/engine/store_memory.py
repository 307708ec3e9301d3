"""The half of the engine's Store that owns buffers: allocation under
capacity, recycling of freed buffers, and eviction to make room.

StoreBuffers is a base class of Store (store.py); its methods work on the
Store's index and byte counters and run under the Store's lock (hence
`_unsafe`). The memory rules they keep are in store.py's docstring.
"""

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .store_pages import ReadyPages, Refiller, chunk_bytes_for, process_total, supported, unmap

if TYPE_CHECKING:
    from .store import StoreStats


class _Value:
    __slots__ = ("buf", "addr", "nbytes", "expires_at", "pins", "linked")

    def __init__(self, buf: np.ndarray, addr: int, nbytes: int) -> None:
        self.buf = buf
        self.addr = addr  # buf's data pointer, kept with it: numpy's lookup is slow
        self.nbytes = nbytes
        self.expires_at: float | None = None
        self.pins = 0
        self.linked = False


class StoreBuffers:
    """Buffer bookkeeping for Store: allocate under capacity, recycle, evict,
    and keep pages faulted ahead of allocation (`prefault`, store_pages.py).

    Every attribute below is Store's, set in Store.__init__ and guarded by
    Store's lock, which every `_unsafe` caller holds.
    """

    name: str
    capacity: int
    prefault: int
    stats: "StoreStats"
    _lock: threading.Lock
    _pages: ReadyPages
    _refiller: Refiller | None
    _refill_paused: bool  # cleared: nothing is kept ready until the next write
    _index: OrderedDict[tuple[str, str], _Value]
    _free: dict[int, list[tuple[np.ndarray, int]]]
    _free_bytes: int
    _held_bytes: int
    _live_bytes: int

    def _recycle_unsafe(self, value: _Value) -> None:
        # None once released (clear(), eviction): a second recycle is a no-op.
        buf: np.ndarray | None = value.buf
        value.buf = None  # type: ignore[assignment]
        if buf is None:
            return
        if self._held_bytes <= self.capacity:
            self._free.setdefault(value.nbytes, []).append((buf, value.addr))
            self._free_bytes += value.nbytes
        else:
            self._held_bytes -= value.nbytes

    def _allocate_unsafe(self, nbytes: int) -> _Value | None:
        if nbytes > self.capacity:
            return None  # evicting everything would not make it fit
        spare = self._free.get(nbytes)
        if spare:
            self._free_bytes -= nbytes
            buf, addr = spare.pop()
            if not spare:
                del self._free[nbytes]  # _make_room_unsafe expects no empty lists
            return _Value(buf, addr, nbytes)
        if self._refill_paused:
            self._refill_paused = False
            if self.prefault:
                self._wake_refiller_unsafe()
        if self._pages.ready_bytes:
            ready = self._pages.ready_bytes
            carved = self._pages.take(nbytes)
            self._held_bytes -= ready - self._pages.ready_bytes  # counted as ready until now
            if carved is not None:
                self._held_bytes += nbytes
                self.stats.allocations += 1
                self.stats.prefaulted += 1
                self._wake_refiller_unsafe()
                return _Value(*carved, nbytes)
        reused = self._make_room_unsafe(nbytes)
        if reused is not None:
            return _Value(*reused, nbytes)
        if self._held_bytes + nbytes > self.capacity:
            return None
        self._held_bytes += nbytes
        self.stats.allocations += 1
        if self.prefault:
            self._wake_refiller_unsafe()
        buf = np.empty(nbytes, dtype=np.uint8)
        return _Value(buf, buf.ctypes.data, nbytes)

    def _make_room_unsafe(self, nbytes: int) -> tuple[np.ndarray, int] | None:
        """Free bytes until `nbytes` more fit under capacity.

        Gives back spare buffers of other sizes, then ready pages, then
        evicts. Returns an evicted buffer of exactly `nbytes` when one turns
        up, for the caller to reuse in place of a new allocation.
        """
        while self._held_bytes + nbytes > self.capacity and self._free_bytes:
            size, bufs = next(iter(self._free.items()))
            bufs.pop()
            if not bufs:
                del self._free[size]
            self._free_bytes -= size
            self._held_bytes -= size
        if self._held_bytes + nbytes > self.capacity and self._pages.ready_bytes:
            self._held_bytes -= self._pages.drop(self._held_bytes + nbytes - self.capacity)
        while self._held_bytes + nbytes > self.capacity and self._index:
            _, victim = self._index.popitem(last=False)
            self.stats.evictions += 1
            victim.linked = False
            self._live_bytes -= victim.nbytes
            if victim.pins:
                continue  # freed by its last reader
            if nbytes and victim.nbytes == nbytes:
                buf, victim.buf = victim.buf, None  # type: ignore[assignment]
                return buf, victim.addr
            victim.buf = None  # type: ignore[assignment]
            self._held_bytes -= victim.nbytes
        return None

    # ------------------------------------------------------- ready pages
    def set_prefault(self, nbytes: int) -> None:
        """Keep up to `nbytes` of pages faulted ahead of allocation, within
        capacity; 0 gives the ready pages back and stops the refiller."""
        with self._lock:
            self.prefault = nbytes
            if nbytes:
                self._wake_refiller_unsafe()
                return
            self._held_bytes -= self._pages.clear()
            refiller, self._refiller = self._refiller, None
        if refiller is not None:
            refiller.close()

    def _wake_refiller_unsafe(self) -> None:
        if self._refiller is None or not self._refiller.alive():
            if not supported():
                return
            self._refiller = Refiller(self, self.name)
        self._refiller.wake.set()

    def reserve_ready(self) -> int:
        """The size of the refiller's next chunk: 0 when enough is ready or
        being mapped in this process (every store's, process_total), or the
        store has no room for a chunk beside one more chunk of writes. A
        chunk counts as held only once delivered, so one being mapped never
        fails a write."""
        with self._lock:
            chunk = chunk_bytes_for(self.capacity, self.prefault)
            if not chunk or self._refill_paused or process_total.nbytes + chunk > self.prefault:
                return 0
            if self._held_bytes + 2 * chunk > self.capacity:
                return 0
            self._pages.mapping_bytes += chunk
            process_total.add(chunk)
            return chunk

    def deliver_ready(self, addr: int | None, nbytes: int) -> None:
        with self._lock:
            self._pages.mapping_bytes -= nbytes
            process_total.add(-nbytes)  # counted again below as ready, if kept
            if addr is None:
                return
            if self.prefault and not self._refill_paused and self._held_bytes + nbytes <= self.capacity:
                self._pages.add(addr, nbytes)
                self._held_bytes += nbytes
                return
        unmap(addr, nbytes)  # turned off, or the room taken by writes, while it was mapped
