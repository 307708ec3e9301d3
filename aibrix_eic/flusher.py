"""The write-behind flusher: one thread that sends queued writes to EIC in
rounds of batched msets, at most one round in flight, and re-deletes keys
whose write failed (pending.py). A round's SDK calls run on the link's data
pool; each entry leaves the table, and its region reference is released,
only once the call that carried it has returned, or was cancelled before it
started, so no SDK call ever touches a released region.

The first write after an idle spell goes out at once; writes arriving while a
round is in flight wait for it and share the next one. That keeps a lone put
at one round trip and a burst of single-block puts at a few batched ones.
"""

import logging
import threading
import time
from concurrent.futures import Future, wait

from aibrix_kvcache.status import Status, StatusCodes

from .config import EICConfig
from .counters import Counters
from .dispatch import PUT, Chunk, Dispatcher
from .link import Link, Session
from .logs import RateLimitedLogger
from .pending import Entry, Finished, PendingTable
from .pool import PUT_PRIORITY
from .resilience import Deadline
from .sdk import HIT, MISS

logger = logging.getLogger(__name__)

TICK_S = 0.05  # how often an idle flusher looks at ages and lost keys


def settle(done: Finished) -> None:
    """Answer waiters, outside the table lock."""
    for ack in done.acks:
        ack.resolve()


def _buffers(writes: list[Entry]) -> list[tuple[int, int, bool]]:
    return [entry.buffer for entry in writes if entry.buffer is not None]  # a write always has one


