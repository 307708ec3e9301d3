"""An allocator watch for tests: every region AIBrix frees is filled with a
sentinel, and checked when the memory is handed out again (and at the end),
so any byte written into released memory is caught."""

import threading

import torch

SENTINEL = 0xA5


class PoisonWatch:
    def __init__(self, allocator) -> None:
        self._allocator = allocator
        self._lock = threading.Lock()
        self._poisoned: list[tuple[torch.Tensor, int, int]] = []  # (slab, start, end) of freed bytes
        self.violations: list[str] = []
        self.frees = 0
        self._finalize = allocator._finalize_mr
        self._alloc = allocator.alloc
        allocator._finalize_mr = self._on_free
        allocator.alloc = self._on_alloc

    def _on_free(self, mr) -> None:
        if mr.capacity > 0:
            start, end = mr.addr, mr.addr + mr.capacity
            mr.slab[start:end].fill_(SENTINEL)
            with self._lock:
                self._poisoned.append((mr.slab, start, end))
                self.frees += 1
        self._finalize(mr)

    def _on_alloc(self, sizes):
        status = self._alloc(sizes)
        if status.is_ok():
            for mr in status.get():
                self._claim(mr.slab, mr.addr, mr.addr + mr.capacity)
        return status

    def _claim(self, slab: torch.Tensor, start: int, end: int) -> None:
        """The range is in use again: check it, then stop watching it."""
        with self._lock:
            kept = []
            for pslab, pstart, pend in self._poisoned:
                if pslab.data_ptr() != slab.data_ptr() or pend <= start or pstart >= end:
                    kept.append((pslab, pstart, pend))
                    continue
                lo, hi = max(pstart, start), min(pend, end)
                self._check(pslab, lo, hi)
                if pstart < lo:
                    kept.append((pslab, pstart, lo))
                if hi < pend:
                    kept.append((pslab, hi, pend))
            self._poisoned = kept

    def _check(self, slab: torch.Tensor, lo: int, hi: int) -> None:
        written = int((slab[lo:hi] != SENTINEL).sum())
        if written:
            self.violations.append(f"{written} bytes written into released memory at slab offset {lo}..{hi}")

    def check_all(self) -> list[str]:
        with self._lock:
            for slab, start, end in self._poisoned:
                self._check(slab, start, end)
        return self.violations
