"""The memory regions registered with EIC, and lookups of buffers in them.

The connector keeps its own copy so it can mark each buffer `registered`
correctly, refuse unregistered memory when registration is required, and
register everything again on a client made after a reconnect.
"""

import threading

from ..util import address_ranges as intervals


class RegisteredRegions:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: list[tuple[int, int]] = []  # (addr, nbytes), as given
        self._index: intervals.Index = intervals.EMPTY
        self.cuda_device: int | None = None

    def add(self, regions: list[tuple[int, int]], cuda_device: int | None) -> list[tuple[int, int]]:
        """Remember regions; returns the ones not remembered before."""
        with self._lock:
            known = set(self._regions)
            new = [region for region in regions if region not in known]
            self._regions.extend(new)
            self.cuda_device = cuda_device
            self._index = intervals.merge((addr, addr + nbytes) for addr, nbytes in self._regions)
            return new

    def all(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._regions)

    def clear(self) -> None:
        with self._lock:
            self._regions = []
            self._index = intervals.EMPTY
            self.cuda_device = None

    def __len__(self) -> int:
        return len(self._regions)

    def contains(self, addr: int, nbytes: int) -> bool:
        return intervals.covers(self._index, addr, nbytes)
