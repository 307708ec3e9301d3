"""How config values are checked: one check per kind of value, the Bounds a
number or size may take, `config_key()` to declare a key with both, and ConfigError,
worded for the person who wrote the file. Each key is declared once, as an
EICConfig field (config/__init__.py), which derives KEY_CHECKS and BOUNDS."""

import dataclasses
import ipaddress
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import yaml

from ..util.units import exact_size_text, parse_size


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a config: the key (None for the file as a whole),
    what is wrong, what to write instead, and the key's line in the file."""

    key: str | None
    problem: str
    fix: str = ""
    line: int | None = None
    variable: str | None = None  # the AIBRIX_EIC_<KEY> variable the value came from, not the file

    def text(self, source: str) -> str:
        if self.variable:
            return f"{self.variable} (overrides {self.key}): {self.problem}" + (
                f" (fix: {self.fix})" if self.fix else ""
            )
        where = f"{source}:{self.line}" if self.line else source
        what = f"{self.key}: {self.problem}" if self.key else self.problem
        return f"{where}: {what}" + (f" (fix: {self.fix})" if self.fix else "")


class ConfigError(ValueError):
    """Every problem found in one config, worded for the person who wrote the
    file. key, problem, fix and line are the first problem's."""

    def __init__(
        self, source: str, key: str | None, problem: str, fix: str = "", problems: "list[Problem] | None" = None
    ) -> None:
        self.source = source
        self.problems = problems or [Problem(key, problem, fix)]
        first = self.problems[0]
        self.key, self.problem, self.fix, self.line = first.key, first.problem, first.fix, first.line
        if len(self.problems) == 1:
            message = f"EIC config {first.text(source)}"
        else:
            lines = "".join(f"\n  {p.text(source)}" for p in self.problems)
            message = f"EIC config {source}: {len(self.problems)} problems{lines}"
        super().__init__(message)

    @classmethod
    def of(cls, source: str, problems: "list[Problem]") -> "ConfigError":
        first = problems[0]
        return cls(source, first.key, first.problem, first.fix, problems)


GiB = 1024**3


@dataclass(frozen=True)
class Bounds:
    """Inclusive (low, high) of a numeric key. Wide enough for any real
    deployment, narrow enough that no value can overflow a thread join, a
    sleep or a pool, or start thousands of threads. docs/config.md states
    each one as str(bounds) writes it."""

    low: int | float
    high: int | float
    size: bool = False  # written with units (4MiB) rather than as a number

    def text(self, limit: int | float) -> str:
        if self.size:
            return exact_size_text(int(limit))
        return str(int(limit)) if float(limit).is_integer() else str(limit)

    def __str__(self) -> str:
        return f"{self.text(self.low)} to {self.text(self.high)}"


# A check turns a raw YAML value into the key's value, or raises ConfigError.
Check = Callable[[str, str, Any, "Bounds | None"], Any]


def config_key(default: Any, check: Check, bounds: Bounds | None = None) -> Any:
    """Declare a config key (an EICConfig field): its default, its check, and
    its Bounds when it is a number or a size."""
    return dataclasses.field(default=default, metadata={"check": check, "bounds": bounds})


def sizes(low: int, high: int) -> Bounds:
    return Bounds(low, high, size=True)


def _type_name(raw: Any) -> str:
    return "null" if raw is None else type(raw).__name__


def _bounds(key: str, bounds: Bounds | None) -> Bounds:
    if bounds is None:  # a declaration mistake, caught by the config tests
        raise TypeError(f"config key {key} is declared without the bounds its check needs")
    return bounds


def _at_most(source: str, key: str, value: int | float, shown: Any, bounds: Bounds) -> None:
    if value > bounds.high:
        raise ConfigError(source, key, f"expected at most {bounds.text(bounds.high)}, got {shown!r}")


