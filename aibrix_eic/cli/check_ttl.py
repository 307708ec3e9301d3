"""The TTL step of `aibrix-eic check`: on the embedded engine it moves the
store's clock; on a real cluster it waits for a 1 s key to expire."""

import dataclasses
import os
import time

from ..link.sdk import HIT, SdkClient
from .check_steps import NEVER_EXPIRES_PROBE_S, PASS, TTL_PROBE_WAIT_S, WARN, CheckSteps, StepFailed, what_to_fix


class TtlSteps(CheckSteps):
    def check_ttl(self) -> tuple[str, str]:
        if self.cfg.uses_embedded_engine:
            return self._check_ttl_with_engine_clock()
        return self._check_ttl_by_waiting()

    def _engine_store(self):
        from ..engine import get_store, parse_endpoint

        name, params = parse_endpoint(self.cfg.endpoint)
        if "dir" not in params:
            return get_store(name)
        # The store the connector opened (one handle per process): found by its path alone.
        from ..engine.shared_store import open_shared_store

        opening = {key: params[key] for key in ("create", "mode") if key in params}
        return open_shared_store(name, params["dir"], None, **opening)

    def _check_ttl_with_engine_clock(self) -> tuple[str, str]:
        """Move the embedded store's clock instead of waiting."""
        store = self._engine_store()
        ttl = self.cfg.eic_kv_ttl
        key = os.urandom(16)
        self.cleanup_keys.add(key)
        self._put_into_eic(key)  # expiry is EIC's: the block must be there, not only pending
        # A second key with a 1 s TTL, so expiry is exercised even when the
        # config never expires anything.
        short_client, short_key = self._put_ttl_probe()
        real_clock = store.clock
        shift = ttl + 1 if ttl > 0 else NEVER_EXPIRES_PROBE_S
        store.clock = lambda: real_clock() + shift
        try:
            configured = self.run_op(self.conn.exists(key))
            probe = short_client.mexist([short_key])
        finally:
            store.clock = real_clock
        short_client.mdel([short_key])
        if probe.outcomes == [HIT]:
            raise StepFailed(
                "a key put with ttl_second=1 is still there after its TTL", "the engine ignores TTLs; report it"
            )
        if ttl > 0:
            if configured.is_ok():
                raise StepFailed(f"a block is still there {shift} s after put with eic_kv_ttl {ttl}", "report it")
            return PASS, f"blocks expire after eic_kv_ttl={ttl} s (checked on the engine's clock)"
        if not configured.is_ok():
            raise StepFailed(f"with eic_kv_ttl -1 a block expired within {shift // 86400} days", "report it")
        return PASS, "eic_kv_ttl -1: blocks never expire (checked 30 days ahead); a 1 s TTL expires"

    def _put_ttl_probe(self):
        """A client whose sets carry ttl_second=1, and a key it just stored."""
        short_client, error = SdkClient.connect(self.sdk, dataclasses.replace(self.cfg, eic_kv_ttl=1))
        if short_client is None:
            raise StepFailed(error, what_to_fix(self.config, error))
        short_key = f"{self.conn.conn_id}.ttl-probe.{os.urandom(8).hex()}"
        region = self.regions[0]
        stored = short_client.mset([short_key], [(region.data_ptr(), region.length, False)])
        if stored.outcomes != [HIT]:
            raise StepFailed(f"mset with ttl_second=1 failed: {stored.detail}", what_to_fix(self.config, stored.detail))
        return short_client, short_key

    def _check_ttl_by_waiting(self) -> tuple[str, str]:
        """A real cluster: put a key with a 1 s TTL and wait for it to go."""
        ttl = self.cfg.eic_kv_ttl
        configured = f"eic_kv_ttl={ttl} s" if ttl > 0 else "eic_kv_ttl -1 (blocks never expire; EIC evicts by capacity)"
        short_client, short_key = self._put_ttl_probe()
        deadline = time.monotonic() + TTL_PROBE_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.25)
            if short_client.mexist([short_key]).outcomes != [HIT]:
                return PASS, f"{configured}; a key put with a 1 s TTL expired"
        short_client.mdel([short_key])
        return (
            WARN,
            f"{configured}; a key put with a 1 s TTL was still there after {TTL_PROBE_WAIT_S:g} s (EIC may expire lazily)",
        )
