"""The write-behind flusher: sends queued writes to EIC in rounds of batched
msets, one drain taking rounds at a time (a round past put_timeout_ms is
given up on, and a new drain may start while its calls still run), and
re-deletes keys whose write failed (table.py). Each entry leaves the table, and its region reference is
released, only once the call that carried it has returned, or was cancelled
before it started, so no SDK call ever touches a released region.

Two parts:
- a drain, a task on the link's data pool, takes a round and runs its first
  SDK call on its own thread; a big round's other calls run on other pool
  threads, and whichever call of the round ends last takes the next round on
  its thread. So a burst of puts costs no thread hand-off per round, which
  on a busy host is most of what a round costs the caller. Between rounds a
  drain gives its thread up to queued gets and probes (they run first).
- the put that queues work when no drain runs submits one to the pool
  itself (one thread woken, not the watcher and then a pool thread); the
  watcher thread
  (`aibrix_eic_flusher`) starts one for work a drain left (keys in flight),
  re-deletes lost keys, drops writes older than write_behind_max_age_ms, drops
  everything queued while the circuit is open, and gives up on a drain whose
  round outlived put_timeout_ms: that counts as a breaker failure, and a new
  drain carries on with the other keys (a key in flight is never sent again
  before its call returns, so per-key order holds). The pool replaces the
  thread stuck in that call; the old drain stops when the call returns.

The first write after an idle spell goes out at once; writes arriving while a
round is in flight wait for it and share the next one. That keeps a lone put
at one round trip and a burst of single-block puts at a few batched ones.
"""

import logging
import math
import threading
import time
from concurrent.futures import Future

from ..link.pool import PUT_PRIORITY
from ..link.resilience import Deadline
from ..link.runtime import Runtime
from ..util.teardown import OwnThread
from .rounds import Drain, RoundSender
from .table import Finished, PendingTable

logger = logging.getLogger(__name__)

TICK_S = 0.05  # how often the watcher looks at ages, lost keys and the drain


