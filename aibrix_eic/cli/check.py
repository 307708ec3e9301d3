"""`aibrix-eic check`: is the EIC connector on this host ready for AIBrix?

It resolves the config and the SDK, builds the connector the way AIBrix's
L2Cache does (`Connector.create` with backend "EIC"), opens it, registers a
buffer, and round-trips one block: put, exists, get (bytes compared), delete,
exists again (now a miss). Then it checks that another namespace cannot see
the block and that the TTL behaves. Each step prints its latency and a
verdict, and a failure says what to fix. Exit status: 0 when every step
passed, 1 otherwise.
"""

import asyncio
import dataclasses
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TextIO

import torch

from ..config import ENV_CONFIG, ConfigError, EICConfig, config_path_from_env
from ..sdk import HIT, SdkClient, load_sdk_module
from ..units import format_size

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"

DEFAULT_BLOCK_NBYTES = 2 * 1024**2  # one llama3-8b block
OTHER_NAMESPACE_SUFFIX = "aibrix-eic-check"
# How long the TTL probe waits for a real cluster to expire a 1 s key.
TTL_PROBE_WAIT_S = 3.0
NEVER_EXPIRES_PROBE_S = 30 * 24 * 3600


class StepFailed(Exception):
    """A step's finding: what went wrong and what to do about it."""

    def __init__(self, detail: str, fix: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix


@dataclass
class StepResult:
    name: str
    verdict: str  # PASS, FAIL, WARN or SKIP
    seconds: float
    detail: str
    fix: str = ""


def _region_class():
    from aibrix_kvcache.memory import MemoryRegion

    class CheckRegion(MemoryRegion):
        """A MemoryRegion over a tensor this command owns."""

        def destroy_unsafe(self) -> None:
            pass  # the tensor is freed with the command

    return CheckRegion


class Checker:
    """Runs the steps in order; after a failure the rest are skipped."""

    def __init__(self, block_nbytes: int | None, routed_at_start: bool, out: TextIO, as_json: bool = False) -> None:
        self.routed_at_start = routed_at_start
        self.as_json = as_json
        self.requested_block_nbytes = block_nbytes
        self.out = out
        self.results: list[StepResult] = []
        self.config: EICConfig | None = None
        self.module = None
        self.connector = None
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="aibrix_eic_check")
        self.key = b""
        self.regions: list = []
        self.payload: torch.Tensor | None = None
        self.cleanup_keys: set[bytes] = set()

    # ------------------------------------------------------------- driver
    def run(self) -> int:
        try:
            self.step("config", self.check_config)
            self.step("sdk", self.check_sdk)
            self.step("connector", self.create_connector)
            self.step("open", self.open_connector)
            self.step("register", self.register_buffer)
            self.step("put", self.put_block)
            self.step("exists", self.block_exists)
            self.step("get", self.get_block)
            self.step("delete", self.delete_block)
            self.step("exists-after-delete", self.block_gone)
            self.step("namespace", self.check_namespace)
            self.step("ttl", self.check_ttl)
            self.step("close", self.close_connector)
        finally:
            self.release()
        return self.verdict()

    def step(self, name: str, action: Callable[[], tuple[str, str]]) -> None:
        if any(result.verdict == FAIL for result in self.results):
            self.record(StepResult(name, SKIP, 0.0, "skipped after the failure above"))
            return
        started = time.perf_counter()
        try:
            verdict, detail = action()
            fix = ""
        except StepFailed as e:
            verdict, detail, fix = FAIL, e.detail, e.fix
        except Exception as e:  # a bug in this command, not in the setup
            verdict, detail = FAIL, f"internal error: {e!r}"
            fix = "this is a bug in aibrix-eic; rerun with -v and report the output"
        self.record(StepResult(name, verdict, time.perf_counter() - started, detail, fix))

    def record(self, result: StepResult) -> None:
        self.results.append(result)
        if self.as_json:
            return  # one document at the end, from verdict()
        timing = f"{result.seconds * 1000:9.1f} ms" if result.verdict != SKIP else " " * 12
        print(f"  {result.verdict}  {result.name:<20} {timing}  {result.detail}", file=self.out)
        if result.fix:
            print(f"  {'':4}  {'':<20} {'':12}  fix: {result.fix}", file=self.out)
        self.out.flush()

    def verdict(self) -> int:
        total_ms = sum(result.seconds for result in self.results) * 1000
        failed = [result for result in self.results if result.verdict == FAIL]
        if self.as_json:
            return self.json_verdict(failed, total_ms)
        if failed:
            first = failed[0]
            print(f"verdict: FAIL at {first.name}: {first.detail}", file=self.out)
            if first.fix:
                print(f"         fix: {first.fix}", file=self.out)
            return 1
        where = self.config.remote_url if self.config else "?"
        warnings = sum(1 for result in self.results if result.verdict == WARN)
        note = f", {warnings} warning(s)" if warnings else ""
        print(
            f"verdict: PASS: the EIC connector works against {where} "
            f"({len(self.results)} steps in {total_ms:.1f} ms{note})",
            file=self.out,
        )
        return 0

    def json_verdict(self, failed: list[StepResult], total_ms: float) -> int:
        """`check --json`: the verdict and one object per step, as one document."""
        document = {
            "verdict": FAIL if failed else PASS,
            "failed_step": failed[0].name if failed else None,
            "remote_url": self.config.remote_url if self.config else None,
            "total_ms": round(total_ms, 3),
            "steps": [
                {
                    "name": result.name,
                    "verdict": result.verdict,
                    "ms": round(result.seconds * 1000, 3),
                    "detail": result.detail,
                    "fix": result.fix or None,
                }
                for result in self.results
            ],
        }
        print(json.dumps(document, indent=2), file=self.out)
        return 1 if failed else 0

    def release(self) -> None:
        if self.connector is not None:
            for key in self.cleanup_keys:
                self.run_op(self.connector.delete(key))
            self.connector.close()
        self.loop.close()
        self.executor.shutdown(wait=False)

    def run_op(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    # -------------------------------------------------------------- steps
    def check_config(self) -> tuple[str, str]:
        path = config_path_from_env()
        try:
            self.config = EICConfig.from_env()
        except ConfigError as e:
            if e.key is None:
                fix = f"pass the path of a readable YAML file (--config, or ${ENV_CONFIG})"
            else:
                fix = f"fix {e.key} in {e.source} (docs/config.md lists every key)"
            raise StepFailed(str(e), fix) from None
        config = self.config
        source = path or "no config file: the embedded engine with default settings"
        return PASS, (
            f"{source} (remote_url {config.remote_url}, eic_kv_ns {config.eic_kv_ns!r}, "
            f"eic_kv_ttl {config.eic_kv_ttl})"
        )

    def check_sdk(self) -> tuple[str, str]:
        try:
            self.module = load_sdk_module(self.config)
        except ConfigError as e:
            raise StepFailed(
                f"the EIC Python SDK is not installed: {e.problem}",
                "install the vendor SDK into this Python environment, or use remote_url: local://",
            ) from None
        if self.config.uses_embedded_engine:
            from ..engine import open_store

            # As Client.init will see it: with remote_url's parameters applied.
            store = open_store(self.config.endpoint)
            faults = store.faults
            notes = [f"capacity {format_size(store.capacity)}"]
            if faults.latency_s:
                notes.append(f"latency {faults.latency_s * 1000:g} ms")
            for name in ("fail_rate", "key_fail_rate", "phantom_rate"):
                if getattr(faults, name):
                    notes.append(f"{name} {getattr(faults, name):g}")
            if faults.unreachable:
                notes.append("unreachable")
            return PASS, f"embedded engine (aibrix_eic.engine), store {store.name!r}: {', '.join(notes)}"
        version = getattr(self.module, "__version__", "version unknown")
        return PASS, f"vendor SDK `eic` ({version}) from {getattr(self.module, '__file__', '?')}"

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
        detail = f'Connector.create(backend_name="EIC") -> {kind} (conn_id {self.connector.conn_id})'
        if not self.routed_at_start:
            return WARN, detail + (
                "; the .pth hook is off in this interpreter (AIBRIX_EIC_DISABLE_AUTOLOAD or "
                "python -S), so vLLM needs the vllm.general_plugins entry point"
            )
        return PASS, detail

    def open_connector(self) -> tuple[str, str]:
        status = self.connector.open()
        if not status.is_ok():
            message = str(status.value) if status.value is not None else str(status)
            raise StepFailed(message, self.what_to_fix(message))
        health = self.connector.health()
        if self.connector.breaker.tripped or not health["connected"]:
            reason = health["breaker_reason"].removeprefix("open: ") or "not connected"
            raise StepFailed(reason, self.what_to_fix(reason))
        return PASS, f"connected to {self.config.remote_url} (includes the warm-up of {self.config.warmup_keys} keys); model identity {self.connector.model_identity.describe()}"

    def register_buffer(self) -> tuple[str, str]:
        block_nbytes = self.requested_block_nbytes or self.config.block_nbytes or min(
            DEFAULT_BLOCK_NBYTES, self.config.max_value_bytes
        )
        # Two blocks: one written, one read back into.
        slab = torch.zeros(2 * block_nbytes, dtype=torch.uint8)
        status = self.connector.register_slabs([slab])
        if not status.is_ok():
            raise StepFailed(str(status.value), self.what_to_fix(str(status.value)))
        region = _region_class()
        self.regions = [region(slab, 0, block_nbytes), region(slab, block_nbytes, block_nbytes)]
        self.payload = torch.frombuffer(bytearray(os.urandom(block_nbytes)), dtype=torch.uint8)
        self.regions[0].to_tensor().copy_(self.payload)
        registered = self.connector.health()["registered_regions"]
        return PASS, f"1 buffer of {format_size(slab.numel())} ({registered} region(s) registered)"

    def put_block(self) -> tuple[str, str]:
        self.key = os.urandom(16)  # the size of AIBrix's rolling-hash keys
        self.cleanup_keys.add(self.key)
        self._expect_ok("put", self.run_op(self.connector.put(self.key, self.regions[0])))
        return PASS, f"1 block of {format_size(self.regions[0].length)}"

    def block_exists(self) -> tuple[str, str]:
        self._expect_ok("exists", self.run_op(self.connector.exists(self.key)))
        return PASS, "hit"

    def get_block(self) -> tuple[str, str]:
        target = self.regions[1].to_tensor()
        target.zero_()
        self._expect_ok("get", self.run_op(self.connector.get(self.key, self.regions[1])))
        if not torch.equal(target, self.payload):
            mismatched = int((target != self.payload).sum())
            raise StepFailed(
                f"get returned OK but {mismatched} of {target.numel()} bytes differ from what was put",
                "the store returned wrong data: do not use this cluster for KV cache; "
                "report it with the output of `aibrix-eic check -v`",
            )
        return PASS, f"{format_size(target.numel())} read back, bytes match"

    def delete_block(self) -> tuple[str, str]:
        self._expect_ok("delete", self.run_op(self.connector.delete(self.key)))
        self.cleanup_keys.discard(self.key)
        return PASS, "deleted"

    def block_gone(self) -> tuple[str, str]:
        status = self.run_op(self.connector.exists(self.key))
        if status.is_ok():
            raise StepFailed(
                "exists still finds the block after delete returned OK",
                "EIC acknowledged a delete it did not do; check the SDK version",
            )
        if not status.is_not_found():
            raise StepFailed(f"exists failed: {status}", self.what_to_fix(str(status)))
        return PASS, "miss, as expected"

    def check_namespace(self) -> tuple[str, str]:
        """A key written in our namespace is invisible from another one: the
        same EIC key string, asked for through a client whose options carry
        another namespace, must miss."""
        from ..codec import KeyCodec
        config = self.config
        other_ns = f"{config.eic_kv_ns}-{OTHER_NAMESPACE_SUFFIX}" if config.eic_kv_ns else OTHER_NAMESPACE_SUFFIX
        key = os.urandom(16)
        self.cleanup_keys.add(key)
        self._expect_ok("put", self.run_op(self.connector.put(key, self.regions[0])))
        eic_key = KeyCodec(self.connector.conn_id, config.eic_kv_ns, self.connector.model_identity.token).encode(key)
        ours, error = SdkClient.connect(self.module, config)
        if ours is None:
            raise StepFailed(f"a second client could not connect: {error}", self.what_to_fix(error))
        theirs, error = SdkClient.connect(self.module, dataclasses.replace(config, eic_kv_ns=other_ns))
        if theirs is None:
            raise StepFailed(f"a client for namespace {other_ns!r} could not connect: {error}", self.what_to_fix(error))
        seen_here = ours.mexist([eic_key])
        if seen_here.outcomes != [HIT]:
            raise StepFailed(
                f"the block is not visible through the SDK in its own namespace {config.eic_kv_ns!r}: "
                f"{seen_here.detail}",
                "the connector and the SDK disagree on the key or namespace; report it",
            )
        seen_there = theirs.mexist([eic_key])
        if seen_there.outcomes == [HIT]:
            raise StepFailed(
                f"a block written in namespace {config.eic_kv_ns!r} is visible from namespace {other_ns!r}",
                "this EIC does not separate namespaces: give each deployment its own "
                "AIBRIX_KV_CACHE_OL_L2_CACHE_NAMESPACE so their keys differ",
            )
        if seen_there.whole_call_failed:  # real clusters only know provisioned namespaces
            how = f"not visible there (that namespace does not answer: {seen_there.detail})"
        else:
            how = "a miss there"
        return PASS, f"namespace {config.eic_kv_ns!r} is isolated: the same EIC key asked for in {other_ns!r} is {how}"

    def check_ttl(self) -> tuple[str, str]:
        if self.config.uses_embedded_engine:
            return self._check_ttl_with_engine_clock()
        return self._check_ttl_by_waiting()

    def close_connector(self) -> tuple[str, str]:
        for key in list(self.cleanup_keys):
            self.run_op(self.connector.delete(key))
        self.cleanup_keys.clear()
        status = self.connector.close()
        self.connector = None
        if not status.is_ok():
            raise StepFailed(str(status.value), "")
        return PASS, "closed"

    # ------------------------------------------------------------ helpers
    def _engine_store(self):
        from ..engine import get_store, parse_endpoint

        name, _ = parse_endpoint(self.config.endpoint)
        return get_store(name)

    def _expect_ok(self, op: str, status) -> None:
        if status.is_ok():
            return
        message = f"{op} returned {status.error_code.name}"
        if status.value is not None:
            message += f": {status.value}"
        health = self.connector.health()
        if health["breaker"] == "open":
            message += f" (circuit open: {health['breaker_reason']})"
        raise StepFailed(message, self.what_to_fix(message))

    def _check_ttl_with_engine_clock(self) -> tuple[str, str]:
        """Move the embedded store's clock instead of waiting."""
        store = self._engine_store()
        ttl = self.config.eic_kv_ttl
        key = os.urandom(16)
        self.cleanup_keys.add(key)
        self._expect_ok("put", self.run_op(self.connector.put(key, self.regions[0])))
        # A second key with a 1 s TTL, so expiry is exercised even when the
        # config never expires anything.
        short_client, short_key = self._put_ttl_probe()
        real_clock = store.clock
        shift = ttl + 1 if ttl > 0 else NEVER_EXPIRES_PROBE_S
        store.clock = lambda: real_clock() + shift
        try:
            configured = self.run_op(self.connector.exists(key))
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
            raise StepFailed(
                f"with eic_kv_ttl -1 a block expired within {shift // 86400} days", "report it"
            )
        return PASS, "eic_kv_ttl -1: blocks never expire (checked 30 days ahead); a 1 s TTL expires"

    def _put_ttl_probe(self):
        """A client whose sets carry ttl_second=1, and a key it just stored."""
        short_client, error = SdkClient.connect(self.module, dataclasses.replace(self.config, eic_kv_ttl=1))
        if short_client is None:
            raise StepFailed(error, self.what_to_fix(error))
        short_key = f"{self.connector.conn_id}.ttl-probe.{os.urandom(8).hex()}"
        region = self.regions[0]
        stored = short_client.mset([short_key], [(region.data_ptr(), region.length, False)])
        if stored.outcomes != [HIT]:
            raise StepFailed(f"mset with ttl_second=1 failed: {stored.detail}", self.what_to_fix(stored.detail))
        return short_client, short_key

    def _check_ttl_by_waiting(self) -> tuple[str, str]:
        """A real cluster: put a key with a 1 s TTL and wait for it to go."""
        ttl = self.config.eic_kv_ttl
        configured = f"eic_kv_ttl={ttl} s" if ttl > 0 else "eic_kv_ttl -1 (blocks never expire; EIC evicts by capacity)"
        short_client, short_key = self._put_ttl_probe()
        deadline = time.monotonic() + TTL_PROBE_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.25)
            if short_client.mexist([short_key]).outcomes != [HIT]:
                return PASS, f"{configured}; a key put with a 1 s TTL expired"
        short_client.mdel([short_key])
        return WARN, f"{configured}; a key put with a 1 s TTL was still there after {TTL_PROBE_WAIT_S:g} s (EIC may expire lazily)"

    def what_to_fix(self, message: str) -> str:
        """Advice for the failures an operator can fix."""
        config = self.config
        embedded = config is not None and config.uses_embedded_engine
        endpoint = config.endpoint if config is not None else "?"
        lowered = message.lower()
        if "needs the eic python sdk" in lowered:
            return "install the SDK wheel named above, or use remote_url: local://"
        if "unreachable" in lowered or "init returned -1" in lowered:
            if embedded:
                return "remote_url asks the embedded engine to act unreachable (unreachable=true); remove that"
            return (
                f"check that {endpoint} is reachable from this host (network path, security group), that the "
                "EIC agent on this node is running, and that eic_instance_id is this cluster's id"
            )
        if "init returned" in lowered or "client.init raised" in lowered:
            return "EIC refused the client: check eic_instance_id, eic_trans_type and eic_flag_file"
        if "eic config" in lowered:
            return "fix the config file (docs/config.md lists every key)"
        if "namespace_not_found" in lowered:
            return f"namespace {config.eic_kv_ns!r} does not exist on this EIC: create it or change eic_kv_ns"
        if "memory_not_registered" in lowered:
            return "EIC did not accept the registered buffer: check register_memory in the SDK logs (eic_log_dir)"
        if "value_too_large" in lowered or "max_value_bytes" in lowered:
            return "blocks are bigger than EIC accepts: use a smaller block size or raise the cluster's value limit"
        if "out_of_capacity" in lowered:
            return "EIC is full and could not evict: raise its capacity"
        if "timeout" in lowered:
            return "EIC answered too slowly: check the network, or raise get/put/exists_timeout_ms in the config"
        if "failed" in lowered and ("mset" in lowered or "mget" in lowered or "mexist" in lowered or "mdel" in lowered):
            if embedded:
                return "the embedded engine injects failures (fail_rate/key_fail_rate in remote_url); remove them"
            return "EIC answers but fails the calls: see the SDK logs in eic_log_dir and the cluster's health"
        return ""


def run_check(
    config_path: str | None, block_nbytes: int | None, routed_at_start: bool, out: TextIO, as_json: bool = False
) -> int:
    """Entry for `aibrix-eic check`; returns the exit status. routed_at_start:
    whether the .pth hook had routed backend EIC to us before the CLI did."""
    from .runtime import scoped_env

    env = {ENV_CONFIG: config_path} if config_path else {}
    with scoped_env(env):
        where = config_path or config_path_from_env() or "the embedded engine (no config)"
        if not as_json:
            print(f"aibrix-eic check: {where}", file=out)
        return Checker(block_nbytes, routed_at_start, out, as_json).run()
