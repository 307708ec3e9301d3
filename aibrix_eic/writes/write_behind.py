"""Write-behind and put coalescing: puts join a queue (table.py) that the
flusher sends to EIC as batched msets, in drains on the data pool: the put
that queues work when no drain runs starts one itself, the watcher thread
only those for work a drain left (flusher.py; docs/write-behind.md says why
and how).

- `put_mode: write_behind`: a put takes its own reference on every region
  (request/checks.py's hold), queues the blocks and returns OK at once; the
  reference is dropped only once no SDK call can touch the region.
- `put_mode: coalesce`, and any put that would take the pending bytes past
  `write_behind_max_bytes`: the put queues the same way but waits until its
  blocks are stored and returns the real outcome. Puts that arrive while a
  flush is in flight share the next mset.

Reads see accepted writes (served from the held region); a write whose
flush failed reads as a miss until EIC is known not to hold an older value
(table.py). Deletes wait for a write of the key in flight, then run.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from ..link.calls import DELETE as DELETE_OP
from ..link.link import Session
from ..link.resilience import Deadline
from ..link.runtime import Runtime
from ..link.sdk import SdkBuffer
from ..request.checks import hold, release
from ..request.dispatch import Dispatcher
from ..request.statuses import NOT_FOUND, OK, close_after, key_statuses
from ..util.device_memory import copy_region
from .flusher import Flusher
from .table import LOST, Ack, Finished, PendingTable

# The rest of an mget over the table: EIC's answer for the keys no pending
# write answers, and the token check of the token-validation layout.
FromEic = Callable[[Sequence[bytes], Sequence[MemoryRegion]], Awaitable[Sequence[Status] | Status]]
RestoreTokens = Callable[[Sequence[bytes], Sequence[MemoryRegion], list[Status], int], int]

# Pending writes hold regions of AIBrix's allocator; past this share of the
# memory registered with us (the allocator's slabs) puts wait instead, so
# allocate_for keeps finding memory when the allocator is small (L1 off).
SLAB_SHARE = 4
_CLOSED = Status(StatusCodes.ERROR, "put skipped: the EIC connector is closing")


class WriteBehind:
    def __init__(self, rt: Runtime, dispatcher: Dispatcher) -> None:
        config = self._config = rt.config
        self._link = rt.link
        self._dispatcher = dispatcher
        self._counters = rt.counters
        self.enabled = config.put_mode != "direct"
        self._accept_early = config.put_mode == "write_behind"
        self.table = PendingTable(config.write_behind_max_bytes, config.write_behind_max_age_ms / 1000)
        self._flusher = Flusher(self.table, rt)
        self._limit_for: tuple[int, int] = (-1, config.write_behind_max_bytes)  # (regions seen, limit)

    # ---------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._flusher.start()  # put_mode direct too: it clears the keys of writes that outlived their deadline

    def close(self, timeout_s: float) -> int:
        """Flush within timeout_s, drop (as misses) what is left; see Flusher.close."""
        return self._flusher.close(timeout_s)

    def outlived(self, eic_keys: list[str], call: Future[None]) -> None:
        """A direct write still in the SDK after its caller got TIMEOUT: its
        keys read as misses until the call returned and an mdel cleared them,
        so the late value never shows over a newer one (table.py)."""
        table = self.table
        with table.cond:
            table.outlive(eic_keys)

        def returned(_call: Future[None]) -> None:
            with table.cond:
                table.returned(eic_keys)

        call.add_done_callback(returned)

    def abandon(self) -> None:
        """close() for a finalizer: never blocks; what is queued is still sent
        within write_behind_close_timeout_ms (Flusher.abandon)."""
        self._flusher.abandon(self._config.write_behind_close_timeout_ms / 1000)  # it runs in every put_mode

    def stopped(self) -> bool:
        """Nothing queued is sent any more (the link may retire its pools)."""
        return self._flusher.stopped()

    @property
    def exit_hooks(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """What util/teardown.py's call_at_exit runs: Flusher.begin_exit, then Flusher.finish_exit."""
        return self._flusher.begin_exit, self._flusher.finish_exit

    @property
    def active(self) -> bool:
        """Whether reads must consult the table (cheap; no lock)."""
        table = self.table
        return bool(table.queued or table.inflight or table.lost)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no accepted write is queued or in flight (for tools,
        tests and benchmarks); False on timeout."""
        table = self.table
        deadline = Deadline(timeout_s)
        with table.cond:
            while table.queued or table.inflight:
                if deadline.expired():
                    return False
                table.cond.wait(min(0.05, deadline.remaining()))
        return True

    def pending_bytes(self) -> int:
        """Bytes of the regions pending writes hold (no lock: a sample)."""
        return self.table.held_bytes

    def snapshot(self) -> dict[str, int]:
        table = self.table
        with table.cond:
            return {
                "write_behind_pending": len(table.queued) + len(table.inflight),
                "write_behind_pending_bytes": table.held_bytes,
                "write_behind_lost_keys": len(table.lost),
            }

    # ------------------------------------------------------------ writing
    async def mput(
        self, eic_keys: list[str], buffers: list[SdkBuffer], mrs: Sequence[MemoryRegion]
    ) -> list[Status] | Status:
        refused = hold(mrs, "mput")
        if refused is not None:
            return refused
        nbytes = sum(buffer[1] for buffer in buffers)
        table = self.table
        done = Finished()
        ack = None
        with table.cond:
            if not self._flusher.running:
                release(mrs)
                return _CLOSED
            early = self._accept_early and table.fits(nbytes, self._byte_limit())
            if not early:
                ack = Ack(len(eic_keys), asyncio.get_running_loop())
            table.add(eic_keys, buffers, mrs, time.monotonic(), early, ack, done)
            drain = self._flusher.claim_drain()  # None: a running drain takes it with its next round
        if drain is not None:
            self._flusher.start_drain(drain)
        done.settle()
        self._counters.add(
            puts=1,
            put_blocks=len(eic_keys),
            write_behind_blocks=len(eic_keys) if early else 0,
            write_behind_waits=0 if early or not self._accept_early else 1,
        )
        if ack is None:
            return [OK] * len(eic_keys)
        timeout_s = self._config.put_timeout_ms / 1000
        try:
            status = await asyncio.wait_for(ack.future, timeout_s)
        except TimeoutError:
            return Status(StatusCodes.TIMEOUT, f"put exceeded put_timeout_ms={self._config.put_timeout_ms:g}")
        if status.is_ok():
            return [OK] * len(eic_keys)
        return Status(status.error_code, f"{len(eic_keys)} blocks put, some not stored: {status.value}")

    def _byte_limit(self) -> int:
        """write_behind_max_bytes, or 1/SLAB_SHARE of the registered memory
        if that is less (recomputed when registrations change)."""
        regions = self._link.regions
        seen, limit = self._limit_for
        if seen != len(regions):
            slab_bytes = sum(nbytes for _, nbytes in regions.all())
            limit = self._config.write_behind_max_bytes
            if slab_bytes:
                limit = min(limit, slab_bytes // SLAB_SHARE)
            self._limit_for = (len(regions), limit)
        return limit

    # ------------------------------------------------------------ reading
    def _read_held(self, eic_keys: Sequence[str], dests: Sequence[MemoryRegion]) -> list[bool | None]:
        """Per key: True (copied from an accepted write), False (reads as
        a miss) or None (ask EIC). The caller holds a reference on every
        dest (mget), so none can be released under the copy."""
        table = self.table
        found: list[bool | None] = [None] * len(eic_keys)
        sources: list[tuple[int, MemoryRegion]] = []
        with table.cond:
            for i, key in enumerate(eic_keys):
                hit = table.lookup(key)
                if hit is LOST:
                    found[i] = False
                elif hit is not None and hold([hit.mr], "get") is None:  # ours: it cannot be released
                    sources.append((i, hit.mr))
        for i, source in sources:
            try:
                found[i] = self._copy(source, dests[i])
            finally:
                release([source])
        if sources:
            self._counters.add(write_behind_served=sum(1 for i, _ in sources if found[i]))
        return found

    async def mget(
        self,
        eic_keys: list[str],
        keys: Sequence[bytes],
        mrs: Sequence[MemoryRegion],
        from_eic: FromEic,
        restore: RestoreTokens,
    ) -> list[Status] | Status:
        """An mget over the table: accepted writes are copied from their
        regions, lost keys are misses, the rest comes from EIC
        (`from_eic(keys, mrs)`). The result is prefix-closed, and in the
        token-validation layout `restore` checks the whole request's tokens."""
        refused = hold(mrs, "mget")  # a released region is INVALID here too, not a silent miss
        if refused is not None:
            return refused
        try:
            statuses = await held_or_from_eic(self._read_held(eic_keys, mrs), keys, mrs, from_eic)
            loaded = next((i for i, status in enumerate(statuses) if not status.is_ok()), len(keys))
            close_after(statuses, loaded)
            if loaded and not MemoryRegion.use_compact_layout():
                close_after(statuses, restore(keys, mrs, statuses, loaded))
            return statuses
        finally:
            release(mrs)

    @staticmethod
    def _copy(source: MemoryRegion, dest: MemoryRegion) -> bool:
        if source.length != dest.length:
            return False  # never a partial fill, like EIC's BUFFER_SIZE_MISMATCH
        copy_region(source, dest)  # either may be device memory
        return True

    def exists(self, eic_key: str) -> Status | None:
        with self.table.cond:
            hit = self.table.lookup(eic_key)
        if hit is None:
            return None
        return NOT_FOUND if hit is LOST else OK

    # ----------------------------------------------------------- deleting
    async def delete(self, eic_key: str, session: Session) -> Status:
        """Drop a queued write of the key, wait for one in flight, then
        mdel. The key reads as a miss from the moment the delete starts (an
        older write still in flight, or already in EIC, must not show through
        the dropped newer one) and stays one if the delete does not finish."""
        table = self.table
        with table.cond:
            table.delete_started(eic_key)
        try:
            return await self._delete(eic_key, session)
        finally:
            with table.cond:
                table.delete_ended(eic_key)

    async def _delete(self, eic_key: str, session: Session) -> Status:
        table = self.table
        timeout_ms = self._config.delete_timeout_ms
        deadline = Deadline(timeout_ms / 1000)
        dropped = False
        while True:
            done = Finished()
            with table.cond:
                if table.drop_queued(eic_key, done):  # a newer write accepted meanwhile is hidden again
                    dropped = True
                    table.mark_lost(eic_key, table.next_seq())
                busy = table.inflight.get(eic_key)
                if busy is None:
                    claim = table.claim_delete(eic_key)
                else:
                    ack = Ack(1, asyncio.get_running_loop())
                    busy.acks = (busy.acks or []) + [ack]
            done.settle()
            if busy is None:
                break
            try:
                await asyncio.wait_for(ack.future, deadline.remaining())
            except TimeoutError:  # the key stays lost: the flusher deletes it once nothing is in flight
                return Status(StatusCodes.TIMEOUT, f"delete exceeded delete_timeout_ms={timeout_ms:g}")
        status = Status(StatusCodes.ERROR, "delete did not run")
        try:
            chunks = self._dispatcher.chunks([eic_key], None, None)
            run_ms = await self._dispatcher.run(DELETE_OP, session.client, chunks)
            status = key_statuses(chunks, "delete", run_ms)[0][0]
        finally:
            done = Finished()
            with table.cond:
                table.finish(claim, status.is_ok() or status.is_not_found(), None, done)
            done.settle()
        if dropped and status.is_not_found():
            return OK  # it existed, as a pending write
        return status


async def held_or_from_eic(
    found: Sequence[bool | None], keys: Sequence[bytes], mrs: Sequence[MemoryRegion], from_eic: FromEic
) -> list[Status]:
    """One Status per key: OK where `found` copied a held write, a miss
    from the first lost key on, EIC's answer for the rest before it."""
    nkeys = len(keys)
    end = found.index(False) if False in found else nkeys
    statuses: list[Status] = [NOT_FOUND] * nkeys
    ask = [i for i in range(end) if found[i] is None]
    if ask:
        answer = await from_eic([keys[i] for i in ask], [mrs[i] for i in ask])
        if isinstance(answer, Status):
            answer = [answer] * len(ask)
        for j, i in enumerate(ask):
            statuses[i] = answer[j]
    for i in range(end):
        if found[i]:
            statuses[i] = OK
    return statuses
