"""An EIC outage mid-workload, through AIBrix's real BaseKVCacheManager:
operations keep returning within their deadlines (as misses), and the cache
comes back by itself once EIC does."""

import logging
import time

import pytest
from harness import (
    BLOCK_NTOKENS,
    block_spec,
    connector_of,
    make_manager,
    manager_env,
    receive,
    send,
    tokens,
    use_config,
    wait_flushed,
)
from waiting import wait_until

from aibrix_eic.engine import get_store

PROBE_INTERVAL_S = 0.3
GET_TIMEOUT_MS = 150
EXISTS_TIMEOUT_MS = 100
PUT_TIMEOUT_MS = 200
SLACK_S = 0.25  # thread hops and a loaded 2-core CI machine


@pytest.fixture
def manager(monkeypatch, tmp_path):
    manager_env(monkeypatch)
    use_config(
        monkeypatch,
        tmp_path,
        remote_url="local://outage",
        get_timeout_ms=GET_TIMEOUT_MS,
        exists_timeout_ms=EXISTS_TIMEOUT_MS,
        put_timeout_ms=PUT_TIMEOUT_MS,
        breaker_failures=3,
        probe_interval_s=PROBE_INTERVAL_S,
        retry_attempts=1,
    )
    cache = make_manager(block_spec())
    yield cache
    get_store("outage").faults.clear()
    cache.close()


def offload(cache, query, seed):
    return send(cache, query, seed)


def reload_tokens(cache, query) -> int:
    return receive(cache, query)[0]


def timed(fn):
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


def breaker_of(cache):
    return connector_of(cache).breaker


@pytest.mark.usefixtures("mexist_miss")
@pytest.mark.parametrize("failure", ["unreachable", "hanging"])
def test_outage_gives_fast_misses_then_the_cache_returns_by_itself(manager, failure, caplog):
    store = get_store("outage")
    query = tokens(8, seed=1)
    assert offload(manager, query, seed=1).is_ok()
    wait_flushed(manager)  # in EIC before the outage, not only in the pending writes
    assert reload_tokens(manager, query) == 8 * BLOCK_NTOKENS

    # 1. EIC goes away mid-workload.
    if failure == "unreachable":
        store.faults.unreachable = True
    else:
        store.faults.latency_s = 5.0  # every call hangs far past its deadline
    with caplog.at_level(logging.WARNING, logger="aibrix_eic"):
        for round_ in range(6):
            status, took = timed(lambda: manager.exists(None, query))
            assert not status.is_ok()
            assert took < EXISTS_TIMEOUT_MS / 1000 + SLACK_S
            ntokens, took = timed(lambda: reload_tokens(manager, query))
            assert ntokens == 0
            assert took < GET_TIMEOUT_MS / 1000 + SLACK_S
            status, took = timed(lambda r=round_: offload(manager, tokens(2, seed=100 + r), seed=r))
            assert took < PUT_TIMEOUT_MS / 1000 + SLACK_S
    assert breaker_of(manager).tripped
    assert any("circuit OPEN" in record.getMessage() for record in caplog.records)

    # Once open, the manager's calls no longer wait on EIC at all: refused before any SDK call.
    fast_fails = connector_of(manager).health()["fast_fails"]
    _, took = timed(lambda: reload_tokens(manager, query))
    assert connector_of(manager).health()["fast_fails"] > fast_fails
    assert took < SLACK_S

    # 2. EIC comes back: hits resume within the probe interval, nobody reopens.
    store.faults.clear()
    wait_until(
        lambda: reload_tokens(manager, query) == 8 * BLOCK_NTOKENS,
        PROBE_INTERVAL_S + EXISTS_TIMEOUT_MS / 1000 + 2.0,
        "hits to resume within the probe interval",
    )
    assert not breaker_of(manager).tripped
    assert manager.exists(None, query).get() == 8 * BLOCK_NTOKENS


@pytest.mark.usefixtures("mexist_miss")
def test_open_with_eic_down_serves_misses_then_connects(monkeypatch, tmp_path):
    manager_env(monkeypatch)
    get_store("down-at-start").faults.unreachable = True
    use_config(monkeypatch, tmp_path, remote_url="local://down-at-start", probe_interval_s=PROBE_INTERVAL_S)
    cache = make_manager(block_spec())  # must not raise: fail-open
    try:
        query = tokens(4, seed=2)
        assert reload_tokens(cache, query) == 0
        assert breaker_of(cache).tripped
        assert "init returned -1" in connector_of(cache).health()["breaker_reason"]
        get_store("down-at-start").faults.clear()
        wait_until(
            lambda: not breaker_of(cache).tripped, PROBE_INTERVAL_S + 2.0, "the probe to connect within its interval"
        )
        assert offload(cache, query, seed=2).is_ok()
        assert reload_tokens(cache, query) == 4 * BLOCK_NTOKENS
        # Slabs given to register_slabs while down were registered on connect.
        connector = connector_of(cache)
        assert connector.link.regions.all() and connector.link.session.regions == set(connector.link.regions.all())
    finally:
        get_store("down-at-start").faults.clear()
        cache.close()


