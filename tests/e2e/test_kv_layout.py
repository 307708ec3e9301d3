"""The e2e adapter's vectorised KV copies equal a per-token reference, both ways."""

import kv_layout
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def reference_onload(blocks, layer_caches, slot_mapping):
    block_tokens = blocks[0].shape[2]
    head_size = blocks[0].shape[4]
    block_size = layer_caches[0].shape[2]
    for token, slot in enumerate(slot_mapping.tolist()):
        block = blocks[token // block_tokens]
        row = token % block_tokens
        for layer, cache in enumerate(layer_caches):
            for head in range(cache.shape[1]):
                # the CPU backend's reading: [blocks, heads, 2, block_size, head_size]
                paged = cache.view(cache.shape[0], cache.shape[1], 2, block_size, head_size)
                paged[slot // block_size, head, 0, slot % block_size] = block[layer, 0, row, head]
                paged[slot // block_size, head, 1, slot % block_size] = block[layer, 1, row, head]


def reference_offload(blocks, layer_caches, slot_mapping):
    block_tokens = blocks[0].shape[2]
    head_size = blocks[0].shape[4]
    block_size = layer_caches[0].shape[2]
    for token, slot in enumerate(slot_mapping.tolist()):
        block = blocks[token // block_tokens]
        row = token % block_tokens
        for layer, cache in enumerate(layer_caches):
            for head in range(cache.shape[1]):
                paged = cache.view(cache.shape[0], cache.shape[1], 2, block_size, head_size)
                block[layer, 0, row, head] = paged[slot // block_size, head, 0, slot % block_size]
                block[layer, 1, row, head] = paged[slot // block_size, head, 1, slot % block_size]


@st.composite
def layouts(draw):
    layers = draw(st.integers(1, 3))
    heads = draw(st.integers(1, 3))
    head_size = draw(st.sampled_from([1, 4, 8]))
    block_size = draw(st.sampled_from([2, 4, 8]))
    num_engine_blocks = draw(st.integers(2, 6))
    block_tokens = draw(st.sampled_from([2, 4, 8]))
    total_slots = num_engine_blocks * block_size
    num_tokens = draw(st.integers(0, total_slots))
    # distinct slots in any order, as vLLM's block tables give them
    slots = draw(st.permutations(range(total_slots)))[:num_tokens]
    num_blocks = max(1, -(-num_tokens // block_tokens))
    seed = draw(st.integers(0, 2**16))
    return layers, heads, head_size, block_size, num_engine_blocks, block_tokens, slots, num_blocks, seed


def _tensors(layout, dtype=torch.float32):
    layers, heads, head_size, block_size, num_engine_blocks, block_tokens, slots, num_blocks, seed = layout
    gen = torch.Generator().manual_seed(seed)
    caches = [
        torch.randn((num_engine_blocks, heads, block_size, 2 * head_size), generator=gen).to(dtype)
        for _ in range(layers)
    ]
    blocks = [
        torch.randn((layers, 2, block_tokens, heads, head_size), generator=gen).to(dtype) for _ in range(num_blocks)
    ]
    return caches, blocks, torch.tensor(slots, dtype=torch.long)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_onload_matches_reference(layout):
    caches, blocks, slots = _tensors(layout)
    expected = [c.clone() for c in caches]
    reference_onload(blocks, expected, slots)
    kv_layout.onload(blocks, caches, slots)
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_offload_matches_reference(layout):
    caches, blocks, slots = _tensors(layout)
    expected = [b.clone() for b in blocks]
    reference_offload(expected, caches, slots)
    kv_layout.offload(blocks, caches, slots)
    for got, want in zip(blocks, expected):
        assert torch.equal(got, want)


@settings(max_examples=50, deadline=None)
@given(layouts())
def test_offload_then_onload_round_trips_bf16(layout):
    caches, blocks, slots = _tensors(layout, torch.bfloat16)
    kv_layout.offload(blocks, caches, slots)
    restored = [torch.zeros_like(c) for c in caches]
    kv_layout.onload(blocks, restored, slots)
    num_engine_blocks, heads, block_size, double_head = caches[0].shape
    mask = torch.zeros(num_engine_blocks * block_size, dtype=torch.bool)
    mask[slots] = True

    def by_slot(cache):  # [blocks, heads, 2, bs, D] -> [blocks*bs, heads, 2, D]
        paged = cache.view(num_engine_blocks, heads, 2, block_size, double_head // 2)
        return paged.permute(0, 3, 1, 2, 4).reshape(num_engine_blocks * block_size, heads, 2, -1)

    for got, want in zip(restored, caches):
        assert torch.equal(by_slot(got)[mask], by_slot(want)[mask])
        assert not by_slot(got)[~mask].any()
