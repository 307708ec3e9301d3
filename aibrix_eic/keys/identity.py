"""The model identity that goes into every EIC key.

AIBrix's conn_id names the layer and head ranges of a rank, not the model,
so two deployments with the same shapes (two fine-tunes of one base, a bf16
and an fp8 KV rollout) would read each other's KV from a shared EIC, and
token validation cannot tell, because the tokens match. The identity is a
digest of what makes the KV bytes:

- the operator's `model_id` from the YAML, when set: it names the weights,
  and replaces the weights path vLLM reports (replicas that mount the same
  weights at different paths then share);
- inside vLLM, every other fact below, read from the config vLLM publishes
  to worker code while it builds the KV connector
  (`vllm.config.get_current_vllm_config_or_none()`, as in vLLM 0.32, or
  the global that `set_current_vllm_config` sets in vLLM 0.10.x; the worker
  holds it set while it builds the KV connector, and AIBrix builds its cache
  manager, and so this connector, in that call).

`model_id` never merges deployments whose other vLLM facts differ. Values
are rendered by canonical.py, the same in every process (TP ranks and
replicas must agree, or the cache never hits). When the bytes of one
process cannot mean the same in another (fp8 KV scales computed at run
time, a setting with no stable rendering), the identity is private: a
random token no other connector shares. vLLM is never imported here: only
a vLLM that the process already loaded is asked.
"""

import base64
import hashlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..util.docs import docs_url
from .canonical import canonical_text

logger = logging.getLogger(__name__)

DIGEST_BYTES = 8  # a collision needs ~2**32 distinct models
# base64url: 11 characters, all in the codec's unescaped set. Hex would take
# 16, and every character of the prefix is copied into every key.
TOKEN_LEN = 11
# Version 2: canonical values, model_id in place of the weights path, private
# identities. Old and new processes never share a token, whatever they render.
FORMAT = b"aibrix-eic-identity-2"

_UNSET = object()  # "ask the running vLLM", as opposed to None: "no vLLM"
WEIGHTS_FACTOR = "model"  # the factor that model_id replaces
UNAVAILABLE = "<unavailable>"  # vLLM could not give the value
UNIDENTIFIABLE = "<unidentifiable>"  # vLLM gave a value with no stable rendering
# KV cache dtypes that hold no scales: vLLM keeps k/v scales at 1.0 for them.
# "auto" is not here: it follows the model, and some models default to fp8.
UNSCALED_KV_DTYPES = frozenset(canonical_text(name) for name in ("bfloat16", "float16", "float32"))


@dataclass(frozen=True)
class ModelIdentity:
    """What the keys of one connector say about the model."""

    token: str  # digest that goes into keys; "" when nothing identifies the model
    model_id: str | None  # the operator's model_id, if set
    vllm_factors: tuple[tuple[str, str], ...]  # what vLLM reported and the digest covers; () outside vLLM
    private: str | None = None  # why no other connector may share the keys; None when they may

    @property
    def known(self) -> bool:
        return bool(self.token)

    @property
    def source(self) -> str:
        parts = [name for name, present in (("model_id", self.model_id), ("vLLM", self.vllm_factors)) if present]
        return " + ".join(parts) or "none"

    def describe(self) -> str:
        """One line for logs and `aibrix-eic check`."""
        if not self.known:
            return "none (neither model_id nor a vLLM config identifies the model)"
        details = []
        if self.model_id is not None:
            details.append(f"model_id={self.model_id!r}")
        details.extend(f"{name}={value}" for name, value in self.vllm_factors)
        scope = f"; PRIVATE to this connector: {self.private}" if self.private else ""
        return f"{self.token} from {self.source}: {', '.join(details)}{scope}"


def resolve_identity(model_id: str | None, vllm_config: Any = _UNSET) -> ModelIdentity:
    """The identity for a connector. `vllm_config`: a vLLM VllmConfig (or an
    object with its attributes); None for none; left out, the one the running
    vLLM publishes, if any."""
    if vllm_config is _UNSET:
        vllm_config = current_vllm_config()
    factors = vllm_kv_factors(vllm_config) if vllm_config is not None else []
    if model_id is None and not factors:
        return ModelIdentity("", None, ())
    if model_id is not None:  # the operator names the weights; where they are mounted does not matter
        factors = [(name, value) for name, value in factors if name != WEIGHTS_FACTOR]
    private = private_reason(factors)
    digest = hashlib.blake2b(FORMAT, digest_size=DIGEST_BYTES)
    # Length-prefixed fields: no two factor lists serialise alike.
    fields = [("model_id", "" if model_id is None else "=" + model_id), *factors]
    if private:
        fields.append(("private", os.urandom(16).hex()))  # shared by no other connector, here or elsewhere
    for name, value in fields:
        for text in (name, value):
            data = text.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(4, "big") + data)
    token = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
    return ModelIdentity(token, model_id, tuple(factors), private)


