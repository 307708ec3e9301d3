"""A connector (or a cache manager) dropped without close(): the GC runs the
finalizers on whatever thread collects, possibly one of the connector's own
threads holding the lock close() needs. The finalizer path must only signal
the threads; they send what is queued for up to write_behind_close_timeout_ms,
drop the rest, release what they hold and exit.

Each collection that could deadlock runs on a helper or connector thread
and is waited on with a generous bound, so a deadlock fails the test
instead of hanging the suite."""

import contextlib
import gc
import threading
import weakref

import pytest
from connector_tools import ConnectorRig
from harness import block_spec, connector_of, make_manager, send, tokens, use_config
from waiting import wait_until

import aibrix_eic.engine as engine
from aibrix_eic.engine import get_store
from aibrix_eic.util.teardown import OwnThread, close_may_wait

BLOCK = 4096
BOUND_S = 20.0  # a deadlock, not a speed goal: the work takes well under a second


def connector_threads() -> list[threading.Thread]:
    """Threads of connectors (the process-wide metrics sampler aside)."""
    return [t for t in threading.enumerate() if t.name.startswith("aibrix_eic_") and t.name != "aibrix_eic_metrics"]


def wait_threads_end(threads_before: int) -> None:
    wait_until(
        lambda: len(connector_threads()) <= threads_before,
        what="the connector threads to end",
        show=lambda: [t.name for t in connector_threads()],
    )


