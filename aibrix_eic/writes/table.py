"""The write-behind table: writes the connector accepted that EIC has not
confirmed yet, and the keys whose last write may have been lost.

Bookkeeping under one lock (shared by `cond` and `wake_flusher`); no SDK
calls. A region reference taken by the caller (request/checks.py's hold) is
dropped here when its entry leaves the table; callers answer the waiters
(`Finished.acks`) after letting go of the lock.

Per key there is at most one queued write (the newest accepted version) and
at most one operation in flight (a write, or a delete). The flusher never
sends a key that has an operation in flight, so writes and deletes of one
key reach EIC in the order they were accepted.

`lost` maps a key to the sequence number of the write or delete that left
its EIC value unknown (a flush that failed, a delete that did not finish).
Reads answer NOT_FOUND for it until a later write stores it or a delete
clears it: an older value of the key must never be served in place of an
accepted write that failed.

`outlived` counts, per key, direct writes (put_mode direct) whose caller got
TIMEOUT while their SDK call still runs. Such a key is lost, and its clearing
mdel waits until all of them returned, so a late write cannot land over a
newer one or over the mdel.
"""

import asyncio
import enum
import threading
from collections.abc import Sequence
from typing import Final, Literal

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from ..link.sdk import SdkBuffer
from ..request.checks import release

WRITE, DELETE = 0, 1


class _Lost(enum.Enum):
    LOST = "lost"


LOST: Final = _Lost.LOST  # what lookup() returns for a key that must read as a miss


class Ack:
    """Answers one asyncio waiter once `remaining` entries have finished:
    the waiting put of a request, or a delete waiting on a write in flight."""

    __slots__ = ("remaining", "failure", "future", "loop")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.remaining = count
        self.failure: Status | None = None
        self.loop = loop
        self.future: asyncio.Future[Status] = loop.create_future()

    def finished_one(self, failure: Status | None) -> bool:
        """Count one entry down (under the table lock); True when all are."""
        if failure is not None and self.failure is None:
            self.failure = failure
        self.remaining -= 1
        return self.remaining == 0

    def resolve(self) -> None:
        """Set the waiter's result from any thread (outside the table lock)."""
        result = self.failure or Status.ok()
        try:
            self.loop.call_soon_threadsafe(_set_result, self.future, result)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more


def _set_result(future: asyncio.Future[Status], result: Status) -> None:
    if not future.done():
        future.set_result(result)


class Entry:
    """One accepted write (holding one reference on `mr`), or a delete."""

    __slots__ = ("key", "kind", "mr", "buffer", "seq", "accepted_at", "counted", "acks")

    def __init__(
        self,
        key: str,
        kind: int,
        seq: int,
        mr: MemoryRegion | None = None,
        buffer: SdkBuffer | None = None,
        accepted_at: float = 0.0,
        counted: bool = False,
    ) -> None:
        self.key = key
        self.kind = kind
        self.seq = seq
        self.mr: MemoryRegion | None = mr
        self.buffer: SdkBuffer | None = buffer  # (addr, nbytes, registered)
        self.accepted_at = accepted_at
        self.counted = counted  # its bytes count against write_behind_max_bytes
        self.acks: list[Ack] | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer[1] if self.buffer is not None else 0


class Finished:
    """Entries leaving the table: their references are dropped at once, under
    the table lock, so an empty table means every reference is gone; their
    waiters are answered by the caller after letting go of the lock."""

    __slots__ = ("acks",)

    def __init__(self) -> None:
        self.acks: list[Ack] = []

    def add(self, entry: Entry, failure: Status | None) -> None:
        if entry.mr is not None:
            release([entry.mr])
            entry.mr = None
        for ack in entry.acks or ():
            if ack.finished_one(failure):
                self.acks.append(ack)
        entry.acks = None

    def settle(self) -> None:
        """Answer the waiters; outside the table lock."""
        for ack in self.acks:
            ack.resolve()


SUPERSEDED = None  # an overwritten or deleted write counts as done: a later one replaced it


