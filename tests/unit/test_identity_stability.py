"""The model identity is the same in every process that runs the same
deployment (TP ranks, replicas, restarts), and different wherever the KV
bytes can differ: hash randomisation, memory addresses and the names of
callables must never decide it."""

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_vllm import fake_vllm_config

from aibrix_eic.keys.identity import resolve_identity

TESTS = Path(__file__).parent.parent / "support"  # fake_vllm.py

# Builds the same deployment in every process: settings that hold sets and
# dicts, a dataclass and a plain object (neither has model_dump), and a
# callable hf_overrides. Prints the tokens of each config, by name.
SCRIPT = """
import dataclasses, json, sys
sys.path.insert(0, {tests!r})
from fake_vllm import fake_vllm_config
from aibrix_eic.keys.identity import resolve_identity

@dataclasses.dataclass
class QuantConfig:
    ignored_layers: set
    group_sizes: dict

class RopeScaling:
    def __init__(self):
        self.rope_type = "yarn"
        self.applies_to = frozenset({{"q_proj", "k_proj", "attn", "mlp", "lm_head", "embed_tokens"}})

def widen_rope(config):
    config.rope_scaling = {{"rope_type": "yarn", "factor": 4.0, "layers": {{"a", "b", "c"}}}}
    return config

quant = QuantConfig(
    ignored_layers={{"lm_head", "model.layers.0.mlp", "model.layers.1.mlp", "embed_tokens", "norm", "q_proj"}},
    group_sizes={{"w": 128, "a": {{"x", "y", "z", "w", "v"}}}},
)
overrides = {{"rope": RopeScaling(), "sliding": {{"full", "sliding", "chunked", "local"}}}}
configs = {{
    "sets_dicts_objects": fake_vllm_config(dtype="bfloat16", quantization_config=quant, hf_overrides=overrides),
    "callable_overrides": fake_vllm_config(dtype="bfloat16", hf_overrides=widen_rope),
    "fp8_runtime_scales": fake_vllm_config(dtype="bfloat16", cache_dtype="fp8", calculate_kv_scales=True),
}}
print(json.dumps({{name: resolve_identity(None, vllm_config=c).token for name, c in configs.items()}}))
"""


@pytest.fixture(scope="module")
def tokens_by_process() -> list[dict[str, str]]:
    """The tokens of SCRIPT's configs in processes with different hash seeds."""
    script = SCRIPT.format(tests=str(TESTS))
    results = []
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "AIBRIX_EIC_DISABLE_AUTOLOAD": "1"}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout))
    return results


@pytest.mark.parametrize("config", ["sets_dicts_objects", "callable_overrides"])
def test_every_process_computes_the_same_identity_whatever_its_hash_seed(tokens_by_process, config):
    assert len({tokens[config] for tokens in tokens_by_process}) == 1, tokens_by_process


def test_fp8_kv_with_runtime_scales_is_never_shared_between_processes(tokens_by_process):
    """vLLM's calculate_kv_scales derives each layer's fp8 k/v scales from
    the data of the process's first forward pass: two processes store the
    same fp8 bytes for different values."""
    assert len({tokens["fp8_runtime_scales"] for tokens in tokens_by_process}) == len(tokens_by_process)


@dataclass
class QuantConfig:
    ignored_layers: set
    bits: int


class PlainSetting:  # no model_dump, no __repr__: str() shows only an address
    def __init__(self, factor: float) -> None:
        self.factor = factor


def token(**changes) -> str:
    return resolve_identity(None, vllm_config=fake_vllm_config(**changes)).token


def test_objects_without_model_dump_are_identified_by_their_fields():
    assert token(quantization_config=PlainSetting(4.0)) != token(quantization_config=PlainSetting(8.0))
    assert token(quantization_config=PlainSetting(4.0)) == token(quantization_config=PlainSetting(4.0))
    assert token(quantization_config=QuantConfig({"a"}, 4)) != token(quantization_config=QuantConfig({"a"}, 8))


def test_different_callable_overrides_never_share_an_identity():
    def make_override(factor: float):
        def widen_rope(config):  # same name and qualname for every factor
            config.rope_scaling = {"rope_type": "yarn", "factor": factor}
            return config

        return widen_rope

    assert token(hf_overrides=make_override(4.0)) != token(hf_overrides=make_override(8.0))
    assert token(hf_overrides=make_override(4.0)) == token(hf_overrides=make_override(4.0))
    yarn_4 = lambda config: config.update({"factor": 4.0})  # noqa: E731
    yarn_8 = lambda config: config.update({"factor": 8.0})  # noqa: E731
    assert token(hf_overrides=yarn_4) != token(hf_overrides=yarn_8)


def test_a_setting_that_cannot_be_rendered_alike_everywhere_makes_the_keys_private():
    """An object whose text is only its address (a lock here) would render
    alike for any state: such an identity is never shared, not even by the
    next connector of this process."""
    first = resolve_identity(None, vllm_config=fake_vllm_config(quantization_config=threading.Lock()))
    second = resolve_identity(None, vllm_config=fake_vllm_config(quantization_config=threading.Lock()))
    assert first.known and first.token != second.token
    assert first.private and "quantization_config" in first.private
    assert " at 0x" not in first.describe() and "PRIVATE to this connector" in first.describe()


def test_runtime_scales_on_an_unquantized_kv_cache_are_shared():
    """With a bf16 cache vLLM leaves the k/v scales at 1.0: nothing per process."""
    first = resolve_identity(None, vllm_config=fake_vllm_config(cache_dtype="bfloat16", calculate_kv_scales=True))
    second = resolve_identity(None, vllm_config=fake_vllm_config(cache_dtype="bfloat16", calculate_kv_scales=True))
    assert first.token == second.token and not first.private


def test_runtime_scales_on_an_fp8_kv_cache_are_private_and_say_why():
    identity = resolve_identity(None, vllm_config=fake_vllm_config(cache_dtype="fp8_e4m3", calculate_kv_scales=True))
    again = resolve_identity(None, vllm_config=fake_vllm_config(cache_dtype="fp8_e4m3", calculate_kv_scales=True))
    assert identity.token != again.token
    assert identity.private and "calculate_kv_scales" in identity.private