@contextlib.contextmanager
def no_automatic_gc():
    """Only the collection the test triggers may free the dropped objects:
    an automatic one on the main thread would take the path that may wait."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CollectOnce:
    """Wraps a function: its first call waits until `armed` is set, then
    runs gc.collect() there, on whatever thread (and under whatever lock)
    made the call; `returned` is set once that collection returned."""

    def __init__(self, original) -> None:
        self._original = original
        self._taken = threading.Lock()
        self.armed = threading.Event()
        self.returned = threading.Event()

    def __call__(self, *args, **kwargs):
        if self._taken.acquire(blocking=False) and self.armed.wait(BOUND_S):
            gc.collect()
            self.returned.set()
        return self._original(*args, **kwargs)

    def collect(self) -> bool:
        """Let the collection run; whether it returned within BOUND_S."""
        self.armed.set()
        return self.returned.wait(BOUND_S)


def pending_rig(store: str, **config) -> tuple[ConnectorRig, list]:
    """A write-behind connector with writes queued and in flight behind a slow engine."""
    config.setdefault("write_behind_close_timeout_ms", 60_000)  # the old close() waited this long
    rig = ConnectorRig(block_nbytes=BLOCK, remote_url=f"local://{store}", put_mode="write_behind", **config).open()
    get_store(store).faults.latency_s = 0.2
    regions = []
    for i in range(6):
        mrs = rig.filled([bytes([i + 1]) * BLOCK])
        assert rig.run(rig.conn.put(key(i), mrs[0])).is_ok()
        rig.release(mrs)  # AIBrix's part: only the connector's reference remains
        regions.append(mrs[0])
    assert rig.conn.health()["write_behind_pending"] > 0, "nothing pending: the test proves nothing"
    return rig, regions


def key(i: int) -> bytes:
    return b"%016d" % i


def read_back(store: str, count: int) -> list[bytes | None]:
    """What a live connector on `store` reads for key(0..count-1): bytes or None (a miss)."""
    reader = ConnectorRig(block_nbytes=BLOCK, remote_url=f"local://{store}", put_mode="direct").open()
    try:
        found: list[bytes | None] = []
        for i in range(count):
            mr = reader.blocks(1)[0]
            status = reader.run(reader.conn.get(key(i), mr))
            assert status.is_ok() or status.is_not_found(), status
            found.append(reader.read(mr) if status.is_ok() else None)
            reader.release([mr])
        return found
    finally:
        reader.close()


def drop(rig: ConnectorRig) -> weakref.ref:
    """Make the connector cyclic garbage, as a manager with L1 on is."""
    conn = rig.conn
    conn._cycle = conn
    ref = weakref.ref(conn)
    rig.conn = None
    del conn
    return ref


def assert_let_go(ref: weakref.ref, regions: list, threads_before: int) -> None:
    assert ref() is None, "the collection did not free the dropped connector"
    wait_threads_end(threads_before)
    wait_until(lambda: all(mr.ref_count == 0 for mr in regions), what="every pending write's region released")


def test_a_collection_on_the_watcher_holding_the_table_lock_returns_and_lets_go():
    """The watcher runs drop_aged under the table lock: a GC there that frees
    its own connector used to deadlock in close() (plain Lock re-acquired)."""
    threads_before = len(connector_threads())
    rig, regions = pending_rig("gc-watcher")
    store = get_store("gc-watcher")
    table = rig.conn.write_behind.table
    table.drop_aged = collector = CollectOnce(table.drop_aged)  # the watcher calls it every tick
    try:
        with no_automatic_gc():
            ref = drop(rig)
            assert collector.collect(), "the GC on the watcher thread never returned: close() blocked in a finalizer"
        assert_let_go(ref, regions, threads_before)
        assert not table.queued and not table.inflight
    finally:
        store.faults.clear()
        rig.loop.close()


def test_a_collection_inside_a_flush_call_does_not_wait_for_that_flush(monkeypatch):
    """A data-pool thread in the middle of an mset collects its own
    connector: the old close() waited write_behind_close_timeout_ms for the
    flush that this very thread was carrying."""
    collector = CollectOnce(engine.Client.mset)  # the first flush waits in it until the drop
    monkeypatch.setattr(engine.Client, "mset", lambda client, *args, **kwargs: collector(client, *args, **kwargs))
    threads_before = len(connector_threads())
    rig, regions = pending_rig("gc-flush")
    try:
        with no_automatic_gc():
            ref = drop(rig)
            assert collector.collect(), "the GC on a data-pool thread never returned: close() waited on itself"
        assert_let_go(ref, regions, threads_before)
    finally:
        get_store("gc-flush").faults.clear()
        rig.loop.close()


def test_close_without_waiting_still_sends_queued_writes_and_releases_them():
    threads_before = len(connector_threads())
    rig, regions = pending_rig("gc-nowait")
    try:
        assert rig.conn.close(wait=False).is_ok()
        # It returned before the flush (each call takes 0.2 s): the threads finish the job.
        assert rig.conn.health()["write_behind_pending"] > 0, "close(wait=False) waited for the flush"
        wait_threads_end(threads_before)
        wait_until(lambda: all(mr.ref_count == 0 for mr in regions), what="every region released")
        health = rig.conn.health()
        assert not health["open"] and health["write_behind_pending"] == 0
        assert health["write_behind_lost"] == 0 and len(get_store("gc-nowait")) == len(regions)
        assert rig.conn.close().is_ok()  # an explicit close afterwards has nothing left to do
        get_store("gc-nowait").faults.clear()
        found = read_back("gc-nowait", len(regions))  # a live reader: the exact bytes put, or a miss
        assert all(data in (None, bytes([i + 1]) * BLOCK) for i, data in enumerate(found)), found
    finally:
        get_store("gc-nowait").faults.clear()
        rig.close()


def test_close_without_waiting_drops_what_it_cannot_send_within_the_close_timeout():
    """A hung EIC: the background flush gives up at write_behind_close_timeout_ms,
    drops what is still queued (misses) and lets go of it; a call still hanging
    releases its regions when it returns."""
    threads_before = len(connector_threads())
    rig, regions = pending_rig("gc-hung", write_behind_close_timeout_ms=300)
    store = get_store("gc-hung")
    store.faults.latency_s = 3.0  # the calls from now on hang far past the flush's time
    table = rig.conn.write_behind.table
    try:
        for version in (1, 2):  # the second waits for the first, in flight until the flush's time is up
            mrs = rig.filled([bytes([0xE0 + version]) * BLOCK])
            assert rig.run(rig.conn.put(key(99), mrs[0])).is_ok()
            rig.release(mrs)
            regions += mrs
            if version == 1:
                wait_until(lambda: not table.queued, what="version 1 in flight")
        assert table.queued, "nothing left queued behind the hung call: the test proves nothing"
        assert rig.conn.close(wait=False).is_ok()
        wait_until(
            lambda: rig.conn.health()["write_behind_lost"] > 0, 2.0, "the hung write counted lost", show=rig.conn.health
        )
        wait_threads_end(threads_before)
        wait_until(lambda: all(mr.ref_count == 0 for mr in regions), what="every region released")
        health = rig.conn.health()
        assert health["write_behind_pending"] == 0
        assert health["write_behind_lost"] + len(store) == len(regions), health
    finally:
        store.faults.clear()
        rig.close()


def test_close_may_wait_only_outside_finalizers_and_our_threads():
    seen: dict[str, bool] = {}

    class Finalized:
        def __del__(self):
            seen["__del__"] = close_may_wait()

    Finalized()
    thread = OwnThread(lambda: seen.__setitem__("own thread", close_may_wait()), "aibrix_eic_test")
    thread.start()
    thread.join()
    other = threading.Thread(target=lambda: seen.__setitem__("other thread", close_may_wait()))
    other.start()
    other.join()
    assert seen == {"__del__": False, "own thread": False, "other thread": True}
    assert close_may_wait()


# ------------------------------------------------------- through AIBrix


@pytest.fixture
def l1_manager_env(monkeypatch, tmp_path):
    spec = block_spec()
    for name, value in {
        "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",  # L1 on: the manager is a reference cycle
        "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(40 * spec.block_nbytes / 1e9),
        "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": "ALL",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "8",
    }.items():
        monkeypatch.setenv(name, value)
    use_config(monkeypatch, tmp_path, remote_url="local://gc-manager", batch_keys=8, warmup_keys=0,
               write_behind_close_timeout_ms=60_000)  # fmt: skip
    get_store("gc-manager").faults.latency_s = 0.05
    yield spec
    get_store("gc-manager").faults.clear()


def test_a_manager_freed_by_a_collection_on_its_watcher_returns_and_lets_go(l1_manager_env):
    """AIBrix's L2Cache.__del__ calls our close() from the collection."""
    threads_before = len(connector_threads())
    cache = make_manager(l1_manager_env)
    assert send(cache, tokens(8, seed=1), seed=1).is_ok()
    connector = connector_of(cache)
    assert connector.health()["write_behind_pending"] > 0, "nothing pending: the test proves nothing"
    table = connector.write_behind.table
    table.drop_aged = collector = CollectOnce(table.drop_aged)
    with no_automatic_gc():
        manager, conn = weakref.ref(cache), weakref.ref(connector)
        del cache, connector
        assert collector.collect(), "the GC on the watcher thread never returned: close() blocked in L2Cache.__del__"
    assert manager() is None and conn() is None, "the collection did not free the dropped manager"
    wait_threads_end(threads_before)
    assert not table.queued and not table.inflight and table.held_bytes == 0


