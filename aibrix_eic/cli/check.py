"""`aibrix-eic check`: is the EIC connector on this host ready for AIBrix?

It resolves the config and the SDK, builds the connector the way AIBrix's
L2Cache does (`Connector.create` with backend "EIC"), opens it, registers a
buffer, and round-trips one block: put, exists, get (bytes compared), delete,
exists again (now a miss). Then it checks that another namespace cannot see
the block and that the TTL behaves, and warns when AIBrix's L1 ingestion, as
the environment sets it, waits for EIC inside the request. One step per
workaround of aibrix_compat/registry.py says whether it is installed, and why. Each step prints its latency and a
verdict, and a failure says what to fix. Exit status: 0 when every step
passed, 1 otherwise.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import torch

from ..aibrix_compat import registry
from ..config import ENV_CONFIG, EICConfig, config_path_from_env
from .check_namespace import NamespaceSteps
from .check_steps import FAIL, PASS, SKIP, WARN, StepFailed
from .check_ttl import TtlSteps

if TYPE_CHECKING:
    from aibrix_kvcache.memory import MemoryRegion


@dataclass
class StepResult:
    name: str
    verdict: str  # PASS, FAIL, WARN or SKIP
    seconds: float
    detail: str
    fix: str = ""


class LoggedWarnings(logging.Handler):
    """The warnings aibrix_eic logs while a step runs: the step shows them and
    says WARN (without -v the library's logs are otherwise not shown)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.seen:  # the same warning from a later step adds nothing
            self.seen.add(message)
            self.messages.append(message)

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        library = logging.getLogger("aibrix_eic")
        level = library.level
        if library.getEffectiveLevel() > logging.WARNING:
            library.setLevel(logging.WARNING)
        library.addHandler(self)
        try:
            yield
        finally:
            library.removeHandler(self)
            library.setLevel(level)


class Checker(TtlSteps, NamespaceSteps):
    """Runs the steps in order; after a failure the rest are skipped."""

    def __init__(
        self,
        block_nbytes: int | None,
        routed_at_start: bool,
        out: TextIO,
        as_json: bool = False,
        config_only: bool = False,
    ) -> None:
        self.config_only = config_only
        self.warnings = LoggedWarnings()
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
        self.regions: list[MemoryRegion] = []
        self.payload: torch.Tensor | None = None
        self.cleanup_keys: set[bytes] = set()

    # ------------------------------------------------------------- driver
    def run(self) -> int:
        with self.warnings.installed():
            return self.run_steps()

    def run_steps(self) -> int:
        if self.config_only:
            self.step("config", self.check_config)
            return self.verdict()
        try:
            self.step("config", self.check_config)
            for workaround in registry.WORKAROUNDS:
                self.step(workaround.name.lower().replace("_", "-"), self.workaround_step(workaround))
            self.step("ingestion", self.check_ingestion)
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
        self.warnings.take()
        try:
            verdict, detail = action()
            fix = ""
        except StepFailed as e:
            verdict, detail, fix = FAIL, e.detail, e.fix
        except Exception as e:  # a bug in this command, not in the setup
            verdict, detail = FAIL, f"internal error: {e!r}"
            fix = "this is a bug in aibrix-eic; rerun with -v and report the output"
        logged = self.warnings.take()
        if logged:
            detail = "; ".join([detail, *(f"warning: {message}" for message in logged)])
            verdict = WARN if verdict == PASS else verdict
        self.record(StepResult(name, verdict, time.perf_counter() - started, detail, fix))

    def record(self, result: StepResult) -> None:
        self.results.append(result)
        if self.as_json:
            return  # one document at the end, from verdict()
        timing = f"{result.seconds * 1000:9.1f} ms" if result.verdict != SKIP else " " * 12
        indent = "\n  " + " " * 4 + "  " + " " * 20 + " " + " " * 12 + "  "
        detail = result.detail.replace("\n", indent)  # a config error lists one problem a line
        print(f"  {result.verdict}  {result.name:<20} {timing}  {detail}", file=self.out)
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
        if self.config_only:
            print(f"verdict: PASS: the config is valid for {where} (not connected{note})", file=self.out)
            return 0
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


def run_check(
    config_path: str | None,
    block_nbytes: int | None,
    routed_at_start: bool,
    out: TextIO,
    as_json: bool = False,
    config_only: bool = False,
) -> int:
    """Entry for `aibrix-eic check`; returns the exit status. routed_at_start:
    whether the .pth hook had routed backend EIC to us before the CLI did."""
    from .runtime import scoped_env

    env = {ENV_CONFIG: config_path} if config_path else {}
    with scoped_env(env):
        where = config_path or config_path_from_env() or "the embedded engine (no config)"
        if not as_json:
            print(f"aibrix-eic check: {where}", file=out)
        return Checker(block_nbytes, routed_at_start, out, as_json, config_only).run()
