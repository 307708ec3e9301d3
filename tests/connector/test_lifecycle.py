"""open() and close(): idempotent, and close really lets go."""

import pytest
import torch
from connector_tools import ConnectorRig
from waiting import wait_until

import aibrix_eic.engine as engine
from aibrix_eic.link.sdk import FAIL, CallResult


def test_open_and_close_are_idempotent_and_close_drops_client_and_registrations():
    rig = ConnectorRig(remote_url="local://life").open()
    try:
        assert rig.conn.open().is_ok()  # second open: no new client
        first_session = rig.conn.link.session
        assert rig.conn.open().is_ok() and rig.conn.link.session is first_session
        slab = torch.zeros(1 << 20, dtype=torch.uint8)
        assert rig.conn.register_slabs([slab]).is_ok()
        assert rig.conn.health()["registered_regions"] == 1
        assert rig.conn.close().is_ok()
        assert rig.conn.close().is_ok()
        health = rig.conn.health()
        assert not health["open"] and not health["connected"] and health["registered_regions"] == 0
        assert rig.run(rig.conn.exists(b"k" * 16)).is_invalid()
    finally:
        rig.close()


def test_reopen_after_close_reaches_the_same_data():
    rig = ConnectorRig(remote_url="local://life").open()
    try:
        key = b"persisted-key-00"
        assert isinstance(rig.run(rig.conn.mput([key], rig.filled([b"p" * 4096]))), list)
        rig.conn.close()
        assert rig.conn.open().is_ok()
        mrs = rig.blocks(1)
        assert rig.run(rig.conn.get(key, mrs[0])).is_ok()
        assert rig.read(mrs[0]) == b"p" * 4096
    finally:
        rig.close()


def test_slabs_registered_again_on_a_new_client_after_reconnect(monkeypatch):
    registrations = []
    original = engine.Client.register_memory

    def spy(self, buffers, info=None):
        registrations.append((id(self), len(buffers)))
        return original(self, buffers, info)

    monkeypatch.setattr(engine.Client, "register_memory", spy)
    rig = ConnectorRig(remote_url="local://life", probe_interval_s=0.05, breaker_failures=1).open()
    try:
        slab = torch.zeros(1 << 20, dtype=torch.uint8)
        rig.conn.register_slabs([slab])
        old_client = rig.conn.link.session.client
        # Make the current client stop answering, so the probe builds a new one.
        monkeypatch.setattr(old_client, "mexist", lambda keys: engine_failure(len(keys)))
        rig.conn.breaker.trip("test")
        wait_until(lambda: not rig.conn.breaker.tripped, what="the probe to close the breaker")
        assert rig.conn.link.session.client is not old_client
        assert len({client for client, _ in registrations}) == 2
        assert rig.conn.link.session.regions == {(slab.data_ptr(), slab.numel())}
    finally:
        rig.close()


def engine_failure(nkeys):
    return CallResult([FAIL] * nkeys, True, "mexist FAILED (test)")


@pytest.mark.usefixtures("mexist_miss")
def test_close_answers_exists_calls_still_queued():
    """close() cancels queued mexist calls; their callers must still get an
    answer instead of waiting forever."""
    import asyncio

    rig = ConnectorRig(remote_url="local://life?latency=300ms", batch_keys=1, exists_timeout_ms=60_000).open()
    try:
        keys = [bytes([i]) * 16 for i in range(8)]  # 8 calls for 4 metadata threads

        async def exists_then_close():
            pending = asyncio.gather(*[rig.conn.exists(key) for key in keys])
            pool = rig.conn.link.meta_pool
            await asyncio.to_thread(
                wait_until,
                lambda: pool._queue.qsize() == 4 and sum(t is not None for t in pool._busy_since.values()) == 4,
                what="four calls running, four queued",
            )
            rig.conn.close()
            return await asyncio.wait_for(pending, timeout=5)

        statuses = rig.run(exists_then_close())
        assert sum(status.is_cancelled() for status in statuses) == 4
        assert all(status.is_cancelled() or status.is_not_found() for status in statuses)
    finally:
        rig.close()


@pytest.mark.usefixtures("mexist_miss")
def test_an_event_loop_closed_before_its_exists_flush_is_not_kept():
    import asyncio
    import gc
    import weakref

    rig = ConnectorRig(remote_url="local://life").open()
    try:
        doomed = asyncio.SelectorEventLoop()  # a stdlib loop (uvloop's are not collected at all)
        doomed.create_task(rig.conn.exists(b"k" * 16))
        doomed.call_soon(doomed.stop)  # runs before the flush the exists() scheduled
        doomed.run_forever()
        doomed.close()
        doomed_ref = weakref.ref(doomed)
        del doomed
        assert rig.run(rig.conn.exists(b"j" * 16)).is_not_found()  # the connector still answers
        gc.collect()
        assert doomed_ref() is None, "the connector still holds the closed loop"
    finally:
        rig.close()


def test_get_batches_of_unusable_input_is_no_batch_not_an_exception():
    rig = ConnectorRig(remote_url="local://life").open()
    try:
        assert rig.conn.get_batches(None, None, 8) == []
        assert rig.conn.get_batches([], [], 8) == []
    finally:
        rig.close()