def test_managers_dropped_with_pending_writes_under_gc_threshold_one(l1_manager_env):
    """The reported setting: every allocation may collect, on any thread."""
    threads_before = len(connector_threads())
    managers: list[weakref.ref] = []
    finished = threading.Event()

    def drop_managers():
        for i in range(4):
            cache = make_manager(l1_manager_env)
            assert send(cache, tokens(4, seed=i), seed=i).is_ok()
            managers.append(weakref.ref(cache))
            del cache
        finished.set()

    thresholds = gc.get_threshold()
    gc.set_threshold(1)
    try:
        worker = threading.Thread(target=drop_managers, daemon=True)
        worker.start()
        assert finished.wait(BOUND_S * 3), "dropping managers hung with gc threshold 1"
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert all(ref() is None for ref in managers), "gc.collect() freed nothing: a collection is stuck"
    wait_threads_end(threads_before)


def test_close_without_waiting_stops_every_thread_in_direct_mode_too():
    """The flusher runs in every put_mode (it clears keys of direct puts that
    outlived their deadline), so the no-wait close must stop it there too."""
    threads_before = len(connector_threads())
    rig = ConnectorRig(block_nbytes=BLOCK, remote_url="local://gc-direct", put_mode="direct").open()
    try:
        assert rig.conn.close(wait=False).is_ok()
        wait_threads_end(threads_before)
    finally:
        rig.close()
