"""Same-run baselines for `aibrix-eic bench`, so that a figure can be judged
on the host that measured it:

- MOCK floor: the same requests through a second BaseKVCacheManager built the
  same way but with AIBrix's own in-memory MOCK L2 backend (mput/mget: a
  dict entry and one copy per block). Nothing of ours runs there, so it is
  what AIBrix's path costs with a backend that only copies.
- memcpy: each request's blocks copied with ctypes.memmove into pre-faulted
  memory, one thread: what one CPU moves on this host.

The bench runs one round of each right after each of its own requests, so
a burst of load on a shared host touches all three alike.
"""

import ctypes
import time

import torch


class MemcpyBaseline:
    """One request's blocks, copied block by block between two pre-faulted buffers."""

    def __init__(self, nblocks: int, block_nbytes: int) -> None:
        self.nblocks = nblocks
        self.block_nbytes = block_nbytes
        nbytes = nblocks * block_nbytes
        self._source = torch.empty(nbytes, dtype=torch.uint8)
        self._dest = torch.empty(nbytes, dtype=torch.uint8)
        # Touch every page now (and give the source distinct bytes), so a
        # round times the copy, not first-touch page faults.
        ctypes.memset(self._source.data_ptr(), 0x5A, nbytes)
        ctypes.memset(self._dest.data_ptr(), 0, nbytes)

    @property
    def nbytes(self) -> int:
        return self.nblocks * self.block_nbytes

    def run_round(self) -> float:
        """Seconds to copy the request's blocks once."""
        source, dest, size = self._source.data_ptr(), self._dest.data_ptr(), self.block_nbytes
        started = time.perf_counter()
        for offset in range(0, self.nbytes, size):
            ctypes.memmove(dest + offset, source + offset, size)
        return time.perf_counter() - started
