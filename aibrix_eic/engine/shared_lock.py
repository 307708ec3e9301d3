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
    4     writers waiting: held shared by a writer while it waits for the
          mutex, so the one that just released it lets it go round.

No wait is unbounded: every lock is tried without blocking and tried again
after a short, growing pause until the caller's deadline (a monotonic time),
then LockTimeout. A process frozen while it holds a lock (SIGSTOP, a paused
container, a debugger) therefore costs the others failed calls, never a
hang. A writer that timed out waiting for the readers of one snapshot
remembers it, and later writes blocked by the same snapshot fail after one
try instead of waiting out their deadline again (`_stuck`).

Descriptors are checked and kept safe:
- each new one is fstat'ed against the lock file's (device, inode) recorded
  when the store was opened, so a lock file deleted or replaced behind the
  store's back never starts a second lock domain over one data.mdb;
- a forked child closes every inherited one (os.register_at_fork): a child
  shares its parent's open file descriptions, so it would otherwise keep the
  parent's locks held after the parent died;
- running out of descriptors (EMFILE) or any other OS failure is a
  StoreUnavailable naming the cause, never a bare OSError.
"""

import errno
import fcntl
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

from .errors import StoreUnavailable

_WRITER, _GATE, _PARITY, _WAITING = 0, 1, 2, 4
_WHAT = {_WRITER: "the writer lock", _GATE: "the commit gate", _PARITY: "readers of an older snapshot"}
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux; l_pid must be 0 for OFD locks
# Retry pauses: short first (a commit takes microseconds), growing to a
# bound that keeps a waiter's extra latency small when the lock frees.
_FIRST_PAUSE_S = 20e-6
_MAX_PAUSE_S = 5e-4

T = TypeVar("T")


class LockTimeout(StoreUnavailable):
    """A lock of the store was not free by the call's deadline: another
    process holds it (busy, or frozen). The call fails; the store serves on."""


class _Descriptor:
    """One thread's descriptor on the lock file, closed with the thread, or
    in a forked child (_close_inherited)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        _open_descriptors.add(self)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass  # closing never fails a call, nor prints from a finalizer

    def __del__(self) -> None:
        self.close()


_open_descriptors: "weakref.WeakSet[_Descriptor]" = weakref.WeakSet()


def _close_inherited() -> None:
    """In a forked child: close every lock descriptor of every store (those
    in other threads' locals included), so no lock the parent holds lives on
    in the child. The child's stores are reopened (shared_store.py)."""
    for descriptor in list(_open_descriptors):
        descriptor.close()


os.register_at_fork(after_in_child=_close_inherited)


def os_failure(path: str, e: OSError) -> StoreUnavailable:
    """An OS limit or failure met while using the store, as StoreUnavailable."""
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return StoreUnavailable(
            path,
            f"out of file descriptors ({e.strerror}): each thread that uses the store holds one",
            "raise the open-files limit (ulimit -n, LimitNOFILE=) or use fewer threads",
        )
    if e.errno == errno.ENOLCK:
        return StoreUnavailable(path, f"the kernel has no lock left ({e.strerror})", "raise the system's lock limit")
    return StoreUnavailable(path, f"{e.strerror or e}", "check the store's directory and this host's limits")


def replaced(path: str, cause: str) -> StoreUnavailable:
    return StoreUnavailable(
        path,
        f"{cause} while this process had the store open; its processes would no longer exclude each other",
        "restart the processes that use the store (it holds only cached KV); never delete store.lock by hand",
    )


