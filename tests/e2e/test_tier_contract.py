"""The EIC secondary tier's contract, through vLLM's own
TieringOffloadingManager (scheduler side, no server): hypothesis sequences
of stores, lookups, loads, faults of the embedded engine and drains.

What must hold in every sequence:
- a chunk the manager says is in the primary tier holds exactly the bytes
  stored for its key (never another key's, never a half copy);
- every job reports, within a bound, whatever the faults (no hang);
- drain (reset_cache) returns with no job in flight, and shutdown returns;
- with the engine healthy, a key stored while it was healthy is found
  again after the primary tier was reset (reads come from EIC).
"""

import hashlib
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

pytest.importorskip("vllm.v1.kv_offload.tiering.base")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from aibrix_eic.engine.registry import get_store  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from waiting import wait_until  # noqa: E402

NUM_CHUNKS = 12
CHUNK_BYTES = 4096
KEYS = [make_offload_key(hashlib.sha256(bytes([i])).digest(), i % 2) for i in range(10)]
END = ScheduleEndContext((), ())
# Every job ends by its deadline (timeouts below) plus the calls then running.
SETTLE_S = 10.0


class _Spec:
    """The part of vLLM's OffloadingSpec the tier reads (its config)."""

    class config:  # noqa: N801
        class model:  # noqa: N801
            name = "contract-model"
            dtype = "float32"


