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
The adaptations live in cpu_adapt (shared with cpu_type3, which must not
import AIBrix 0.8.0's vLLM integration). It also routes AIBrix's INFO lines (sent/reused token counts, which the
suite asserts on) to vLLM's log handler.
"""

# first: cpu_adapt sets AIBrix's switches before AIBrix's modules load
from cpu_adapt import CPU_BACKEND, adapt, route_aibrix_logs_to_vllm

# isort: split
from aibrix_kvcache.integration.vllm.kv_connector import (
    aibrix_offloading_connector_type1 as _type1,
)

__all__ = ["CPU_BACKEND", "AIBrixOffloadingConnector", "adapt"]

adapt(_type1, "OFFLOADING_CONNECTOR_SUPPORTED_ATTN_BACKENDS")
route_aibrix_logs_to_vllm()

AIBrixOffloadingConnector = _type1.AIBrixOffloadingConnector
