"""The tier's config and the identity of its keys.

Config: the connector's YAML, named by `config_file` in the tier's
`secondary_tiers` entry or else by AIBRIX_KV_CACHE_OL_EIC_CONFIG (the
connector's variable), with any other key of the entry taken as an EIC
config key over the file's (`remote_url`, `eic_kv_ns`, `model_id`, ...),
checked by config/ with the same one-pass errors. With neither, the
embedded engine (`local://`) in this process.

Keys: the model identity of keys/identity.py (the operator's `model_id`, or
what vLLM says about the model) plus the chunk layout of vLLM's CPU offload
(`layout_text`), which AIBrix's block layout is not: keys/codec.py's
`tier_codec` keeps the two key sets disjoint.
"""

from collections.abc import Mapping
from typing import Any

from ..config import ENV_CONFIG, EICConfig, config_path_from_env
from ..keys.canonical import canonical_text

CONFIG_FILE = "config_file"


def tier_config(entry: Mapping[str, Any], tier_type: str, environ: Mapping[str, str] | None = None) -> EICConfig:
    """The EICConfig of a secondary_tiers entry (its keys other than vLLM's);
    ConfigError naming the file and/or the entry, with every problem."""
    inline = dict(entry)
    path = inline.pop(CONFIG_FILE, None) or config_path_from_env(environ)
    base = EICConfig.load(str(path)) if path else EICConfig()
    if not inline:
        return base
    return base.overridden(inline, f"secondary_tiers entry {tier_type!r}")


def describe_source(entry: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> str:
    """Where the config came from, for the log line at start."""
    parts = []
    if entry.get(CONFIG_FILE):
        parts.append(f"{CONFIG_FILE}={entry[CONFIG_FILE]}")
    elif config_path_from_env(environ):
        parts.append(f"{ENV_CONFIG}={config_path_from_env(environ)}")
    inline = sorted(key for key in entry if key != CONFIG_FILE)
    if inline:
        parts.append(f"the secondary_tiers entry ({', '.join(inline)})")
    return " + ".join(parts) or "defaults (local://, this process only)"


def layout_text(offloading_config: Any, chunk_bytes: int, model_id: str | None) -> str:
    """What makes the bytes of one tier chunk mean the same in two
    processes, besides the model identity: the chunk's size and blocks, the
    KV cache groups (their layers and tokens per block), the parallel
    shape the chunk spans, the dtype, the canonical layout, and the model
    name unless `model_id` names the weights instead. Read from vLLM's
    OffloadingConfig; a field it lacks reads as missing, which can only
    split replicas, never merge them."""
    cfg = offloading_config

    def read(*path: str) -> Any:
        value = cfg
        for name in path:
            value = getattr(value, name, "<missing>")
        return value

    groups = [(g.tokens_per_block, tuple(g.layer_names)) for g in getattr(cfg, "groups", ())]
    fields: list[tuple[str, Any]] = [
        ("chunk_bytes", chunk_bytes),
        ("blocks_per_chunk", read("cache", "blocks_per_chunk")),
        ("tokens_per_hash", read("cache", "tokens_per_hash")),
        ("groups", groups),
        ("dtype", read("model", "dtype")),
        ("tp", read("parallel", "tp_size")),
        ("pp", read("parallel", "pp_size")),
        ("pcp", read("parallel", "pcp_size")),
        ("dcp", read("parallel", "dcp_size")),
        ("replicated", read("replicated_layout")),
        ("canonical", read("canonical_layout")),
        ("kv_cache_layout", read("kv_cache_layout")),
    ]
    if model_id is None:
        fields.append(("model", read("model", "name")))
    return ";".join(f"{name}={canonical_text(value)}" for name, value in fields)
