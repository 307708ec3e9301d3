"""The model identity: from the operator's model_id, from a vLLM config (a
fake one: vLLM is not installed in the test venv), and never importing vLLM."""

import subprocess
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from fake_vllm import fake_vllm_config
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.keys.codec import SAFE_CHARS, escape_field
from aibrix_eic.keys.identity import TOKEN_LEN, current_vllm_config, resolve_identity, vllm_kv_factors


def test_nothing_identifies_the_model_outside_vllm_without_model_id():
    identity = resolve_identity(None, vllm_config=None)
    assert not identity.known and identity.token == "" and identity.source == "none"
    assert "neither model_id nor a vLLM config" in identity.describe()


def test_model_id_alone_identifies_the_model():
    identity = resolve_identity("llama3-70b-ft-a", vllm_config=None)
    assert identity.known and identity.source == "model_id"
    assert len(identity.token) == TOKEN_LEN and set(identity.token) <= SAFE_CHARS
    assert "model_id='llama3-70b-ft-a'" in identity.describe()
    assert resolve_identity("llama3-70b-ft-b", vllm_config=None).token != identity.token
    assert resolve_identity("llama3-70b-ft-a", vllm_config=None) == identity  # deterministic


def test_vllm_config_identifies_the_model_and_names_its_factors():
    identity = resolve_identity(None, vllm_config=fake_vllm_config())
    assert identity.known and identity.source == "vLLM"
    factors = dict(identity.vllm_factors)
    assert factors["model"] == '"meta-llama/Llama-3.1-8B-Instruct"'
    assert factors["dtype"] == '"torch.bfloat16"'
    assert factors["kv_cache_dtype"] == '"auto"'
    assert factors["head_size"] == "128" and factors["num_kv_heads"] == "8" and factors["num_layers"] == "32"
    assert factors["block_size"] == "16" and factors["calculate_kv_scales"] == "false"
    assert 'kv_cache_dtype="auto"' in identity.describe()


