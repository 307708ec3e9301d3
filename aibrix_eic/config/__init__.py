"""Load and validate the connector's YAML config; nothing else reads files.

Every key of the upstream AIBrix EIC YAML is accepted unchanged, so an
existing file works as is. Each key is declared once, as an EICConfig field
with its default, its check and its bounds (schema.py); docs/config.md
documents every one.
Any problem raises ConfigError with a message naming the file, the key and
what was expected.
"""

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..util.docs import docs_url
from . import schema
from .schema import Bounds, ConfigError, GiB, config_key, sizes

logger = logging.getLogger(__name__)

ENV_CONFIG = "AIBRIX_KV_CACHE_OL_EIC_CONFIG"
ENV_CONFIG_UPSTREAM = "AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE"
DEFAULT_SOURCE = "<defaults>"
SCHEMES = ("eic", "local")
MiB = 1024**2
_MS = Bounds(0.001, 3_600_000)  # a deadline or an age, in ms: up to an hour

# Keys other EIC callers use, with what to write instead.
_FOREIGN_KEYS = {
    "eic_namespace": "SGLang's name for the namespace; use eic_kv_ns",
    "eic_refetch_shard_size": "an SGLang fork key; use batch_keys",
    "eic_check_max_num": "an SGLang fork key with no equivalent here",
    "enable_kvset_direct": "an SGLang key; use put_registered",
    "enable_kvget_direct": "an SGLang key; reads always use registered memory when it is registered",
    "enable_kvset_gpu_direct": "an SGLang key; GDR puts are not supported yet",
    "enable_kvget_gpu_direct": "an SGLang key; GDR gets are not supported yet",
}


