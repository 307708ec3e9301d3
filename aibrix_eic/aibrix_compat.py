"""Workarounds for aibrix-kvcache 0.8 defects that a connector can see.

Token-validation layout (AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED=1): a
block's value is [block bytes | magic | footer(prefix_len, query_len) |
prefix+query tokens]. `ManagedMemoryRegion.unpack_tokens` in 0.8.0 reads the
footer bytes as the prefix and the first query_len tokens as the query, so
every block that has a prefix fails L2Cache's token check and only the first
block of a sequence ever loads from L2. We parse the tokens correctly after a
get and cache them on the region, which is where unpack_tokens looks first;
L2Cache then checks the real tokens against the real key.
"""

import numpy as np
import torch
from aibrix_kvcache import TokenListView
from aibrix_kvcache.memory import ManagedMemoryRegion

_INT32 = np.dtype(np.int32).itemsize
_MAGIC = ManagedMemoryRegion.MAGIC
_FOOTER_NBYTES = 2 * _INT32


def restore_packed_tokens(mr: ManagedMemoryRegion) -> bool:
    """Parse the tokens a get brought in and cache them on `mr`.

    False when the value does not hold a well-formed footer of exactly the
    region's size, in which case the block must not be reported loaded.
    """
    block_nbytes = getattr(mr, "_block_nbytes", -1)
    if block_nbytes <= 0:
        return False
    start = mr.addr + block_nbytes
    header_end = start + _INT32 + _FOOTER_NBYTES
    if header_end > mr.addr + mr.length:
        return False
    header = mr.slab[start:header_end].view(torch.int32).numpy()
    magic, prefix_len, query_len = int(header[0]), int(header[1]), int(header[2])
    if magic != _MAGIC or prefix_len < 0 or query_len <= 0:
        return False
    if ManagedMemoryRegion.calculate_size(block_nbytes, prefix_len + query_len) != mr.length:
        return False
    tokens_end = header_end + _INT32 * (prefix_len + query_len)
    all_tokens = mr.slab[header_end:tokens_end].view(torch.int32).numpy().copy()
    # Views of one array: L2Cache concatenates them with `+`, which
    # TokenListView allows only for adjacent views of the same data.
    mr._prefix = TokenListView(all_tokens, 0, prefix_len) if prefix_len else None
    mr._query = TokenListView(all_tokens, prefix_len, prefix_len + query_len)
    return True

