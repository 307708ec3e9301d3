"""TEST SCAFFOLDING for a CPU box: AIBrix 0.8.0's AIBrixPDReuseConnector
(prefill/decode disaggregation through the cache manager's L2) on vLLM-CPU.

Passed as `kv_connector_module_path`. The connector module has the same
CUDA points as Type1 (its copy kernels, its per-request slot mapping on
"cuda", its supported-backend table and an attention-backend lookup that
needs `get_kv_cache_shape`), adapted the same way (cpu_type1.adapt).
"""

import cpu_type1
from aibrix_kvcache.integration.vllm.kv_connector import (
    aibrix_pd_reuse_connector as _pd,
)

cpu_type1.adapt(_pd, "PD_REUSE_CONNECTOR_SUPPORTED_ATTN_BACKENDS")

AIBrixPDReuseConnector = _pd.AIBrixPDReuseConnector
