"""Randomized linearizability checker: many tasks on one event
loop hammer one EICConnector on the embedded engine with overwrites (every
put writes new bytes), gets, deletes and exists, while a fault task flips the
engine's latency (sometimes far past the deadlines, so calls time out while
their SDK call still runs), failures and reachability, and a lifecycle task
closes and reopens the connector. Every put mode runs it. Some operations
come as bursts on one key (puts, deletes and gets a few ms, or a deadline,
apart), since the races that serve an older value need several operations
on one key within one flush.

The history is checked by tests/support/linearizability.py. Its rule: every get reported OK returns a value not superseded by a write
that returned OK before the get started (a put returning OK, or a delete
returning OK or NOT_FOUND, that started after the version's put returned and
ended before the get started); the bytes are always one whole version of the
key. A put that failed or timed out may still land, but only before it
returned to its caller. Misses are always allowed.

exists() is advisory (a real EIC probes only a value's first slice, and the
engine's phantom hits model that), so its answers are only checked to be
well-formed Statuses, never for staleness.

Also checked: every answer is a Status (or a list of one per key) with an
expected code, mget results are prefix-closed, and no region reference
outlives close(). No assertion depends on timing: the logical clock orders
what the caller saw, and the run's length only decides how much it sees.

CI runs a short derandomized version: fixed seeds (the thread timing still
varies), SECONDS per mode.
By hand: AIBRIX_EIC_CHECKER_SECONDS=120 [AIBRIX_EIC_CHECKER_SEED=n] pytest
tests/connector/test_linearizability.py -s prints what each mode did and found.
"""

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from aibrix_kvcache.status import Status, StatusCodes
from connector_tools import ConnectorRig
from hypothesis import given, settings
from linearizability import FOREIGN, Finding, History, check, decode, explain, payload
from waiting import wait_until

from aibrix_eic.engine import Faults, get_store

SECONDS = float(os.environ.get("AIBRIX_EIC_CHECKER_SECONDS", "4"))
SEED = int(os.environ.get("AIBRIX_EIC_CHECKER_SEED", "7"))
TASKS = 8
NKEYS = 12
BLOCK = 1024
KEYS = [b"linearizable-%02d" % i for i in range(NKEYS)]
KEY_WEIGHTS = [1 / (i + 1) ** 1.5 for i in range(NKEYS)]  # a few hot keys: more races per key
PAUSES_S = [0, 0, 0, 0.0005, 0.002, 0.01]
BURST_GAPS_S = [0, 0.0005, 0.002, 0.005, 0.06]  # 60 ms: past a deadline, so an earlier put may have timed out

CONFIG = {
    "get_timeout_ms": 50,
    "put_timeout_ms": 50,
    "exists_timeout_ms": 50,
    "delete_timeout_ms": 50,
    "retry_attempts": 2,
    "retry_backoff_ms": 1,
    "retry_backoff_max_ms": 4,
    "breaker_failures": 20,  # a stall lasts a while before it trips; "down" trips it at once
    "probe_interval_s": 0.02,
    "batch_keys": 2,  # a 3-key request is two SDK calls
    "write_behind_max_bytes": 6 * BLOCK,  # some write-behind puts wait
    "write_behind_max_age_ms": 150,
    "write_behind_close_timeout_ms": 100,
}
# Engine regimes the fault task switches between (weight, latencies, fail_rate,
# key_fail_rate, unreachable): "slow" keeps flushes in flight while the next
# writes of a key queue behind them; "stalled" calls outlive the 50 ms
# deadlines and land after their caller saw an error; "down" opens the breaker.
REGIMES = {
    "healthy": (3, [0, 0.001], 0.0, 0.0, False),
    "slow": (3, [0.005, 0.02, 0.04], 0.0, 0.0, False),
    "stalled": (3, [0.08, 0.3, 0.3], 0.0, 0.0, False),
    "flaky": (1, [0, 0.005], 0.2, 0.2, False),
    "down": (1, [0, 0.02], 1.0, 0.0, False),
    "unreachable": (0.5, [0], 0.0, 0.0, True),
}
FAULT_HOLD_S = (0.02, 0.2)
CLOSE_EVERY_S = (0.3, 1.0)
ANSWERS = frozenset({StatusCodes.OK, StatusCodes.NOT_FOUND, StatusCodes.ERROR, StatusCodes.TIMEOUT})


