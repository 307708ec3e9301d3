"""Load and validate the connector's YAML config; nothing else reads files.

Every key of the upstream AIBrix EIC YAML is accepted unchanged, so an
existing file works as is. Our own keys are documented in docs/config.md.
Any problem raises ConfigError with a message naming the file, the key and
what was expected.
"""

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from .units import exact_size_text, parse_size

ENV_CONFIG = "AIBRIX_KV_CACHE_OL_EIC_CONFIG"
ENV_CONFIG_UPSTREAM = "AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE"
DEFAULT_SOURCE = "<defaults>"
SCHEMES = ("eic", "local")

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


class ConfigError(ValueError):
    """A config problem, worded for the person who wrote the file."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"EIC config {where}: {problem}")


@dataclass(frozen=True)
class EICConfig:
    """Validated settings; build with EICConfig.load or EICConfig.from_env."""

    source: str = DEFAULT_SOURCE
    # Upstream keys (aibrix_kvcache/l2/connectors/eic/eic.py), same defaults.
    remote_url: str = "local://"
    eic_instance_id: str = ""
    eic_thread_num: int = 6
    eic_log_dir: str | None = None
    eic_log_level: int = 1
    eic_trans_type: int = 3
    eic_kv_ttl: int = -1
    eic_kv_ns: str = ""
    eic_flag_file: str | None = None
    # Our keys.
    batch_keys: int = 64
    batch_bytes: int = 16 * 1024 * 1024
    get_timeout_ms: float = 2000.0
    put_timeout_ms: float = 5000.0
    exists_timeout_ms: float = 500.0
    delete_timeout_ms: float = 2000.0
    retry_attempts: int = 2
    retry_backoff_ms: float = 2.0
    retry_backoff_max_ms: float = 50.0
    breaker_failures: int = 5
    probe_interval_s: float = 2.0
    fail_open: bool = True
    warmup_keys: int = 64
    warmup_timeout_ms: float = 1000.0
    require_registration: bool = False
    put_registered: bool = True
    max_value_bytes: int = 4 * 1024 * 1024
    block_nbytes: int | None = None
    metrics: bool = True  # Prometheus series, see metrics.py
    metrics_port: int | None = None  # per-process exporter when vLLM's /metrics cannot show them
    model_id: str | None = None  # goes into every key; see identity.py
    put_mode: str = "direct"  # "write_behind", "coalesce": see write_behind.py, docs/write-behind.md
    write_behind_max_bytes: int = 512 * 1024 * 1024
    write_behind_max_age_ms: float = 2000.0
    write_behind_close_timeout_ms: float = 2000.0

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
            with open(path, "r", encoding="utf-8") as fin:
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
            raise ConfigError(
                path, None, f"expected a mapping of keys to values, got a YAML {type(data).__name__}"
            )
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
            values[key] = _KEY_CHECKS[key](source, key, raw)
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
                raise ConfigError(
                    self.source, "remote_url", f"eic:// needs a host:port, got {self.remote_url!r}"
                )
            if not self.eic_instance_id:
                raise ConfigError(
                    self.source, "eic_instance_id", "is required for eic:// (the EIC cluster UUID)"
                )
        else:
            from .engine.registry import parse_endpoint

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
        if self.eic_log_dir is not None and os.path.exists(self.eic_log_dir) and not os.path.isdir(
            self.eic_log_dir
        ):
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


def config_path_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The config path from our variable, else the upstream one, else ""."""
    env = os.environ if environ is None else environ
    return (env.get(ENV_CONFIG) or env.get(ENV_CONFIG_UPSTREAM) or "").strip()


def _unknown_key_hint(key: str, known: set[str]) -> str:
    if key in _FOREIGN_KEYS:
        return f"unknown key ({_FOREIGN_KEYS[key]})"
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return "unknown key (see docs/config.md for the keys this connector reads)"


# ------------------------------------------------------------ type checks
GiB = 1024**3

# Inclusive (lowest, highest) of every numeric key. Wide enough for any real
# deployment, narrow enough that no value can overflow a thread join, a sleep
# or a pool, or start thousands of threads. docs/config.md states each one.
BOUNDS: dict[str, tuple[int | float, int | float]] = {
    "eic_thread_num": (1, 1024),
    "eic_log_level": (0, 255),
    "eic_trans_type": (0, 255),
    "eic_kv_ttl": (-1, 2**31 - 1),
    "batch_keys": (1, 65536),
    "batch_bytes": (1, 64 * GiB),
    "get_timeout_ms": (0.001, 3_600_000),
    "put_timeout_ms": (0.001, 3_600_000),
    "exists_timeout_ms": (0.001, 3_600_000),
    "delete_timeout_ms": (0.001, 3_600_000),
    "retry_attempts": (0, 100),
    "retry_backoff_ms": (0.001, 60_000),
    "retry_backoff_max_ms": (0.001, 60_000),
    "breaker_failures": (1, 1_000_000),
    "probe_interval_s": (0.001, 3600),
    "warmup_keys": (0, 65536),
    "warmup_timeout_ms": (0.001, 3_600_000),
    "max_value_bytes": (1, 4 * GiB),
    "block_nbytes": (1, 4 * GiB),
    "metrics_port": (1, 65535),
    "write_behind_max_bytes": (1, 1024 * GiB),
    "write_behind_max_age_ms": (0.001, 3_600_000),
    "write_behind_close_timeout_ms": (0.001, 3_600_000),
}
_SIZE_KEYS = frozenset({"batch_bytes", "max_value_bytes", "block_nbytes", "write_behind_max_bytes"})


