"""canonical_text: equal values render alike whatever their insertion order,
different values differently, and nothing renders as a memory address."""

import enum
import functools
import json
import math
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.keys.canonical import Unidentifiable, canonical_text

SCALARS = st.none() | st.integers() | st.text(max_size=8)
HASHABLE = st.recursive(SCALARS, lambda inner: st.frozensets(inner, max_size=3), max_leaves=6)
# Config-like data. No bools or floats: Python calls 1 == True == 1.0 equal,
# and the text keeps them apart, which only splits.
DATA = st.recursive(
    HASHABLE,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
        | st.sets(HASHABLE, max_size=4)
    ),
    max_leaves=20,
)


@given(items=st.lists(HASHABLE, max_size=12, unique=True), data=st.data())
def test_sets_and_dicts_render_alike_whatever_their_insertion_order(items, data):
    shuffled = data.draw(st.permutations(items))
    assert canonical_text(set(items)) == canonical_text(set(shuffled))
    assert canonical_text(dict(zip(items, range(len(items))))) == canonical_text(
        {key: items.index(key) for key in shuffled}
    )


@given(first=DATA, second=DATA)
def test_values_render_alike_exactly_when_they_are_equal(first, second):
    assert (canonical_text(first) == canonical_text(second)) == (first == second)


@given(value=DATA)
def test_every_rendering_is_json(value):
    json.loads(canonical_text(value))


class Layout(enum.Enum):
    NHD = "NHD"
    HND = "HND"


@dataclass
class Scales:
    kv: float
    skip: set = field(default_factory=set)


class Slotted:
    __slots__ = ("group",)

    def __init__(self, group: int) -> None:
        self.group = group


class Rope:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, config):
        return config


def scale(config, factor):
    return config * factor


@pytest.mark.parametrize(
    "first, second",
    [
        ("1", 1),  # a string is not a number
        (None, "null"),
        ([1], {1}),  # a list is not a set
        ({"set": [1]}, {1}),  # a dict that looks like a tag is not the tagged value
        (Layout.NHD, Layout.HND),
        (Layout.NHD, "NHD"),
        (Scales(1.0), Scales(2.0)),
        (Scales(1.0, {"a"}), Scales(1.0, {"b"})),
        (Slotted(1), Slotted(2)),
        (Rope(4.0), Rope(8.0)),
        (functools.partial(scale, factor=2), functools.partial(scale, factor=3)),
        (math.nan, math.inf),
        (b"\x00", b"\x01"),
        (len, abs),
    ],
)
def test_different_settings_render_differently(first, second):
    assert canonical_text(first) != canonical_text(second)


def test_objects_render_by_their_fields_and_functions_by_their_behaviour():
    assert canonical_text(Scales(1.0, {"a", "b"})) == canonical_text(Scales(1.0, {"b", "a"}))
    assert canonical_text(functools.partial(scale, factor=2)) == canonical_text(functools.partial(scale, factor=2))

    def make(factor):
        return lambda config: config * factor

    assert canonical_text(make(2)) == canonical_text(make(2))
    assert canonical_text(make(2)) != canonical_text(make(3))
    for text in map(canonical_text, (Scales(1.0), Rope(4.0), make(2), scale, len)):
        assert " at 0x" not in text


def test_a_function_depends_on_the_globals_it_reads(monkeypatch):
    before = canonical_text(uses_a_global)
    monkeypatch.setattr(sys.modules[__name__], "ROPE_FACTOR", 8.0)
    assert canonical_text(uses_a_global) != before


ROPE_FACTOR = 4.0


def uses_a_global(config):
    return config * ROPE_FACTOR


def test_cycles_render_without_recursing_forever():
    loop: list = []
    loop.append(loop)
    assert canonical_text(loop) == canonical_text(loop)


def test_an_object_known_only_by_its_address_is_unidentifiable():
    class Opaque:
        __slots__ = ()

    with pytest.raises(Unidentifiable):
        canonical_text(Opaque())
    with pytest.raises(Unidentifiable):
        canonical_text({"a": [Opaque()]})
