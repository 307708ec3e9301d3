"""Workaround for an aibrix-kvcache 0.8 defect in the token-validation
layout (AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED=1; the timeout half is in
timeouts.py). A block's value is [block bytes | magic | footer(prefix_len,
query_len) | prefix+query tokens]. `ManagedMemoryRegion.unpack_tokens` in 0.8.0 reads the
footer bytes as the prefix and the first query_len tokens as the query, so
every block that has a prefix fails L2Cache's token check and only the first
block of a sequence ever loads from L2. We parse the tokens correctly after a
get and cache them on the region, which is where unpack_tokens looks first;
L2Cache then checks the real tokens against the real key.
"""

from collections.abc import Sequence

import numpy as np
import torch
from aibrix_kvcache import TokenListView
from aibrix_kvcache.memory import ManagedMemoryRegion, MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

_INT32 = np.dtype(np.int32).itemsize
_MAGIC = ManagedMemoryRegion.MAGIC
_FOOTER_NBYTES = 2 * _INT32


class KeyWithTokens(bytes):
    """A cache key that remembers the tokens it stands for (prefix and
    block), so the connector can check a loaded block's own tokens against
    them: L2Cache hands `mget` the cache keys only."""

    tokens: TokenListView


def with_tokens(real_key: object, cache_key: bytes) -> bytes:
    if not isinstance(real_key, TokenListView):
        return cache_key
    tagged = KeyWithTokens(cache_key)
    tagged.tokens = real_key
    return tagged


def restore_packed_tokens(mr: ManagedMemoryRegion) -> np.ndarray | None:
    """Parse the tokens a get brought in, cache them on `mr`, and return them
    (prefix then block).

    None when the value does not hold a well-formed footer of exactly the
    region's size, in which case the block must not be reported loaded.
    """
    block_nbytes = getattr(mr, "_block_nbytes", -1)
    if block_nbytes <= 0:
        return None
    start = mr.addr + block_nbytes
    header_end = start + _INT32 + _FOOTER_NBYTES
    if header_end > mr.addr + mr.length:
        return None
    header = mr.slab[start:header_end].view(torch.int32).cpu().numpy()  # .cpu(): the slab may be on a GPU
    magic, prefix_len, query_len = int(header[0]), int(header[1]), int(header[2])
    if magic != _MAGIC or prefix_len < 0 or query_len <= 0:
        return None
    if ManagedMemoryRegion.calculate_size(block_nbytes, prefix_len + query_len) != mr.length:
        return None
    tokens_end = header_end + _INT32 * (prefix_len + query_len)
    all_tokens = mr.slab[header_end:tokens_end].view(torch.int32).cpu().numpy().copy()
    # Views of one array: L2Cache concatenates them with `+`, which
    # TokenListView allows only for adjacent views of the same data.
    mr._prefix = TokenListView(all_tokens, 0, prefix_len) if prefix_len else None
    mr._query = TokenListView(all_tokens, prefix_len, prefix_len + query_len)
    return all_tokens


def tokens_belong(loaded: np.ndarray, key: bytes, previous: np.ndarray | None) -> bool:
    """Whether a loaded block's tokens are the ones its request asked for:
    equal to the key's tokens when the key carries them (with_tokens), and in
    any case an extension of the previous block's, so a block from another
    sequence cannot sit inside a loaded prefix."""
    expected = getattr(key, "tokens", None)
    if expected is not None and not np.array_equal(loaded, expected.to_numpy()):
        return False
    return previous is None or (len(loaded) > len(previous) and np.array_equal(loaded[: len(previous)], previous))


def restore_tokens(keys: Sequence[bytes], mrs: Sequence[MemoryRegion], statuses: list[Status], loaded: int) -> int:
    """After a get in the token-validation layout: hand L2Cache correctly
    parsed tokens, and end the loaded prefix at a block without a well-formed
    footer or whose tokens are not the ones asked for (L2Cache skips such a
    block but counts the ones after it): that block becomes NOT_FOUND.
    Returns the new prefix length; the caller closes the statuses after it."""
    previous = None
    for i in range(loaded):
        mr = mrs[i]
        if not isinstance(mr, ManagedMemoryRegion):
            continue
        block_tokens = restore_packed_tokens(mr)
        if block_tokens is None:
            reason = "stored value has no valid token footer"
        elif not tokens_belong(block_tokens, keys[i], previous):
            reason = "stored tokens are not this request's (another sequence's block)"
        else:
            previous = block_tokens
            continue
        statuses[i] = Status(StatusCodes.NOT_FOUND, f"block {i}: {reason}")
        return i
    return loaded
