"""Vectorised KV copies between vLLM's CPU paged cache and AIBrix's LCND blocks.

Test scaffolding for the e2e suite (used by cpu_type1.py): AIBrix's own copy
kernels (`reshape_and_cache_multi_layer`, `reshape_and_offload_multi_layer`)
exist only for CUDA. Pure torch, so it can be tested without vLLM.

Layouts:
- vLLM CPU cache, one tensor per layer, shaped [num_blocks, kv_heads,
  block_size, 2 * head_size] but read by the CPU attention backend as
  [num_blocks, kv_heads, 2 (K, V), block_size, head_size]: per engine block
  and head, block_size K rows then block_size V rows (vllm/v1/attention/
  backends/cpu_attn.py, `kv_cache.view(...).chunk(2, dim=2)`). A token's slot
  is `block_id * block_size + offset`.
- AIBrix LCND block, one tensor per cache block: [layers, 2 (K, V),
  block_tokens, heads, head_size].

Each direction does one `index_select`/`index_copy_` per layer on flat row
indices plus one strided copy per cache block: a per-token loop costs about
six times as much on a 3000-token reload.
"""

from collections.abc import Sequence

import torch


def cache_rows(slot_mapping: torch.Tensor, num_heads: int, block_size: int) -> torch.Tensor:
    """Row numbers of the tokens' K rows (token-major, then head) followed by
    their V rows, in a layer cache viewed as [num_blocks * heads * 2 *
    block_size, head_size]: the order of an LCND [2, tokens, heads] run."""
    slots = slot_mapping.to(torch.long)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots - blocks * block_size
    heads = torch.arange(num_heads, dtype=torch.long)
    k_rows = ((blocks[:, None] * num_heads + heads[None, :]) * 2) * block_size + offsets[:, None]
    return torch.cat((k_rows.reshape(-1), k_rows.reshape(-1) + block_size))


def _check(blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], num_tokens: int) -> tuple:
    layers, two, block_tokens, heads, head_size = blocks[0].shape
    assert two == 2, f"not an LCND block: {tuple(blocks[0].shape)}"
    assert layers == len(layer_caches), f"{layers} block layers, {len(layer_caches)} cache layers"
    cache = layer_caches[0]
    assert cache.dim() == 4 and cache.shape[1] == heads and cache.shape[3] == 2 * head_size, (
        f"cache layer {tuple(cache.shape)} is not [blocks, {heads}, block_size, {2 * head_size}]"
    )
    assert num_tokens <= len(blocks) * block_tokens, f"{num_tokens} tokens, {len(blocks)} blocks"
    return layers, block_tokens, heads, head_size, cache.shape[2]


def _block_view(staging: torch.Tensor, index: int, block_tokens: int, num_tokens: int):
    """Tokens of cache block `index` in the [layers, 2, tokens, heads,
    head_size] staging tensor, and how many there are."""
    start = index * block_tokens
    stop = min(start + block_tokens, num_tokens)
    return staging[:, :, start:stop], stop - start


def onload(blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], slot_mapping: torch.Tensor) -> None:
    """Write the first len(slot_mapping) tokens of `blocks` into the cache slots."""
    num_tokens = slot_mapping.numel()
    if num_tokens == 0:
        return
    layers, block_tokens, heads, head_size, block_size = _check(blocks, layer_caches, num_tokens)
    staging = torch.empty((layers, 2, num_tokens, heads, head_size), dtype=blocks[0].dtype)
    for index, block in enumerate(blocks):
        view, count = _block_view(staging, index, block_tokens, num_tokens)
        if count <= 0:
            break
        view.copy_(block[:, :, :count])
    rows = cache_rows(slot_mapping, heads, block_size)
    staging = staging.view(layers, 2 * num_tokens * heads, head_size)
    for layer, cache in enumerate(layer_caches):
        cache.view(-1, head_size).index_copy_(0, rows, staging[layer])


def offload(blocks: Sequence[torch.Tensor], layer_caches: Sequence[torch.Tensor], slot_mapping: torch.Tensor) -> None:
    """Read the cache slots' tokens into the first len(slot_mapping) token rows of `blocks`."""
    num_tokens = slot_mapping.numel()
    if num_tokens == 0:
        return
    layers, block_tokens, heads, head_size, block_size = _check(blocks, layer_caches, num_tokens)
    rows = cache_rows(slot_mapping, heads, block_size)
    staging = torch.empty((layers, 2 * num_tokens * heads, head_size), dtype=layer_caches[0].dtype)
    for layer, cache in enumerate(layer_caches):
        torch.index_select(cache.view(-1, head_size), 0, rows, out=staging[layer])
    staging = staging.view(layers, 2, num_tokens, heads, head_size)
    for index, block in enumerate(blocks):
        view, count = _block_view(staging, index, block_tokens, num_tokens)
        if count <= 0:
            break
        block[:, :, :count].copy_(view)