WEIGHTS_CHANGES = [
    {"model": "meta-llama/Llama-3.1-8B"},  # a fine-tune / another checkpoint
    {"model_weights": "s3://bucket/llama-ft"},
]
OTHER_CHANGES = [
    {"revision": "a1b2c3"},
    {"code_revision": "v2"},
    {"architectures": ["MistralForCausalLM"]},
    {"hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}},
    {"dtype": torch.float16},
    {"quantization": "fp8"},
    {"quantization_config": {"weight_bits": 4}},
    {"head_size": 64},
    {"num_kv_heads": 4},
    {"num_layers": 40},
    {"use_mla": True},
    {"cache_dtype": "fp8_e4m3"},  # a bf16 and an fp8 KV rollout of one model
    {"kv_cache_dtype_skip_layers": ["0"]},
    {"calculate_kv_scales": True},  # fp8 scales from this process's first batch ("auto" may be fp8)
    {"block_size": 32},
]


@pytest.mark.parametrize("change", WEIGHTS_CHANGES + OTHER_CHANGES, ids=lambda change: next(iter(change)))
def test_every_factor_that_changes_the_kv_bytes_changes_the_identity(change):
    base = resolve_identity(None, vllm_config=fake_vllm_config())
    changed = resolve_identity(None, vllm_config=fake_vllm_config(**change))
    assert changed.token != base.token


def test_identity_is_the_same_for_equal_configs_in_separate_objects():
    # Every TP rank and every restart must agree, or the cache never hits.
    first = resolve_identity(None, vllm_config=fake_vllm_config(hf_overrides={"b": 1, "a": {2, 1}}))
    second = resolve_identity(None, vllm_config=fake_vllm_config(hf_overrides={"a": {1, 2}, "b": 1}))
    assert first.token == second.token


def test_callable_hf_overrides_give_stable_text_without_addresses():
    def widen_rope(config):
        return config

    factors = dict(vllm_kv_factors(fake_vllm_config(hf_overrides=widen_rope)))
    assert "0x" not in factors["hf_overrides"] and "widen_rope" in factors["hf_overrides"]


def test_model_id_and_vllm_are_combined_not_substituted():
    vllm_only = resolve_identity(None, vllm_config=fake_vllm_config())
    both = resolve_identity("prod-llama", vllm_config=fake_vllm_config())
    fp8_both = resolve_identity("prod-llama", vllm_config=fake_vllm_config(cache_dtype="fp8"))
    id_only = resolve_identity("prod-llama", vllm_config=None)
    assert both.source == "model_id + vLLM"
    assert len({vllm_only.token, both.token, fp8_both.token, id_only.token}) == 4


def test_model_id_names_the_weights_so_replicas_mounting_them_elsewhere_share():
    """With model_id set, the weights path is the operator's business: the
    same model_id at another mount point (or in RunAI's local copy) is the
    same model."""
    base = resolve_identity("llama3-8b@2026-11", vllm_config=fake_vllm_config(model="/mnt/a/llama3-8b"))
    for elsewhere in (
        fake_vllm_config(model="/models/llama3-8b/"),
        fake_vllm_config(model="/tmp/runai-copy", model_weights="s3://bucket/llama3-8b"),
    ):
        assert resolve_identity("llama3-8b@2026-11", vllm_config=elsewhere).token == base.token
    assert "model" not in dict(base.vllm_factors)  # describe() shows what is in the digest
    other_id = resolve_identity("llama3-8b@2026-12", vllm_config=fake_vllm_config(model="/mnt/a/llama3-8b"))
    assert other_id.token != base.token


@pytest.mark.parametrize("change", OTHER_CHANGES, ids=lambda change: next(iter(change)))
def test_model_id_never_merges_what_else_vllm_reports(change):
    base = resolve_identity("prod-llama", vllm_config=fake_vllm_config())
    assert resolve_identity("prod-llama", vllm_config=fake_vllm_config(**change)).token != base.token


def test_a_trailing_slash_on_the_weights_path_does_not_split():
    assert token_of(model="/models/llama3-8b/") == token_of(model="/models/llama3-8b")
    assert token_of(model_weights="s3://bucket/llama/") == token_of(model_weights="s3://bucket/llama")
    assert token_of(model="/models/llama3-8b") != token_of(model="/models/llama3-8b-ft")


def token_of(**changes) -> str:
    return resolve_identity(None, vllm_config=fake_vllm_config(**changes)).token


def test_a_value_vllm_cannot_give_splits_but_never_fails():
    config = fake_vllm_config()

    def broken():
        raise RuntimeError("attention-free model")

    config.model_config.get_head_size = broken
    factors = dict(vllm_kv_factors(config))
    assert factors["head_size"] == "<unavailable>"
    assert resolve_identity(None, vllm_config=config).token != resolve_identity(None, fake_vllm_config()).token


def test_a_vllm_config_without_a_model_identifies_nothing():
    assert not resolve_identity(None, vllm_config=SimpleNamespace(model_config=None, cache_config=None)).known


def test_the_running_vllm_is_asked_only_when_already_loaded(monkeypatch):
    published = fake_vllm_config()
    module = types.ModuleType("vllm.config")
    module.get_current_vllm_config_or_none = lambda: published
    monkeypatch.delitem(sys.modules, "vllm.config", raising=False)
    assert current_vllm_config() is None
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    assert current_vllm_config() is published
    assert resolve_identity(None).token == resolve_identity(None, vllm_config=published).token
    module.get_current_vllm_config_or_none = lambda: None  # outside vLLM's set_current_vllm_config
    assert not resolve_identity(None).known

    def raising():
        raise AssertionError("Current vLLM config is not set")

    module.get_current_vllm_config_or_none = raising
    assert current_vllm_config() is None


def test_a_vllm_without_the_getter_is_read_from_its_global(monkeypatch):
    """vLLM 0.10.x (AIBrix's images, Type3) has no get_current_vllm_config_or_none;
    its set_current_vllm_config keeps the config in _current_vllm_config."""
    published = fake_vllm_config()
    module = types.ModuleType("vllm.config")
    module._current_vllm_config = published
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    assert current_vllm_config() is published
    assert resolve_identity(None).token == resolve_identity(None, vllm_config=published).token
    module._current_vllm_config = None
    assert not resolve_identity(None).known


def test_building_a_connector_never_imports_vllm():
    code = (
        "import sys\n"
        "from aibrix_eic.connector import EICConnector\n"
        "from aibrix_eic.config import EICConfig\n"
        "conn = EICConnector(EICConfig(), 'c')\n"
        "assert not any(name == 'vllm' or name.startswith('vllm.') for name in sys.modules), 'vllm imported'\n"
        "print(conn.model_identity.source)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"


@given(model_id=st.text(min_size=1, max_size=300))
def test_any_model_id_gives_a_short_token_in_the_safe_set(model_id):
    token = resolve_identity(model_id, vllm_config=None).token
    assert len(token) == TOKEN_LEN and set(token) <= SAFE_CHARS
    assert escape_field(token) == token  # goes into keys as is, no ~HH escapes


@given(first=st.text(min_size=1), second=st.text(min_size=1))
def test_distinct_model_ids_give_distinct_tokens(first, second):
    same = resolve_identity(first, vllm_config=None).token == resolve_identity(second, vllm_config=None).token
    assert same == (first == second)
