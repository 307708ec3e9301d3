"""`aibrix_eic_sdk_calls` counts every SDK call the data path makes: the
series must equal what the engine itself saw, with writes pending, failed
flushes (their clearing mdel), re-deletes of lost keys, user deletes and
exists in the mix. Probes and the warm-up are not data calls (no outage here,
warmup_keys=0), so the two counts must match exactly."""

import uuid

import pytest
from connector_tools import ConnectorRig
from prometheus_client import REGISTRY
from waiting import wait_until

import aibrix_eic.engine as engine
from aibrix_eic.engine import get_store

BLOCK = 4096
SDK_OP = {"mget": "get", "mset": "put", "mexist": "exists", "mdel": "delete"}


@pytest.fixture
def engine_calls(monkeypatch):
    """SDK calls the engine answered, by the series' op name."""
    calls = dict.fromkeys(SDK_OP.values(), 0)
    for name, op in SDK_OP.items():
        original = getattr(engine.Client, name)

        def spy(self, keys, *args, _original=original, _op=op, **kwargs):
            calls[_op] += 1
            return _original(self, keys, *args, **kwargs)

        monkeypatch.setattr(engine.Client, name, spy)
    return calls


def series(rig: ConnectorRig, op: str) -> float:
    labels = {**rig.conn._metrics.labels, "op": op}
    return REGISTRY.get_sample_value("aibrix_eic_sdk_calls_total", labels) or 0.0


def test_sdk_calls_series_equals_the_engines_count(engine_calls):
    store = f"calls-{uuid.uuid4().hex[:8]}"
    rig = ConnectorRig(
        block_nbytes=BLOCK, remote_url=f"local://{store}", eic_kv_ns=store, put_mode="write_behind",
        retry_attempts=0, breaker_failures=10_000,
    ).open()  # fmt: skip
    faults = get_store(store).faults
    conn = rig.conn
    try:
        keys = [bytes([i]) * 16 for i in range(6)]
        mrs = rig.filled([bytes([i]) * BLOCK for i in range(3)])
        assert all(s.is_ok() for s in rig.run(conn.mput(keys[:3], mrs)))
        rig.release(mrs)
        assert conn.write_behind.wait_idle(10)
        faults.latency_s = 0.05  # the next writes stay pending while reads and exists run
        mrs = rig.filled([b"p" * BLOCK])
        assert rig.run(conn.put(keys[3], mrs[0])).is_ok()
        rig.release(mrs)
        got = rig.blocks(2)
        assert all(s.is_ok() for s in rig.run(conn.mget([keys[3], keys[0]], got)))  # one pending, one from EIC
        rig.release(got)
        assert rig.run(conn.exists(keys[5])).is_not_found()  # asks EIC: a mexist
        assert conn.write_behind.wait_idle(10)
        faults.latency_s = 0.0
        faults.fail_rate = 1.0  # a flush fails, and so does its clearing mdel: the key is lost
        mrs = rig.filled([b"f" * BLOCK])
        assert rig.run(conn.put(keys[4], mrs[0])).is_ok()
        rig.release(mrs)
        wait_until(lambda: conn.health()["write_behind_lost_keys"] == 1, what="one lost key", show=conn.health)
        faults.fail_rate = 0.0  # the flusher re-deletes the lost key
        wait_until(
            lambda: conn.health()["write_behind_lost_keys"] == 0, what="the lost key re-deleted", show=conn.health
        )
        assert rig.run(conn.delete(keys[1])).is_ok()  # a user delete
        assert conn.write_behind.wait_idle(10)
        rig.quiesce()
        conn._metrics.publish()
        assert all(engine_calls[op] for op in SDK_OP.values()), engine_calls
        assert {op: series(rig, op) for op in engine_calls} == engine_calls
        assert REGISTRY.get_sample_value("aibrix_eic_sdk_calls_in_flight", conn._metrics.labels) == 0
    finally:
        faults.clear()
        rig.close()
