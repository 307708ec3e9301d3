"""How each config value is checked: the type each key takes, the bounds of
every number, and ConfigError, worded for the person who wrote the file.
config.py applies these to a YAML mapping."""

import math
from typing import Any

from ..util.units import exact_size_text, parse_size


class ConfigError(ValueError):
    """A config problem, worded for the person who wrote the file."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"EIC config {where}: {problem}")


GiB = 1024**3

# Inclusive (lowest, highest) of every numeric key. Wide enough for any real
# deployment, narrow enough that no value can overflow a thread join, a sleep
# or a pool, or start thousands of threads. docs/config.md states each one.
BOUNDS: dict[str, tuple[int | float, int | float]] = {
    "eic_thread_num": (1, 1024),
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
        raise ConfigError(source, key, f"expected a string naming the model (quote it), got {_type_name(raw)} {raw!r}")
    text = raw.strip()
    if not text:
        raise ConfigError(source, key, "is empty; leave it out or name the model (for example llama3-70b-ft-2026-11)")
    if len(text) > MODEL_ID_MAX:
        raise ConfigError(source, key, f"expected at most {MODEL_ID_MAX} characters, got {len(text)}")
    if not text.isprintable():
        raise ConfigError(source, key, f"expected printable text, got {text!r}")
    return text


# The SDK builds its enums from any int (pybind11 casts without checking), so
# only these documented values are passed on. docs/engine.md has the evidence.
TRANSPORT_TYPES = {0: "TCP", 2: "RDMA", 3: "GDR"}
LOG_LEVELS = (0, 1, 2, 3, 4)


def _one_of(choices: str, allowed) -> Any:
    def check(source: str, key: str, raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(source, key, f"expected an integer, got {_type_name(raw)} {raw!r}")
        if raw not in allowed:
            raise ConfigError(source, key, f"expected one of {choices}, got {raw}")
        return raw

    return check


_transport_type = _one_of(", ".join(f"{n} ({name})" for n, name in TRANSPORT_TYPES.items()), TRANSPORT_TYPES)
_log_level = _one_of(", ".join(map(str, LOG_LEVELS)), LOG_LEVELS)


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


KEY_CHECKS = {
    "remote_url": _str,
    "eic_instance_id": _str,
    "eic_thread_num": _int,
    "eic_log_dir": _optional_str,
    "eic_log_level": _log_level,
    "eic_trans_type": _transport_type,
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
