"""Cross-process exclusion for the shared store, which opens LMDB without its
own lock file (MDB_NOLOCK).

Why not LMDB's lock file: it marks a live reader by an fcntl lock at byte
offset = pid, so two processes in different PID namespaces (two pods on one
node sharing DIR) that have the same pid number collide, and the second one's
reads fail with EAGAIN. The locks here are Linux open-file-description (OFD)
locks: they belong to an open file, not to a pid, so namespaces do not
matter, and the kernel drops them when their holder dies (a SIGKILLed reader
or writer never wedges anyone). Each thread has its own descriptor, so the
threads of one process exclude each other as processes do.

Without a reader table LMDB lets the writer of txn N+1 reuse the pages
freed by txns up to N-1 (live only in snapshots up to N-2), so no reader may
still hold such a snapshot. Byte offsets in the lock file:

    0     the writer mutex: one writer at a time, in any process.
    1     the commit gate: a writer holds it exclusively while it commits
          (writes its pages and the meta page); a reader holds it shared only
          while it picks its snapshot, so it never reads a half-written meta.
    2, 3  snapshot parity: a reader of snapshot t holds byte 2 + t % 2 shared
          for its whole read. The writer of txn N+1 first takes byte
          2 + (N+1) % 2 exclusively, which waits for readers of N-1 (one
          generation more than needed; N-2 and older are already gone, as
          the writer of N waited for them): new readers get snapshot N,
          the other byte, so a writer is never starved by a stream of readers
          and readers wait only for a commit, never for a whole write.
"""

import fcntl
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

_WRITER, _GATE, _PARITY = 0, 1, 2
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux; l_pid must be 0 for OFD locks

T = TypeVar("T")


class _Descriptor:
    """One thread's descriptor on the lock file, closed with the thread."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.fd)


class StoreLock:
    """The readers-writer protocol above, on the lock file at `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _fd(self) -> int:
        held = getattr(self._local, "descriptor", None)
        if held is None:
            held = self._local.descriptor = _Descriptor(self.path)
        return held.fd

    def _lock(self, fd: int, byte: int, kind: int) -> None:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0))

    def _unlock(self, fd: int, byte: int) -> None:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0))

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The writer mutex, for work that is not one transaction (opening)."""
        fd = self._fd()
        self._lock(fd, _WRITER, fcntl.F_WRLCK)
        try:
            yield
        finally:
            self._unlock(fd, _WRITER)

    def read(self, begin: Callable[[], T], snapshot_of: Callable[[T], int]) -> tuple[T, Callable[[], None]]:
        """Start a read with `begin()` at a snapshot no writer reuses pages
        of; returns it and the function that ends the protection (call it
        after the transaction ends)."""
        fd = self._fd()
        self._lock(fd, _GATE, fcntl.F_RDLCK)
        try:
            txn = begin()
            try:
                parity = _PARITY + snapshot_of(txn) % 2
                self._lock(fd, parity, fcntl.F_RDLCK)
            except BaseException:
                abort = getattr(txn, "abort", None)
                if abort is not None:
                    abort()
                raise
        finally:
            self._unlock(fd, _GATE)
        return txn, lambda: self._unlock(fd, parity)

    @contextmanager
    def write(
        self, next_txnid: Callable[[], int], mutex_held: bool = False
    ) -> Iterator[Callable[[Callable[[], None]], None]]:
        """Hold the writer mutex (unless `mutex_held`: taken by `writing()`)
        and the parity byte of the transaction about to be written
        (`next_txnid()`, read under the mutex); yields the function that runs
        a commit under the gate."""
        fd = self._fd()
        if not mutex_held:
            self._lock(fd, _WRITER, fcntl.F_WRLCK)
        try:
            parity = _PARITY + next_txnid() % 2
            self._lock(fd, parity, fcntl.F_WRLCK)
            try:

                def commit(do: Callable[[], None]) -> None:
                    self._lock(fd, _GATE, fcntl.F_WRLCK)
                    try:
                        do()
                    finally:
                        self._unlock(fd, _GATE)

                yield commit
            finally:
                self._unlock(fd, parity)
        finally:
            if not mutex_held:
                self._unlock(fd, _WRITER)