def bound_text(key: str) -> str:
    """The range of a numeric key as docs/config.md writes it."""
    low, high = BOUNDS[key]
    return f"{_limit_text(key, low)} to {_limit_text(key, high)}"


def _limit_text(key: str, limit: int | float) -> str:
    if key in _SIZE_KEYS:
        return exact_size_text(int(limit))
    return str(int(limit)) if float(limit).is_integer() else str(limit)


def _type_name(raw: Any) -> str:
    return "null" if raw is None else type(raw).__name__


def _at_most(source: str, key: str, value: int | float, shown: Any) -> None:
    high = BOUNDS[key][1]
    if value > high:
        raise ConfigError(source, key, f"expected at most {_limit_text(key, high)}, got {shown!r}")


def _int(source: str, key: str, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ConfigError(source, key, f"expected an integer, got {_type_name(raw)} {raw!r}")
    low = BOUNDS[key][0]
    if raw < low:
        raise ConfigError(source, key, f"expected an integer >= {low}, got {raw}")
    _at_most(source, key, raw, raw)
    return raw


def _positive_number(source: str, key: str, raw: Any) -> float:
    if isinstance(raw, str):  # YAML 1.1 reads 1e3 (no dot) as a string
        try:
            raw = float(raw)
        except ValueError:
            raise ConfigError(source, key, f"expected a number, got str {raw!r}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(source, key, f"expected a number, got {_type_name(raw)} {raw!r}")
    if isinstance(raw, float) and not math.isfinite(raw):  # YAML's .nan and .inf
        raise ConfigError(source, key, f"expected a finite number, got {raw}")
    if raw <= 0:
        raise ConfigError(source, key, f"expected a number > 0, got {raw}")
    _at_most(source, key, raw, raw)  # before float(): a YAML int can exceed any float
    low = BOUNDS[key][0]
    if raw < low:
        raise ConfigError(source, key, f"expected at least {_limit_text(key, low)}, got {raw}")
    return float(raw)


def _str(source: str, key: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise ConfigError(source, key, f"expected a string, got {_type_name(raw)} {raw!r}")
    return raw


def _optional_str(source: str, key: str, raw: Any) -> str | None:
    if raw is None or raw == "":
        return None
    return _str(source, key, raw)


MODEL_ID_MAX = 256


def _model_id(source: str, key: str, raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):  # a YAML number would lose digits (3.10 -> 3.1)
        raise ConfigError(
            source, key, f"expected a string naming the model (quote it), got {_type_name(raw)} {raw!r}"
        )
    text = raw.strip()
    if not text:
        raise ConfigError(source, key, "is empty; leave it out or name the model (for example llama3-70b-ft-2026-11)")
    if len(text) > MODEL_ID_MAX:
        raise ConfigError(source, key, f"expected at most {MODEL_ID_MAX} characters, got {len(text)}")
    if not text.isprintable():
        raise ConfigError(source, key, f"expected printable text, got {text!r}")
    return text


PUT_MODES = ("write_behind", "coalesce", "direct")


def _put_mode(source: str, key: str, raw: Any) -> str:
    if raw not in PUT_MODES:
        raise ConfigError(source, key, f"expected one of {', '.join(PUT_MODES)}, got {_type_name(raw)} {raw!r}")
    return raw


def _bool(source: str, key: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(source, key, f"expected true or false, got {_type_name(raw)} {raw!r}")
    return raw


def _size(source: str, key: str, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ConfigError(source, key, f"expected a size such as 4MiB or 4194304, got {_type_name(raw)} {raw!r}")
    try:
        nbytes = parse_size(raw)
    except ValueError as e:
        raise ConfigError(source, key, str(e)) from None
    if nbytes <= 0:
        raise ConfigError(source, key, f"expected a size > 0, got {raw!r}")
    _at_most(source, key, nbytes, raw)
    return nbytes


def _optional_size(source: str, key: str, raw: Any) -> int | None:
    return None if raw is None else _size(source, key, raw)


def _optional_int(source: str, key: str, raw: Any) -> int | None:
    return None if raw is None else _int(source, key, raw)


_KEY_CHECKS = {
    "remote_url": _str,
    "eic_instance_id": _str,
    "eic_thread_num": _int,
    "eic_log_dir": _optional_str,
    "eic_log_level": _int,
    "eic_trans_type": _int,
    "eic_kv_ttl": _int,
    "eic_kv_ns": _str,
    "eic_flag_file": _optional_str,
    "batch_keys": _int,
    "batch_bytes": _size,
    "get_timeout_ms": _positive_number,
    "put_timeout_ms": _positive_number,
    "exists_timeout_ms": _positive_number,
    "delete_timeout_ms": _positive_number,
    "retry_attempts": _int,
    "retry_backoff_ms": _positive_number,
    "retry_backoff_max_ms": _positive_number,
    "breaker_failures": _int,
    "probe_interval_s": _positive_number,
    "fail_open": _bool,
    "warmup_keys": _int,
    "warmup_timeout_ms": _positive_number,
    "require_registration": _bool,
    "put_registered": _bool,
    "max_value_bytes": _size,
    "block_nbytes": _optional_size,
    "metrics": _bool,
    "metrics_port": _optional_int,
    "model_id": _model_id,
    "put_mode": _put_mode,
    "write_behind_max_bytes": _size,
    "write_behind_max_age_ms": _positive_number,
    "write_behind_close_timeout_ms": _positive_number,
}
