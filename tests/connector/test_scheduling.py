"""Gets are scheduled ahead of queued puts; exists never waits behind data."""

import asyncio
import threading

from connector_tools import ConnectorRig
from waiting import wait_until

import aibrix_eic.engine as engine
from aibrix_eic.link.pool import GET_PRIORITY, PUT_PRIORITY, PriorityThreadPool


def test_pool_runs_lower_priority_values_first():
    pool = PriorityThreadPool(1, "sched_test")
    gate = threading.Event()
    order = []
    pool.submit(gate.wait)
    futures = [pool.submit(order.append, f"put{i}", priority=PUT_PRIORITY) for i in range(3)]
    futures += [pool.submit(order.append, f"get{i}", priority=GET_PRIORITY) for i in range(3)]
    gate.set()
    for future in futures:
        future.result(timeout=5)
    assert order == ["get0", "get1", "get2", "put0", "put1", "put2"]
    pool.shutdown()


def test_pool_shutdown_cancels_queued_work_and_threads_are_daemons():
    pool = PriorityThreadPool(1, "sched_test")
    gate, started = threading.Event(), threading.Event()

    def hold():
        started.set()
        return gate.wait()

    running = pool.submit(hold)
    assert started.wait(5)
    ours = [thread for thread in threading.enumerate() if thread.name.startswith("sched_test_")]
    queued = pool.submit(lambda: "never")
    pool.shutdown()
    assert queued.cancelled()
    gate.set()
    assert running.result(timeout=5) is True
    assert ours and all(thread.daemon for thread in ours)


def test_get_overtakes_queued_puts(monkeypatch):
    # direct: asserts how the put's own calls queue; write-behind's counterpart is in test_write_behind.py
    rig = ConnectorRig(remote_url="local://sched", eic_thread_num=1, batch_keys=1, put_mode="direct").open()
    calls = []
    first_put_running = threading.Event()
    original_mset, original_mget = engine.Client.mset, engine.Client.mget

    def mset(self, *args):
        calls.append("mset")
        if not first_put_running.is_set():
            first_put_running.set()  # the one pool thread is here until the get is queued behind the puts
            pool = rig.conn.link.data_pool
            wait_until(lambda: pool.waiting_ahead_of(PUT_PRIORITY), what="the get queued ahead of the puts")
        return original_mset(self, *args)

    def mget(self, *args):
        calls.append("mget")
        return original_mget(self, *args)

    try:
        rig.run(rig.conn.mput([b"hot-key-00000000"], rig.filled([b"h" * 4096])))
        first_put_running.set()  # only the request below waits for its get
        calls.clear()
        first_put_running.clear()
        monkeypatch.setattr(engine.Client, "mset", mset)
        monkeypatch.setattr(engine.Client, "mget", mget)
        put_keys = [bytes([i]) * 16 for i in range(6)]
        put_mrs = rig.filled([bytes([i]) * 4096 for i in range(6)])
        get_mrs = rig.blocks(1)

        async def both():
            put_task = asyncio.ensure_future(rig.conn.mput(put_keys, put_mrs))
            # the first put chunk is on the thread
            await asyncio.to_thread(wait_until, first_put_running.is_set, what="the first put chunk running")
            statuses = await rig.conn.mget([b"hot-key-00000000"], get_mrs)
            await put_task
            return statuses

        statuses = rig.run(both())
        assert statuses[0].is_ok()
        # One put chunk was already running; the get went next, not 6th.
        assert calls == ["mset", "mget"] + ["mset"] * 5, calls
    finally:
        rig.close()
