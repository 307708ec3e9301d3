"""The half of the engine's Store that owns buffers: allocation under
capacity, recycling of freed buffers, and eviction to make room.

StoreBuffers is a base class of Store (store.py); its methods work on the
Store's index and byte counters and run under the Store's lock (hence
`_unsafe`). The memory rules they keep are in store.py's docstring.
"""

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

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
    """Buffer bookkeeping for Store: allocate under capacity, recycle, evict.

    Every attribute below is Store's, set in Store.__init__ and guarded by
    Store's lock, which every caller holds.
    """

    capacity: int
    stats: "StoreStats"
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
        reused = self._make_room_unsafe(nbytes)
        if reused is not None:
            return _Value(*reused, nbytes)
        if self._held_bytes + nbytes > self.capacity:
            return None
        self._held_bytes += nbytes
        self.stats.allocations += 1
        buf = np.empty(nbytes, dtype=np.uint8)
        return _Value(buf, buf.ctypes.data, nbytes)

    def _make_room_unsafe(self, nbytes: int) -> tuple[np.ndarray, int] | None:
        """Free bytes until `nbytes` more fit under capacity.

        Returns an evicted buffer of exactly `nbytes` when one turns up, for
        the caller to reuse in place of a new allocation.
        """
        while self._held_bytes + nbytes > self.capacity and self._free_bytes:
            size, bufs = next(iter(self._free.items()))
            bufs.pop()
            if not bufs:
                del self._free[size]
            self._free_bytes -= size
            self._held_bytes -= size
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
