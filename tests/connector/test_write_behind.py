"""Write-behind and coalesced puts on a directly built connector: each
guarantee of docs/write-behind.md against the embedded engine, with the
engine slowed or faulted so that writes are really pending when it matters."""

import asyncio
import threading
import time

import pytest
from connector_tools import ConnectorRig
from harness import watch_peak_counted_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import wait_until

from aibrix_eic.engine import get_store
from aibrix_eic.engine import surface as engine_surface

BLOCK = 4096


def payload(version: int) -> bytes:
    return version.to_bytes(4, "little") * (BLOCK // 4)


@pytest.fixture
def make_rig():
    rigs = []

    def make(store: str = "wb", **config) -> ConnectorRig:
        config.setdefault("put_mode", "write_behind")
        config.setdefault("remote_url", f"local://{store}")
        rig = ConnectorRig(block_nbytes=BLOCK, **config).open()
        rig.store = get_store(store)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def put(rig, key: bytes, version: int):
    mrs = rig.filled([payload(version)])
    status = rig.run(rig.conn.put(key, mrs[0]))
    rig.release(mrs)  # what AIBrix does once put returned
    return status, mrs[0]


def get(rig, key: bytes):
    mr = rig.blocks(1)[0]
    status = rig.run(rig.conn.get(key, mr))
    data = rig.read(mr)
    rig.release([mr])
    return status, data


def idle(rig, timeout: float = 10.0) -> None:
    assert rig.conn.write_behind.wait_idle(timeout)
    rig.quiesce()


def in_flight(rig) -> None:
    """Wait until the flusher has sent what is queued."""
    table = rig.conn.write_behind.table
    wait_until(
        lambda: table.inflight and not table.queued,
        what="everything queued in flight",
        show=lambda: (len(table.queued), len(table.inflight)),
    )


def spy_calls(monkeypatch) -> list:
    """Every SDK data call the engine receives: (op, keys)."""
    calls = []
    lock = threading.Lock()
    for op in ("mset", "mget", "mdel"):
        original = getattr(engine_surface.Client, op)

        def spy(self, keys, *args, _op=op, _original=original):
            with lock:
                calls.append((_op, list(keys)))
            return _original(self, keys, *args)

        monkeypatch.setattr(engine_surface.Client, op, spy)
    return calls


def test_put_returns_before_the_write_and_the_block_reads_back_exact(make_rig):
    rig = make_rig()
    rig.store.faults.latency_s = 1.0
    started = time.perf_counter()
    status, mr = put(rig, b"k" * 16, 1)
    assert status.is_ok() and time.perf_counter() - started < 0.5
    assert mr.ref_count == 1, "write-behind holds its own reference after AIBrix released"
    assert rig.conn.health()["write_behind_pending"] == 1
    status, data = get(rig, b"k" * 16)  # read-your-writes before the flush
    assert status.is_ok() and data == payload(1)
    assert rig.run(rig.conn.exists(b"k" * 16)).is_ok()
    idle(rig)
    assert mr.ref_count == 0, "the reference is dropped once the write is stored"
    rig.store.faults.clear()
    status, data = get(rig, b"k" * 16)  # now from EIC
    assert status.is_ok() and data == payload(1)
    health = rig.conn.health()
    assert health["write_behind_served"] == 1 and health["gets"] == 1, "the first read came from the table"


def test_a_region_is_never_reused_while_its_write_is_pending(make_rig):
    rig = make_rig()
    rig.store.faults.latency_s = 0.1
    _, pending = put(rig, b"p" * 16, 7)
    others = rig.blocks(64)
    assert all(not (o.addr <= pending.addr < o.addr + o.length) for o in others if o.slab is pending.slab)
    rig.release(others)
    idle(rig)
    rig.store.faults.clear()
    assert get(rig, b"p" * 16)[1] == payload(7)


def test_a_get_over_pending_and_missing_blocks_is_prefix_closed(make_rig):
    rig = make_rig()
    rig.store.faults.latency_s = 0.2
    put(rig, b"1" * 16, 1)
    put(rig, b"3" * 16, 3)
    mrs = rig.blocks(3)
    statuses = rig.run(rig.conn.mget([b"1" * 16, b"2" * 16, b"3" * 16], mrs))
    assert [s.is_ok() for s in statuses] == [True, False, False]  # 3 is pending, but after a miss
    assert rig.read(mrs[0]) == payload(1)
    rig.release(mrs)
    idle(rig)


def test_concurrent_puts_share_batched_msets(make_rig, monkeypatch):
    rig = make_rig(put_mode="coalesce")
    rig.store.faults.latency_s = 0.002
    calls = spy_calls(monkeypatch)
    keys = [bytes([i]) * 16 for i in range(64)]
    mrs = rig.filled([payload(i) for i in range(64)])

    async def all_at_once():
        return await asyncio.gather(*(rig.conn.put(k, m) for k, m in zip(keys, mrs)))

    statuses = rig.run(all_at_once())
    rig.release(mrs)
    assert all(status.is_ok() for status in statuses)  # coalesce: OK means stored
    msets = [c for c in calls if c[0] == "mset"]
    assert len(msets) <= 3, [len(k) for _, k in msets]
    for i in range(64):
        assert get(rig, keys[i])[1] == payload(i)


def test_delete_wins_over_a_queued_and_an_in_flight_write(make_rig):
    rig = make_rig()
    rig.store.faults.latency_s = 0.1
    put(rig, b"a" * 16, 1)
    in_flight(rig)
    put(rig, b"b" * 16, 2)  # queued behind it
    put(rig, b"a" * 16, 3)  # a newer write of a, queued behind the one in flight
    assert rig.run(rig.conn.delete(b"b" * 16)).is_ok()  # it existed, as a pending write
    assert rig.run(rig.conn.delete(b"a" * 16)).is_ok()  # waits for the write in flight, then mdel
    for key in (b"a" * 16, b"b" * 16):
        assert get(rig, key)[0].is_not_found()
        assert rig.run(rig.conn.exists(key)).is_not_found()
    idle(rig)
    rig.store.faults.clear()
    assert len(rig.store) == 0
    assert get(rig, b"a" * 16)[0].is_not_found()


def test_an_overwrite_is_never_reordered_behind_an_older_write(make_rig, monkeypatch):
    rig = make_rig()
    calls = spy_calls(monkeypatch)
    rig.store.faults.latency_s = 0.02
    key = b"o" * 16
    for version in range(1, 9):
        put(rig, key, version)
        time.sleep(0.004 * (version % 3))
        assert get(rig, key)[1] == payload(version)
    idle(rig)
    rig.store.faults.clear()
    assert get(rig, key)[1] == payload(8)
    assert all(len(keys) == 1 for op, keys in calls if op == "mset"), "one version of a key per mset"


def test_close_flushes_pending_writes_and_releases_every_reference(make_rig):
    rig = make_rig(store="close")
    rig.store.faults.latency_s = 0.02
    regions = [put(rig, bytes([i]) * 16, i)[1] for i in range(1, 20)]
    started = time.perf_counter()
    rig.conn.close()
    assert time.perf_counter() - started < 2.0
    assert all(mr.ref_count == 0 for mr in regions)
    assert len(rig.store) == 19
    rig.open()
    rig.store.faults.clear()
    assert all(get(rig, bytes([i]) * 16)[1] == payload(i) for i in range(1, 20))


def test_close_within_its_bound_drops_what_a_hung_engine_holds_up(make_rig):
    rig = make_rig(store="hung", write_behind_close_timeout_ms=200, put_timeout_ms=5000)
    rig.store.faults.latency_s = 1.0
    regions = [put(rig, b"\x01" * 16, 1)[1]]
    in_flight(rig)
    regions += [put(rig, bytes([i]) * 16, i)[1] for i in range(2, 6)]  # queued behind it
    started = time.perf_counter()
    rig.conn.close()
    assert time.perf_counter() - started < 0.6, "close() is bounded by write_behind_close_timeout_ms"
    table = rig.conn.write_behind.table
    assert not table.queued and len(table.inflight) == 1
    assert rig.conn.health()["write_behind_lost"] == 4, "what was queued is dropped at close"
    held = [mr for mr in regions if mr.ref_count]
    assert held == regions[:1], "only the region of a call still running stays held"
    wait_until(lambda: all(mr.ref_count == 0 for mr in regions), what="...their release when that call returns")


def test_past_the_byte_bound_a_put_waits_until_stored(make_rig):
    rig = make_rig(write_behind_max_bytes=2 * BLOCK)
    rig.store.faults.latency_s = 0.5
    table = rig.conn.write_behind.table
    peak = watch_peak_counted_bytes(table)
    started = time.perf_counter()
    for i in range(2):
        put(rig, bytes([i]) * 16, i)
    assert time.perf_counter() - started < 0.25, "within the bound puts return at once"
    mrs = rig.filled([payload(10), payload(11)])
    started = time.perf_counter()
    status = rig.run(rig.conn.mput([b"x" * 16, b"y" * 16], mrs))
    rig.release(mrs)
    assert all(s.is_ok() for s in status)
    assert time.perf_counter() - started >= 0.5, "past the bound the put waited for its mset"
    assert peak[0] <= 2 * BLOCK
    health = rig.conn.health()
    assert health["write_behind_waits"] == 1 and health["write_behind_blocks"] == 2
    idle(rig)
    rig.store.faults.clear()
    assert get(rig, b"x" * 16)[1] == payload(10) and get(rig, b"y" * 16)[1] == payload(11)


def test_nothing_is_queued_while_the_breaker_is_open(make_rig):
    rig = make_rig(probe_interval_s=3600)
    rig.conn.breaker.trip("test")
    status, mr = put(rig, b"z" * 16, 1)
    assert not status.is_ok() and "circuit is open" in str(status.value)
    assert mr.ref_count == 0 and rig.conn.health()["write_behind_pending"] == 0


def test_writes_queued_when_the_breaker_opens_become_misses(make_rig):
    rig = make_rig(probe_interval_s=3600)
    rig.store.faults.latency_s = 0.1
    regions = [put(rig, b"\x01" * 16, 1)[1]]
    in_flight(rig)
    regions += [put(rig, bytes([i]) * 16, i)[1] for i in range(2, 6)]
    rig.conn.breaker.trip("test")
    idle(rig)
    assert all(mr.ref_count == 0 for mr in regions)
    assert rig.conn.health()["write_behind_lost"] == 4
    rig.conn.breaker.reset()
    for i in range(2, 6):
        assert get(rig, bytes([i]) * 16)[0].is_not_found()


def test_a_failed_flush_is_a_miss_never_the_older_value(make_rig):
    rig = make_rig(retry_attempts=1, retry_backoff_ms=1, retry_backoff_max_ms=1, breaker_failures=1000)
    key = b"f" * 16
    put(rig, key, 1)
    idle(rig)
    assert get(rig, key)[1] == payload(1)
    rig.store.faults.fail_rate = 1.0  # the mset and the clearing mdel both fail
    status, mr = put(rig, key, 2)
    assert status.is_ok()  # accepted: its loss shows as a miss
    idle(rig)
    assert mr.ref_count == 0
    assert rig.conn.health()["write_behind_lost_keys"] == 1
    assert get(rig, key)[0].is_not_found(), "the older value must not be served"
    assert rig.run(rig.conn.exists(key)).is_not_found()
    rig.store.faults.clear()  # the flusher now deletes the older value
    wait_until(lambda: rig.conn.health()["write_behind_lost_keys"] == 0, what="the lost key re-deleted")
    assert get(rig, key)[0].is_not_found() and len(rig.store) == 0
    put(rig, key, 3)
    idle(rig)
    assert get(rig, key)[1] == payload(3)


def test_a_newer_write_lost_to_age_hides_an_older_one_in_flight(make_rig):
    rig = make_rig(write_behind_max_age_ms=20, put_timeout_ms=5000)
    key = b"g" * 16
    put(rig, key, 1)
    idle(rig)
    rig.store.faults.latency_s = 0.3
    put(rig, key, 2)
    in_flight(rig)
    put(rig, key, 3)  # queued behind 2, then dropped for its age while 2 is still in the SDK
    wait_until(lambda: rig.conn.health()["write_behind_lost"], what="the queued write lost to its age")
    assert rig.conn.health()["write_behind_lost"] == 1
    assert get(rig, key)[0].is_not_found(), "the write in flight (2) is older than the lost one (3)"
    assert rig.run(rig.conn.exists(key)).is_not_found()
    idle(rig)
    rig.store.faults.clear()
    assert get(rig, key)[0].is_not_found()


def test_failed_keys_are_retried_within_the_deadline(make_rig):
    rig = make_rig(remote_url="local://retry?seed=3", retry_attempts=5, retry_backoff_ms=1, retry_backoff_max_ms=2)
    rig.store = get_store("retry")
    rig.store.faults.key_fail_rate = 0.3
    for i in range(32):
        put(rig, bytes([i]) * 16, i + 1)
    idle(rig)
    rig.store.faults.clear()
    health = rig.conn.health()
    assert health["retries"] > 0
    stored = 0
    for i in range(32):
        status, data = get(rig, bytes([i]) * 16)
        if status.is_ok():
            assert data == payload(i + 1)
            stored += 1
    assert stored >= 30  # 0.3 ** 6 per key


def test_a_released_region_is_refused_and_not_queued(make_rig):
    rig = make_rig()
    mr = rig.blocks(1)[0]
    rig.release([mr])
    status = rig.run(rig.conn.put(b"r" * 16, mr))
    assert status.is_invalid() and "already released" in str(status.value)
    assert rig.conn.health()["write_behind_pending"] == 0


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),  # blocks per mput, back to back
    batch_keys=st.integers(1, 8),
    batch_blocks=st.integers(1, 4),
)
def test_a_flush_is_split_within_batch_keys_and_batch_bytes(sizes, batch_keys, batch_blocks):
    """However puts batch up, every mset of a flush stays within batch_keys
    and batch_bytes, and carries each accepted block once."""
    calls, original = [], engine_surface.Client.mset

    def spy(self, keys, vals, *args):
        calls.append((list(keys), sum(nbytes for _, nbytes, _ in vals)))
        return original(self, keys, vals, *args)

    engine_surface.Client.mset = spy
    limits = {"batch_keys": batch_keys, "batch_bytes": batch_blocks * BLOCK}
    rig = ConnectorRig(remote_url="local://wb-split", block_nbytes=BLOCK, put_mode="write_behind", **limits).open()
    try:
        written: dict[bytes, bytes] = {}
        for size in sizes:
            versions = range(len(written), len(written) + size)
            keys = [version.to_bytes(16, "little") for version in versions]
            mrs = rig.filled([payload(version) for version in versions])
            statuses = rig.run(rig.conn.mput(keys, mrs))
            rig.release(mrs)
            assert all(status.is_ok() for status in statuses)
            written.update(zip(keys, map(payload, versions)))
        idle(rig)
        for keys, nbytes in calls:
            assert len(keys) <= batch_keys and nbytes <= batch_blocks * BLOCK
        sent = [key for keys, _ in calls for key in keys]
        assert len(sent) == len(set(sent)) == len(written)
        for key, expected in written.items():
            status, data = get(rig, key)
            assert status.is_ok() and data == expected
    finally:
        engine_surface.Client.mset = original
        get_store("wb-split").clear()
        rig.close()