def content(key: bytes) -> np.ndarray:
    seed = hashlib.blake2b(key, digest_size=64).digest()
    return np.frombuffer(seed * (CHUNK_BYTES // len(seed)), dtype=np.uint8)


class Rig:
    """A primary tier, our tier on a fresh embedded store, vLLM's manager."""

    def __init__(self, **entry: object) -> None:
        self.store_name = f"tier-contract-{uuid.uuid4().hex[:12]}"
        self.region = SharedOffloadRegion(
            engine_id=uuid.uuid4().hex,
            num_chunks=NUM_CHUNKS,
            rank=None,
            kv_bytes_per_chunk=CHUNK_BYTES,
            cpu_page_size=CHUNK_BYTES,
        )
        self.primary = CPUPrimaryTierOffloadingManager(num_chunks=NUM_CHUNKS, mmap_region=self.region)
        config = {
            "type": "EICSecondaryTier",
            "module_path": "aibrix_eic.tier.manager",
            "remote_url": f"local://{self.store_name}?seed=7",
            "get_timeout_ms": 400,
            "put_timeout_ms": 400,
            "exists_timeout_ms": 200,
            "probe_interval_s": 0.05,
            "retry_backoff_ms": 1,
            "retry_backoff_max_ms": 2,
            "metrics": False,
            **entry,
        }
        self.tier = SecondaryTierFactory.create_secondary_tier(config, self.primary.get_kv_memoryview(), _Spec())
        self.manager = TieringOffloadingManager(self.primary, [self.tier])
        self.faults = get_store(self.store_name).faults
        self._view: np.ndarray | None = np.frombuffer(self.primary.get_kv_memoryview(), dtype=np.uint8).reshape(
            NUM_CHUNKS, CHUNK_BYTES
        )
        self._requests = 0

    @property
    def view(self) -> np.ndarray:
        assert self._view is not None
        return self._view

    def request(self) -> ReqContext:
        self._requests += 1
        ctx = ReqContext(f"r{self._requests}")
        self.manager.on_new_request(ctx)
        return ctx

    def finish(self, ctx: ReqContext) -> None:
        self.manager.on_request_finished(ctx)
        self.manager.on_schedule_end(END)

    def settle(self) -> None:
        """Step until no job is in flight (every job reports, faults or not)."""

        def idle() -> bool:
            self.manager.on_schedule_end(END)
            return not self.manager.has_pending_work()

        wait_until(idle, SETTLE_S, "every tier job reported")

    def store(self, keys: list[bytes]) -> list[bytes]:
        """GPU -> primary (we write the bytes), then vLLM cascades to the tier."""
        ctx = self.request()
        out = self.manager.prepare_store(keys, ctx)
        written = []
        if out is not None and out.keys_to_store:
            for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
                self.view[int(chunk)] = content(key)
            self.manager.complete_store(out.keys_to_store, ctx)
            written = list(out.keys_to_store)
        self.finish(ctx)
        self.settle()
        return written

    def load(self, keys: list[bytes]) -> dict[bytes, LookupResult]:
        """Look each key up until it resolves, as vLLM's scheduler does
        (RETRY and HIT_PENDING: ask again next step); then check the bytes of
        every HIT and release them."""
        ctx = self.request()
        results: dict[bytes, LookupResult] = {}

        def resolved() -> bool:
            for key in keys:
                results[key] = self.manager.lookup(key, ctx)
            self.manager.on_schedule_end(END)
            return all(r in (LookupResult.HIT, LookupResult.MISS) for r in results.values())

        wait_until(resolved, SETTLE_S, "every lookup resolved", show=lambda: results)
        hits = [key for key in keys if results[key] is LookupResult.HIT]
        if hits:
            spec = self.manager.prepare_load(hits, ctx)
            for key, chunk in zip(hits, spec.chunk_ids):
                assert np.array_equal(self.view[int(chunk)], content(key)), f"wrong bytes for {key.hex()[:12]}"
            self.manager.complete_load(hits, ctx)
        self.finish(ctx)
        self.settle()
        return results

    def close(self) -> None:
        self.faults.clear()
        self._view = None  # our export of the primary tier's memory, or vLLM cannot unmap it
        self.manager.shutdown()


@settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
class TierContract(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig()
        self.healthy = True
        self.stored_healthy: set[bytes] = set()  # stored while the engine was healthy

    keys = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)

    @rule(keys=keys)
    def store(self, keys: list[bytes]) -> None:
        written = self.rig.store(keys)
        if self.healthy:
            self.stored_healthy.update(written)

    @rule(keys=keys)
    def load(self, keys: list[bytes]) -> None:
        self.rig.load(keys)  # checks the bytes of every hit

    @rule(
        fail_rate=st.sampled_from([0.0, 0.3, 1.0]),
        key_fail_rate=st.sampled_from([0.0, 0.3]),
        phantom_rate=st.sampled_from([0.0, 0.5]),
        latency_ms=st.sampled_from([0, 5]),
    )
    def faults(self, fail_rate: float, key_fail_rate: float, phantom_rate: float, latency_ms: int) -> None:
        faults = self.rig.faults
        faults.fail_rate, faults.key_fail_rate, faults.phantom_rate = fail_rate, key_fail_rate, phantom_rate
        faults.latency_s = latency_ms / 1000
        self.healthy = not (fail_rate or key_fail_rate or phantom_rate)

    @rule()
    def heal(self) -> None:
        self.rig.faults.clear()
        self.healthy = True

    @rule()
    def drain(self) -> None:
        """vLLM's reset_cache: drain_jobs, then the primary tier is emptied,
        so the next loads of stored keys must come from EIC."""
        self.rig.manager.reset_cache()
        assert not self.rig.manager.has_pending_work()

    @precondition(lambda self: self.healthy and bool(self.stored_healthy))
    @rule(data=st.data())
    def stored_keys_come_back(self, data: st.DataObject) -> None:
        """Liveness: once the breaker is closed again, a key stored while the
        engine was healthy is found, from EIC if the primary lost it."""
        wait_until(
            lambda: self.rig.tier.link.breaker.snapshot().state.value == "closed", SETTLE_S, "the breaker closed"
        )
        key = data.draw(st.sampled_from(sorted(self.stored_healthy)))
        self.rig.manager.reset_cache()
        assert self.rig.load([key])[key] is LookupResult.HIT

    @invariant()
    def nothing_left_in_flight(self) -> None:
        assert not self.rig.manager.has_pending_work()

    def teardown(self) -> None:
        self.rig.close()


TestTierContract = TierContract.TestCase


def test_drain_waits_for_a_store_in_flight_without_aborting_it():
    rig = Rig()
    try:
        rig.faults.latency_s = 0.2
        ctx = rig.request()
        out = rig.manager.prepare_store(KEYS[:2], ctx)
        for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
            rig.view[int(chunk)] = content(key)
        rig.manager.complete_store(out.keys_to_store, ctx)  # the cascade starts
        rig.finish(ctx)
        assert rig.tier.has_pending_work()
        rig.manager.reset_cache()  # drain_jobs, then the primary tier is emptied
        assert not rig.manager.has_pending_work()
        rig.faults.clear()
        assert all(r is LookupResult.HIT for r in rig.load(KEYS[:2]).values()), "the store was aborted"
    finally:
        rig.close()


def test_an_unreachable_store_answers_every_lookup_with_a_miss():
    rig = Rig()
    try:
        rig.store(KEYS[:3])
        rig.manager.reset_cache()
        rig.faults.unreachable = True
        results = rig.load(KEYS[:3])
        assert set(results.values()) == {LookupResult.MISS}
    finally:
        rig.close()


def test_a_load_keeps_exactly_the_keys_it_copied():
    """Per-key failures in one mget: vLLM keeps the keys that came back
    (successful_keys), recomputes the rest, and never sees a half copy."""
    rig = Rig(retry_attempts=0)
    try:
        rig.store(KEYS)
        rig.manager.reset_cache()
        rig.faults.key_fail_rate = 0.5
        rig.faults.reseed(3)
        results = rig.load(KEYS)  # checks the bytes of each hit
        assert LookupResult.HIT in results.values() and LookupResult.MISS in results.values()
    finally:
        rig.close()


def test_two_tiers_on_one_store_share_keys_and_other_models_do_not():
    writer = Rig()
    try:
        writer.store(KEYS[:3])
        url = f"local://{writer.store_name}"
        same = Rig(remote_url=url)
        other = Rig(remote_url=url, model_id="another-model")
        try:
            assert set(same.load(KEYS[:3]).values()) == {LookupResult.HIT}
            assert set(other.load(KEYS[:3]).values()) == {LookupResult.MISS}
        finally:
            same.close()
            other.close()
    finally:
        writer.close()
