"""Pre-faulted pages for the in-process store's value buffers (`prefault=`).

The first write into fresh anonymous memory pays a page fault per 4 KiB
page: on the development VM a 1.5 MiB value copied into a fresh buffer cost
0.8 CPU-s/GiB, into faulted pages 0.1 (benchmarks/bench_prefault.py). So the
store keeps chunks of memory mapped and faulted ahead of its allocator
(ReadyPages); a put carves its buffer from them and pays only the copy. One
thread per store (Refiller) maps and faults the chunks at the lowest CPU
priority, so that on a busy host the model's threads go first.

Memory rules (the store's lock guards ReadyPages; the refiller maps outside it):
- a carved buffer is a page-aligned range of its own, unmapped when its last
  reference goes (as free() unmaps a large malloc'd block): a dropped value
  gives its memory back at once, and no range is handed out twice;
- pages kept ready count in the store's held_bytes, so the store never
  holds more than its capacity; it gives ready pages back before it
  evicts a value. A chunk being mapped counts only once delivered (it
  is unmapped then if writes took the room meanwhile): it never fails a
  write, and it is at most an eighth of the capacity;
- a carved buffer holds zeros (fresh pages); the put overwrites all of it
  before the value is published, as with np.empty.
"""

import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..util.rate_limited_log import RateLimitedLogger
from .endpoint import parse_prefault

log = RateLimitedLogger(logging.getLogger(__name__), interval_s=60.0)

PAGE = mmap.PAGESIZE
# Smaller values come from malloc: rounding them up to whole pages would
# waste up to a sixteenth of each (and malloc reuses its own pages for them).
MIN_POOLED = 64 * 1024
CHUNK_BYTES = 64 * 1024**2
# The default prefault of stores made without prefault= (a size or off):
# one setting for every process of a deployment or a test run.
PREFAULT_ENV = "AIBRIX_EIC_ENGINE_PREFAULT"
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels answer EINVAL
_MAP_FAILED = ctypes.c_void_p(-1).value
_NICEST = 19
_IDLE_WAKE_S = 1.0  # how often an idle refiller checks that its store still exists
_RETRY_AFTER_FAILURE_S = 10.0


def default_prefault(fallback: int) -> int:
    """PREFAULT_ENV's bytes when it is set, else `fallback`. Raises
    ValueError naming the variable on a value it cannot parse."""
    text = os.environ.get(PREFAULT_ENV)
    if text is None:
        return fallback
    try:
        return parse_prefault(text)
    except ValueError as e:
        raise ValueError(f"{PREFAULT_ENV}={text!r}: {e}") from None


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None  # per-thread nice and MADV_POPULATE_WRITE are Linux's
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_libc = _load_libc()


def supported() -> bool:
    """Whether this platform can keep pages ready (Linux)."""
    return _libc is not None