class Gate:
    """Data operations run unless a close/reopen is under way; the lifecycle
    task waits until none is in flight (an SDK call that outlived its
    request may still run: that is part of what is tested)."""

    def __init__(self) -> None:
        self.admitting = asyncio.Event()
        self.admitting.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.active = 0

    async def enter(self) -> None:
        while not self.admitting.is_set():
            await self.admitting.wait()
        self.active += 1  # no await since the check: no close can start in between
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    async def exclusive(self) -> None:
        self.admitting.clear()
        await self.idle.wait()

    def readmit(self) -> None:
        self.admitting.set()


@dataclass
class Run:
    rig: ConnectorRig
    store_faults: Faults
    history: History = field(default_factory=History)
    gate: Gate = field(default_factory=Gate)
    counts: Counter = field(default_factory=Counter)
    stop_at: float = 0.0

    def going(self) -> bool:
        return time.monotonic() < self.stop_at

    # -------------------------------------------------------- operations
    async def put(self, keys: tuple[int, ...]) -> None:
        history = self.history
        versions = tuple(history.new_version() for _ in keys)
        mrs = self.rig.filled([payload(key, version, BLOCK) for key, version in zip(keys, versions)])
        op = history.begin("put", keys, versions)
        result = await self.rig.conn.mput([KEYS[key] for key in keys], mrs)
        history.end(op, result, ANSWERS)
        self.rig.release(mrs)
        self.counts["put " + ("ok" if op.all_ok else "failed")] += 1

    async def get(self, keys: tuple[int, ...]) -> None:
        mrs = self.rig.blocks(len(keys))
        op = self.history.begin("get", keys)
        result = await self.rig.conn.mget([KEYS[key] for key in keys], mrs)
        self.history.end(op, result, ANSWERS)
        oks = [code == StatusCodes.OK for code in op.codes]
        if oks != sorted(oks, reverse=True):
            self.history.answers.append(Finding("answer", f"mget of {keys} not prefix-closed: {op.codes}"))
        op.read = tuple(decode(key, self.rig.read(mr)) if ok else None for key, mr, ok in zip(keys, mrs, oks))
        self.rig.release(mrs)
        self.counts["get blocks ok"] += sum(oks)
        self.counts["get blocks missed"] += len(oks) - sum(oks)

    async def delete(self, key: int) -> None:
        op = self.history.begin("delete", (key,))
        self.history.end(op, await self.rig.conn.delete(KEYS[key]), ANSWERS)
        self.counts[f"delete {op.codes[0].name}"] += 1

    async def exists(self, key: int) -> None:
        op = self.history.begin("exists", (key,))
        self.history.end(op, await self.rig.conn.exists(KEYS[key]), ANSWERS)
        self.counts["exists"] += 1

    # ------------------------------------------------------------- tasks
    async def client(self, rng: random.Random) -> None:
        while self.going():
            await self.gate.enter()
            try:
                await self.one_operation(rng)
            finally:
                self.gate.leave()
            await asyncio.sleep(rng.choice(PAUSES_S))

    async def one_operation(self, rng: random.Random) -> None:
        nkeys = rng.choices([1, 2, 3], weights=[7, 2, 1])[0]
        keys: list[int] = []
        while len(keys) < nkeys:  # distinct keys: one request holds a key once
            key = rng.choices(range(NKEYS), weights=KEY_WEIGHTS)[0]
            if key not in keys:
                keys.append(key)
        kind = rng.choices(["put", "get", "delete", "exists", "burst"], weights=[30, 30, 12, 12, 16])[0]
        if kind == "burst":
            await self.burst(keys[0], rng)
        else:
            await self.single(kind, tuple(keys))

    async def single(self, kind: str, keys: tuple[int, ...]) -> None:
        if kind == "put":
            await self.put(keys)
        elif kind == "get":
            await self.get(keys)
        elif kind == "delete":
            await self.delete(keys[0])
        else:
            await self.exists(keys[0])

    async def burst(self, key: int, rng: random.Random) -> None:
        """Several operations on one key at once, each a little behind the
        previous one: overwrites, deletes and reads racing in the queue."""

        async def after(delay_s: float, kind: str) -> None:
            await asyncio.sleep(delay_s)
            await self.single(kind, (key,))

        kinds = rng.choices(["put", "get", "delete"], weights=[4, 4, 2], k=rng.randint(3, 6))
        delay = 0.0
        steps = []
        for kind in kinds:
            steps.append(after(delay, kind))
            delay += rng.choice(BURST_GAPS_S)
        await asyncio.gather(*steps)

    async def faults(self, rng: random.Random) -> None:
        faults = self.store_faults
        names = list(REGIMES)
        weights = [REGIMES[name][0] for name in names]
        while self.going():
            name = rng.choices(names, weights=weights)[0]
            _, latencies, faults.fail_rate, faults.key_fail_rate, faults.unreachable = REGIMES[name]
            faults.latency_s = rng.choice(latencies)
            faults.phantom_rate = rng.choice([0.0, 0.0, 0.3])
            self.counts[f"regime {name}"] += 1
            await asyncio.sleep(rng.uniform(*FAULT_HOLD_S))

    async def lifecycle(self, rng: random.Random) -> None:
        while True:
            await asyncio.sleep(rng.uniform(*CLOSE_EVERY_S))
            if not self.going():
                return
            await self.reopen()

    async def reopen(self) -> None:
        await self.gate.exclusive()
        try:
            self.close()
            status = self.rig.conn.open()
            if not status.is_ok():
                self.history.answers.append(Finding("answer", f"reopen answered {status!r}"))
            self.counts["reopens"] += 1
        finally:
            self.gate.readmit()

    def close(self) -> None:
        self.counts["breaker_trips"] += self.rig.conn.health()["breaker_trips"]  # each open starts a new breaker
        self.rig.conn.close()

    async def workload(self, seconds: float, seed: int) -> None:
        self.stop_at = time.monotonic() + seconds
        tasks = [self.client(random.Random(f"{seed}-client-{i}")) for i in range(TASKS)]
        tasks += [self.faults(random.Random(f"{seed}-faults")), self.lifecycle(random.Random(f"{seed}-lifecycle"))]
        await asyncio.gather(*tasks)

    async def final_reads(self) -> None:
        """Every key once more, on a healthy engine after every late SDK
        write has landed: a stale value left in EIC shows here."""
        for key in range(NKEYS):
            await self.get((key,))


