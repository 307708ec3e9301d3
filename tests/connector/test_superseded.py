"""No superseded value is ever served (docs/write-behind.md, "ordering"):
once a write or delete of a key returned, no older value of that key may
be read again, also when the older write's SDK call is still running."""

import asyncio
import time

import pytest
from connector_tools import ConnectorRig
from waiting import wait_until

from aibrix_eic.engine import get_store

BLOCK = 4096
KEY = b"s" * 16


def payload(version: int) -> bytes:
    return version.to_bytes(4, "little") * (BLOCK // 4)


@pytest.fixture
def make_rig():
    rigs = []

    def make(**config) -> ConnectorRig:
        config.setdefault("remote_url", "local://superseded")
        config.setdefault("breaker_failures", 1000)
        rig = ConnectorRig(block_nbytes=BLOCK, **config).open()
        rig.store = get_store("superseded")
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.store.faults.clear()
        rig.close()


async def read(rig) -> tuple:
    mr = rig.blocks(1)[0]
    try:
        status = await rig.conn.get(KEY, mr)
        return status, rig.read(mr)
    finally:
        rig.release([mr])


async def put(rig, version: int):
    mrs = rig.filled([payload(version)])
    try:
        return await rig.conn.put(KEY, mrs[0])
    finally:
        rig.release(mrs)  # what AIBrix does once put returned


async def until(predicate, what: str) -> None:
    """wait_until off the loop, so the loop's tasks run meanwhile."""
    await asyncio.to_thread(wait_until, predicate, what=what)


@pytest.mark.parametrize("put_mode", ["write_behind", "coalesce"])
def test_a_delete_racing_an_overwrite_never_serves_the_older_value(make_rig, put_mode):
    """put(v1) in flight, put(v2) queued behind it, then delete: from the
    moment the delete starts, v1 must never be read (it was superseded by v2
    before the delete began)."""
    rig = make_rig(put_mode=put_mode)
    table = rig.conn.write_behind.table
    rig.store.faults.latency_s = 0.3

    async def scenario():
        first = asyncio.create_task(put(rig, 1))
        await until(lambda: bool(table.inflight), "v1 in flight")
        second = asyncio.create_task(put(rig, 2))
        await until(lambda: bool(table.queued), "v2 queued")
        if put_mode == "write_behind":
            assert (await second).is_ok()
        delete = asyncio.create_task(rig.conn.delete(KEY))
        reads = []
        while not delete.done():
            reads.append(await read(rig))
            await asyncio.sleep(0.02)
        reads.append(await read(rig))
        await asyncio.gather(first, second)
        return delete.result(), reads

    status, reads = rig.run(scenario(), timeout=10)
    assert status.is_ok() or status.is_not_found(), status
    assert len(reads) >= 5, "the delete ran long enough to be read across"
    served = [data for read_status, data in reads if read_status.is_ok()]
    assert payload(1) not in served, f"the superseded v1 was served {served.count(payload(1))} times"
    assert not reads[-1][0].is_ok(), "after the delete the key is a miss"
    assert rig.conn.write_behind.wait_idle(5)
    rig.quiesce()
    assert not rig.run(read(rig))[0].is_ok()


def test_a_direct_put_that_timed_out_never_lands_over_a_newer_one(make_rig):
    """put(v1) times out while its mset still runs; put(v2) returns OK; the
    late v1 must never be read, neither before nor after it lands."""
    rig = make_rig(put_mode="direct", put_timeout_ms=50)
    rig.store.faults.latency_s = 0.4

    async def scenario():
        first = await put(rig, 1)
        rig.store.faults.latency_s = 0.0
        second = await put(rig, 2)
        reads = []
        deadline = time.monotonic() + 0.8  # past the moment the late v1 lands
        while time.monotonic() < deadline:  # a window, not a wait
            reads.append(await read(rig))
            await asyncio.sleep(0.02)
        return first, second, reads

    first, second, reads = rig.run(scenario(), timeout=10)
    assert first.error_code.name == "TIMEOUT", first
    assert second.is_ok(), second
    served = [data for status, data in reads if status.is_ok()]
    assert payload(1) not in served, f"the timed-out v1 was served {served.count(payload(1))} times"
    rig.quiesce()
    status, data = rig.run(read(rig))
    assert not status.is_ok() or data == payload(2)
