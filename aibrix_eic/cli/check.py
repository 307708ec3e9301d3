"""`aibrix-eic check`: is the EIC connector on this host ready for AIBrix?

It resolves the config and the SDK, builds the connector the way AIBrix's
L2Cache does (`Connector.create` with backend "EIC"), opens it, registers a
buffer, and round-trips one block: put, exists, get (bytes compared), delete,
exists again (now a miss). Then it checks that another namespace cannot see
the block and that the TTL behaves, and warns when AIBrix's L1 ingestion, as
the environment sets it, waits for EIC inside the request. One step per
workaround of aibrix_compat/registry.py says whether it is installed, and
why. Each step prints its latency and a verdict, and a failure says what to fix. Exit status: 0 when every step
passed, 1 otherwise.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TextIO

import torch

from ..aibrix_compat import registry
from .check_config import ConfigStep
from .check_namespace import NamespaceSteps
from .check_report import StepRunner
from .check_ttl import TtlSteps

if TYPE_CHECKING:
    from aibrix_kvcache.memory import MemoryRegion


class Checker(TtlSteps, NamespaceSteps, ConfigStep, StepRunner):
    """Runs the steps in order; after a failure the rest are skipped."""

    def __init__(
        self,
        block_nbytes: int | None,
        routed_at_start: bool,
        out: TextIO,
        as_json: bool = False,
    ) -> None:
        StepRunner.__init__(self, out, as_json, config_only=False)
        self.routed_at_start = routed_at_start
        self.requested_block_nbytes = block_nbytes
        self.module = None
        self.connector = None
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="aibrix_eic_check")
        self.key = b""
        self.regions: list[MemoryRegion] = []
        self.payload: torch.Tensor | None = None
        self.cleanup_keys: set[bytes] = set()

    def run_steps(self) -> int:
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

    def release(self) -> None:
        if self.connector is not None:
            for key in self.cleanup_keys:
                self.run_op(self.connector.delete(key))
            self.connector.close()
        self.loop.close()
        self.executor.shutdown(wait=False)

    def run_op(self, coroutine):
        return self.loop.run_until_complete(coroutine)


def run_check(block_nbytes: int | None, routed_at_start: bool, out: TextIO, as_json: bool = False) -> int:
    """The full check (the config in the environment); returns the exit
    status. routed_at_start: whether the .pth hook had routed backend EIC to
    us before the CLI did."""
    return Checker(block_nbytes, routed_at_start, out, as_json).run()
