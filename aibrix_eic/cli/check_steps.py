"""The steps of `aibrix-eic check`, in the order it runs them; the namespace
and TTL steps are in check_namespace.py and check_ttl.py, the config step in
check_config.py. Each returns (verdict, detail) or raises StepFailed with what to fix."""

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from ..aibrix_compat import registry
from ..config import ConfigError, EICConfig
from ..link.sdk import load_sdk_module
from ..util.units import format_size
from ..writes.write_behind import SLAB_SHARE
from .check_advice import ingestion_advice, ingestion_is_fine
from .check_advice import what_to_fix as _advice
from .check_report import FAIL, PASS, SKIP, WARN, StepFailed

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "CheckSteps", "StepFailed", "what_to_fix"]

if TYPE_CHECKING:
    from aibrix_kvcache.memory import MemoryRegion
    from aibrix_kvcache.status import Status

    from ..connector import EICConnector
    from ..engine.store_api import StoreApi

DEFAULT_BLOCK_NBYTES = 2 * 1024**2  # one llama3-8b block
# How long the TTL probe waits for a real cluster to expire a 1 s key.
TTL_PROBE_WAIT_S = 3.0
NEVER_EXPIRES_PROBE_S = 30 * 24 * 3600
# Blocks of registered memory: write-behind accepts a put early only while
# pending writes hold at most 1/SLAB_SHARE of it, so with this much the test
# block takes the default path (accepted at once, flushed later), as AIBrix's
# blocks do in production.
REGISTERED_BLOCKS = 2 * SLAB_SHARE


def what_to_fix(config: EICConfig | None, message: str) -> str:
    return _advice(message, config)


def open_engine_store(endpoint: str) -> "StoreApi":
    """The embedded engine's store as Client.init will see it (remote_url's
    parameters applied). A store that cannot be opened (a shared store's
    directory, files or the lmdb module) is the setup's problem, said with
    its path, cause and fix; anything else is left to the step's own
    handling of bugs."""
    from ..engine import open_errors, open_store

    try:
        return open_store(endpoint)
    except Exception as e:
        problem = open_errors.explain(endpoint, e)
        if problem is None:
            raise
        raise StepFailed(
            f"the embedded engine cannot open shared store {problem.path}: {problem.cause}", problem.fix
        ) from None


def _region_class():
    from aibrix_kvcache.memory import MemoryRegion

    class CheckRegion(MemoryRegion):
        """A MemoryRegion over a tensor this command owns."""

        def destroy_unsafe(self) -> None:
            pass  # the tensor is freed with the command

    return CheckRegion