def _wait_released(rig: ConnectorRig, after: str) -> None:
    """Wait until every region reference was dropped (an SDK call still
    running holds its regions until it returns, so this waits for those calls)."""
    wait_until(
        lambda: rig.allocator._used_nbytes == 0,
        what=f"every region reference released after {after}",
        show=lambda: rig.allocator._used_nbytes,
    )


def run_checker(put_mode: str, seconds: float, seed: int) -> tuple[list[Finding], Counter, History]:
    """Run the workload on a fresh engine store, then the final reads; the
    findings, what the run did, and its history."""
    store_name = f"linearizable-{put_mode}-{seed}"
    store = get_store(store_name)
    store.clear()
    store.faults.clear()
    store.faults.reseed(seed)
    rig = ConnectorRig(
        block_nbytes=BLOCK, conn_id=f"lin-{put_mode}", remote_url=f"local://{store_name}", put_mode=put_mode, **CONFIG
    ).open()
    run = Run(rig, store.faults)
    try:
        rig.run(run.workload(seconds, seed), timeout=seconds + 120)
        store.faults.clear()
        run.close()
        _wait_released(rig, "the workload")  # also: every late mset has landed
        assert rig.conn.open().is_ok()
        rig.run(run.final_reads())
        rig.conn.close()
        _wait_released(rig, "the final reads")
    finally:
        rig.conn.close()
        rig.loop.close()
        store.clear()
    run.counts.update(timeouts=rig.conn.health()["timeouts"], ops=len(run.history.ops))
    findings = check(run.history)
    return findings, run.counts, run.history


