"""Builds a random-weight Llama and its tokenizer offline, deterministically.

Nothing can be downloaded from a model hub on the test machines, so the e2e
suite and the TTFT benchmark serve a model made here: a byte-level BPE
tokenizer trained on seeded generated text, and a LlamaForCausalLM with
seeded random weights whose vocabulary equals the tokenizer's. A built model
is reused while its spec (and so its directory name) is unchanged.

    python tests/e2e/model.py tiny build/e2e/models   # prints the model dir
"""

import hashlib
import json
import random
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512


@dataclass(frozen=True)
class ModelSpec:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    dtype: str  # torch_dtype written to config.json; vLLM serves in it
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# The CPU attention backend supports head_dim 32, 64, 80, 96, 112, 128, ...
# (16 loads, then kills the engine on the first request).
SPECS = {
    "tiny": ModelSpec(128, 2, 4, 2, 256, "float32"),
    # Another model with tiny's KV shapes (only the MLP differs): KV of one
    # fits the other's cache, so only the model identity keeps them apart.
    "tiny-alt": ModelSpec(128, 2, 4, 2, 512, "float32"),
    # Large enough that prefill dominates a 3000-token request (136 M params).
    "mid": ModelSpec(1024, 12, 16, 8, 2816, "float32"),
}


def _corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "an", "el", "or", "ix", "um", "ve"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(600)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(lines)]


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(random.Random(SEED)), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    wrapped.save_pretrained(out)


def _build_weights(spec: ModelSpec, vocab_size: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)


def model_dir(name: str, root: Path) -> Path:
    spec = SPECS[name]
    # The files depend on the transformers that writes them (a tokenizer
    # saved by a newer one names a class an older one lacks): the Type3
    # venv's transformers and .venv-e2e's each get their own copy.
    writer = metadata.version("transformers")
    digest = hashlib.sha256(json.dumps([asdict(spec), SEED, VOCAB_SIZE, writer]).encode()).hexdigest()[:10]
    return root / f"{name}-{digest}"


def build(name: str, root: Path) -> Path:
    """The directory of model `name` under `root`, built if missing."""
    out = model_dir(name, root)
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    from transformers import AutoTokenizer

    vocab_size = len(AutoTokenizer.from_pretrained(out))
    _build_weights(SPECS[name], vocab_size, out)
    done.write_text("ok\n")
    return out


if __name__ == "__main__":
    print(build(sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "build/e2e/models")))
