"""A directly built EICConnector for fault and input tests, with the
allocator, event loop and quiescing they need."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from aibrix_kvcache.memory import TensorPoolAllocator

from aibrix_eic.config import EICConfig
from aibrix_eic.connector import EICConnector


class ConnectorRig:
    """An opened EICConnector on engine store `store_name`, plus helpers."""

    def __init__(self, block_nbytes: int = 4096, capacity: int = 32 << 20, conn_id: str = "rig", **config):
        config.setdefault("remote_url", "local://rig")
        config.setdefault("warmup_keys", 0)
        self.config = EICConfig.from_mapping(config, source="<test>")
        self.block_nbytes = block_nbytes
        self.conn = EICConnector(self.config, conn_id, ThreadPoolExecutor(2))
        self.loop = asyncio.new_event_loop()
        self.allocator = TensorPoolAllocator.create(capacity_nbytes=capacity)

    def open(self):
        status = self.conn.open()
        assert status.is_ok(), status
        return self

    def run(self, coro, timeout: float = 30.0):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def blocks(self, count: int, nbytes: int | None = None) -> list:
        mrs = list(self.allocator.alloc([nbytes or self.block_nbytes] * count).get())
        for mr in mrs:
            mr.block_nbytes = mr.length
        return mrs

    def filled(self, payloads: list[bytes]) -> list:
        mrs = self.blocks(len(payloads))
        for mr, payload in zip(mrs, payloads):
            mr.to_tensor().copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        return mrs

    @staticmethod
    def read(mr) -> bytes:
        return mr.to_tensor().numpy().tobytes()

    @staticmethod
    def release(mrs) -> None:
        for mr in mrs:
            mr.ref_down()

    def quiesce(self, timeout: float = 30.0) -> None:
        """Wait until no SDK call is in flight: every pool thread must pick
        up a barrier task, which it can only do once its earlier work ended."""
        for pool in (self.conn.link.data_pool, self.conn.link.meta_pool):
            if pool is None:
                continue
            nthreads = pool.max_workers
            barrier = threading.Barrier(nthreads + 1)
            for _ in range(nthreads):
                pool.submit(barrier.wait, timeout)
            barrier.wait(timeout)

    def close(self) -> None:
        self.conn.close()
        self.loop.close()
