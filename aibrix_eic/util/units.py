"""Parsing of human-written sizes ("4GiB") and durations ("1ms").

Shared by the YAML config and the embedded engine's endpoint parameters, so
both accept the same spellings and give the same error messages.
"""

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}

_NUMBER_AND_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from an int or a string such as "4GiB", "512MiB", "64k", "1024"."""
    if isinstance(text, bool):
        raise ValueError(f"expected a size such as 4GiB, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    match = _NUMBER_AND_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"expected a size such as 4GiB, 512MiB or 65536, got {text!r}")
    nbytes = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(nbytes):  # "1e400": int() of it would raise OverflowError
        raise ValueError(f"size {text!r} is too large")
    return int(nbytes)


def parse_duration(text: str | int | float) -> float:
    """Seconds from a string with a unit ("1ms", "250us", "2s") or 0."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as 1ms, got {text!r}")
    if isinstance(text, (int, float)):
        if text == 0:
            return 0.0
        raise ValueError(f"a duration needs a unit (us, ms, s), got {text!r}")
    match = _NUMBER_AND_UNIT.match(str(text))
    if match is None:
        raise ValueError(f"expected a duration such as 1ms or 0.5s, got {text!r}")
    value, unit = float(match.group(1)), match.group(2).lower()
    if unit == "" and value == 0:
        return 0.0
    if unit not in _DURATION_UNITS:
        raise ValueError(f"a duration needs a unit (ns, us, ms, s), got {text!r}")
    seconds = value * _DURATION_UNITS[unit]
    if not math.isfinite(seconds):
        raise ValueError(f"duration {text!r} is too large")
    return seconds


def exact_size_text(nbytes: int) -> str:
    """ "64GiB" when nbytes is a whole number of a binary unit, else bytes:
    for bounds in messages and docs, where "64.0GiB" would read as rounded."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def format_size(nbytes: int) -> str:
    """ "2.0MiB"-style text for logs and reports."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"  # pragma: no cover - unreachable
