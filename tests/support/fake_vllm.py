"""A fake vLLM config (vLLM is not installed in the test venv) with what a
vLLM 0.32 VllmConfig exposes for a Llama-3-8B-like model. Torch-free unless
the default dtype is used, so subprocesses that pass `dtype` start fast."""

from types import SimpleNamespace
from typing import Any

DEFAULTS: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "model_weights": "",
    "revision": None,
    "code_revision": None,
    "architectures": ["LlamaForCausalLM"],
    "hf_overrides": {},
    "dtype": None,  # torch.bfloat16, imported only when asked for
    "quantization": None,
    "quantization_config": None,
    "head_size": 128,
    "num_kv_heads": 8,
    "num_layers": 32,
    "use_mla": False,
    "cache_dtype": "auto",
    "kv_cache_dtype_skip_layers": [],
    "calculate_kv_scales": False,
    "block_size": 16,
}


def fake_vllm_config(**changes: Any) -> SimpleNamespace:
    values = {**DEFAULTS, **changes}
    if values["dtype"] is None:
        import torch

        values["dtype"] = torch.bfloat16
    model = SimpleNamespace(
        model=values["model"],
        model_weights=values["model_weights"],
        revision=values["revision"],
        code_revision=values["code_revision"],
        architectures=values["architectures"],
        hf_overrides=values["hf_overrides"],
        dtype=values["dtype"],
        quantization=values["quantization"],
        quantization_config=values["quantization_config"],
        use_mla=values["use_mla"],
        get_head_size=lambda: values["head_size"],
        get_total_num_kv_heads=lambda: values["num_kv_heads"],
        get_total_num_hidden_layers=lambda: values["num_layers"],
    )
    cache = SimpleNamespace(
        cache_dtype=values["cache_dtype"],
        kv_cache_dtype_skip_layers=values["kv_cache_dtype_skip_layers"],
        calculate_kv_scales=values["calculate_kv_scales"],
        block_size=values["block_size"],
    )
    return SimpleNamespace(model_config=model, cache_config=cache, parallel_config=SimpleNamespace())