# The coercion rule, the same for every key: a quoted string is read as YAML
# reads it unquoted ("8" is 8, "yes" is true, "2000" is 2000), and numbers
# also take the 1e3 form YAML 1.1 leaves a string. Nothing else converts: a
# bool is never a number, a number never a bool or a string (model_id: 3.10
# would lose a digit), and a float is never an integer.
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def unquoted(raw: Any) -> Any:
    """raw, or for a string what YAML would read had it not been quoted."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    tag = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))
    if tag == "tag:yaml.org,2002:str":
        return raw
    try:
        return _CONSTRUCTOR.construct_object(yaml.ScalarNode(tag, text))
    except (yaml.YAMLError, ValueError):
        return raw


def integer(source: str, key: str, raw: Any, bounds: Bounds | None) -> int:
    bounds = _bounds(key, bounds)
    value = unquoted(raw)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(source, key, f"expected an integer, got {_type_name(raw)} {raw!r}")
    if value < bounds.low:
        raise ConfigError(source, key, f"expected an integer >= {bounds.low}, got {value}")
    _at_most(source, key, value, value, bounds)
    return value


def positive_number(source: str, key: str, raw: Any, bounds: Bounds | None) -> float:
    bounds = _bounds(key, bounds)
    raw = unquoted(raw)
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
    _at_most(source, key, raw, raw, bounds)  # before float(): a YAML int can exceed any float
    if raw < bounds.low:
        raise ConfigError(source, key, f"expected at least {bounds.text(bounds.low)}, got {raw}")
    return float(raw)


def string(source: str, key: str, raw: Any, _bounds: Bounds | None = None) -> str:
    if not isinstance(raw, str):
        raise ConfigError(source, key, f"expected a string, got {_type_name(raw)} {raw!r}")
    return raw


def optional_string(source: str, key: str, raw: Any, _bounds: Bounds | None) -> str | None:
    if raw is None or raw == "":
        return None
    return string(source, key, raw)


MODEL_ID_MAX = 256


def model_name(source: str, key: str, raw: Any, _bounds: Bounds | None) -> str | None:
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


def _one_of(choices: str, allowed: Collection[int]) -> Check:
    def check(source: str, key: str, raw: Any, _bounds: Bounds | None) -> int:
        value = unquoted(raw)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {_type_name(raw)} {raw!r}")
        if value not in allowed:
            raise ConfigError(source, key, f"expected one of {choices}, got {value}")
        return value

    return check


transport_type = _one_of(", ".join(f"{n} ({name})" for n, name in TRANSPORT_TYPES.items()), TRANSPORT_TYPES)
log_level = _one_of(", ".join(map(str, LOG_LEVELS)), LOG_LEVELS)


PUT_MODES = ("write_behind", "coalesce", "direct")


def put_mode(source: str, key: str, raw: Any, _bounds: Bounds | None) -> str:
    if raw not in PUT_MODES:
        raise ConfigError(source, key, f"expected one of {', '.join(PUT_MODES)}, got {_type_name(raw)} {raw!r}")
    return raw


_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def listen_address(source: str, key: str, raw: Any, _bounds: Bounds | None) -> str:
    """An address to listen on: an IPv4 or IPv6 literal, or a host name
    (resolved where it runs, not here)."""
    text = string(source, key, raw).strip()
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) > 253 or not _HOSTNAME.match(text) or text.replace(".", "").isdigit():
        raise ConfigError(source, key, f"expected an IP address or a host name, got {raw!r}")
    return text


def boolean(source: str, key: str, raw: Any, _bounds: Bounds | None) -> bool:
    value = unquoted(raw)
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {_type_name(raw)} {raw!r}")
    return value


def size(source: str, key: str, raw: Any, bounds: Bounds | None) -> int:
    bounds = _bounds(key, bounds)
    value = unquoted(raw)
    if isinstance(value, int) and not isinstance(value, bool):
        raw = value  # "0x100000", "4_194_304": parse_size reads only decimal
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ConfigError(source, key, f"expected a size such as 4MiB or 4194304, got {_type_name(raw)} {raw!r}")
    try:
        nbytes = parse_size(raw)
    except ValueError as e:
        raise ConfigError(source, key, str(e)) from None
    if nbytes <= 0:
        raise ConfigError(source, key, f"expected a size > 0, got {raw!r}")
    _at_most(source, key, nbytes, raw, bounds)
    return nbytes


def optional_size(source: str, key: str, raw: Any, bounds: Bounds | None) -> int | None:
    return None if raw is None else size(source, key, raw, bounds)


def optional_integer(source: str, key: str, raw: Any, bounds: Bounds | None) -> int | None:
    return None if raw is None else integer(source, key, raw, bounds)


# What each check accepts, in the words of a fix ("write an integer from 1 to 1024").
_EXPECTS: dict[Any, str] = {
    integer: "an integer",
    optional_integer: "an integer or null",
    positive_number: "a number",
    size: "a size (4MiB, 512KiB or 4194304)",
    optional_size: "a size or null (4MiB, 512KiB or 4194304)",
    boolean: "true or false",
    string: "a string (quoted if it looks like a number)",
    optional_string: "a string or null",
    listen_address: "an IP address or a host name (127.0.0.1 for this host only, 0.0.0.0 for every interface)",
    model_name: f"a quoted string naming the model, 1 to {MODEL_ID_MAX} printable characters",
    transport_type: f"one of {', '.join(f'{n} ({name})' for n, name in TRANSPORT_TYPES.items())}",
    log_level: f"one of {', '.join(map(str, LOG_LEVELS))}",
    put_mode: f"one of {', '.join(PUT_MODES)}",
}


def expectation(check: Check, bounds: Bounds | None) -> str:
    """What a key takes: its check's kind of value, and its range if any."""
    noun, paren, example = _EXPECTS[check].partition(" (")
    nullable = noun.endswith(" or null")
    text = noun.removesuffix(" or null") + (f" from {bounds}" if bounds else "")
    return text + (f" ({example}" if paren else "") + (", or null" if nullable else "")


def value_text(value: Any, bounds: Bounds | None) -> str:
    """A default as it would be written in the YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if bounds is not None and bounds.size:
        return exact_size_text(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else '""'