def _report(put_mode: str, seconds: float, seed: int, findings: list, counts: Counter, history: History) -> str:
    kinds = Counter(finding.kind for finding in findings)
    lines = [f"{put_mode}: {seconds:g} s, seed {seed}: {dict(sorted(counts.items()))}; findings {dict(kinds)}"]
    lines += [f"  {finding.kind}: {finding.text}" for finding in findings[:12]]
    if findings and findings[0].key is not None:
        lines.append(f"  key {findings[0].key} around the first finding:")
        lines += [f"    {line}" for line in explain(history, findings[0])]
    return "\n".join(lines)


@pytest.mark.parametrize("put_mode", ["direct", "coalesce", "write_behind"])
def test_no_get_returns_a_superseded_value(put_mode):
    findings, counts, history = run_checker(put_mode, SECONDS, SEED)
    report = _report(put_mode, SECONDS, SEED, findings, counts, history)
    print(report)
    assert not findings, report
    # The run met what it claims to check.
    for exercised in ("get blocks ok", "put ok", "delete OK", "reopens", "timeouts", "breaker_trips"):
        assert counts[exercised] > 0, f"the run never saw {exercised}: {report}"


# ----------------------------------------------------- the check itself


def _history(*steps) -> History:
    """Ops in sequence: ("put", key, code) / ("get", key, version) / ("delete", key, code)."""
    history = History()
    versions = {}
    for step in steps:
        kind, key, arg = step
        if kind == "put":
            version = history.new_version()
            op = history.begin("put", (key,), (version,))
            history.end(op, Status(arg, ""), ANSWERS)
            versions[len(versions) + 1] = version
        elif kind == "get":
            op = history.begin("get", (key,))
            history.end(op, Status(StatusCodes.OK if arg else StatusCodes.NOT_FOUND, ""), ANSWERS)
            op.read = (arg,)
        else:
            op = history.begin(kind, (key,))
            history.end(op, Status(arg, ""), ANSWERS)
    return history


OK, TIMEOUT, NOT_FOUND = StatusCodes.OK, StatusCodes.TIMEOUT, StatusCodes.NOT_FOUND


def test_the_check_flags_an_older_value_after_a_newer_ok_write():
    assert [f.kind for f in check(_history(("put", 0, OK), ("put", 0, OK), ("get", 0, 1)))] == ["stale"]
    assert check(_history(("put", 0, OK), ("put", 0, OK), ("get", 0, 2))) == []
    # A timed-out put, then a newer OK one: the old value must not come back (defect 2).
    assert [f.kind for f in check(_history(("put", 0, TIMEOUT), ("put", 0, OK), ("get", 0, 1)))] == ["stale"]
    # A newer put that failed supersedes nothing; another key's write neither.
    assert check(_history(("put", 0, OK), ("put", 0, TIMEOUT), ("get", 0, 1))) == []
    assert check(_history(("put", 0, OK), ("put", 1, OK), ("get", 0, 1))) == []
    # A finished delete supersedes (OK or NOT_FOUND); a timed-out one does not.
    assert [f.kind for f in check(_history(("put", 0, OK), ("delete", 0, NOT_FOUND), ("get", 0, 1)))] == ["stale"]
    assert check(_history(("put", 0, OK), ("delete", 0, TIMEOUT), ("get", 0, 1))) == []
    # Misses are always fine.
    assert check(_history(("put", 0, OK), ("put", 0, OK), ("get", 0, None))) == []