@dataclass(frozen=True)
class EICConfig:
    """Validated settings; build with EICConfig.load or EICConfig.from_env."""

    source: str = DEFAULT_SOURCE  # not a key: the file the values came from
    # Upstream keys (aibrix_kvcache/l2/connectors/eic/eic.py), same defaults.
    remote_url: str = config_key("local://", schema.string)
    eic_instance_id: str = config_key("", schema.string)
    eic_thread_num: int = config_key(6, schema.integer, Bounds(1, 1024))
    eic_log_dir: str | None = config_key(None, schema.optional_string)
    eic_log_level: int = config_key(1, schema.log_level)
    eic_trans_type: int = config_key(3, schema.transport_type)
    eic_kv_ttl: int = config_key(-1, schema.integer, Bounds(-1, 2**31 - 1))
    eic_kv_ns: str = config_key("", schema.string)
    eic_flag_file: str | None = config_key(None, schema.optional_string)
    # Our keys.
    batch_keys: int = config_key(64, schema.integer, Bounds(1, 65536))
    batch_bytes: int = config_key(16 * MiB, schema.size, sizes(1, 64 * GiB))
    get_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)
    put_timeout_ms: float = config_key(5000.0, schema.positive_number, _MS)
    exists_timeout_ms: float = config_key(500.0, schema.positive_number, _MS)
    delete_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)
    retry_attempts: int = config_key(2, schema.integer, Bounds(0, 100))
    retry_backoff_ms: float = config_key(2.0, schema.positive_number, Bounds(0.001, 60_000))
    retry_backoff_max_ms: float = config_key(50.0, schema.positive_number, Bounds(0.001, 60_000))
    breaker_failures: int = config_key(5, schema.integer, Bounds(1, 1_000_000))
    probe_interval_s: float = config_key(2.0, schema.positive_number, Bounds(0.001, 3600))
    fail_open: bool = config_key(True, schema.boolean)
    warmup_keys: int = config_key(64, schema.integer, Bounds(0, 65536))
    warmup_timeout_ms: float = config_key(1000.0, schema.positive_number, _MS)
    require_registration: bool = config_key(False, schema.boolean)
    put_registered: bool = config_key(False, schema.boolean)
    max_value_bytes: int = config_key(4 * MiB, schema.size, sizes(1, 4 * GiB))
    block_nbytes: int | None = config_key(None, schema.optional_size, sizes(1, 4 * GiB))
    metrics: bool = config_key(True, schema.boolean)  # Prometheus series, see observability/metrics.py
    metrics_port: int | None = config_key(None, schema.optional_integer, Bounds(1, 65535))  # when vLLM's cannot
    model_id: str | None = config_key(None, schema.model_name)  # goes into every key; see keys/identity.py
    put_mode: str = config_key("write_behind", schema.put_mode)  # or coalesce, direct: docs/write-behind.md
    write_behind_max_bytes: int = config_key(512 * MiB, schema.size, sizes(1, 1024 * GiB))
    write_behind_max_age_ms: float = config_key(2000.0, schema.positive_number, _MS)
    write_behind_close_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)

    # ----------------------------------------------------------- derived
    @property
    def scheme(self) -> str:
        return self.remote_url.partition("://")[0]

    @property
    def endpoint(self) -> str:
        """remote_url without its scheme or a trailing slash: what
        Client.init receives."""
        return self.remote_url.partition("://")[2].rstrip("/")

    @property
    def uses_embedded_engine(self) -> bool:
        return self.scheme == "local"

    # ----------------------------------------------------------- builders
    @classmethod
    def load(cls, path: str) -> "EICConfig":
        """Read and validate the YAML file at `path`."""
        if not os.path.exists(path):
            raise ConfigError(path, None, "file does not exist")
        if os.path.isdir(path):
            raise ConfigError(path, None, "is a directory, expected a YAML file")
        try:
            with open(path, encoding="utf-8") as fin:
                data = yaml.safe_load(fin)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(path, None, f"is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                path, None, f"is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it as UTF-8"
            ) from None
        except OSError as e:
            raise ConfigError(path, None, f"cannot be read: {e.strerror}") from None
        except (ValueError, RecursionError) as e:  # whatever else a hostile file makes the parser raise
            raise ConfigError(path, None, f"could not be parsed: {e!r}") from None
        if data is None:
            raise ConfigError(path, None, "is empty; expected a mapping with at least remote_url")
        if not isinstance(data, dict):
            raise ConfigError(path, None, f"expected a mapping of keys to values, got a YAML {type(data).__name__}")
        if "remote_url" not in data:
            raise ConfigError(path, "remote_url", "is required (eic://host:port or local://)")
        return cls.from_mapping(data, source=path)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = DEFAULT_SOURCE) -> "EICConfig":
        """Validate a mapping (already parsed YAML)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if not isinstance(key, str):
                raise ConfigError(source, repr(key), "keys must be strings")
            if key not in known:
                raise ConfigError(source, key, _unknown_key_hint(key, known))
            values[key] = KEY_CHECKS[key](source, key, raw, BOUNDS.get(key))
        config = cls(source=source, **values)
        config._check_combinations()
        return config

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "EICConfig":
        """The config named by the environment, or defaults when none is."""
        path = config_path_from_env(environ)
        if not path:
            return cls()
        return cls.load(path)

    # ---------------------------------------------------------- validation
    def _check_combinations(self) -> None:
        scheme, sep, rest = self.remote_url.partition("://")
        if not sep or scheme not in SCHEMES:
            raise ConfigError(
                self.source,
                "remote_url",
                f"expected eic://host:port or local://[name][?params], got {self.remote_url!r}",
            )
        if scheme == "eic":
            if not rest.strip("/"):
                raise ConfigError(self.source, "remote_url", f"eic:// needs a host:port, got {self.remote_url!r}")
            if not self.eic_instance_id:
                raise ConfigError(self.source, "eic_instance_id", "is required for eic:// (the EIC cluster UUID)")
        else:
            from ..engine.registry import parse_endpoint

            try:
                parse_endpoint(rest)
            except ValueError as e:
                raise ConfigError(self.source, "remote_url", str(e)) from None
        if self.eic_kv_ttl == 0 or self.eic_kv_ttl < -1:
            raise ConfigError(
                self.source, "eic_kv_ttl", f"expected -1 (no expiry) or seconds > 0, got {self.eic_kv_ttl}"
            )
        if self.eic_flag_file is not None and not os.path.isfile(self.eic_flag_file):
            raise ConfigError(self.source, "eic_flag_file", f"{self.eic_flag_file} does not exist")
        if self.eic_log_dir is not None and os.path.exists(self.eic_log_dir) and not os.path.isdir(self.eic_log_dir):
            raise ConfigError(self.source, "eic_log_dir", f"{self.eic_log_dir} exists and is not a directory")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ConfigError(
                self.source,
                "retry_backoff_max_ms",
                f"must be >= retry_backoff_ms ({self.retry_backoff_ms}), got {self.retry_backoff_max_ms}",
            )
        if self.block_nbytes is not None and self.block_nbytes > self.max_value_bytes:
            raise ConfigError(
                self.source,
                "block_nbytes",
                f"{self.block_nbytes} exceeds max_value_bytes ({self.max_value_bytes})",
            )


# Derived from the declarations above: the check of every key, and the bounds
# of every number and size.
KEY_CHECKS = {f.name: f.metadata["check"] for f in dataclasses.fields(EICConfig) if "check" in f.metadata}
BOUNDS: dict[str, Bounds] = {
    f.name: f.metadata["bounds"] for f in dataclasses.fields(EICConfig) if f.metadata.get("bounds") is not None
}


def config_path_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The config path from our variable, else the upstream one, else ""."""
    env = os.environ if environ is None else environ
    return (env.get(ENV_CONFIG) or env.get(ENV_CONFIG_UPSTREAM) or "").strip()


def warn_about_env(environ: Mapping[str, str] | None = None) -> None:
    """Say which config the connector will read when that may surprise: both
    variables set to different files, or neither (the embedded engine)."""
    env = os.environ if environ is None else environ
    ours, theirs = env.get(ENV_CONFIG), env.get(ENV_CONFIG_UPSTREAM)
    if ours and theirs and ours != theirs:
        logger.warning("%s=%s and %s=%s differ; using %s", ENV_CONFIG, ours, ENV_CONFIG_UPSTREAM, theirs, ours)
    if not config_path_from_env(env):
        logger.warning(
            "Neither %s nor %s is set: the EIC connector runs on the embedded engine "
            "(local://) with default settings; cached KV lives in this process only",
            ENV_CONFIG,
            ENV_CONFIG_UPSTREAM,
        )


def _unknown_key_hint(key: str, known: set[str]) -> str:
    if key in _FOREIGN_KEYS:
        return f"unknown key ({_FOREIGN_KEYS[key]})"
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key (see {docs_url('config.md')} for the keys this connector reads)"