def test_rejected_keys_are_not_retried_by_the_flusher(make_rig):
    """A store too small for a flush rejects its tail; re-sending would only
    evict the blocks the same flush just stored. The rejected blocks become
    misses, counted as lost."""
    rig = make_rig(remote_url="local://wb-tiny?capacity=8KiB", retry_attempts=3)
    keys = [bytes([i]) * 16 for i in range(4)]
    mrs = rig.filled([payload(i) for i in range(4)])
    statuses = rig.run(rig.conn.mput(keys, mrs))
    rig.release(mrs)
    assert all(status.is_ok() for status in statuses)  # accepted: the loss shows as misses
    idle(rig)
    health = rig.conn.health()
    assert health["retries"] == 0
    assert health["put_failures"] == 2 and health["write_behind_lost"] == 2
    assert all(mr.ref_count == 0 for mr in mrs)
    found = rig.blocks(4)
    statuses = rig.run(rig.conn.mget(keys, found))
    assert [s.is_ok() for s in statuses] == [True, True, False, False]
    assert [rig.read(mr) for mr in found[:2]] == [payload(0), payload(1)]
    rig.release(found)


def test_a_get_overtakes_queued_flush_calls(make_rig, monkeypatch):
    """Flush calls queue behind gets on the data pool: a reload does not
    wait for a backlog of writes to drain."""
    rig = make_rig(store="wb-sched", eic_thread_num=1, batch_keys=1)
    hot = b"hot-key-00000000"
    put(rig, hot, 1)
    idle(rig)
    calls = spy_calls(monkeypatch)
    rig.store.faults.latency_s = 0.02
    mrs = rig.filled([payload(10 + i) for i in range(6)])
    statuses = rig.run(rig.conn.mput([bytes([i]) * 16 for i in range(6)], mrs))
    rig.release(mrs)
    assert all(status.is_ok() for status in statuses)
    wait_until(lambda: calls, what="the first flush call on the only thread")
    status, data = get(rig, hot)
    assert status.is_ok() and data == payload(1)
    idle(rig)
    ops = [op for op, _ in calls]
    assert ops.index("mget") == 1, ops  # next after the call already running, not 7th


