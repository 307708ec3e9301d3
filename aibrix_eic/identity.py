"""The model identity that goes into every EIC key.

AIBrix's conn_id names the layer and head ranges of a rank, not the model,
so two deployments with the same shapes (two fine-tunes of one base, a bf16
and an fp8 KV rollout) would read each other's KV from a shared EIC, and
token validation cannot tell, because the tokens match. The identity is a
digest of what makes the KV bytes:

- the operator's `model_id` from the YAML, when set;
- inside vLLM, the facts below, read from the config vLLM publishes to
  worker code while it builds the KV connector
  (`vllm.config.get_current_vllm_config_or_none()`, as in vLLM 0.32; the
  worker holds it set while it builds the KV connector, and AIBrix builds
  its cache manager, and so this connector, in that call).

The two are combined, never substituted: `model_id` can split deployments
that vLLM cannot tell apart (weights replaced in place under one path), but
never merges deployments whose vLLM facts differ. vLLM is never imported
here: only a vLLM that the process already loaded is asked.
"""

import base64
import hashlib
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DIGEST_BYTES = 8  # a collision needs ~2**32 distinct models
# base64url: 11 characters, all in the codec's unescaped set. Hex would take
# 16, and every character of the prefix is copied into every key.
TOKEN_LEN = 11
FORMAT = b"aibrix-eic-identity-1"

_UNSET = object()  # "ask the running vLLM", as opposed to None: "no vLLM"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class ModelIdentity:
    """What the keys of one connector say about the model."""

    token: str  # digest that goes into keys; "" when nothing identifies the model
    model_id: str | None  # the operator's model_id, if set
    vllm_factors: tuple[tuple[str, str], ...]  # what vLLM reported; () outside vLLM

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
        return f"{self.token} from {self.source}: {', '.join(details)}"


def resolve_identity(model_id: str | None, vllm_config: Any = _UNSET) -> ModelIdentity:
    """The identity for a connector. `vllm_config`: a vLLM VllmConfig (or an
    object with its attributes); None for none; left out, the one the running
    vLLM publishes, if any."""
    if vllm_config is _UNSET:
        vllm_config = current_vllm_config()
    factors = tuple(vllm_kv_factors(vllm_config)) if vllm_config is not None else ()
    if model_id is None and not factors:
        return ModelIdentity("", None, ())
    digest = hashlib.blake2b(FORMAT, digest_size=DIGEST_BYTES)
    # Length-prefixed fields: no two factor lists serialise alike.
    for name, value in (("model_id", "" if model_id is None else "=" + model_id), *factors):
        for text in (name, value):
            data = text.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(4, "big") + data)
    token = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
    return ModelIdentity(token, model_id, factors)


def announce(identity: ModelIdentity, config: Any) -> None:
    """Say at open() which model the keys belong to, loudly when none."""
    if identity.known:
        logger.info("EIC keys carry model identity %s", identity.describe())
        return
    logger.warning(
        "EIC keys carry NO MODEL IDENTITY: %s sets no model_id and no vLLM config is visible. "
        "Deployments sharing this EIC (%s, namespace %r) with the same layer and head ranges "
        "will read each other's KV as their own. Set model_id in the EIC YAML (docs/config.md).",
        config.source,
        config.remote_url,
        config.eic_kv_ns,
    )


def current_vllm_config() -> Any:
    """vLLM's current config if vLLM is loaded and publishes one, else None."""
    module = sys.modules.get("vllm.config")
    getter = getattr(module, "get_current_vllm_config_or_none", None) if module is not None else None
    if getter is None:
        return None
    try:
        return getter()
    except Exception:  # a vLLM that fails here must not stop the cache
        return None


def vllm_kv_factors(vllm_config: Any) -> list[tuple[str, str]]:
    """(name, value) of every vLLM setting that changes the KV bytes of a
    token sequence, in a fixed order. A value vLLM cannot give becomes
    "<unavailable>", which can only split deployments, never merge them."""
    model: Any = getattr(vllm_config, "model_config", None)
    cache: Any = getattr(vllm_config, "cache_config", None)  # read lazily: None becomes "<unavailable>"
    if model is None:  # a config without a model says nothing about the KV
        return []
    readers: list[tuple[str, Callable[[], Any]]] = [
        # The weights: RunAI-style loaders point `model` at a local copy and
        # keep the original URI in `model_weights`.
        ("model", lambda: getattr(model, "model_weights", "") or model.model),
        ("revision", lambda: model.revision),
        ("code_revision", lambda: model.code_revision),
        ("architectures", lambda: model.architectures),
        ("hf_overrides", lambda: model.hf_overrides),  # e.g. rope scaling, changes K
        ("dtype", lambda: model.dtype),
        ("quantization", lambda: model.quantization),
        ("quantization_config", lambda: getattr(model, "quantization_config", None)),
        ("head_size", lambda: model.get_head_size()),
        ("num_kv_heads", lambda: model.get_total_num_kv_heads()),
        ("num_layers", lambda: model.get_total_num_hidden_layers()),
        ("use_mla", lambda: model.use_mla),
        ("kv_cache_dtype", lambda: cache.cache_dtype),
        ("kv_cache_dtype_skip_layers", lambda: getattr(cache, "kv_cache_dtype_skip_layers", None)),
        ("block_size", lambda: cache.block_size),
    ]
    factors = []
    for name, read in readers:
        try:
            value = _stable_text(read())
        except Exception:
            value = "<unavailable>"
        factors.append((name, value))
    return factors


def _stable_text(value: Any) -> str:
    """Text that is the same in every process for the same setting: no
    memory addresses, no set or dict ordering."""
    if hasattr(value, "model_dump"):  # pydantic config objects
        value = value.model_dump()
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        try:
            return json.dumps(value, sort_keys=True, default=_json_default, separators=(",", ":"))
        except (TypeError, ValueError):
            pass
    elif callable(value) and not isinstance(value, type):  # hf_overrides may be a function
        return f"<callable {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}>"
    return _ADDRESS.sub("", str(value))  # torch.dtype -> "torch.bfloat16"


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return _ADDRESS.sub("", str(value))
