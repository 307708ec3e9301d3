"""util/flags.py: the one reading of a boolean written as text, for the
AIBRIX_EIC_DISABLE_* variables and the engine's URL parameters. Every
spelling those accepted before is still accepted, and junk is named."""

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.engine.registry import parse_endpoint
from aibrix_eic.plugin import DISABLE_AUTOLOAD_ENV, autoload_disabled
from aibrix_eic.util.flags import FALSE_WORDS, TRUE_WORDS, env_flag, parse_flag

SPACES = st.sampled_from(["", " ", "\t", "  \n"])


def any_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(word, upper))
    )


@given(st.sampled_from(TRUE_WORDS + FALSE_WORDS).flatmap(lambda w: st.tuples(st.just(w), any_case(w))), SPACES, SPACES)
def test_every_spelling_reads_in_any_case_with_spaces_around(word_and_spelling, before, after):
    word, spelling = word_and_spelling
    assert parse_flag(before + spelling + after) is (word in TRUE_WORDS)


@given(st.text().filter(lambda t: t.strip().lower() not in TRUE_WORDS + FALSE_WORDS))
def test_anything_else_is_refused_naming_the_text(text):
    with pytest.raises(ValueError) as info:
        parse_flag(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("default", [False, True])
@pytest.mark.parametrize("raw", [None, "", "   "])
def test_an_unset_or_empty_variable_is_the_default(raw, default):
    environ = {} if raw is None else {"AIBRIX_EIC_X": raw}
    assert env_flag("AIBRIX_EIC_X", default, environ) is default


@pytest.mark.parametrize("default", [False, True])
def test_a_variable_that_is_not_a_flag_is_the_default_with_a_warning_naming_it(default, caplog):
    with caplog.at_level(logging.WARNING, logger="aibrix_eic.util.flags"):
        assert env_flag("AIBRIX_EIC_X", default, {"AIBRIX_EIC_X": "maybe"}) is default
    assert "AIBRIX_EIC_X" in caplog.text and "'maybe'" in caplog.text


# What AIBRIX_EIC_DISABLE_AUTOLOAD and AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING
# accepted before env_flag (`.strip().lower() in ("1", "true", "yes", "on")`),
# and what each spelling meant: still the same (the second, now a deprecated
# alias of AIBRIX_EIC_PATCH_TIMEOUTS=0, is read by aibrix_compat/registry.py;
# tests/unit/test_compat_registry.py checks it).
def old_reading(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", " yes ", "On", "0", "false", "no", "off", "", "2", "maybe"])
def test_the_disable_variables_read_every_value_as_before(raw):
    assert autoload_disabled({DISABLE_AUTOLOAD_ENV: raw}) is old_reading(raw)


def test_an_engine_parameter_that_is_not_a_flag_names_the_parameter():
    assert parse_endpoint("x?unreachable=ON")[1] == {"unreachable": True}
    with pytest.raises(ValueError, match="unreachable='sometimes'"):
        parse_endpoint("x?unreachable=sometimes")