def test_a_flush_stuck_past_put_timeout_counts_as_a_failure_and_other_keys_still_flush(make_rig, monkeypatch):
    """A hung mset holds its own keys (and regions) until it returns, but not
    the queue: past put_timeout_ms the breaker hears of it and later writes
    go out on another thread. The stuck key is not sent again meanwhile."""
    rig = make_rig(store="wb-stuck", put_timeout_ms=150, breaker_failures=50, write_behind_max_age_ms=10_000)
    stuck_key = b"\x07" * 16
    release_call = threading.Event()
    sent_stuck = []
    original = engine_surface.Client.mset

    def mset(self, keys, *args):
        if any(stuck_key.hex() in key for key in keys):
            sent_stuck.append(list(keys))
            release_call.wait(10)
        return original(self, keys, *args)

    monkeypatch.setattr(engine_surface.Client, "mset", mset)
    try:
        _, stuck_region = put(rig, stuck_key, 1)
        in_flight(rig)
        later = [put(rig, bytes([i]) * 16, i)[1] for i in range(10, 14)]  # queued behind the stuck round
        # 5 s, well inside the 10 s the stuck call is held: past it, they could go out after it
        wait_until(lambda: all(mr.ref_count == 0 for mr in later), 5.0, "later writes flushed past the stuck one")
        for i in range(10, 14):
            status, data = get(rig, bytes([i]) * 16)
            assert status.is_ok() and data == payload(i)
        health = rig.conn.health()
        assert health["timeouts"] >= 1, "the stuck round counts as a timeout (a breaker failure)"
        assert stuck_region.ref_count == 1, "the region of the hung call stays held"
        assert get(rig, stuck_key)[1] == payload(1), "and reads of it are served from it meanwhile"
        assert len(sent_stuck) == 1, "a key in flight is never sent again before its call returns"
    finally:
        release_call.set()
    idle(rig)
    assert stuck_region.ref_count == 0
    status, data = get(rig, stuck_key)
    assert status.is_ok() and data == payload(1)


