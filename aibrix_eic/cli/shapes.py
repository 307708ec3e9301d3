"""KV-cache shapes of common models, as one vLLM TP rank hands them to AIBrix.

A shape fixes the bytes of one block: block_ntokens x 2 (K and V) x layers x
kv heads on this rank x head_size x dtype size, in the LCND layout that
AIBrix's Type3 connector uses with FlashAttention. Each TP rank owns
kv_heads / tp of the heads and builds its own cache manager, so the
`-tpN` shapes are per rank.
"""

from dataclasses import dataclass
from typing import Any

BLOCK_NTOKENS = 16  # vLLM's default block size on GPUs


_DTYPE_NBYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    description: str
    layers: int
    kv_heads_per_rank: int
    head_size: int
    tp: int = 1
    dtype: str = "bfloat16"  # a torch dtype name; torch is imported only when needed
    block_ntokens: int = BLOCK_NTOKENS

    @property
    def dtype_nbytes(self) -> int:
        return _DTYPE_NBYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads_per_rank * self.head_size * self.dtype_nbytes

    @property
    def block_nbytes(self) -> int:
        return self.bytes_per_token * self.block_ntokens

    def block_spec(self, rank: int = 0) -> Any:
        """AIBrix's KVCacheBlockSpec for TP rank `rank` (its own kv heads)."""
        import torch
        from aibrix_kvcache.spec import KVCacheBlockLayout, KVCacheBlockSpec, KVCacheTensorSpec

        first_head = rank * self.kv_heads_per_rank
        return KVCacheBlockSpec(
            block_ntokens=self.block_ntokens,
            block_dtype=getattr(torch, self.dtype),
            block_layout=KVCacheBlockLayout.LCND,
            tensor_spec=KVCacheTensorSpec(
                heads=list(range(first_head, first_head + self.kv_heads_per_rank)),
                layers=list(range(self.layers)),
                head_size=self.head_size,
            ),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "layers": self.layers,
            "kv_heads_per_rank": self.kv_heads_per_rank,
            "head_size": self.head_size,
            "tp": self.tp,
            "dtype": self.dtype,
            "block_ntokens": self.block_ntokens,
            "block_nbytes": self.block_nbytes,
            "bytes_per_token": self.bytes_per_token,
        }


SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("llama3-8b", "Llama-3-8B, TP1 (32 layers, 8 kv heads)", 32, 8, 128),
        ModelShape(
            "llama3-70b-tp8",
            "Llama-3-70B (e.g. DeepSeek-R1-Distill-Llama-70B), one rank of TP8 (80 layers, 8 kv heads / 8 ranks)",
            80,
            1,
            128,
            tp=8,
        ),
        ModelShape(
            "llama3-70b-tp4", "Llama-3-70B, one rank of TP4 (80 layers, 8 kv heads / 4 ranks)", 80, 2, 128, tp=4
        ),
        ModelShape("qwen2.5-7b", "Qwen2.5-7B, TP1 (28 layers, 4 kv heads)", 28, 4, 128),
        ModelShape(
            "qwen2.5-32b-tp2", "Qwen2.5-32B, one rank of TP2 (64 layers, 8 kv heads / 2 ranks)", 64, 4, 128, tp=2
        ),
    )
}

DEFAULT_SHAPE = "llama3-8b"