def test_the_check_allows_a_write_that_overlaps_the_get_or_the_put():
    history = History()
    first = history.begin("put", (0,), (history.new_version(),))
    second = history.begin("put", (0,), (history.new_version(),))  # overlaps the first
    history.end(first, Status.ok(), ANSWERS)
    history.end(second, Status.ok(), ANSWERS)
    get = history.begin("get", (0,))
    history.end(get, Status.ok(), ANSWERS)
    get.read = (1,)
    assert check(history) == []
    third = history.begin("put", (0,), (history.new_version(),))
    get = history.begin("get", (0,))  # starts before the third put ends
    history.end(third, Status.ok(), ANSWERS)
    history.end(get, Status.ok(), ANSWERS)
    get.read = (2,)
    assert check(history) == []


def test_the_check_flags_torn_foreign_and_future_bytes():
    block = bytearray(payload(0, 1, BLOCK))
    block[-1] ^= 1
    assert decode(0, bytes(block)) == FOREIGN
    assert decode(1, payload(0, 1, BLOCK)) == FOREIGN
    assert decode(0, payload(0, 7, BLOCK)) == 7
    assert [f.kind for f in check(_history(("put", 0, OK), ("get", 0, FOREIGN)))] == ["foreign"]
    assert [f.kind for f in check(_history(("put", 1, OK), ("get", 0, 1)))] == ["foreign"]
    history = History()
    get = history.begin("get", (0,))
    history.end(get, Status.ok(), ANSWERS)
    put = history.begin("put", (0,), (history.new_version(),))
    history.end(put, Status.ok(), ANSWERS)
    get.read = (1,)
    assert [f.kind for f in check(history)] == ["future"]


def test_the_check_flags_malformed_answers():
    history = History()
    history.end(history.begin("get", (0, 1)), [Status.ok()], ANSWERS)
    history.end(history.begin("put", (0,), (1,)), Status(StatusCodes.INVALID, "closed"), ANSWERS)
    assert [f.kind for f in check(history)] == ["answer", "answer"]


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "put_failed", "delete", "get"]), st.integers(0, 2)), max_size=40))
def test_the_check_accepts_exactly_the_fresh_reads_of_a_sequential_history(steps):
    """Sequential ops against a dict model: a read of the newest version (or
    of a failed put after it, which may have landed) passes; a read of a
    version an OK write replaced is flagged."""
    history = History()
    fresh: dict[int, set[int]] = {}  # key -> versions a read may return
    replaced: dict[int, set[int]] = {}  # key -> versions an OK write superseded
    expected_stale = 0
    for kind, key in steps:
        if kind.startswith("put"):
            version = history.new_version()
            ok = kind == "put"
            history.end(history.begin("put", (key,), (version,)), Status.ok() if ok else Status(TIMEOUT, ""), ANSWERS)
            if ok:
                replaced.setdefault(key, set()).update(fresh.get(key, set()))
                fresh[key] = {version}
            else:
                fresh.setdefault(key, set()).add(version)
        elif kind == "delete":
            history.end(history.begin("delete", (key,)), Status.ok(), ANSWERS)
            replaced.setdefault(key, set()).update(fresh.pop(key, set()))
        else:
            for version in sorted(fresh.get(key, set()) | replaced.get(key, set())):
                get = history.begin("get", (key,))
                history.end(get, Status.ok(), ANSWERS)
                get.read = (version,)
                expected_stale += version in replaced.get(key, set())
    findings = check(history)
    assert all(finding.kind == "stale" for finding in findings)
    assert len(findings) == expected_stale