def test_a_lost_key_whose_delete_is_in_flight_does_not_spin_the_flusher(make_rig, monkeypatch):
    """Lost keys are re-deleted at most every flusher tick, also while the
    only one left is already being deleted (nothing to take, nothing to do)."""
    from aibrix_eic.writes import flusher

    rig = make_rig(store="wb-nospin", retry_attempts=0, breaker_failures=1000)
    key = b"s" * 16
    rig.store.faults.fail_rate = 1.0  # the mset and its clearing mdel fail: the key is lost
    put(rig, key, 1)
    idle(rig)
    assert rig.conn.health()["write_behind_lost_keys"] == 1
    drains = []
    original = flusher.Flusher._submit_drain
    monkeypatch.setattr(flusher.Flusher, "_submit_drain", lambda self, drain: (drains.append(1), original(self, drain)))
    table = rig.conn.write_behind.table
    with table.cond:  # a user delete of the key in flight: the lost key cannot be taken
        claim = table.claim_delete(next(iter(table.lost)))
    time.sleep(0.5)
    assert len(drains) <= 0.5 / flusher.TICK_S + 2, f"{len(drains)} drains in 0.5 s"
    rig.store.faults.clear()
    from aibrix_eic.writes.table import Finished

    with table.cond:
        table.finish(claim, False, None, Finished())  # it did not finish: still lost, the flusher retries
    wait_until(lambda: rig.conn.health()["write_behind_lost_keys"] == 0, what="the lost key re-deleted")