def map_faulted(nbytes: int) -> int | None:
    """A private anonymous mapping of `nbytes` with every page faulted in
    (written once), or None when the memory is not there. ctypes releases
    the GIL around each call."""
    assert _libc is not None
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    addr = _libc.mmap(None, nbytes, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == _MAP_FAILED:
        return None
    if _libc.madvise(addr, nbytes, _MADV_POPULATE_WRITE) != 0:
        if ctypes.get_errno() != errno.EINVAL:
            _libc.munmap(addr, nbytes)  # ENOMEM and the like: not there now
            return None
        ctypes.memset(addr, 0, nbytes)  # a kernel before 5.14: touch every page
    return addr


def unmap(addr: int, nbytes: int) -> None:
    if _libc is not None and nbytes:
        _libc.munmap(addr, nbytes)


class _Carved:
    """The pages under one value's buffer: numpy keeps it as the array's
    base, and the pages go back to the system with the last reference."""

    __slots__ = ("__array_interface__", "_addr", "_length")

    def __init__(self, addr: int, nbytes: int, length: int) -> None:
        self._addr = addr
        self._length = length
        self.__array_interface__ = {"data": (addr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}

    def __del__(self, unmap: Callable[[int, int], None] = unmap) -> None:
        unmap(self._addr, self._length)  # bound at definition: module globals may be gone at exit


class _ProcessTotal:
    """Ready and being-mapped bytes of every store in this process: a store
    refills only while the total is under its `prefault`, so a process
    that opens many stores (a benchmark, a test run) keeps one store's
    worth ready, not one per store. Stores' locks differ: its own guards it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nbytes = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.nbytes += nbytes


process_total = _ProcessTotal()


class _Chunk:
    __slots__ = ("next", "end")

    def __init__(self, addr: int, nbytes: int) -> None:
        self.next = addr  # where the next buffer is carved
        self.end = addr + nbytes


def chunk_bytes_for(capacity: int, ahead: int) -> int:
    """The size of the chunks a store of `capacity` keeps `ahead` bytes
    ready in: at most an eighth of the capacity, so that a chunk being
    mapped never crowds out the store's values; 0 when too small to carve
    one pooled value from."""
    nbytes = min(CHUNK_BYTES, ahead, capacity // 8) // PAGE * PAGE
    return nbytes if nbytes >= MIN_POOLED else 0


class ReadyPages:
    """Faulted chunks, carved front to back. Not thread-safe: the store's
    lock guards every call. Byte counts returned are for the store's
    held_bytes."""

    def __init__(self) -> None:
        self._chunks: deque[_Chunk] = deque()
        self.ready_bytes = 0  # mapped, faulted, not yet carved
        self.mapping_bytes = 0  # being mapped by the refiller, not yet held
        self.largest_chunk = 0

    def take(self, nbytes: int) -> tuple[np.ndarray, int] | None:
        """A buffer of `nbytes` carved from ready pages, and its address;
        None when the size is not pooled or nothing fits. What it uses up
        (the page rounding, and chunk tails too short to carve from, given
        back) leaves ready_bytes."""
        length = -(-nbytes // PAGE) * PAGE
        if nbytes < MIN_POOLED or 4 * length > self.largest_chunk:
            return None  # a value over a quarter chunk would waste too much tail
        while self._chunks:
            chunk = self._chunks[0]
            if chunk.end - chunk.next < length:
                self._give_back(self._chunks.popleft())
                continue
            addr = chunk.next
            chunk.next += length
            if chunk.next == chunk.end:
                self._chunks.popleft()
            self.ready_bytes -= length
            process_total.add(-length)
            return np.asarray(_Carved(addr, nbytes, length)), addr
        return None

    def add(self, addr: int, nbytes: int) -> None:
        self._chunks.append(_Chunk(addr, nbytes))
        self.ready_bytes += nbytes
        process_total.add(nbytes)
        self.largest_chunk = max(self.largest_chunk, nbytes)

    def drop(self, nbytes: int) -> int:
        """Give back ready pages, untouched chunks first, until `nbytes` are
        freed or none is left; the bytes freed."""
        freed = 0
        while self._chunks and freed < nbytes:
            freed += self._give_back(self._chunks.pop())
        return freed

    def clear(self) -> int:
        return self.drop(self.ready_bytes)

    def __del__(self) -> None:
        self.clear()  # a store dropped without close(): its pages and its share of process_total

    def _give_back(self, chunk: _Chunk) -> int:
        nbytes = chunk.end - chunk.next
        unmap(chunk.next, nbytes)
        self.ready_bytes -= nbytes
        process_total.add(-nbytes)
        return nbytes


class PageOwner(Protocol):
    def reserve_ready(self) -> int:
        """Bytes of a chunk to map now; 0 for none."""

    def deliver_ready(self, addr: int | None, nbytes: int) -> None:
        """The chunk reserved, mapped at addr (None: it could not be)."""


class Refiller:
    """The thread that keeps a store's pages ready: it asks the store for a
    chunk to map, maps and faults it with the GIL released, and hands it
    over. It holds the store weakly and ends when the store is gone or
    closed."""

    def __init__(self, owner: PageOwner, name: str) -> None:
        self._owner = weakref.ref(owner)
        self.wake = threading.Event()
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=f"aibrix_eic_prefault_{name}", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        # False in a forked child: the thread stayed in the parent.
        return self._thread.is_alive()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    def _run(self) -> None:
        _lower_priority()
        while not self.closed:
            wait_s = _IDLE_WAKE_S
            owner = self._owner()
            if owner is None:
                return
            nbytes = owner.reserve_ready()
            if nbytes:
                addr = map_faulted(nbytes)
                owner.deliver_ready(addr, nbytes)
                if addr is not None:
                    continue
                log.log(
                    "map",
                    logging.WARNING,
                    "engine store: could not map %d bytes of ready pages; retrying later",
                    nbytes,
                )
                wait_s = _RETRY_AFTER_FAILURE_S
            del owner
            self.wake.wait(wait_s)
            self.wake.clear()


def _lower_priority() -> None:
    """Nice 19 for the calling thread only (Linux's nice is per thread).
    Not SCHED_IDLE: a thread that may hold the GIL must not starve."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICEST)
    except OSError:
        pass
