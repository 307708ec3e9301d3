"""The per-request reuse line (observability/reuse.py): what each get
loaded, at DEBUG, and a summary at INFO at most once per interval, never
naming a key."""

import logging

import pytest
from connector_tools import ConnectorRig

from aibrix_eic.observability.reuse import ReuseLog

BLOCK = 4096
KEYS = [bytes([i]) * 16 for i in range(1, 7)]


@pytest.fixture
def rig():
    rig = ConnectorRig(block_nbytes=BLOCK, remote_url="local://reuse-log", put_mode="direct").open()
    yield rig
    rig.close()


def test_each_get_logs_the_blocks_it_loaded_and_no_key(rig, caplog):
    stored = rig.filled([bytes([i]) * BLOCK for i in range(4)])
    assert all(s.is_ok() for s in rig.run(rig.conn.mput(KEYS[:4], stored)))
    rig.release(stored)
    caplog.set_level(logging.DEBUG, logger="aibrix_eic.observability.reuse")
    mrs = rig.blocks(6)
    statuses = rig.run(rig.conn.mget(KEYS, mrs))  # 4 stored, 2 never were
    rig.release(mrs)
    assert [s.is_ok() for s in statuses] == [True] * 4 + [False] * 2
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "aibrix_eic.observability.reuse" and r.levelno == logging.DEBUG
    ]
    assert len(lines) == 1
    assert lines[0].startswith("EIC get: 4 of 6 blocks loaded (16.0KiB) in ")
    for key in KEYS:
        assert key.hex() not in lines[0] and repr(key) not in lines[0]


def test_no_debug_line_when_debug_is_off(rig, caplog):
    caplog.set_level(logging.INFO, logger="aibrix_eic.observability.reuse")
    mrs = rig.blocks(2)
    rig.run(rig.conn.mget(KEYS[:2], mrs))
    rig.release(mrs)
    assert not [r for r in caplog.records if r.name == "aibrix_eic.observability.reuse" and r.levelno == logging.DEBUG]


def test_the_info_summary_comes_once_per_interval_with_the_totals_since_the_last(caplog):
    now = [0.0]
    reuse = ReuseLog(interval_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="aibrix_eic.observability.reuse")
    for second in range(0, 60, 10):  # 6 gets inside one interval: no summary yet
        now[0] = float(second)
        reuse.get(asked=8, loaded=6, nbytes=6 * BLOCK, seconds=0.001)
    assert not caplog.records
    now[0] = 61.0
    reuse.get(asked=8, loaded=2, nbytes=2 * BLOCK, seconds=0.001)  # the 7th closes the interval
    assert [r.getMessage() for r in caplog.records] == [
        "EIC reuse, last 61 s: 7 get requests loaded 38 of 56 blocks (67.9%), 152.0KiB"
    ]
    caplog.clear()
    now[0] = 62.0
    reuse.get(asked=4, loaded=4, nbytes=4 * BLOCK, seconds=0.001)
    assert not caplog.records  # counted from 61 s on
    now[0] = 125.0
    reuse.get(asked=4, loaded=0, nbytes=0, seconds=0.001)
    assert [r.getMessage() for r in caplog.records] == [
        "EIC reuse, last 64 s: 2 get requests loaded 4 of 8 blocks (50.0%), 16.0KiB"
    ]
