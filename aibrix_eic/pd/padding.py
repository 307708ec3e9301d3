"""The tokens that key a PD prompt's partial last block. No vLLM import.

AIBrix 0.8.0's PD connector stores a prompt's last, partial block whole, its
tokens padded to the block with token id 0, and its L2 keys are built from
token ids alone. So prompt A and B = A + [0] * k, when B is no longer than A
rounded up to a block, named one block by one key: B's decoder loaded A's
block, whose slots past len(A) hold no KV of B's (wrong tokens), and B's
prefiller found it "existing" and wrote nothing. We pad with PAD_TOKEN, an id
no tokenizer hands out, so a key names its real tokens and how many there
are: a padded block's key is never a whole block's, and two prompts share it
only when they are equal (tests/unit/test_pd_padding.py).
"""

from collections.abc import Sequence

import numpy as np

# Token ids are non-negative; the int32 that AIBrix hashes can hold -1.
PAD_TOKEN = -1


def fill_padding(context_tokens: np.ndarray, prompt_len: int) -> bool:
    """Write PAD_TOKEN past the prompt in a padded block's tokens, in place;
    whether anything changed (so a view cached on the old ids is stale)."""
    tail = context_tokens[prompt_len:]
    if tail.size == 0 or bool((tail == PAD_TOKEN).all()):
        return False
    tail[:] = PAD_TOKEN
    return True


def padded_prompt(prompt: Sequence[int], block_ntokens: int) -> np.ndarray:
    """The prompt as the PD connector keys it: padded to whole blocks."""
    aligned = -(-len(prompt) // block_ntokens) * block_ntokens
    tokens = np.zeros(aligned, dtype=np.int32)  # AIBrix's buffer before we fill it
    tokens[: len(prompt)] = prompt
    fill_padding(tokens, len(prompt))
    return tokens