class Flusher:
    def __init__(self, table: PendingTable, rt: Runtime) -> None:
        self._table = table
        self._config = rt.config
        self._link = rt.link
        self._counters = rt.counters
        self._rate_log = rt.rate_log
        self._thread: threading.Thread | None = None
        self.running = False  # puts are accepted (read and written under the table lock)
        self._closing = False  # send what is queued, then stop
        self._closing_until = math.inf  # an abandoned flush drops what is still queued from then on
        self._generation = 0  # a watcher left over from before a reopen stops
        self._drain: Drain | None = None  # the one drain allowed to take rounds
        self._lost_retry_at = 0.0  # lost keys are re-deleted at most every TICK_S
        self._took_nothing_at = -1  # table.seq when a drain last found nothing it could send
        self._round_timeout_s = rt.config.put_timeout_ms / 1000
        self._rounds = RoundSender(table, rt, self._run_drain, self._drain_ended)

    @property
    def draining(self) -> bool:
        """A drain will see new work without being told (under the table lock)."""
        return self._drain is not None

    # ---------------------------------------------------------- lifecycle
    def start(self) -> None:
        with self._table.cond:
            if self.running:
                return
            self.running, self._closing, self._closing_until = True, False, math.inf
            self._drain = None
            self._generation += 1
            generation = self._generation
        self._thread = OwnThread(self._watch, "aibrix_eic_flusher", (generation,))
        self._thread.start()

    def close(self, timeout_s: float) -> int:
        """Flush what can be flushed within timeout_s, drop the rest (as
        misses) and release its references; returns how many were dropped.
        A reference held by an SDK call still running is released when that
        call returns."""
        table = self._table
        with table.cond:
            if not self.running:
                return 0
            self.running, self._closing = False, True
            table.wake_flusher.notify_all()
        deadline = Deadline(timeout_s)
        if self._thread is not None:
            self._thread.join(deadline.remaining())
        done = Finished()
        with table.cond:
            self._closing = False  # a watcher still running stops at its next look
            self._drain = None  # ...and so does a drain, after its round
            table.wake_flusher.notify_all()
            dropped = table.drop_all_queued("pending write dropped: the connector closed", done)
            while table.inflight and not deadline.expired():
                table.cond.wait(min(TICK_S, deadline.remaining()))
        done.settle()
        if dropped:
            self._counters.add(write_behind_lost=dropped)
            logger.warning("EIC close dropped %d pending writes it could not flush in time", dropped)
        return dropped

    def abandon(self, flush_s: float) -> None:
        """close() for a finalizer: attribute writes, no lock (the table lock
        is a plain Lock that the thread running the finalizer may hold) and no
        wait. Nothing is accepted from now on; the watcher and its drains go
        on sending what is queued for up to flush_s, as close() would, with
        nobody waiting. Then (or at once when EIC is down) the watcher drops
        what is left (misses) with its references and exits; calls in flight
        release their regions as they return."""
        self._closing_until = time.monotonic() + flush_s
        self._closing = flush_s > 0  # before running goes False: the watcher must not see a plain stop
        self.running = False

    def stopped(self) -> bool:
        """The watcher has exited and no call it started is still out (no lock)."""
        thread = self._thread
        return (thread is None or not thread.is_alive()) and not self._table.inflight

    def begin_exit(self) -> None:
        """At process exit, first (util/teardown.py's call_at_exit; registered
        on the flusher, which its watcher keeps alive after the connector is
        gone): a flusher still running (its connector never closed) starts
        flushing as an abandoned one does. Never waits, so every connector's
        flush runs side by side."""
        if not self.running:
            return
        with self._table.cond:
            pending = len(self._table.queued) + len(self._table.inflight)
        if pending:
            logger.info("EIC flushing %d pending writes at process exit", pending)
        self.abandon(self._config.write_behind_close_timeout_ms / 1000)

    def finish_exit(self) -> None:
        """At process exit, after every begin_exit: wait until the watcher is
        done, at most until its flush deadline."""
        until = self._closing_until
        if until == math.inf:
            return  # closed explicitly: close() did the waiting
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, until - time.monotonic()) + 2 * TICK_S)
        table = self._table
        with table.cond:  # the watcher stops once nothing is queued; the last round may still be out
            while table.inflight and time.monotonic() < until:
                table.cond.wait(min(TICK_S, max(0.0, until - time.monotonic())))

    # ------------------------------------------------------------ watcher
    def _watch(self, generation: int) -> None:
        table = self._table
        while True:
            done = Finished()
            start_drain: Drain | None = None
            overdue = False
            abandoned = 0
            with table.cond:
                if generation != self._generation:
                    return
                now = time.monotonic()
                lost = table.drop_aged(now, done)
                if now >= self._closing_until and not self.running:
                    self._closing = False  # an abandoned flush's time is up: drop what is left
                down = self._down()
                if down:
                    lost += table.drop_all_queued("pending write dropped: EIC circuit is open", done)
                started = self._drain.round_started if self._drain is not None else None
                # TICK_S of grace: a call retrying up to the round's deadline ends by itself
                if started is not None and now - started > self._round_timeout_s + TICK_S:
                    self._drain = None  # it stops after its round; a new drain carries on
                    overdue = True
                stop = self._should_stop(down)
                if stop:  # nothing is left queued, or running, once the watcher is gone (see abandon)
                    abandoned = table.drop_all_queued("pending write dropped: the connector closed", done)
                    lost += abandoned
                    self._drain = None
                else:
                    if self._drain is None and not down and self._has_sendable_work(now):
                        start_drain = self._drain = Drain()
                    else:
                        table.wake_flusher.wait(TICK_S)
            done.settle()
            if lost:
                self._counters.add(write_behind_lost=lost)
            if overdue:
                self._link.deadline_passed("put", self._config.put_timeout_ms, "write-behind flush")
            if stop:
                if abandoned:  # an explicit close() drops (and logs) under the lock itself
                    logger.warning("EIC connector closed without waiting: dropped %d pending writes", abandoned)
                return
            if start_drain is not None:
                self._submit_drain(start_drain)

    def _should_stop(self, down: bool) -> bool:
        """Whether the watcher ends now (under the table lock): the connector
        closed without waiting (abandon, or close's wait is over), or a
        closing flush cannot go on (EIC down) or has nothing left to send."""
        if self.running:
            return False
        return not self._closing or down or (not self._table.queued and self._drain is None)

    def _has_sendable_work(self, now: float) -> bool:
        """Whether a new drain would find something to send (under the table
        lock): queued writes, unless the last drain found every one waiting
        on a key in flight and nothing changed since (then once a tick), or
        lost keys to re-delete, at most once a tick."""
        table = self._table
        retry = now >= self._lost_retry_at
        if table.queued and (retry or table.seq != self._took_nothing_at):
            return True
        return bool(table.lost) and retry

    def claim_drain(self) -> Drain | None:
        """After a put queued work (under the table lock): the drain that put
        starts itself on the data pool (start_drain), or None when one runs
        (it takes the work with its next round) or the connector is closing.
        Starting it here, not from the watcher, saves a thread wake-up per
        burst of puts: on a loaded host each costs the caller its CPU."""
        if self._drain is not None or not self.running:
            return None
        self._drain = Drain()
        return self._drain

    def start_drain(self, drain: Drain) -> None:
        """Outside the table lock: run a drain claimed with claim_drain."""
        self._submit_drain(drain)

    def _down(self) -> bool:
        return self._link.usable("data", count=False) is None

    def _drain_ended(self, drain: Drain) -> None:
        with self._table.cond:
            if self._drain is drain:
                self._drain = None
            self._table.wake_flusher.notify_all()

    # -------------------------------------------------------------- drain
    def _run_drain(self, drain: Drain) -> None:
        """Take and send rounds until nothing is queued. Runs on a pool
        thread: as a task, or on the thread that finished a round's last call."""
        try:
            self._drain_rounds(drain, time.monotonic())
        except BaseException as e:  # a bug: the drain must not stay marked running, or nothing flushes again
            self._rate_log.log("wb-internal", logging.ERROR, "EIC write-behind drain failed internally: %r", e)
            self._drain_ended(drain)

    def _drain_rounds(self, drain: Drain, task_started: float) -> None:
        table = self._table
        while True:
            with table.cond:
                drain.round_started = None
                if self._drain is not drain or self._down():
                    if self._drain is drain:
                        self._drain = None
                        table.wake_flusher.notify_all()
                    return
                now = time.monotonic()
                with_deletes = now >= self._lost_retry_at
                writes, deletes = table.take_round(with_deletes)
                if deletes:
                    self._lost_retry_at = now + TICK_S
                if not writes and not deletes:
                    # What is left waits for a key's operation in flight: no new drain for it
                    # before something changes or a tick passes (the watcher's `wanted`).
                    self._lost_retry_at = max(self._lost_retry_at, now + TICK_S)
                    self._took_nothing_at = table.seq
                    self._drain = None
                    if not self.running or table.queued:  # a close waits for it; work left needs the watcher
                        table.wake_flusher.notify_all()
                    return
                drain.round_started = now
            if not self._rounds.send(drain, writes, deletes):
                return  # calls still running on other threads: the last to end carries on
            pool = self._link.data_pool
            # Let queued gets and probes run first; and hand the thread back well before the pool
            # would take a long stream of rounds for a call stuck past every deadline.
            if pool is not None and (
                pool.waiting_ahead_of(PUT_PRIORITY) or time.monotonic() - task_started > self._round_timeout_s / 4
            ):
                self._submit_drain(drain)
                return

    def _submit_drain(self, drain: Drain) -> None:
        pool = self._link.data_pool
        try:
            if pool is None:
                raise RuntimeError("no pool")
            future = pool.submit(self._run_drain, drain, priority=PUT_PRIORITY)
        except RuntimeError:  # closed under us
            self._drain_ended(drain)
            return

        def ended_if_cancelled(done: Future[None]) -> None:
            if done.cancelled():
                self._drain_ended(drain)

        future.add_done_callback(ended_if_cancelled)