class Flusher:
    def __init__(self, table: PendingTable, config: EICConfig, link: Link, dispatcher: Dispatcher,
                 counters: Counters, rate_log: RateLimitedLogger) -> None:  # fmt: skip
        self._table = table
        self._config = config
        self._link = link
        self._dispatcher = dispatcher
        self._counters = counters
        self._rate_log = rate_log
        self._thread: threading.Thread | None = None
        self.running = False  # puts are accepted (read and written under table.cond)
        self._closing = False  # send what is queued, then stop
        self._generation = 0  # a flusher left over from before a reopen stops
        self._lost_retry_at = 0.0  # lost keys are re-deleted at most every TICK_S

    # ---------------------------------------------------------- lifecycle
    def start(self) -> None:
        with self._table.cond:
            if self.running:
                return
            self.running, self._closing = True, False
            self._generation += 1
            generation = self._generation
        self._thread = threading.Thread(target=self._loop, args=(generation,), name="aibrix_eic_flusher", daemon=True)
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
            table.cond.notify_all()
        deadline = Deadline(timeout_s)
        if self._thread is not None:
            self._thread.join(deadline.remaining())
        done = Finished()
        with table.cond:
            self._closing = False  # a flusher still waiting on a hung call stops at its next look
            dropped = table.drop_all_queued("pending write dropped: the connector closed", done)
            while table.inflight and not deadline.expired():
                table.cond.wait(min(TICK_S, deadline.remaining()))
        settle(done)
        if dropped:
            self._counters.add(write_behind_lost=dropped)
            logger.warning("EIC close dropped %d pending writes it could not flush in time", dropped)
        return dropped

    def _loop(self, generation: int) -> None:
        table = self._table
        while generation == self._generation:
            done = Finished()
            writes: list[Entry] = []
            deletes: list[Entry] = []
            with table.cond:
                while True:
                    lost = table.drop_aged(time.monotonic(), done)
                    down = self._link.breaker.tripped or self._link.session is None or self._link.data_pool is None
                    if down:
                        lost += table.drop_all_queued("pending write dropped: EIC circuit is open", done)
                    if lost:
                        self._counters.add(write_behind_lost=lost)
                    stopping = not self.running and not (self._closing and table.queued and not down)
                    if stopping or generation != self._generation:
                        break
                    now = time.monotonic()
                    with_deletes = now >= self._lost_retry_at
                    writes, deletes = ([], []) if down else table.take_round(1 << 30, with_deletes)
                    if deletes:
                        self._lost_retry_at = now + TICK_S
                    if writes or deletes:
                        break
                    table.cond.wait(TICK_S)
            settle(done)
            if not writes and not deletes:
                return
            self._send_round(writes, deletes)

    def _send_round(self, writes: list[Entry], deletes: list[Entry]) -> None:
        session, pool = self._link.session, self._link.data_pool
        deadline = Deadline(self._config.put_timeout_ms / 1000)
        futures: list[Future] = []
        groups: list[list[Entry]] = []
        if writes:
            mark = session is not None and session.registration_ok and self._config.put_registered
            buffers = [(addr, nbytes, registered and mark) for addr, nbytes, registered in _buffers(writes)]
            chunks = self._dispatcher.chunks([e.key for e in writes], buffers, ())
            start = 0
            for chunk in chunks:
                groups.append(writes[start : start + len(chunk.keys)])
                start += len(chunk.keys)
            for chunk, group in zip(chunks, groups):
                futures.append(self._submit(pool, self._flush_chunk, session, chunk, group, deadline))
            self._counters.add(write_behind_flushes=1)
        for start in range(0, len(deletes), self._config.batch_keys):
            group = deletes[start : start + self._config.batch_keys]
            futures.append(self._submit(pool, self._delete_lost, session, None, group, deadline))
        while futures and not deadline.expired():  # at most one round in flight
            futures = list(wait(futures, timeout=min(TICK_S, deadline.remaining()))[1])
            done = Finished()
            with self._table.cond:
                lost = self._table.drop_aged(time.monotonic(), done)
            settle(done)
            if lost:
                self._counters.add(write_behind_lost=lost)
        if futures:  # entries stay in flight (and held) until their calls return
            self._counters.add(timeouts=1)
            self._link.breaker.record_failure(f"put exceeded put_timeout_ms={self._config.put_timeout_ms:g}")
            self._rate_log.log("wb-timeout", logging.WARNING, "EIC write-behind flush exceeded put_timeout_ms")

    def _submit(self, pool, fn, session, chunk, group: list[Entry], deadline: Deadline) -> Future:
        try:
            if session is None or pool is None:
                raise RuntimeError("no session")
            future = pool.submit(fn, session, chunk, group, deadline, priority=PUT_PRIORITY)
        except RuntimeError:  # closed under us: nothing was sent
            self._end(group, [False] * len(group), "not sent: the connector closed")
            future = Future()
            future.set_result(None)
            return future

        def end_if_cancelled(done: Future) -> None:  # it never ran: nothing can touch its regions
            if done.cancelled():
                self._end(group, [False] * len(group), "cancelled")

        future.add_done_callback(end_if_cancelled)
        return future

    def _flush_chunk(self, session: Session, chunk: Chunk, group: list[Entry], deadline: Deadline) -> None:
        try:
            self._store(session, chunk, group, deadline)
        except BaseException as e:  # a bug here must still end every entry (and release it)
            self._rate_log.log("wb-internal", logging.ERROR, "EIC write-behind flush failed internally: %r", e)
            self._end(group, [False] * len(group), f"internal error {e!r}")

    def _store(self, session: Session, chunk: Chunk, group: list[Entry], deadline: Deadline) -> None:
        self._dispatcher.run_here(PUT, session.client, chunk, deadline)
        outcomes = chunk.outcomes or []
        settled = [outcome == HIT for outcome in outcomes]
        failed = [i for i, ok in enumerate(settled) if not ok]
        if failed:  # accepted early, so nobody hears of it: a lost block (a later miss)
            self._counters.add(put_failures=len(failed), write_behind_lost=sum(1 for i in failed if group[i].counted))
            if not self._link.breaker.tripped:  # clear the key: an older value must not be served
                result = session.client.mdel([chunk.keys[i] for i in failed])
                self._link.observe(result)
                for j, i in enumerate(failed):
                    settled[i] = result.outcomes[j] in (HIT, MISS)
        self._end(group, settled, f"not stored: {chunk.detail}", stored=[o == HIT for o in outcomes])

    def _delete_lost(self, session: Session, _chunk, group: list[Entry], _deadline: Deadline) -> None:
        settled = [False] * len(group)
        try:
            result = session.client.mdel([entry.key for entry in group])
            self._link.observe(result)
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
        settle(done)
