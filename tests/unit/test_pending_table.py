"""A hypothesis state machine that drives the write-behind table (writes/table.py)
the way write_behind.py and the flusher do, against a model of what EIC may
hold and of the newest accepted version of each key.

The model: per key, the newest accepted write (or DELETED once a delete
started after it), whether that write is still held by the table, and the
set of values EIC may hold (a finished write or delete that failed leaves
either the old or the new one). The table must never answer a read with
anything but the newest version: an Entry only when it carries the newest
accepted write, None ("ask EIC") only when whatever EIC may hold is that
version or nothing, LOST otherwise. And it serves an accepted write it
still holds (read-your-writes), and keeps exact byte and reference counts.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aibrix_eic.writes.table import DELETE, LOST, WRITE, Finished, PendingTable

WRITE_KEYS = st.sampled_from(["w0", "w1", "w2"])
DIRECT_KEYS = st.sampled_from(["d0", "d1"])  # put_mode direct: only outlived puts and the flusher's deletes
DELETED = "deleted"  # the newest event of a key was a delete
LATE = "late"  # a timed-out direct put that may still land


class Region:
    """Stands in for a MemoryRegion: the table only releases it."""

    def __init__(self, version: int, nbytes: int) -> None:
        self.version = version
        self.length = nbytes
        self.refs = 1

    def ref_down(self) -> None:
        self.refs -= 1
        assert self.refs == 0, "a region released twice"


class TableAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = PendingTable(max_bytes=1 << 20, max_age_s=10.0)
        self.version = 0
        self.now = 0.0
        self.newest: dict[str, object] = {}  # key -> newest accepted version, or DELETED
        self.held: dict[str, int] = {}  # key -> version of the newest write while the table holds it
        self.eic: dict[str, set] = {}  # key -> values EIC may hold (None: nothing)
        self.flight: list = []  # entries the "flusher" took and has not finished
        self.user_deletes: set[int] = set()  # ids of in-flight entries that are user deletes
        self.regions: list[Region] = []
        self.running_late: dict[str, int] = {}  # key -> outlived direct puts not yet returned

    def possible(self, key: str) -> set:
        return self.eic.setdefault(key, {None})

    # ---------------------------------------------------------------- rules
    @rule(key=WRITE_KEYS, nbytes=st.integers(1, 64), counted=st.booleans())
    def put(self, key, nbytes, counted):
        self.version += 1
        region = Region(self.version, nbytes)
        self.regions.append(region)
        done = Finished()
        with self.table.cond:
            self.table.add([key], [(0, nbytes, False)], [region], self.now, counted, None, done)
        done.settle()
        self.newest[key] = self.version
        self.held[key] = self.version

    @rule(with_deletes=st.booleans())
    def take_round(self, with_deletes):
        with self.table.cond:
            writes, deletes = self.table.take_round(with_deletes)
        assert len({e.key for e in writes + deletes}) == len(writes + deletes), "one operation per key in flight"
        assert not {e.key for e in writes + deletes} & {e.key for e in self.flight}, "a key sent twice"
        self.flight.extend(writes + deletes)

    @precondition(lambda self: self.flight)
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data, ok):
        entry = self.flight.pop(data.draw(st.integers(0, len(self.flight) - 1)))
        key = entry.key
        if entry.kind == WRITE:
            version = entry.mr.version
            self.eic[key] = {version} if ok else self.possible(key) | {version}
            if self.held.get(key) == version:
                del self.held[key]
        else:
            self.eic[key] = {None} if ok else self.possible(key) | {None}
            if self.running_late.get(key):  # a late put can still land after this delete
                self.eic[key].add(LATE)
        done = Finished()
        with self.table.cond:
            self.table.finish(entry, ok, None, done)
            if id(entry) in self.user_deletes:
                self.user_deletes.discard(id(entry))
                self.table.delete_ended(key)
        done.settle()

    @rule(key=WRITE_KEYS)
    def user_delete(self, key):
        """WriteBehind.delete: the key reads as a miss from now on; a queued
        write is dropped; the mdel runs unless a write is in flight (then
        this delete times out waiting, and the key stays lost)."""
        done = Finished()
        with self.table.cond:
            self.table.delete_started(key)
            if self.table.drop_queued(key, done):
                self.table.mark_lost(key, self.table.next_seq())
            if key in self.table.inflight:
                self.table.delete_ended(key)
            else:
                entry = self.table.claim_delete(key)
                self.flight.append(entry)
                self.user_deletes.add(id(entry))
        done.settle()
        self.newest[key] = DELETED
        self.held.pop(key, None)

    @rule(age_s=st.sampled_from([1.0, 20.0]))
    def time_passes(self, age_s):
        """The watcher drops queued writes older than max_age_s."""
        self.now += age_s
        done = Finished()
        with self.table.cond:
            aged = [e.key for e in self.table.queued.values() if self.now - e.accepted_at > self.table.max_age_s]
            assert self.table.drop_aged(self.now, done) == len(aged)
        done.settle()
        for key in aged:
            del self.held[key]

    @rule()
    def circuit_opens(self):
        done = Finished()
        with self.table.cond:
            dropped = list(self.table.queued)
            self.table.drop_all_queued("circuit open", done)
        done.settle()
        for key in dropped:
            del self.held[key]

    @rule(key=DIRECT_KEYS)
    def direct_put_outlives_its_deadline(self, key):
        with self.table.cond:
            self.table.outlive([key])
        self.newest[key] = DELETED  # the caller got TIMEOUT: the late value is nobody's newest
        self.possible(key).add(LATE)
        self.running_late[key] = self.running_late.get(key, 0) + 1

    @precondition(lambda self: self.table.outlived)
    @rule(data=st.data())
    def outlived_put_returns(self, data):
        key = data.draw(st.sampled_from(sorted(self.table.outlived)))
        with self.table.cond:
            self.table.returned([key])
        self.running_late[key] -= 1

    # ----------------------------------------------------------- invariants
    @invariant()
    def reads_serve_only_the_newest_version(self):
        with self.table.cond:
            answers = {key: self.table.lookup(key) for key in ["w0", "w1", "w2", "d0", "d1"]}
        for key, hit in answers.items():
            newest = self.newest.get(key, DELETED)
            if hit is LOST:
                continue
            if hit is None:
                allowed = {None} if newest is DELETED else {None, newest}
                assert self.possible(key) <= allowed, f"{key}: EIC may hold {self.possible(key)}, newest {newest}"
            else:
                assert hit.kind == WRITE and hit.mr is not None and hit.mr.version == newest, key

    @invariant()
    def an_accepted_write_it_holds_is_served(self):
        with self.table.cond:
            for key, version in self.held.items():
                hit = self.table.lookup(key)
                assert hit is not LOST and hit is not None and hit.mr.version == version, key

    @invariant()
    def bytes_and_references_add_up(self):
        with self.table.cond:
            entries = [*self.table.queued.values(), *self.table.inflight.values()]
            holding = [e for e in entries if e.mr is not None]
            assert self.table.held_bytes == sum(e.nbytes for e in holding)
            assert self.table.counted_bytes == sum(e.nbytes for e in holding if e.counted)
            assert all(e.kind == DELETE or e.mr is not None for e in self.table.queued.values())
        held = {id(e.mr) for e in holding}
        assert all((r.refs == 1) == (id(r) in held) for r in self.regions), "a region leaked or released early"


TestPendingTable = TableAgainstModel.TestCase
TestPendingTable.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