def private_reason(factors: list[tuple[str, str]]) -> str | None:
    """Why KV stored under these factors means something else in another
    process, or None when it means the same everywhere."""
    values = dict(factors)
    unstable = [name for name, value in factors if value == UNIDENTIFIABLE]
    if unstable:
        return f"{', '.join(unstable)} cannot be rendered alike in every process"
    # calculate_kv_scales: each attention layer sets its fp8 k/v scales from
    # the data of this process's first forward pass, so another process's
    # fp8 bytes decode to other values (docs/config.md#model-identity).
    runtime_scales = values.get("calculate_kv_scales", canonical_text(False)) != canonical_text(False)
    if runtime_scales and values.get("kv_cache_dtype") not in UNSCALED_KV_DTYPES:
        return f"calculate_kv_scales computes the {values.get('kv_cache_dtype')} KV scales in this process"
    return None


def announce(identity: ModelIdentity, config: Any) -> None:
    """Say at open() which model the keys belong to, loudly when none."""
    if identity.private:
        logger.warning(
            "EIC keys carry model identity %s. No other process or connector reads these entries; "
            "they only fill EIC until its TTL or eviction removes them (%s).",
            identity.describe(),
            docs_url("config.md", "model-identity"),
        )
        return
    if identity.known:
        logger.info("EIC keys carry model identity %s", identity.describe())
        return
    logger.warning(
        "EIC keys carry NO MODEL IDENTITY: %s sets no model_id and no vLLM config is visible. "
        "Deployments sharing this EIC (%s, namespace %r) with the same layer and head ranges "
        "will read each other's KV as their own. Set model_id in the EIC YAML (%s).",
        config.source,
        config.remote_url,
        config.eic_kv_ns,
        docs_url("config.md", "model-identity"),
    )


def current_vllm_config() -> Any:
    """vLLM's current config if vLLM is loaded and publishes one, else None."""
    module = sys.modules.get("vllm.config")
    if module is None:
        return None
    getter = getattr(module, "get_current_vllm_config_or_none", None)
    if getter is None:
        # vLLM before the getter (0.10.x, AIBrix's images): set_current_vllm_config
        # keeps the config in this global (its get_current_vllm_config would
        # make up a default config when none is set)
        return getattr(module, "_current_vllm_config", None)
    try:
        return getter()
    except Exception:  # a vLLM that fails here must not stop the cache
        return None


def vllm_kv_factors(vllm_config: Any) -> list[tuple[str, str]]:
    """(name, canonical text) of every vLLM setting that changes the KV
    bytes of a token sequence, in a fixed order. A value vLLM cannot give
    becomes UNAVAILABLE, which can only split deployments, never merge them;
    one with no stable rendering becomes UNIDENTIFIABLE (a private identity)."""
    model: Any = getattr(vllm_config, "model_config", None)
    cache: Any = getattr(vllm_config, "cache_config", None)  # read lazily: None becomes UNAVAILABLE
    if model is None:  # a config without a model says nothing about the KV
        return []
    readers: list[tuple[str, Callable[[], Any]]] = [
        # The weights: RunAI-style loaders point `model` at a local copy and
        # keep the original URI in `model_weights`.
        (WEIGHTS_FACTOR, lambda: _weights_path(getattr(model, "model_weights", "") or model.model)),
        ("revision", lambda: model.revision),
        ("code_revision", lambda: model.code_revision),
        ("architectures", lambda: model.architectures),
        ("hf_overrides", lambda: model.hf_overrides),  # e.g. rope scaling, changes K; may be a function
        ("dtype", lambda: model.dtype),
        ("quantization", lambda: model.quantization),
        ("quantization_config", lambda: getattr(model, "quantization_config", None)),
        ("head_size", lambda: model.get_head_size()),
        ("num_kv_heads", lambda: model.get_total_num_kv_heads()),
        ("num_layers", lambda: model.get_total_num_hidden_layers()),
        ("use_mla", lambda: model.use_mla),
        ("kv_cache_dtype", lambda: cache.cache_dtype),
        ("kv_cache_dtype_skip_layers", lambda: getattr(cache, "kv_cache_dtype_skip_layers", None)),
        # Absent before vLLM 0.8 and after its removal: scales then come from
        # the checkpoint (the weights) or are 1.0.
        ("calculate_kv_scales", lambda: bool(getattr(cache, "calculate_kv_scales", False))),
        ("block_size", lambda: cache.block_size),
    ]
    factors = []
    for name, read in readers:
        try:
            value = read()
        except Exception:
            factors.append((name, UNAVAILABLE))
            continue
        try:
            factors.append((name, canonical_text(value)))
        except Exception:  # Unidentifiable, or a value whose own methods fail
            factors.append((name, UNIDENTIFIABLE))
    return factors


def _weights_path(path: Any) -> Any:
    """One path per directory: "/models/llama/" is "/models/llama"."""
    if isinstance(path, str) and len(path) > 1:
        return path.rstrip("/") or "/"
    return path