def test_a_write_waiting_behind_its_keys_delete_does_not_spin_the_flusher(make_rig, monkeypatch):
    """A queued write whose key has a delete in flight waits for it without
    the flusher starting empty rounds meanwhile, and goes out after it."""
    from aibrix_eic.writes import flusher
    from aibrix_eic.writes.table import Finished

    rig = make_rig(store="wb-nospin2")
    key = b"o" * 16
    eic_key = rig.conn._codec.encode(key)
    table = rig.conn.write_behind.table
    with table.cond:  # a delete of the key in flight (what WriteBehind.delete claims)
        claim = table.claim_delete(eic_key)
    drains = []
    original = flusher.Flusher._submit_drain
    monkeypatch.setattr(flusher.Flusher, "_submit_drain", lambda self, drain: (drains.append(1), original(self, drain)))
    put(rig, key, 2)  # queued: its key is busy, so no round can take it yet
    time.sleep(0.3)
    assert len(drains) <= 0.3 / flusher.TICK_S + 2, f"{len(drains)} drains in 0.3 s"
    with table.cond:
        table.finish(claim, True, None, Finished())
    idle(rig)
    status, data = get(rig, key)
    assert status.is_ok() and data == payload(2)


@pytest.mark.parametrize("batch_keys", [64, 1])
def test_a_long_stream_of_writes_does_not_look_like_a_stuck_pool_thread(make_rig, batch_keys):
    """A drain that keeps finding work gives its pool task up now and then,
    so the pool never takes it for a call stuck past every deadline and
    starts replacement threads for it."""
    # batch_keys=64: a round is one call, so the drain keeps its thread while writes keep coming
    # (without the hand-back its task ran the whole stream). batch_keys=1: a round's second call
    # goes to the pool, whose submit is where a thread that looks stuck gets replaced.
    # Deadlines of 2 s: a drain hands its thread back after 0.5 s, so only a stall of the whole
    # process for over 1.5 s could fail this (a host at load 12 on 2 cores stalled 0.3 s past a
    # 0.75 s margin).
    rig = make_rig(store="wb-stream", get_timeout_ms=2000, put_timeout_ms=2000, eic_thread_num=2, batch_keys=batch_keys)
    stuck_after_s = 2.0
    rig.store.faults.latency_s = 0.005
    pool = rig.conn.link.data_pool
    longest_task_s, streaming = [0.0], threading.Event()
    streaming.set()

    def watch_tasks() -> None:
        while streaming.is_set():
            longest_task_s[0] = max(longest_task_s[0], pool.longest_busy_s())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_tasks)
    watcher.start()
    started = time.monotonic()
    most_threads = pool.threads
    i = 0
    try:
        # 2.5 s: longer than stuck_after_s, so a drain that never hands back fails; no longer, as
        # the stream outpaces the drains (5 ms a call) and its backlog must drain before idle().
        while time.monotonic() - started < 2.5:  # a window, not a wait
            mrs = rig.filled([payload(i), payload(i + 1)])
            statuses = rig.run(rig.conn.mput([i.to_bytes(16, "little"), (i + 1).to_bytes(16, "little")], mrs))
            rig.release(mrs)
            assert all(status.is_ok() for status in statuses)
            most_threads = max(most_threads, pool.threads)
            i += 2
            time.sleep(0.001)
    finally:
        streaming.clear()
        watcher.join()
    idle(rig, timeout=60)
    assert longest_task_s[0] < stuck_after_s, (
        f"a pool task ran {longest_task_s[0]:.2f} s of a stream that never stalled"
    )
    assert most_threads == 2, f"the pool grew to {most_threads} threads for a drain that was never stuck"


def test_a_put_starts_its_flush_without_waking_the_watcher(make_rig, monkeypatch):
    """The put that finds no drain running starts one on the data pool
    itself: a wake-up of the watcher thread per burst of puts is CPU the
    caller loses on a busy host (benchmarks/RESULTS.md, L1-on). With the
    watcher thread gone, every write still reaches EIC, in order."""
    from aibrix_eic.writes import flusher

    monkeypatch.setattr(flusher.Flusher, "_watch", lambda self, generation: None)
    rig = make_rig()
    rig.store.faults.latency_s = 0.002
    for version in range(1, 21):  # one put at a time, as AIBrix's synchronous ingestion makes them
        status, _ = put(rig, bytes([version % 4]) * 16, version)
        assert status.is_ok()
    assert rig.conn.write_behind.wait_idle(10), "writes waited for a watcher that never came"
    rig.quiesce()
    assert len(rig.store) == 4
    for key in range(4):
        newest = max(v for v in range(1, 21) if v % 4 == key)
        status, data = get(rig, bytes([key]) * 16)
        assert status.is_ok() and data == payload(newest)