class PendingTable:
    def __init__(self, max_bytes: int, max_age_s: float) -> None:
        lock = threading.Lock()
        self.cond = threading.Condition(lock)  # entries finished, or dropped: for waiters on the table
        self.wake_flusher = threading.Condition(lock)  # work arrived, or a drain ended: for the flusher alone
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.queued: dict[str, Entry] = {}  # oldest first
        self.inflight: dict[str, Entry] = {}
        self.lost: dict[str, int] = {}
        self.outlived: dict[str, int] = {}  # key -> direct writes still in the SDK after their caller's deadline
        self.deleting: dict[str, int] = {}  # key -> user deletes running: they clear the key, not the flusher
        self.counted_bytes = 0  # accepted without a waiting caller
        self.held_bytes = 0  # every region reference the table holds
        self._seq = 0

    # ------------------------------------------------------------ queries
    def fits(self, nbytes: int, limit: int) -> bool:
        return self.counted_bytes + nbytes <= limit

    def lookup(self, key: str) -> "Entry | Literal[_Lost.LOST] | None":
        """The newest write of key (an Entry), LOST, or None (ask EIC). A
        write in flight that a later loss overtook (a newer write dropped,
        a delete that timed out) is not served: it is not the newest."""
        entry = self.queued.get(key) or self.inflight.get(key)
        if entry is not None:
            return entry if entry.kind == WRITE and entry.seq > self.lost.get(key, -1) else LOST
        return LOST if key in self.lost else None

    # ------------------------------------------------------------ changes
    @property
    def seq(self) -> int:
        """The last sequence number handed out: it moves on every change a
        round could take (a write queued, a key lost)."""
        return self._seq

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def add(
        self,
        keys: Sequence[str],
        buffers: Sequence[SdkBuffer],
        mrs: Sequence[MemoryRegion],
        now: float,
        counted: bool,
        ack: Ack | None,
        done: Finished,
    ) -> None:
        """Queue one write per key (their references already taken)."""
        for key, buffer, mr in zip(keys, buffers, mrs):
            old = self.queued.pop(key, None)
            if old is not None:
                self._forget(old)
                done.add(old, SUPERSEDED)
            entry = Entry(key, WRITE, self.next_seq(), mr, buffer, now, counted)
            if ack is not None:
                entry.acks = [ack]
            self.queued[key] = entry
            self.held_bytes += entry.nbytes
            if counted:
                self.counted_bytes += entry.nbytes

    def take_round(self, with_deletes: bool = True) -> tuple[list[Entry], list[Entry]]:
        """Move sendable writes in flight, and claim the lost keys nothing
        else is about to change for a delete. (writes, deletes)."""
        writes = [entry for key, entry in self.queued.items() if key not in self.inflight]
        for entry in writes:
            del self.queued[entry.key]
            self.inflight[entry.key] = entry
        deletes: list[Entry] = []
        for key, seq in self.lost.items() if with_deletes else ():
            if (
                key not in self.inflight
                and key not in self.queued
                and key not in self.outlived
                and key not in self.deleting
            ):
                deletes.append(Entry(key, DELETE, seq))
        for entry in deletes:
            self.inflight[entry.key] = entry
        return writes, deletes

    def claim_delete(self, key: str) -> Entry:
        """A user delete in flight for key (nothing else is)."""
        entry = Entry(key, DELETE, self.next_seq())
        self.inflight[key] = entry
        return entry

    def drop_queued(self, key: str, done: Finished) -> bool:
        entry = self.queued.pop(key, None)
        if entry is None:
            return False
        self._forget(entry)
        done.add(entry, SUPERSEDED)
        return True

    def finish(self, entry: Entry, known_absent_or_stored: bool, failure: Status | None, done: Finished) -> None:
        """An operation in flight has ended. `known_absent_or_stored`: EIC
        now holds this write (or, for a delete, nothing), so an older loss
        no longer matters; otherwise the key reads as a miss until cleared."""
        if self.inflight.get(entry.key) is entry:
            del self.inflight[entry.key]
        self._forget(entry)
        if known_absent_or_stored:
            if self.lost.get(entry.key, -1) <= entry.seq:
                self.lost.pop(entry.key, None)
        else:
            self.mark_lost(entry.key, entry.seq)
        done.add(entry, failure)
        self.cond.notify_all()

    def delete_started(self, key: str) -> None:
        """A user delete of key runs: the key reads as a miss from now on,
        until that delete's mdel (or a newer write) clears it."""
        self.deleting[key] = self.deleting.get(key, 0) + 1
        self.mark_lost(key, self.next_seq())

    def delete_ended(self, key: str) -> None:
        left = self.deleting.get(key, 1) - 1
        if left > 0:
            self.deleting[key] = left
        else:
            self.deleting.pop(key, None)

    def outlive(self, keys: Sequence[str]) -> None:
        """Direct writes whose caller's deadline passed while their SDK call
        runs: the keys read as misses, and are not cleared before every such
        call returned (a late write would land over the mdel)."""
        for key in keys:
            self.outlived[key] = self.outlived.get(key, 0) + 1
            self.mark_lost(key, self.next_seq())

    def returned(self, keys: Sequence[str]) -> None:
        """Outlived direct writes of keys have returned: the flusher may clear them."""
        for key in keys:
            left = self.outlived.get(key, 1) - 1
            if left > 0:
                self.outlived[key] = left
            else:
                self.outlived.pop(key, None)
        self.wake_flusher.notify()

    def mark_lost(self, key: str, seq: int) -> None:
        if self.lost.get(key, -1) < seq:
            self.lost[key] = seq

    def drop_aged(self, now: float, done: Finished) -> int:
        """Queued writes older than max_age_s become misses."""
        aged = []
        for entry in self.queued.values():  # oldest first
            if now - entry.accepted_at <= self.max_age_s:
                break
            aged.append(entry)
        return self._drop(aged, "pending write dropped: older than write_behind_max_age_ms", done)

    def drop_all_queued(self, why: str, done: Finished) -> int:
        return self._drop(list(self.queued.values()), why, done)

    def _drop(self, entries: list[Entry], why: str, done: Finished) -> int:
        if not entries:
            return 0
        failure = Status(StatusCodes.ERROR, why)
        for entry in entries:
            del self.queued[entry.key]
            self._forget(entry)
            self.mark_lost(entry.key, entry.seq)
            done.add(entry, failure)
        self.cond.notify_all()
        return len(entries)

    def _forget(self, entry: Entry) -> None:
        if entry.mr is not None:  # not yet forgotten
            self.held_bytes -= entry.nbytes
            if entry.counted:
                self.counted_bytes -= entry.nbytes
