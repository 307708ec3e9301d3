"""Properties of the key codec: AIBrix key bytes -> EIC key strings."""

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aibrix_eic.keys import codec
from aibrix_eic.keys.codec import FIELD_MAX, MAX_KEY_LEN, RAW_MAX, SAFE_CHARS, KeyCodec, decode

keys = st.binary(min_size=1, max_size=4 * RAW_MAX)
fields = st.text(max_size=2 * FIELD_MAX)


def digested(text: str) -> bool:
    return codec.escape_field(text).startswith("~h")


@given(conn_id=fields, namespace=fields, identity=fields, key=keys)
def test_decode_recovers_the_parts(conn_id, namespace, identity, key):
    parts = decode(KeyCodec(conn_id, namespace, identity).encode(key))
    assert parts.conn_id == (None if digested(conn_id) else conn_id)
    assert parts.namespace == (None if digested(namespace) else namespace)
    assert parts.identity == (None if digested(identity) else identity)
    if len(key) <= RAW_MAX:
        assert parts.key == key and parts.key_digest is None
    else:
        assert parts.key is None and parts.key_digest == codec.hash_key(key)


@given(conn_id=fields, namespace=fields, identity=fields, key=keys)
def test_keys_are_short_and_use_safe_characters(conn_id, namespace, identity, key):
    eic_key = KeyCodec(conn_id, namespace, identity).encode(key)
    assert len(eic_key) <= MAX_KEY_LEN
    assert set(eic_key) <= SAFE_CHARS


@given(conn_id=fields, namespace=fields, key_a=keys, key_b=keys)
def test_distinct_keys_give_distinct_eic_keys(conn_id, namespace, key_a, key_b):
    key_codec = KeyCodec(conn_id, namespace)
    assert (key_codec.encode(key_a) == key_codec.encode(key_b)) == (key_a == key_b)


@given(
    first=st.tuples(fields, fields, fields),
    second=st.tuples(fields, fields, fields),
    key_a=keys,
    key_b=keys,
)
def test_partitions_namespaces_and_models_never_share_keys(first, second, key_a, key_b):
    if first == second:
        return
    eic_a = KeyCodec(*first).encode(key_a)
    eic_b = KeyCodec(*second).encode(key_b)
    assert eic_a != eic_b


@given(conn_id=fields, namespace=fields, batch=st.lists(keys, max_size=20))
def test_encode_many_matches_encode(conn_id, namespace, batch):
    key_codec = KeyCodec(conn_id, namespace)
    assert key_codec.encode_many(batch) == [key_codec.encode(key) for key in batch]


def test_encoding_is_deterministic_across_instances():
    key = bytes(range(16))
    assert KeyCodec("aibrix_h0_7_l0_31_lcnd16roc", "ns").encode(key) == KeyCodec(
        "aibrix_h0_7_l0_31_lcnd16roc", "ns"
    ).encode(key)


def test_rolling_hash_keys_are_stored_raw_and_readable():
    key = bytes.fromhex("00112233445566778899aabbccddeeff")
    eic_key = KeyCodec("aibrix_h0_7_l0_31_lcnd16roc").encode(key)
    assert eic_key == "e2..aibrix_h0_7_l0_31_lcnd16roc..r00112233445566778899aabbccddeeff"
    with_model = KeyCodec("aibrix_h0_7_l0_31_lcnd16roc", "ns", "062c808b4c04aa01").encode(key)
    assert with_model == "e2.ns.aibrix_h0_7_l0_31_lcnd16roc.062c808b4c04aa01.r00112233445566778899aabbccddeeff"


@given(conn_id=fields, namespace=fields, identity_a=fields, identity_b=fields, batch=st.lists(keys, max_size=8))
def test_another_model_identity_never_hits_a_key_of_this_one(conn_id, namespace, identity_a, identity_b, batch):
    """Changing the identity makes every old entry a miss: the two key sets
    are disjoint, whatever the keys."""
    if identity_a == identity_b:
        return
    keys_a = set(KeyCodec(conn_id, namespace, identity_a).encode_many(batch))
    keys_b = set(KeyCodec(conn_id, namespace, identity_b).encode_many(batch))
    assert keys_a.isdisjoint(keys_b)


def test_keys_of_the_previous_format_are_never_produced():
    # e1 keys (no model field) written before an upgrade must be misses after it.
    key = bytes(range(16))
    for identity in ("", "062c808b4c04aa01"):
        eic_key = KeyCodec("c", "ns", identity).encode(key)
        assert eic_key.startswith("e2.") and eic_key != "e1.ns.c.r" + key.hex()


def test_long_keys_use_blake2b_not_md5():
    key = b"x" * 1000
    eic_key = KeyCodec("c").encode(key)
    assert eic_key.endswith("h" + hashlib.blake2b(key, digest_size=32).hexdigest())
    assert hashlib.md5(key).hexdigest() not in eic_key


def test_separator_in_a_field_is_escaped():
    a = KeyCodec("a.b", "").encode(b"k")
    b = KeyCodec("a", "b").encode(b"k")
    assert a != b
    assert decode(a).conn_id == "a.b"


@pytest.mark.parametrize(
    "text", ["", "e2.a.b", "e1..c.r00", "e2..c.r00", "e2..c..xzz", "e2..c..rzz", "e2..c..h00", "e2..c...r00"]
)
def test_decode_rejects_strings_it_did_not_make(text):
    with pytest.raises(ValueError):
        decode(text)


@settings(max_examples=50)
@given(conn_id=st.text(min_size=FIELD_MAX + 1, max_size=4 * FIELD_MAX))
def test_overlong_fields_are_digested_to_a_bounded_length(conn_id):
    eic_key = KeyCodec(conn_id).encode(b"k")
    assert len(eic_key) <= MAX_KEY_LEN
    assert digested(conn_id)
    assert decode(eic_key).conn_id is None
