"""Config loading: upstream YAML accepted unchanged, every mistake named."""

import dataclasses
import os
import typing
from pathlib import Path

import pytest
from harness import write_config

from aibrix_eic.config import (
    BOUNDS,
    DEFAULT_SOURCE,
    KEY_CHECKS,
    ConfigError,
    EICConfig,
    config_path_from_env,
    schema,
)

UPSTREAM_YAML = """\
remote_url: "eic://192.168.12.62:12500"
eic_instance_id: "6c9c2a3e-0000-4000-8000-000000000000"
eic_thread_num: 6
eic_log_dir: "{log_dir}"
eic_log_level: 1
eic_trans_type: 3
eic_kv_ttl: -1
eic_kv_ns: "aibrix"
eic_flag_file: null
"""


def load_text(tmp_path, text: str) -> EICConfig:
    path = tmp_path / "eic.yaml"
    path.write_text(text)
    return EICConfig.load(str(path))


def error_of(tmp_path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    return info.value


def test_upstream_yaml_loads_unchanged(tmp_path):
    config = load_text(tmp_path, UPSTREAM_YAML.format(log_dir=tmp_path / "logs"))
    assert config.remote_url == "eic://192.168.12.62:12500"
    assert config.endpoint == "192.168.12.62:12500"
    assert config.scheme == "eic"
    assert config.eic_kv_ns == "aibrix"
    assert config.eic_thread_num == 6
    assert config.eic_flag_file is None


def test_defaults_use_the_embedded_engine():
    config = EICConfig()
    assert config.uses_embedded_engine
    assert config.source == DEFAULT_SOURCE


def test_puts_are_written_behind_unless_the_file_says_otherwise(tmp_path):
    assert EICConfig().put_mode == "write_behind"
    assert load_text(tmp_path, UPSTREAM_YAML.format(log_dir=tmp_path / "logs")).put_mode == "write_behind"
    assert load_text(tmp_path, "remote_url: local://\nput_mode: direct\n").put_mode == "direct"
    error = error_of(tmp_path, "remote_url: local://\nput_mode: behind\n")
    assert error.key == "put_mode" and "write_behind, coalesce, direct" in str(error)


def test_trailing_slash_is_not_sent_to_the_sdk(tmp_path):
    config = load_text(tmp_path, "remote_url: eic://10.0.0.1:12500/\neic_instance_id: x\n")
    assert config.endpoint == "10.0.0.1:12500"


def test_local_url_with_engine_parameters(tmp_path):
    config = load_text(tmp_path, "remote_url: local://bench?capacity=1GiB&latency=1ms\n")
    assert config.uses_embedded_engine
    assert config.endpoint == "bench?capacity=1GiB&latency=1ms"


def test_sizes_accept_units(tmp_path):
    config = load_text(tmp_path, "remote_url: local://\nmax_value_bytes: 2MiB\nblock_nbytes: 65536\n")
    assert config.max_value_bytes == 2 * 1024 * 1024
    assert config.block_nbytes == 65536


def test_missing_file_names_the_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as info:
        EICConfig.load(path)
    assert path in str(info.value) and "does not exist" in str(info.value)


def test_unparsable_yaml_names_the_file_and_line(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\neic_kv_ns: [unclosed\n")
    assert str(tmp_path / "eic.yaml") in str(error)
    assert "not valid YAML" in str(error) and "line" in str(error)


def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path):
    error = error_of(tmp_path, "- remote_url\n- local://\n")
    assert "expected a mapping" in str(error)


def test_empty_file_is_rejected(tmp_path):
    assert "is empty" in str(error_of(tmp_path, ""))


def test_missing_remote_url_is_named(tmp_path):
    error = error_of(tmp_path, "eic_kv_ns: a\n")
    assert error.key == "remote_url" and "required" in str(error)


@pytest.mark.parametrize(
    "line, key, expected",
    [
        ("eic_thread_num: six", "eic_thread_num", "expected an integer, got str"),
        ("eic_thread_num: true", "eic_thread_num", "expected an integer, got bool"),
        ("eic_thread_num: 0", "eic_thread_num", "expected an integer >= 1"),
        ("eic_kv_ns: 7", "eic_kv_ns", "expected a string, got int"),
        ("eic_kv_ttl: 1.5", "eic_kv_ttl", "expected an integer, got float"),
        ("get_timeout_ms: fast", "get_timeout_ms", "expected a number, got str"),
        ("get_timeout_ms: 0", "get_timeout_ms", "expected a number > 0"),
        ("fail_open: yes please", "fail_open", "expected true or false, got str"),
        ("max_value_bytes: lots", "max_value_bytes", "expected a size"),
        ("batch_keys: []", "batch_keys", "expected an integer, got list"),
    ],
)
def test_wrong_type_names_file_key_and_expected_type(tmp_path, line, key, expected):
    error = error_of(tmp_path, f"remote_url: local://\n{line}\n")
    assert error.key == key
    assert expected in str(error)
    assert str(tmp_path / "eic.yaml") in str(error)


@pytest.mark.parametrize(
    "key, suggestion",
    [("eic_kv_nss", "eic_kv_ns"), ("get_timeout", "get_timeout_ms"), ("remote_ur", "remote_url")],
)
def test_unknown_key_suggests_the_closest(tmp_path, key, suggestion):
    error = error_of(tmp_path, f"remote_url: local://\n{key}: 1\n")
    assert error.key == key and error.line == 2
    assert f"did you mean {suggestion!r}" in str(error)
    assert error.fix == f"rename {key} to {suggestion}"


def test_sglang_namespace_key_points_to_ours(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\neic_namespace: a\n")
    assert error.fix == "rename eic_namespace to eic_kv_ns" and error.line == 2


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("http://host:1", "expected eic://host:port or local://"),
        ("host:12500", "expected eic://host:port or local://"),
        ("eic://", "eic:// needs a host:port"),
        ("local://?capacity=huge", "capacity"),
        ("local://?latnecy=1ms", "did you mean 'latency'"),
    ],
)
def test_bad_url_is_named(tmp_path, url, fragment):
    error = error_of(tmp_path, f"remote_url: '{url}'\neic_instance_id: x\n")
    assert error.key == "remote_url"
    assert fragment in str(error)


def test_eic_url_needs_an_instance_id(tmp_path):
    error = error_of(tmp_path, "remote_url: eic://10.0.0.1:12500\n")
    assert error.key == "eic_instance_id"


@pytest.mark.parametrize("ttl", [0, -2])
def test_ttl_must_be_minus_one_or_positive(tmp_path, ttl):
    error = error_of(tmp_path, f"remote_url: local://\neic_kv_ttl: {ttl}\n")
    assert error.key == "eic_kv_ttl"


def test_missing_flag_file_is_named(tmp_path):
    error = error_of(tmp_path, f"remote_url: local://\neic_flag_file: {tmp_path / 'flags'}\n")
    assert error.key == "eic_flag_file" and "does not exist" in str(error)


def test_log_dir_that_is_a_file_is_rejected(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    error = error_of(tmp_path, f"remote_url: local://\neic_log_dir: {afile}\n")
    assert error.key == "eic_log_dir"


def test_backoff_cap_below_base_is_rejected(tmp_path):
    error = error_of(tmp_path, "remote_url: local://\nretry_backoff_ms: 10\nretry_backoff_max_ms: 5\n")
    assert error.key == "retry_backoff_max_ms"


def test_eic_url_without_sdk_names_what_to_install(tmp_path):
    from aibrix_eic.link.sdk import load_sdk_module

    config = load_text(tmp_path, "remote_url: eic://10.0.0.1:12500\neic_instance_id: x\n")
    with pytest.raises(ConfigError) as info:
        load_sdk_module(config)
    message = str(info.value)
    assert "needs the EIC Python SDK" in message
    assert "pip install" in message and "eic-1.5.2" in message
    assert "local://" in message


def test_env_prefers_our_variable_then_upstream(tmp_path):
    ours = write_config(str(tmp_path / "ours.yaml"), remote_url="local://ours")
    theirs = write_config(str(tmp_path / "theirs.yaml"), remote_url="local://theirs")
    env = {"AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE": theirs}
    assert config_path_from_env(env) == theirs
    env["AIBRIX_KV_CACHE_OL_EIC_CONFIG"] = ours
    assert config_path_from_env(env) == ours
    assert EICConfig.from_env(env).remote_url == "local://ours"
    assert EICConfig.from_env({}) == EICConfig()


def test_config_file_is_the_only_reader(tmp_path):
    # from_mapping validates without touching the file system for local://.
    config = EICConfig.from_mapping({"remote_url": "local://x"}, source="inline")
    assert config.source == "inline" and not os.path.exists("inline")


# ------------------------------------------------ values that used to escape
NUMBER_KEYS = [
    "get_timeout_ms",
    "put_timeout_ms",
    "exists_timeout_ms",
    "delete_timeout_ms",
    "warmup_timeout_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "probe_interval_s",
]


def test_non_utf8_file_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "eic.yaml"
    path.write_bytes(b"remote_url: local://\neic_kv_ns: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        EICConfig.load(str(path))
    assert str(path) in str(info.value) and "UTF-8" in str(info.value)
    with pytest.raises(ConfigError):
        EICConfig.from_env({"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(path)})


def test_non_utf8_file_makes_l2cache_open_invalid_instead_of_raising(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from aibrix_kvcache.l2.l2_cache import L2Cache
    from harness import block_spec

    path = tmp_path / "eic.yaml"
    path.write_bytes(b"remote_url: local://\n\xff\xfe: 1\n")
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_EIC_CONFIG", str(path))
    cache = L2Cache("EIC", "SIMPLE", "aibrix", block_spec(), ThreadPoolExecutor(1))
    status = cache.open()
    assert status.is_invalid() and str(path) in str(status.value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
@pytest.mark.parametrize("key", NUMBER_KEYS)
def test_non_finite_numbers_are_rejected(tmp_path, key, value):
    error = error_of(tmp_path, f"remote_url: local://\n{key}: {value}\n")
    assert error.key == key
    assert "finite" in str(error) or "> 0" in str(error)


@pytest.mark.parametrize("key", NUMBER_KEYS)
def test_huge_numbers_are_rejected_naming_the_key(tmp_path, key):
    # A YAML float, YAML 1.1's string "1e13" (no dot), an int float() cannot hold.
    for value in ("1.0e+13", "1e13", "1" + "0" * 400):
        error = error_of(tmp_path, f"remote_url: local://\n{key}: {value}\n")
        assert error.key == key and "at most" in str(error), (value, error)


def test_warmup_timeout_that_overflows_a_thread_join_is_rejected_at_load(tmp_path):
    # 1e13 ms is past threading.TIMEOUT_MAX on Linux: it broke open().
    error = error_of(tmp_path, "remote_url: local://\nwarmup_timeout_ms: 1.0e+13\n")
    assert error.key == "warmup_timeout_ms" and "at most" in str(error)
    with pytest.raises(ConfigError) as info:
        EICConfig.from_mapping({"remote_url": "local://", "warmup_timeout_ms": 1e13})
    assert info.value.key == "warmup_timeout_ms"


def test_numbers_written_without_a_dot_are_numbers(tmp_path):
    # YAML 1.1 reads 1e3 as a string; the operator meant a number.
    config = load_text(tmp_path, "remote_url: local://\nget_timeout_ms: 1e3\nprobe_interval_s: '2.5'\n")
    assert config.get_timeout_ms == 1000.0 and config.probe_interval_s == 2.5


@pytest.mark.parametrize("key", ["batch_bytes", "max_value_bytes", "block_nbytes"])
@pytest.mark.parametrize("value", ['"1e400"', '"1e400KiB"', '"1e300GiB"', "1" + "0" * 40])
def test_sizes_that_overflow_are_a_config_error_naming_the_key(tmp_path, key, value):
    error = error_of(tmp_path, f"remote_url: local://\n{key}: {value}\n")
    assert error.key == key
    assert "too large" in str(error) or "at most" in str(error)


@pytest.mark.parametrize(
    "param",
    [
        "capacity=1e400",
        "capacity=1e300GiB",
        "capacity=2000TiB",
        "max_value=1e400",
        "max_value=8GiB",
        "latency=1e400s",
        "latency=1e300m",
        "latency=7200s",
    ],
)
def test_engine_parameters_that_overflow_name_the_parameter(tmp_path, param):
    name = param.split("=")[0]
    error = error_of(tmp_path, f"remote_url: 'local://?{param}'\n")
    assert error.key == "remote_url"
    assert name in str(error)


@pytest.mark.parametrize(
    "line, key",
    [
        ("eic_thread_num: 100000", "eic_thread_num"),
        ("batch_keys: 10000000", "batch_keys"),
        ("retry_attempts: 1000", "retry_attempts"),
        ("breaker_failures: 10000000000", "breaker_failures"),
        ("warmup_keys: 10000000", "warmup_keys"),
        ("eic_kv_ttl: 10000000000", "eic_kv_ttl"),
        ("batch_bytes: 1TiB", "batch_bytes"),
        ("max_value_bytes: 8GiB", "max_value_bytes"),
        ("probe_interval_s: 0.00001", "probe_interval_s"),
        ("retry_backoff_max_ms: 600000", "retry_backoff_max_ms"),
    ],
)
def test_values_outside_their_bounds_name_the_key_and_the_bound(tmp_path, line, key):
    error = error_of(tmp_path, f"remote_url: local://\n{line}\n")
    assert error.key == key
    assert "at most" in str(error) or "at least" in str(error)


def test_values_at_their_bounds_are_accepted(tmp_path):
    lines = ["remote_url: local://"]
    for key, bounds in BOUNDS.items():
        high = bounds.high
        if key in ("block_nbytes", "batch_bytes", "max_value_bytes"):
            continue  # sizes are cross-checked against each other below
        lines.append(f"{key}: {high}")
    config = load_text(tmp_path, "\n".join(lines) + "\n")
    for key, bounds in BOUNDS.items():
        if key not in ("block_nbytes", "batch_bytes", "max_value_bytes"):
            assert getattr(config, key) == bounds.high
    low_lines = ["remote_url: local://"] + [
        f"{key}: {bounds.low}" for key, bounds in BOUNDS.items() if key not in ("retry_backoff_max_ms", "eic_kv_ttl")
    ]
    assert load_text(tmp_path, "\n".join(low_lines) + "\n")


def docs_row(key: str) -> str | None:
    docs = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    return next((line for line in docs.splitlines() if line.startswith(f"| `{key}` |")), None)


KEYS = [field for field in dataclasses.fields(EICConfig) if field.name not in ("source", "lines", "overridden_by")]


@pytest.mark.parametrize("field", KEYS, ids=lambda field: field.name)
def test_every_key_is_declared_with_its_check_and_documented(field):
    assert callable(field.metadata.get("check")), f"{field.name} has no check"
    assert KEY_CHECKS[field.name] is field.metadata["check"]
    assert docs_row(field.name) is not None, f"docs/config.md has no row for {field.name}"


@pytest.mark.parametrize(
    "field",
    [field for field in KEYS if {int, float} & {field.type, *typing.get_args(field.type)}],
    ids=lambda field: field.name,
)
@pytest.mark.parametrize("value", [10**15, -(10**15)])
def test_every_number_key_is_bounded(tmp_path, field, value):
    """By its declared Bounds, or by its list of choices (log level, transport)."""
    error = error_of(tmp_path, f"remote_url: local://\n{field.name}: {value}\n")
    assert error.key == field.name


def test_every_number_key_has_its_bound_in_the_docs():
    assert BOUNDS, "no bounds derived from the declarations"
    for key, bounds in BOUNDS.items():
        row = docs_row(key)
        assert row is not None, key
        assert str(bounds) in row.split("|")[2], f"{key}: docs/config.md does not state {str(bounds)!r}"


def test_a_check_that_needs_bounds_refuses_a_declaration_without_them():
    with pytest.raises(TypeError, match="batch_keys"):
        schema.integer("f.yaml", "batch_keys", 3, None)


# ------------------------------------------------------------------ model_id
def test_model_id_is_read_and_stripped(tmp_path):
    config = load_text(tmp_path, "remote_url: local://\nmodel_id: '  llama3-70b-ft-a@rev7  '\n")
    assert config.model_id == "llama3-70b-ft-a@rev7"
    assert EICConfig().model_id is None
    assert load_text(tmp_path, "remote_url: local://\nmodel_id: null\n").model_id is None


@pytest.mark.parametrize(
    "value, expected",
    [
        ("3.10", "quote it"),
        ("''", "is empty"),
        ("'   '", "is empty"),
        ("[a]", "expected a string"),
        ("'" + "m" * 257 + "'", "at most 256 characters"),
        ('"a\\tb"', "printable"),
    ],
)
def test_bad_model_id_is_named(tmp_path, value, expected):
    error = error_of(tmp_path, f"remote_url: local://\nmodel_id: {value}\n")
    assert error.key == "model_id" and expected in str(error)
