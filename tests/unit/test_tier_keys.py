"""The secondary tier's keys (keys/codec.py's tier_codec, tier/settings.py's
layout_text): disjoint from every AIBrix connector's keys by construction;
shared by replicas that agree on namespace, model and layout; apart
otherwise."""

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.keys.codec import FIELD_MAX, MAX_KEY_LEN, RAW_MAX, SAFE_CHARS, KeyCodec, tier_codec
from aibrix_eic.tier.settings import layout_text

fields = st.text(max_size=2 * FIELD_MAX)
keys = st.binary(min_size=1, max_size=4 * RAW_MAX)
layouts = st.text(min_size=1, max_size=200)


@given(conn_id=fields, namespace=fields, identity=fields, layout=layouts, key_a=keys, key_b=keys)
def test_no_tier_key_is_an_aibrix_key(conn_id, namespace, identity, layout, key_a, key_b):
    """Same namespace and identity, any conn_id, any key bytes: never equal,
    so a chunk of vLLM's CPU layout is never read as an AIBrix block."""
    tier = tier_codec(namespace, identity, layout).encode(key_a)
    aibrix = KeyCodec(conn_id, namespace, identity).encode(key_b)
    assert tier != aibrix
    assert len(tier) <= MAX_KEY_LEN and set(tier) <= SAFE_CHARS


@given(namespace=fields, identity=fields, layout=layouts, key=keys)
def test_replicas_that_agree_share_keys(namespace, identity, layout, key):
    assert tier_codec(namespace, identity, layout).encode(key) == tier_codec(namespace, identity, layout).encode(key)


@given(identity_a=fields, identity_b=fields, layout_a=layouts, layout_b=layouts, key=keys)
def test_other_models_or_layouts_never_share(identity_a, identity_b, layout_a, layout_b, key):
    same = identity_a == identity_b and layout_a == layout_b
    a = tier_codec("ns", identity_a, layout_a).encode(key)
    b = tier_codec("ns", identity_b, layout_b).encode(key)
    assert (a == b) == same


def offloading_config(**changes):
    fields = {
        "groups": (SimpleNamespace(tokens_per_block=32, layer_names=("l0", "l1")),),
        "model": SimpleNamespace(name="/models/llama", dtype="float32"),
        "cache": SimpleNamespace(blocks_per_chunk=1, tokens_per_hash=32),
        "parallel": SimpleNamespace(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1),
        "replicated_layout": False,
        "canonical_layout": False,
        "kv_cache_layout": None,
    }
    fields.update(changes)
    return SimpleNamespace(**fields)


def test_the_layout_names_what_changes_a_chunks_bytes():
    base = layout_text(offloading_config(), 8192, None)
    assert layout_text(offloading_config(), 8192, None) == base
    assert layout_text(offloading_config(), 16384, None) != base
    for change in (
        {"model": SimpleNamespace(name="/models/other", dtype="float32")},
        {"model": SimpleNamespace(name="/models/llama", dtype="bfloat16")},
        {"parallel": SimpleNamespace(tp_size=2, pp_size=1, pcp_size=1, dcp_size=1)},
        {"cache": SimpleNamespace(blocks_per_chunk=2, tokens_per_hash=32)},
        {"groups": (SimpleNamespace(tokens_per_block=64, layer_names=("l0", "l1")),)},
    ):
        assert layout_text(offloading_config(**change), 8192, None) != base, change


def test_model_id_replaces_the_weights_path():
    """Replicas that mount one model at different paths share once model_id names it."""
    a = offloading_config(model=SimpleNamespace(name="/mnt/a/llama", dtype="float32"))
    b = offloading_config(model=SimpleNamespace(name="/mnt/b/llama", dtype="float32"))
    assert layout_text(a, 8192, None) != layout_text(b, 8192, None)
    assert layout_text(a, 8192, "llama-3") == layout_text(b, 8192, "llama-3")
