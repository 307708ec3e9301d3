"""A hung EIC: the cache comes back within two probe intervals once EIC
answers again, although the calls that hung still hold their threads, and
neither threads nor SDK clients pile up while it hangs."""

import asyncio
import gc
import threading
import time
import weakref

import pytest
from connector_tools import ConnectorRig
from waiting import wait_until

import aibrix_eic.engine as engine
from aibrix_eic.engine import get_store

PROBE_INTERVAL_S = 0.2
DATA_THREADS = 8


@pytest.fixture
def clients(monkeypatch) -> list[weakref.ref]:
    """Weak references to every engine Client built during the test."""
    built: list[weakref.ref] = []
    original_init = engine.Client.__init__

    def tracked_init(self):
        original_init(self)
        built.append(weakref.ref(self))

    monkeypatch.setattr(engine.Client, "__init__", tracked_init)
    return built


def busy_past_deadline(pool) -> int:
    """Threads of pool whose current call has run past the pool's deadline."""
    now = time.monotonic()
    return sum(since is not None and now - since > pool._stuck_after_s for since in list(pool._busy_since.values()))


@pytest.mark.usefixtures("mexist_miss")
def test_hits_resume_within_two_probe_intervals_after_a_hang_that_filled_the_pool():
    rig = ConnectorRig(
        remote_url="local://hang-recovery", eic_thread_num=DATA_THREADS, batch_keys=1, put_mode="direct",
        get_timeout_ms=300, put_timeout_ms=300, probe_interval_s=PROBE_INTERVAL_S, breaker_failures=2,
    ).open()  # fmt: skip
    store = get_store("hang-recovery")
    try:
        key = b"hang-recovery-k1"
        assert isinstance(rig.run(rig.conn.mput([key], rig.filled([b"h" * rig.block_nbytes]))), list)
        store.faults.latency_s = 3.0

        async def burst():
            targets = rig.blocks(DATA_THREADS)
            try:
                return await asyncio.gather(*[rig.conn.get(key, mr) for mr in targets])
            finally:
                rig.release(targets)

        statuses = rig.run(burst())  # every data thread is now stuck for 3 s
        assert all(status.is_timeout() for status in statuses), statuses
        assert rig.conn.breaker.tripped
        pool = rig.conn.link.data_pool
        wait_until(
            lambda: busy_past_deadline(pool) >= DATA_THREADS,
            what="every data thread's stuck call past the pool's deadline",
            show=lambda: busy_past_deadline(pool),
        )
        trips_at_recovery = rig.conn.breaker.snapshot().trips
        store.faults.latency_s = 0.0
        recovered_at = time.monotonic()

        first_hit = None
        outcomes = []
        while time.monotonic() - recovered_at < 1.5:  # a window, not a wait
            mr = rig.blocks(1)[0]
            status = rig.run(rig.conn.get(key, mr))
            if status.is_ok():
                assert rig.read(mr) == b"h" * rig.block_nbytes
                if first_hit is None:
                    first_hit = time.monotonic() - recovered_at
            outcomes.append(status.is_ok())
            rig.release([mr])
            time.sleep(0.01)

        assert first_hit is not None and first_hit <= 2 * PROBE_INTERVAL_S, first_hit
        assert rig.conn.breaker.snapshot().trips - trips_at_recovery <= 1
        assert all(outcomes[outcomes.index(True) :]), "the breaker flapped after recovery"
        assert rig.conn.link.data_pool.threads <= 2 * DATA_THREADS
    finally:
        store.faults.clear()
        rig.close()


def test_threads_and_clients_stay_bounded_through_a_10s_hang_with_a_fast_probe(clients):
    before = threading.active_count()
    rig = ConnectorRig(
        remote_url="local://hang-bound", eic_thread_num=4, batch_keys=1, probe_interval_s=0.05,
        get_timeout_ms=100, put_timeout_ms=100, exists_timeout_ms=100, breaker_failures=1,
    ).open()  # fmt: skip
    store = get_store("hang-bound")
    # data pool <= 2 x 4, metadata pool <= 2 x 4, the prober: the bound this test holds the connector to
    bound = 2 * 4 + 2 * 4 + 1
    try:
        store.faults.latency_s = 10.0
        peak = 0
        hang_ends = time.monotonic() + 10.0
        while time.monotonic() < hang_ends:  # a window, not a wait
            mrs = rig.blocks(1)

            async def get_and_exists(mr=mrs[0]):
                return await asyncio.gather(rig.conn.get(b"hang-bound-k-01", mr), rig.conn.exists(b"hang-bound-k-02"))

            rig.run(get_and_exists())
            rig.release(mrs)
            peak = max(peak, threading.active_count() - before)
            time.sleep(0.05)
        assert rig.conn.breaker.tripped
        assert peak <= bound, f"{peak} threads over the bound of {bound}"
        gc.collect()
        alive = sum(1 for ref in clients if ref() is not None)
        assert alive <= 2, f"{alive} SDK clients alive"
        assert len(clients) <= 2  # a call that hangs is no reason for a new client
    finally:
        store.faults.clear()
        rig.close()


def test_clients_a_failing_probe_builds_are_let_go(clients):
    rig = ConnectorRig(remote_url="local://probe-clients", probe_interval_s=0.02, breaker_failures=1).open()
    store = get_store("probe-clients")
    try:
        store.faults.fail_rate = 1.0  # every call fails outright: each probe tries a new client
        rig.conn.breaker.trip("test")
        wait_until(
            lambda: len(clients) > 10, what="more than 10 clients built by failing probes", show=lambda: len(clients)
        )
        gc.collect()
        alive = sum(1 for ref in clients if ref() is not None)
        assert alive <= 3, f"{alive} of {len(clients)} SDK clients still alive"
    finally:
        store.faults.clear()
        rig.close()