class StoreLock:
    """The readers-writer protocol above, on the lock file at `path`, whose
    (device, inode) is `identity`."""

    def __init__(self, path: str, identity: tuple[int, int]) -> None:
        self.path = path
        self.identity = identity
        self._local = threading.local()
        self._stuck: tuple[int, int] | None = None  # (byte, txnid) a write timed out on
        self._released_at = 0.0  # when a writer of this process last let the mutex go

    def _fd(self) -> int:
        held = getattr(self._local, "descriptor", None)
        if held is None or held.fd < 0:
            held = self._local.descriptor = _Descriptor(self._open())
        return held.fd

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise replaced(self.path, "the lock file was deleted") from None
        except OSError as e:
            raise os_failure(self.path, e) from e
        try:
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise os_failure(self.path, e) from e
        if (st.st_dev, st.st_ino) != self.identity:
            os.close(fd)
            raise replaced(self.path, "the lock file was replaced by another file")
        return fd

    def _lock(self, fd: int, byte: int, kind: int, deadline: float) -> None:
        request = _FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0)
        pause = _FIRST_PAUSE_S
        while True:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
                return
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise os_failure(self.path, e) from e
            left = deadline - time.monotonic()
            if left <= 0:
                what = _WHAT[min(byte, _PARITY)]
                raise LockTimeout(
                    self.path,
                    f"{what} was held by another process past this call's deadline (busy, or frozen)",
                    "nothing to do if it passes; a process stopped for long (SIGSTOP, a paused container, "
                    "a debugger) holds the store until it resumes or is killed",
                )
            time.sleep(min(pause, left))
            pause = min(2 * pause, _MAX_PAUSE_S)

    def _unlock(self, fd: int, byte: int) -> None:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0))
        except OSError:
            pass  # the descriptor was closed (fork): the lock went with it

    @contextmanager
    def _held(self, byte: int, kind: int, deadline: float) -> Iterator[None]:
        fd = self._fd()
        self._lock(fd, byte, kind, deadline)
        try:
            yield
        finally:
            self._unlock(fd, byte)

    def writing(self, deadline: float) -> AbstractContextManager[None]:
        """The writer mutex, for work that is not one transaction (creating)."""
        return self._held(_WRITER, fcntl.F_WRLCK, deadline)

    def picking(self, deadline: float) -> AbstractContextManager[None]:
        """The commit gate, shared: no commit rewrites a meta page meanwhile."""
        return self._held(_GATE, fcntl.F_RDLCK, deadline)

    def read(
        self, begin: Callable[[], T], snapshot_of: Callable[[T], int], deadline: float
    ) -> tuple[T, Callable[[], None]]:
        """Start a read with `begin()` at a snapshot no writer reuses pages
        of; returns it and the function that ends the protection (call it
        after the transaction ends)."""
        fd = self._fd()
        self._lock(fd, _GATE, fcntl.F_RDLCK, deadline)
        try:
            txn = begin()
            try:
                parity = _PARITY + snapshot_of(txn) % 2
                # Free at once: the writer that takes this byte exclusively
                # (of txn snapshot + 2) cannot start before snapshot + 1
                # commits, which the gate held here keeps from happening.
                self._lock(fd, parity, fcntl.F_RDLCK, deadline)
            except BaseException:
                abort = getattr(txn, "abort", None)
                if abort is not None:
                    abort()
                raise
        finally:
            self._unlock(fd, _GATE)
        return txn, lambda: self._unlock(fd, parity)

    @contextmanager
    def write(self, next_txnid: Callable[[], int], deadline: float) -> Iterator[Callable[[Callable[[], None]], None]]:
        """Hold the writer mutex and the parity byte of the transaction
        about to be written (`next_txnid()`, read under the mutex); yields
        the function that runs a commit under the gate."""
        fd = self._fd()
        self._take_writer(fd, deadline)
        try:
            txnid = next_txnid()
            parity = _PARITY + txnid % 2
            self._lock(fd, parity, fcntl.F_WRLCK, self._parity_deadline(parity, txnid, deadline))
            self._stuck = None
            try:

                def commit(do: Callable[[], None]) -> None:
                    self._lock(fd, _GATE, fcntl.F_WRLCK, deadline)
                    try:
                        do()
                    finally:
                        self._unlock(fd, _GATE)

                yield commit
            finally:
                self._unlock(fd, parity)
        finally:
            self._unlock(fd, _WRITER)
            self._released_at = time.monotonic()

    def _take_writer(self, fd: int, deadline: float) -> None:
        """The writer mutex, taken in turn: polling has no queue, so a writer
        that just let it go and comes straight back would take it again
        before the others wake (8 writers: put p99 0.8 s, some past their
        deadline). A waiter holds byte _WAITING shared while it waits; a
        writer that released the mutex within the longest pause and sees a
        waiter lets that pause pass first."""
        if time.monotonic() - self._released_at < _MAX_PAUSE_S and self._others_waiting(fd):
            time.sleep(2 * _MAX_PAUSE_S)
        try:
            self._lock(fd, _WRITER, fcntl.F_WRLCK, 0.0)
            return
        except LockTimeout:
            pass
        self._lock(fd, _WAITING, fcntl.F_RDLCK, deadline)
        try:
            self._lock(fd, _WRITER, fcntl.F_WRLCK, deadline)
        finally:
            self._unlock(fd, _WAITING)

    def _others_waiting(self, fd: int) -> bool:
        request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, _WAITING, 1, 0)
        try:
            held = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, request)
        except OSError:
            return False
        return _FLOCK.unpack(held)[0] != fcntl.F_UNLCK

    def _parity_deadline(self, parity: int, txnid: int, deadline: float) -> float:
        """The readers this write waits for already made a write of this
        process time out: one try (fail fast), not another full wait."""
        if self._stuck == (parity, txnid):
            return 0.0
        self._stuck = (parity, txnid)  # cleared once the byte is taken
        return deadline