class CheckSteps:
    """The steps; Checker (check.py) runs them and keeps their state."""

    requested_block_nbytes: int | None
    routed_at_start: bool
    config_only: bool
    config: EICConfig | None
    module: ModuleType | None
    connector: "EICConnector | None"
    key: bytes
    regions: list["MemoryRegion"]
    payload: torch.Tensor | None
    cleanup_keys: set[bytes]
    executor: ThreadPoolExecutor

    def run_op(self, coroutine):
        raise NotImplementedError

    @property
    def cfg(self) -> EICConfig:
        if self.config is None:
            raise StepFailed("no config was loaded")
        return self.config

    @property
    def conn(self) -> "EICConnector":
        if self.connector is None:
            raise StepFailed("no connector was built")
        return self.connector

    @property
    def sdk(self) -> ModuleType:
        if self.module is None:
            raise StepFailed("no SDK was loaded")
        return self.module

    def check_ingestion(self) -> tuple[str, str]:
        """AIBrix's L1 ingestion as this environment sets it: whether our
        batching of its synchronous ingestion is on, and whether synchronous
        writes behind L1 wait for EIC inside every request (a warning, not a
        failure)."""
        state = registry.decide(registry.INGESTION)
        batched = state.on
        batching = f"batched L1 ingestion {'on' if batched else 'off'}: {state.why}"
        advice = ingestion_advice(self.cfg.put_mode, batched)
        if advice:
            return WARN, f"{advice}; {batching}"
        return PASS, f"{ingestion_is_fine(self.cfg.put_mode)}; {batching}"

    def workaround_step(self, workaround: "registry.Workaround") -> Callable[[], tuple[str, str]]:
        """One workaround of aibrix_compat/registry.py: whether a worker with
        this environment and this aibrix-kvcache installs it, and why; WARN
        for an untested aibrix-kvcache, a missing AIBrix name or a
        deprecated variable."""

        def step() -> tuple[str, str]:
            state = registry.decide(workaround)
            detail = f"{'on' if state.on else 'off'}: {state.why}; fixes: {workaround.fixes} ({workaround.report_link})"
            return (WARN if state.warn else PASS), detail

        return step

    def check_sdk(self) -> tuple[str, str]:
        try:
            self.module = load_sdk_module(self.cfg)
        except ConfigError as e:
            raise StepFailed(
                f"the EIC Python SDK is not installed: {e.problem}",
                "install the vendor SDK into this Python environment, or use remote_url: local://",
            ) from None
        if self.cfg.uses_embedded_engine:
            store = open_engine_store(self.cfg.endpoint)
            faults = store.faults
            notes = [f"capacity {format_size(store.capacity)}"]
            if faults.latency_s:
                notes.append(f"latency {faults.latency_s * 1000:g} ms")
            for name in ("fail_rate", "key_fail_rate", "phantom_rate"):
                if getattr(faults, name):
                    notes.append(f"{name} {getattr(faults, name):g}")
            if faults.unreachable:
                notes.append("unreachable")
            directory = getattr(store, "path", None)  # the shared mode's; in-process stores have none
            where = f"shared store {store.name!r} in {directory}" if directory else f"store {store.name!r}"
            return PASS, f"embedded engine (aibrix_eic.engine), {where}: {', '.join(notes)}"
        version = getattr(self.sdk, "__version__", "version unknown")
        return PASS, f"vendor SDK `eic` ({version}) from {getattr(self.sdk, '__file__', '?')}"

    def create_connector(self) -> tuple[str, str]:
        from aibrix_kvcache import envs
        from aibrix_kvcache.l2.connectors import Connector, ConnectorConfig

        from ..connector import EICConnector

        conn_config = ConnectorConfig(
            backend_name="EIC",
            namespace=envs.AIBRIX_KV_CACHE_OL_L2_CACHE_NAMESPACE,
            partition_id="check",
            executor=self.executor,
        )
        self.connector = Connector.create(conn_config)
        kind = f"{type(self.connector).__module__}.{type(self.connector).__qualname__}"
        if not isinstance(self.connector, EICConnector):
            raise StepFailed(
                f'Connector.create(backend_name="EIC") built {kind}, not aibrix_eic\'s connector',
                "reinstall aibrix-eic (pip install aibrix-eic) so its .pth hook loads, "
                "or call aibrix_eic.install() before AIBrix builds its cache",
            )
        detail = f'Connector.create(backend_name="EIC") -> {kind} (conn_id {self.conn.conn_id})'
        if not self.routed_at_start:
            return WARN, detail + (
                "; the .pth hook is off in this interpreter (AIBRIX_EIC_DISABLE_AUTOLOAD or "
                "python -S), so vLLM needs the vllm.general_plugins entry point"
            )
        return PASS, detail

    def open_connector(self) -> tuple[str, str]:
        status = self.conn.open()
        if not status.is_ok():
            message = str(status.value) if status.value is not None else str(status)
            raise StepFailed(message, what_to_fix(self.config, message))
        health = self.conn.health()
        if self.conn.breaker.tripped or not health["connected"]:
            reason = health["breaker_reason"].removeprefix("open: ") or "not connected"
            raise StepFailed(reason, what_to_fix(self.config, reason))
        return (
            PASS,
            f"connected to {self.cfg.remote_url} (includes the warm-up of {self.cfg.warmup_keys} keys); model identity {self.conn.model_identity.describe()}",
        )

    def register_buffer(self) -> tuple[str, str]:
        block_nbytes = self.requested_block_nbytes
        if block_nbytes is not None and block_nbytes <= 0:
            raise StepFailed(f"block size {block_nbytes} is not a size", "pass a size > 0, such as --block-size 2MiB")
        if block_nbytes is None:
            block_nbytes = self.cfg.block_nbytes
        if block_nbytes is None:
            block_nbytes = min(DEFAULT_BLOCK_NBYTES, self.cfg.max_value_bytes)
        # One block written, one read back into, the rest room for write-behind.
        slab = torch.zeros(REGISTERED_BLOCKS * block_nbytes, dtype=torch.uint8)
        status = self.conn.register_slabs([slab])
        if not status.is_ok():
            raise StepFailed(str(status.value), what_to_fix(self.config, str(status.value)))
        region = _region_class()
        self.regions = [region(slab, 0, block_nbytes), region(slab, block_nbytes, block_nbytes)]
        self.payload = torch.frombuffer(bytearray(os.urandom(block_nbytes)), dtype=torch.uint8)
        self.regions[0].to_tensor().copy_(self.payload)
        registered = self.conn.health()["registered_regions"]
        return PASS, f"1 buffer of {format_size(slab.numel())} ({registered} region(s) registered)"

    def put_block(self) -> tuple[str, str]:
        self.key = os.urandom(16)  # the size of AIBrix's rolling-hash keys
        self.cleanup_keys.add(self.key)
        how = self._put_into_eic(self.key)
        return PASS, f"1 block of {format_size(self.regions[0].length)}{how}"

    def block_exists(self) -> tuple[str, str]:
        self._expect_ok("exists", self.run_op(self.conn.exists(self.key)))
        return PASS, "hit"

    def get_block(self) -> tuple[str, str]:
        target = self.regions[1].to_tensor()
        target.zero_()
        self._expect_ok("get", self.run_op(self.conn.get(self.key, self.regions[1])))
        payload = self.payload
        if payload is None or not torch.equal(target, payload):
            mismatched = target.numel() if payload is None else int((target != payload).sum())
            raise StepFailed(
                f"get returned OK but {mismatched} of {target.numel()} bytes differ from what was put",
                "the store returned wrong data: do not use this cluster for KV cache; "
                "report it with the output of `aibrix-eic check -v`",
            )
        return PASS, f"{format_size(target.numel())} read back, bytes match"

    def delete_block(self) -> tuple[str, str]:
        self._expect_ok("delete", self.run_op(self.conn.delete(self.key)))
        self.cleanup_keys.discard(self.key)
        return PASS, "deleted"

    def block_gone(self) -> tuple[str, str]:
        status = self.run_op(self.conn.exists(self.key))
        if status.is_ok():
            raise StepFailed(
                "exists still finds the block after delete returned OK",
                "EIC acknowledged a delete it did not do; check the SDK version",
            )
        if not status.is_not_found():
            raise StepFailed(f"exists failed: {status}", what_to_fix(self.config, str(status)))
        return PASS, "miss, as expected"

    def close_connector(self) -> tuple[str, str]:
        for key in list(self.cleanup_keys):
            self.run_op(self.conn.delete(key))
        self.cleanup_keys.clear()
        status = self.conn.close()
        self.connector = None
        if not status.is_ok():
            raise StepFailed(str(status.value), "")
        return PASS, "closed"

    # ------------------------------------------------------------ helpers
    def _put_into_eic(self, key: bytes) -> str:
        """Put the test block and wait until it is in EIC. A write-behind put
        returns before its block is sent, and a get would then be answered
        from the connector's own copy: the round trip must go through EIC.
        Returns a note for the step's detail."""
        conn, config = self.conn, self.cfg
        before = conn.health()
        self._expect_ok("put", self.run_op(conn.put(key, self.regions[0])))
        started = time.perf_counter()
        bound_ms = config.put_timeout_ms + config.write_behind_max_age_ms  # queued at most max_age, then one round
        if not conn.write_behind.wait_idle(bound_ms / 1000):
            message = (
                f"put returned OK, but the block was still not written to EIC after {bound_ms:g} ms "
                "(put_timeout_ms + write_behind_max_age_ms): the write-behind flush is waiting on EIC"
            )
            raise StepFailed(message, what_to_fix(self.config, message))
        after = conn.health()
        failed = after["put_failures"] - before["put_failures"]
        lost = after["write_behind_lost"] - before["write_behind_lost"]
        if failed or lost or after["write_behind_lost_keys"]:
            message = (
                "put returned OK (write-behind accepts a block before sending it), but the block did not reach "
                f"EIC: the flush's mset failed for it (put_failures +{failed}, write_behind_lost +{lost})"
            )
            if after["breaker"] == "open":
                message += f" (circuit open: {after['breaker_reason']})"
            raise StepFailed(message, what_to_fix(self.config, message))
        if after["write_behind_blocks"] == before["write_behind_blocks"]:
            return ""  # stored before put returned (put_mode direct or coalesce, or past the byte bound)
        return f", written behind: in EIC {(time.perf_counter() - started) * 1000:.1f} ms after put returned"

    def _expect_ok(self, op: str, status: "Status") -> None:
        if status.is_ok():
            return
        message = f"{op} returned {status.error_code.name}"
        if status.value is not None:
            message += f": {status.value}"
        health = self.conn.health()
        if health["breaker"] == "open":
            message += f" (circuit open: {health['breaker_reason']})"
        raise StepFailed(message, what_to_fix(self.config, message))
