"""pd/padding.py: the tokens that key a PD prompt's partial last block. No
two different prompts, as (token ids, length), share a key under AIBrix's
own key builders; AIBrix's zero padding gave A and A + [0] * k one key."""

import numpy as np
from aibrix_kvcache import TokenListView
from aibrix_kvcache.l2.key_builders.key_builder import KeyBuilder
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.pd.padding import PAD_TOKEN, fill_padding, padded_prompt

KEY_BUILDERS = ["ROLLING_HASH", "SIMPLE_HASH", "RAW"]
# ids near 0 make zero-padding-shaped prompts likely
token_ids = st.one_of(st.sampled_from([0, 0, 1, 2]), st.integers(0, 2**31 - 1))


def keys(prompt: list[int], block_ntokens: int, builder: str) -> list[bytes]:
    """AIBrix's L2 keys of the prompt's blocks, as the PD connector builds them."""
    view = TokenListView(padded_prompt(prompt, block_ntokens))
    key_builder = KeyBuilder.create(builder, block_size=block_ntokens)
    return [key for _, key in key_builder.build(None, view)]


def named(prompt: list[int], block_ntokens: int, index: int) -> tuple[int, ...]:
    """What block `index`'s key must name: the prompt's real tokens up to the
    end of that block (their count included)."""
    return tuple(prompt[: (index + 1) * block_ntokens])


@st.composite
def prompt_pairs(draw):
    """Two prompts, often of the colliding shapes: B = A + [0] * k, A cut short."""
    block_ntokens = draw(st.sampled_from([2, 4, 32]))
    a = draw(st.lists(token_ids, min_size=1, max_size=3 * block_ntokens))
    shape = draw(st.sampled_from(["zeros", "shorter", "any"]))
    if shape == "zeros":
        b = a + [0] * draw(st.integers(1, block_ntokens))
    elif shape == "shorter":
        b = a[: draw(st.integers(1, len(a)))]
    else:
        b = draw(st.lists(token_ids, min_size=1, max_size=3 * block_ntokens))
    return a, b, block_ntokens


@given(prompt_pairs(), st.sampled_from(KEY_BUILDERS))
def test_a_key_names_one_sequence_of_real_tokens_and_its_length(pair, builder):
    a, b, block_ntokens = pair
    keys_a, keys_b = keys(a, block_ntokens, builder), keys(b, block_ntokens, builder)
    for i, key_a in enumerate(keys_a):
        for j, key_b in enumerate(keys_b):
            if key_a == key_b:
                assert named(a, block_ntokens, i) == named(b, block_ntokens, j), (i, j)


@given(st.lists(token_ids, min_size=1, max_size=100), st.sampled_from([2, 4, 32]))
def test_padding_is_only_past_the_prompt_and_no_token_id(prompt, block_ntokens):
    tokens = padded_prompt(prompt, block_ntokens)
    assert len(tokens) % block_ntokens == 0 and len(tokens) - len(prompt) < block_ntokens
    assert tokens[: len(prompt)].tolist() == prompt
    assert (tokens[len(prompt) :] == PAD_TOKEN).all() and PAD_TOKEN < 0


def test_filling_again_changes_nothing():
    tokens = np.zeros(8, dtype=np.int32)
    assert fill_padding(tokens, 5)
    assert not fill_padding(tokens, 5)
    assert not fill_padding(tokens, 8)  # a prompt of whole blocks has no padding


def test_aibrix_zero_padding_gave_a_and_a_plus_zeros_one_key():
    """What the padding fixes (AIBrix 0.8.0 pads with id 0): A of 998
    tokens and A + [0] * 26 had every key equal."""
    a = list(range(1, 999))
    zero_padded = np.zeros(1024, dtype=np.int32)
    zero_padded[:998] = a
    b = np.array(a + [0] * 26, dtype=np.int32)
    key_builder = KeyBuilder.create("ROLLING_HASH", block_size=32)
    assert [k for _, k in key_builder.build(None, TokenListView(zero_padded))] == [
        k for _, k in key_builder.build(None, TokenListView(b))
    ]
    assert keys(a, 32, "ROLLING_HASH")[-1] != keys(a + [0] * 26, 32, "ROLLING_HASH")[-1]
