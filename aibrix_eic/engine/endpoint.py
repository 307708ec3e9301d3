"""Parsing of an embedded-engine endpoint (`[name][?param=value&...]`):
the store's name and its parameters, each checked. Kept apart from the
stores (registry.py) so that the config check can parse a local:// URL
without importing numpy or anything else a store needs.
"""

import difflib
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from ..util.flags import parse_flag
from ..util.units import exact_size_text, parse_duration, parse_size
from .shared_files import parse_mode

# How a store reads an mexist miss (Store.mexist_miss): what the SDK's
# per-key result says for a key it does not hold.
MEXIST_MISS_READINGS = ("success", "failed")

# Upper bounds of the numeric parameters: far above any test or benchmark,
# low enough that no value overflows a sleep or an allocation size.
MAX_CAPACITY = 1024**5  # 1 PiB
MAX_VALUE = 4 * 1024**3
MAX_LATENCY_S = 3600.0


def _parse_rate(text: str) -> float:
    rate = float(text)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"expected a rate between 0 and 1, got {text!r}")
    return rate


def _bounded_size(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        nbytes = parse_size(text)
        if nbytes > maximum:
            raise ValueError(f"expected at most {exact_size_text(maximum)}, got {text!r}")
        return nbytes

    return parse


def _parse_latency(text: str) -> float:
    seconds = parse_duration(text)
    if seconds > MAX_LATENCY_S:
        raise ValueError(f"expected at most {MAX_LATENCY_S:g}s, got {text!r}")
    return seconds


def _parse_lock_timeout(text: str) -> float:
    seconds = _parse_latency(text)
    if seconds <= 0:
        raise ValueError(f"expected a duration above 0, got {text!r}")
    return seconds


def parse_prefault(text: str) -> int:
    """Bytes from `prefault=`'s value: a size, or off (0)."""
    if text.strip().lower() == "off":
        return 0
    return _bounded_size(MAX_CAPACITY)(text)


def _parse_namespaces(text: str) -> list[str]:
    return [ns for ns in text.split(",")]


def _parse_mexist_miss(text: str) -> str:
    if text not in MEXIST_MISS_READINGS:
        raise ValueError(f"expected one of {', '.join(MEXIST_MISS_READINGS)}, got {text!r}")
    return text


def _parse_seed(text: str) -> int:
    return int(text)


def _parse_dir(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a directory path, got an empty one")
    return text


# param name -> (parser, where it applies)
ENDPOINT_PARAMS: dict[str, Callable[[str], Any]] = {
    "capacity": _bounded_size(MAX_CAPACITY),
    "max_value": _bounded_size(MAX_VALUE),
    "namespaces": _parse_namespaces,
    "latency": _parse_latency,
    "fail_rate": _parse_rate,
    "key_fail_rate": _parse_rate,
    "unreachable": parse_flag,
    "phantom_rate": _parse_rate,
    "gdr_write_fail_rate": _parse_rate,
    "mexist_miss": _parse_mexist_miss,
    "default_codes_fail_rate": _parse_rate,
    "seed": _parse_seed,
    "dir": _parse_dir,
    "create": parse_flag,
    "mode": parse_mode,
    "lock_timeout": _parse_lock_timeout,
    "prefault": parse_prefault,
}


def parse_endpoint(endpoint: str) -> tuple[str, dict[str, Any]]:
    """Split an endpoint into its store name and parsed parameters.

    Raises ValueError naming the parameter on anything it cannot parse.
    """
    name, _, query = (endpoint or "").partition("?")
    name = name.strip().rstrip("/") or "default"
    params: dict[str, Any] = {}
    for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        parser = ENDPOINT_PARAMS.get(key)
        if parser is None:
            hint = difflib.get_close_matches(key, ENDPOINT_PARAMS, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ValueError(f"unknown engine parameter {key!r}{suggestion} (known: {', '.join(ENDPOINT_PARAMS)})")
        try:
            params[key] = parser(raw)
        except ValueError as e:
            raise ValueError(f"engine parameter {key}={raw!r}: {e}") from None
    return name, params
