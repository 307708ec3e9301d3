"""pd/loads.py: which engine blocks a PD decoder's short load left
unwritten, and the scheduler's record of failed hand-offs."""

from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.pd.loads import HandOffs, unloaded_block_ids


@st.composite
def prompts(draw):
    """(slot mapping, prompt length, block size): a prompt laid out on
    distinct engine blocks in any order, as vLLM's allocator hands them out."""
    block_ntokens = draw(st.sampled_from([1, 4, 16, 32]))
    prompt_len = draw(st.integers(1, 300))
    nblocks = -(-prompt_len // block_ntokens)
    blocks = draw(st.permutations(range(nblocks * 3)))[:nblocks]
    slots = [blocks[t // block_ntokens] * block_ntokens + t % block_ntokens for t in range(prompt_len)]
    return slots, prompt_len, block_ntokens, blocks


@given(prompts(), st.data())
def test_the_blocks_named_are_exactly_those_holding_an_unloaded_token(prompt, data):
    slots, prompt_len, block_ntokens, blocks = prompt
    loaded_until = data.draw(st.integers(0, prompt_len + 5))
    named = unloaded_block_ids(slots, loaded_until, prompt_len, block_ntokens)
    # a block is named iff one of its prompt tokens was not loaded
    want = {blocks[t // block_ntokens] for t in range(loaded_until, prompt_len)}
    assert named == want
    # and vLLM, truncating at the first named block in the request's order,
    # keeps only tokens that were loaded
    order = [b for b in blocks if b in named]
    if order:
        first = blocks.index(order[0])
        assert first * block_ntokens <= loaded_until


def test_a_whole_load_names_nothing():
    assert unloaded_block_ids([5, 6, 7, 8], 4, 4, 2) == set()


def test_a_failed_hand_off_is_remembered_until_the_request_finishes():
    hand_offs = HandOffs()
    hand_offs.started("a", [1, 2, 3])
    hand_offs.started("b", [7, 8])
    assert hand_offs.invalid({3, 99}) == {"a"}
    assert hand_offs.failed("a") and not hand_offs.failed("b")
    assert hand_offs.invalid({3}) == set()  # reported once; "a" is no longer loading
    hand_offs.finished("a")
    hand_offs.finished("b")
    assert not hand_offs.failed("a") and len(hand_offs) == 0


def test_a_new_load_of_the_same_request_id_starts_clean():
    hand_offs = HandOffs()
    hand_offs.started("a", [1])
    hand_offs.invalid({1})
    hand_offs.started("a", [4])
    assert not hand_offs.failed("a")


def test_a_received_load_is_not_blamed_for_its_blocks_later():
    """After a load is reported received its blocks belong to the running
    request, and after a preemption to whoever gets them next: a failure
    reported on them is another request's."""
    hand_offs = HandOffs()
    hand_offs.started("a", [1, 2])
    hand_offs.started("b", [3])
    assert hand_offs.invalid({3}) == {"b"}
    hand_offs.received(["a", "b"])
    assert hand_offs.invalid({1, 2}) == set()
    assert not hand_offs.failed("a")
    assert hand_offs.failed("b")  # received with a failure: still recomputed if vLLM asks again