def test_fail_closed_open_reports_the_error_and_can_be_retried(monkeypatch, tmp_path):
    from connector_tools import ConnectorRig

    get_store("strict").faults.unreachable = True
    rig = ConnectorRig(remote_url="local://strict", fail_open=False)
    try:
        status = rig.conn.open()
        assert status.is_error()
        assert "init returned -1" in str(status.value) and "unreachable" in str(status.value)
        get_store("strict").faults.clear()
        assert rig.conn.open().is_ok()
        assert rig.conn.open().is_ok()  # idempotent
        assert rig.conn.health()["connected"]
    finally:
        rig.close()


def test_partial_failures_do_not_trip_the_breaker(monkeypatch, tmp_path):
    from connector_tools import ConnectorRig

    rig = ConnectorRig(remote_url="local://flaky?key_fail_rate=0.3&seed=3", breaker_failures=2, retry_attempts=0).open()
    try:
        for i in range(30):
            rig.run(rig.conn.mput([bytes([i]) * 16, bytes([i + 100]) * 16], rig.filled([b"a" * 4096, b"b" * 4096])))
        assert not rig.conn.breaker.tripped
        assert rig.conn.health()["put_failures"] > 0
    finally:
        rig.close()


def test_failed_keys_are_retried_and_misses_are_not(monkeypatch):
    from connector_tools import ConnectorRig

    import aibrix_eic.engine as engine

    rig = ConnectorRig(remote_url="local://retry", retry_attempts=3, retry_backoff_ms=1, retry_backoff_max_ms=2).open()
    calls = []
    original = engine.Client.mget

    def flaky_mget(self, keys, option, vals):
        calls.append(list(keys))
        status, vals, outcome = original(self, keys, option, vals)
        if len(calls) == 1:  # first call: the first key fails in transit
            outcome.status_codes[0] = engine.StatusCode.FAILED
        return status, vals, outcome

    try:
        payload = b"x" * 4096
        rig.run(rig.conn.mput([b"present-key-0000"], rig.filled([payload])))
        monkeypatch.setattr(engine.Client, "mget", flaky_mget)
        mrs = rig.blocks(2)
        statuses = rig.run(rig.conn.mget([b"present-key-0000", b"missing-key-0000"], mrs))
        assert statuses[0].is_ok() and rig.read(mrs[0]) == payload
        assert statuses[1].is_not_found()
        assert len(calls) == 2 and len(calls[1]) == 1  # only the failed key, once
        assert rig.conn.health()["retries"] == 1
    finally:
        rig.close()


def test_late_reply_never_writes_into_reused_memory():
    """A get that times out keeps its memory referenced until the SDK call
    returns, so AIBrix cannot hand that memory to anyone else meanwhile."""
    from connector_tools import ConnectorRig

    rig = ConnectorRig(remote_url="local://late", get_timeout_ms=30, breaker_failures=100).open()
    try:
        rig.run(rig.conn.mput([b"k" * 16], rig.filled([b"v" * 4096])))
        assert rig.conn.write_behind.wait_idle(10)  # the get must go to EIC, not to the pending write
        get_store("late").faults.latency_s = 0.3
        mrs = rig.blocks(1)
        statuses = rig.run(rig.conn.mget([b"k" * 16], mrs))
        assert statuses[0].is_timeout()
        assert mrs[0].ref_count == 2  # ours + the in-flight call's
        rig.release(mrs)  # AIBrix gives up its reference
        assert mrs[0].ref_count == 1  # the memory is not back in the pool yet
        rig.quiesce()
        assert mrs[0].ref_count == 0  # returned only after the late reply
    finally:
        get_store("late").faults.clear()
        rig.close()


def test_rejected_keys_are_not_retried():
    """A store too small for a request rejects its tail; re-sending would only
    evict the blocks this same put just stored."""
    from connector_tools import ConnectorRig

    # direct: asserts the put's own reply; write-behind's counterpart is in test_write_behind.py
    rig = ConnectorRig(remote_url="local://tiny?capacity=8KiB", retry_attempts=3, put_mode="direct").open()
    try:
        keys = [bytes([i]) * 16 for i in range(4)]
        status = rig.run(rig.conn.mput(keys, rig.filled([bytes([i]) * 4096 for i in range(4)])))
        assert status.is_error() and "2 of 4 blocks not stored" in str(status.value)
        assert rig.conn.health()["retries"] == 0
        mrs = rig.blocks(4)
        statuses = rig.run(rig.conn.mget(keys, mrs))
        assert [s.is_ok() for s in statuses] == [True, True, False, False]
        assert rig.read(mrs[1]) == bytes([1]) * 4096
    finally:
        rig.close()


def test_large_blocks_are_split_into_several_concurrent_calls(monkeypatch):
    from connector_tools import ConnectorRig

    import aibrix_eic.engine as engine

    sizes = []
    original = engine.Client.mset

    def spy(self, keys, vals, option):
        sizes.append(len(keys))
        return original(self, keys, vals, option)

    monkeypatch.setattr(engine.Client, "mset", spy)
    # direct: asserts the split of the put's own calls; write-behind's counterpart is in test_write_behind.py
    rig = ConnectorRig(
        remote_url="local://split", block_nbytes=1 << 20, batch_bytes="4MiB", capacity=64 << 20, put_mode="direct"
    ).open()
    try:
        keys = [bytes([i]) * 16 for i in range(10)]
        statuses = rig.run(rig.conn.mput(keys, rig.blocks(10)))
        assert all(s.is_ok() for s in statuses)
        assert sorted(sizes) == [2, 4, 4]
    finally:
        rig.close()
