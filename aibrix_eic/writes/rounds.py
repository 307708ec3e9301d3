"""One flush round of the write-behind flusher: its SDK calls (msets of
queued writes, mdels of lost keys), the first on the drain's own thread and
the others on the data pool, each through the link's one call path
(`Link.send` and `Link.call`, link/calls.py: retries, metrics, breaker). The entries a call carried leave the table,
and their regions are released, only once it returned (or was cancelled
before it started); whichever call of the round ends last takes the drain's
next round on its thread (flusher.py says why).
"""

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from aibrix_kvcache.status import Status, StatusCodes

from ..link.calls import PUT
from ..link.link import Session
from ..link.pool import PUT_PRIORITY, PriorityThreadPool
from ..link.resilience import Deadline
from ..link.runtime import Runtime
from ..link.sdk import HIT, MISS, SdkBuffer
from .table import Entry, Finished, PendingTable

SendCall = Callable[[Session, list[Entry], list[SdkBuffer], Deadline], None]


@dataclass(frozen=True)
class RoundCall:
    """One SDK call of a round: an mset of a group of writes and their
    buffers, or an mdel of a group of lost keys (no buffers)."""

    send: SendCall
    group: list[Entry]
    buffers: list[SdkBuffer]


class Drain:
    """One drain of the flusher, a task taking rounds one after another;
    `round_started` is when its current round began (None
    between rounds), read by the watcher under the table lock."""

    __slots__ = ("round_started",)

    def __init__(self) -> None:
        self.round_started: float | None = None


class _Countdown:
    """Calls of a round still running (under the table lock)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def _buffers(writes: list[Entry]) -> list[SdkBuffer]:
    return [entry.buffer for entry in writes if entry.buffer is not None]  # a write always has one


class RoundSender:
    """Sends the rounds of one flusher. `next_round(drain)` runs on the
    thread of a round's last call; `drain_ended(drain)` when the pool
    cancelled that call (shutting down: no next round)."""

    def __init__(
        self,
        table: PendingTable,
        rt: Runtime,
        next_round: Callable[[Drain], None],
        drain_ended: Callable[[Drain], None],
    ) -> None:
        self._table = table
        self._config = rt.config
        self._link = rt.link
        self._counters = rt.counters
        self._rate_log = rt.rate_log
        self._next_round = next_round
        self._drain_ended = drain_ended
        self._round_timeout_s = rt.config.put_timeout_ms / 1000

    def send(self, drain: Drain, writes: list[Entry], deletes: list[Entry]) -> bool:
        """Start one round: its first SDK call here, the others on the pool.
        True when the whole round has ended on return."""
        session, pool = self._link.session, self._link.data_pool
        deadline = Deadline(self._round_timeout_s)
        calls: list[RoundCall] = []
        if writes:
            mark = session is not None and session.registration_ok and self._config.put_registered
            buffers = [(addr, nbytes, registered and mark) for addr, nbytes, registered in _buffers(writes)]
            step = self._link.keys_per_call(buffers[0][1])
            for start in range(0, len(writes), step):
                calls.append(RoundCall(self._flush, writes[start : start + step], buffers[start : start + step]))
            self._counters.add(write_behind_flushes=1)
        for start in range(0, len(deletes), self._config.batch_keys):
            calls.append(RoundCall(self._delete_lost, deletes[start : start + self._config.batch_keys], []))
        if session is None or pool is None:
            for call in calls:
                self._end(call.group, [False] * len(call.group), "not sent: the connector closed")
            return True
        countdown = _Countdown(len(calls))
        for call in calls[1:]:
            self._submit(pool, drain, countdown, call, session, deadline)
        self._run_call(calls[0], session, deadline)
        return self._call_ended(countdown)

    def _submit(
        self,
        pool: PriorityThreadPool,
        drain: Drain,
        countdown: "_Countdown",
        call: RoundCall,
        session: Session,
        deadline: Deadline,
    ) -> None:
        try:
            future = pool.submit(self._pool_call, drain, countdown, call, session, deadline, priority=PUT_PRIORITY)
        except RuntimeError:  # closed under us: nothing was sent
            self._end(call.group, [False] * len(call.group), "not sent: the connector closed")
            self._call_ended(countdown)
            return

        def end_if_cancelled(done: Future[None]) -> None:  # it never ran: nothing can touch its regions
            if done.cancelled():
                self._end(call.group, [False] * len(call.group), "cancelled")
                if self._call_ended(countdown):
                    self._drain_ended(drain)  # the pool is shutting down: no next round

        future.add_done_callback(end_if_cancelled)

    def _pool_call(
        self, drain: Drain, countdown: "_Countdown", call: RoundCall, session: Session, deadline: Deadline
    ) -> None:
        self._run_call(call, session, deadline)
        if self._call_ended(countdown):
            self._next_round(drain)  # the round's last call: take the next round on this thread

    def _run_call(self, call: RoundCall, session: Session, deadline: Deadline) -> None:
        try:
            call.send(session, call.group, call.buffers, deadline)
        except BaseException as e:  # the call's own guards ended its entries
            self._rate_log.log("wb-internal", logging.ERROR, "EIC write-behind call failed internally: %r", e)

    def _call_ended(self, countdown: "_Countdown") -> bool:
        """One call of a round ended; True for the last."""
        with self._table.cond:
            countdown.left -= 1
            return countdown.left == 0

    def _flush(self, session: Session, group: list[Entry], buffers: list[SdkBuffer], deadline: Deadline) -> None:
        try:
            self._store(session, group, buffers, deadline)
        except BaseException as e:  # a bug here must still end every entry (and release it)
            self._rate_log.log("wb-internal", logging.ERROR, "EIC write-behind flush failed internally: %r", e)
            self._end(group, [False] * len(group), f"internal error {e!r}")

    def _store(self, session: Session, group: list[Entry], buffers: list[SdkBuffer], deadline: Deadline) -> None:
        keys = [entry.key for entry in group]
        result = self._link.send(PUT, session.client, keys, buffers, deadline)
        outcomes = result.outcomes
        settled = [outcome == HIT for outcome in outcomes]
        failed = [i for i, ok in enumerate(settled) if not ok]
        if failed:  # accepted early, so nobody hears of it: a lost block (a later miss)
            self._counters.add(put_failures=len(failed), write_behind_lost=sum(1 for i in failed if group[i].counted))
            if not self._link.breaker.tripped:  # clear the key: an older value must not be served
                result = self._link.call("delete", session.client.mdel, [keys[i] for i in failed])
                for j, i in enumerate(failed):
                    settled[i] = result.outcomes[j] in (HIT, MISS)
        self._end(group, settled, f"not stored: {result.detail}", stored=[o == HIT for o in outcomes])

    def _delete_lost(
        self, session: Session, group: list[Entry], _buffers: list[SdkBuffer], _deadline: Deadline
    ) -> None:
        settled = [False] * len(group)
        try:
            result = self._link.call("delete", session.client.mdel, [entry.key for entry in group])
            settled = [outcome in (HIT, MISS) for outcome in result.outcomes]
        finally:
            self._end(group, settled, "")

    def _end(self, group: list[Entry], settled: list[bool], why: str, stored: list[bool] | None = None) -> None:
        """Entries whose SDK call returned (or never ran) leave the table;
        their regions are released only now."""
        done = Finished()
        failure = Status(StatusCodes.ERROR, why)
        with self._table.cond:
            for i, entry in enumerate(group):
                ok = i < len(settled) and settled[i]
                self._table.finish(entry, ok, None if stored is not None and stored[i] else failure, done)
        done.settle()
