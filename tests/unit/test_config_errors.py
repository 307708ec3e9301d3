"""Config errors as an operator meets them: every problem of a file in one
pass, each with its file, line, key and a fix; one coercion rule for every
key; duplicates refused; an empty file and a syntax error told apart."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.config import BOUNDS, KEY_CHECKS, ConfigError, EICConfig, node_problems, schema


def load_text(tmp_path, text: str, **kwargs) -> EICConfig:
    path = tmp_path / "eic.yaml"
    path.write_text(text)
    return EICConfig.load(str(path), **kwargs)


def error_of(tmp_path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    return info.value


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    error = error_of(
        tmp_path,
        "remote_url: local://\neic_thread_num: six\nfail_open: maybe\neic_kv_nss: a\nbatch_keys: 0\n",
    )
    assert [(p.key, p.line) for p in error.problems] == [
        ("eic_thread_num", 2),
        ("fail_open", 3),
        ("eic_kv_nss", 4),
        ("batch_keys", 5),
    ]
    path = str(tmp_path / "eic.yaml")
    for problem in error.problems:
        assert f"{path}:{problem.line}: {problem.key}:" in str(error)
        assert problem.fix, problem
    assert "4 problems" in str(error)


def test_a_problem_of_the_keys_together_is_reported_with_the_others(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\nretry_backoff_ms: 10\nretry_backoff_max_ms: 5\neic_kv_ns: 7\n")
    assert {p.key for p in error.problems} == {"retry_backoff_max_ms", "eic_kv_ns"}
    backoff = next(p for p in error.problems if p.key == "retry_backoff_max_ms")
    assert backoff.line == 3 and "at least 10" in backoff.fix


def test_a_missing_remote_url_is_reported_with_the_others(tmp_path):
    error = error_of(tmp_path, "eic_thread_num: six\n")
    assert {p.key for p in error.problems} == {"remote_url", "eic_thread_num"}


def test_a_wrong_value_names_the_expected_type_its_range_and_the_default(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\neic_thread_num: six\n")
    assert "expected an integer, got str 'six'" in error.problem
    assert error.fix == "write an integer from 1 to 1024, or remove the line to get the default, 6"
    assert str(tmp_path / "eic.yaml") + ":2: eic_thread_num:" in str(error)


@pytest.mark.parametrize("key", sorted(KEY_CHECKS))
def test_every_key_has_a_fix_that_names_what_it_takes(tmp_path, key):
    error = error_of(tmp_path, f"remote_url: local://\n{key}: [1, 2]\n" if key != "remote_url" else "remote_url: []\n")
    problem = next(p for p in error.problems if p.key == key)
    assert problem.fix.startswith("write ") and problem.line is not None, problem


def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\neic_kv_ns: a\nbatch_keys: 8\neic_kv_ns: b\n")
    assert error.key == "eic_kv_ns" and "set twice, on lines 2 and 4" in error.problem
    assert error.line == 4 and error.fix


def test_a_key_from_a_yaml_merge_may_be_overridden(tmp_path):
    config = load_text(tmp_path, "remote_url: local://\n<<: {eic_kv_ns: merged, batch_keys: 8}\neic_kv_ns: mine\n")
    assert config.eic_kv_ns == "mine" and config.batch_keys == 8


@pytest.mark.parametrize("key", ["foo_bar", "eic_check_max_num"])
def test_an_unknown_key_with_nothing_to_rename_to_is_to_be_removed(tmp_path, key):
    error = error_of(tmp_path, f"remote_url: local://\n{key}: 1\n")
    assert error.fix.startswith(f"remove {key}") and error.line == 2


def test_an_empty_file_and_a_syntax_error_are_told_apart(tmp_path):
    empty = error_of(tmp_path, "# nothing here\n")
    broken = error_of(tmp_path, "remote_url: local://\neic_kv_ns: [unclosed\n")
    assert "is empty" in empty.problem and "remote_url" in empty.fix
    assert "not valid YAML at line 3, column 1" in broken.problem
    assert "began at line 2, column 12" in broken.problem and broken.fix == "correct the YAML syntax at line 2"
    assert empty.fix != broken.fix


def test_a_syntax_error_names_its_line_and_column(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\neic_kv_ns: a: b\n")
    assert "at line 2, column 13" in error.problem and error.fix == "correct the YAML syntax at line 2"


# ------------------------------------------------------------- coercion
INT_KEYS = [k for k, check in KEY_CHECKS.items() if check in (schema.integer, schema.optional_integer)]
BOOL_KEYS = [k for k, check in KEY_CHECKS.items() if check is schema.boolean]
NUMBER_KEYS = [k for k, check in KEY_CHECKS.items() if check is schema.positive_number]
# YAML 1.1's spellings of true and false, as PyYAML reads them unquoted.
BOOL_WORDS = ["yes", "Yes", "YES", "no", "No", "true", "True", "FALSE", "on", "On", "off", "OFF"]


@given(data=st.data())
def test_a_quoted_integer_means_what_the_unquoted_one_does(tmp_path_factory, data):
    key = data.draw(st.sampled_from(INT_KEYS))
    bounds = BOUNDS[key]
    value = data.draw(st.integers(int(bounds.low), int(bounds.high)))
    if key == "eic_kv_ttl" and value == 0:
        value = -1
    tmp_path = tmp_path_factory.mktemp("c")
    assert getattr(load_text(tmp_path, f"remote_url: local://\n{key}: '{value}'\n"), key) == value
    assert getattr(load_text(tmp_path, f"remote_url: local://\n{key}: {value}\n"), key) == value


@pytest.mark.parametrize("word", BOOL_WORDS)
@pytest.mark.parametrize("key", BOOL_KEYS)
def test_a_quoted_boolean_means_what_the_unquoted_one_does(tmp_path, key, word):
    quoted = getattr(load_text(tmp_path, f"remote_url: local://\n{key}: '{word}'\n"), key)
    assert quoted is getattr(load_text(tmp_path, f"remote_url: local://\n{key}: {word}\n"), key)
    assert quoted is (word.lower() in ("yes", "true", "on"))


@pytest.mark.parametrize("key", NUMBER_KEYS)
def test_a_quoted_number_means_what_the_unquoted_one_does(tmp_path, key):
    for written in ("20", "2.5", "1e1"):
        quoted = getattr(load_text(tmp_path, f"remote_url: local://\n{key}: '{written}'\n"), key)
        assert quoted == getattr(load_text(tmp_path, f"remote_url: local://\n{key}: {written}\n"), key)


def test_the_three_values_of_the_report_follow_one_rule(tmp_path):
    config = load_text(tmp_path, "remote_url: local://\nget_timeout_ms: '2000'\neic_thread_num: '8'\nfail_open: 'no'\n")
    assert (config.get_timeout_ms, config.eic_thread_num, config.fail_open) == (2000.0, 8, False)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("eic_thread_num: true", "expected an integer, got bool"),  # never 1
        ("eic_thread_num: 8.0", "expected an integer, got float"),
        ("eic_thread_num: '8.5'", "expected an integer, got str '8.5'"),
        ("fail_open: 1", "expected true or false, got int 1"),
        ("fail_open: 'maybe'", "expected true or false, got str 'maybe'"),
        ("eic_kv_ns: 7", "expected a string, got int"),
        ("get_timeout_ms: true", "expected a number, got bool"),
    ],
)
def test_what_the_rule_does_not_convert(tmp_path, line, expected):
    assert expected in error_of(tmp_path, f"remote_url: local://\n{line}\n").problem


# ------------------------------------------------------- node checks
def test_a_flag_file_missing_here_is_a_node_problem_not_a_config_one(tmp_path):
    text = f"remote_url: local://\neic_flag_file: {tmp_path / 'flags'}\n"
    config = load_text(tmp_path, text, node_checks=False)
    assert [p.key for p in node_problems(config)] == ["eic_flag_file"]
    error = error_of(tmp_path, text)
    assert error.key == "eic_flag_file" and error.line == 2 and "ConfigMap" in error.fix


def test_problems_are_plain_records():
    problem = schema.Problem("k", "is wrong", "write it right", 3)
    assert dataclasses.replace(problem, line=4).text("f.yaml") == "f.yaml:4: k: is wrong (fix: write it right)"
