"""AIBRIX_EIC_<KEY>: one variable per config key, overriding the file (or
the defaults), validated by the key's own check, every problem naming the
variable; other AIBRIX_EIC_* variables are not config and are left alone."""

import pytest
from harness import write_config
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.config import ENV_CONFIG, KEY_CHECKS, ConfigError, EICConfig, env_overrides, env_variable


def test_the_variable_is_the_key_in_upper_case():
    assert env_variable("put_mode") == "AIBRIX_EIC_PUT_MODE"
    assert env_variable("eic_kv_ns") == "AIBRIX_EIC_EIC_KV_NS"


def test_a_variable_overrides_the_file(tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://", put_mode="coalesce", eic_thread_num=4)
    env = {ENV_CONFIG: path, "AIBRIX_EIC_PUT_MODE": "direct", "AIBRIX_EIC_BATCH_BYTES": "8MiB"}
    config = EICConfig.from_env(env)
    assert (config.put_mode, config.batch_bytes, config.eic_thread_num) == ("direct", 8 * 1024**2, 4)
    assert set(config.overridden_by) == {"AIBRIX_EIC_PUT_MODE", "AIBRIX_EIC_BATCH_BYTES"}
    assert "put_mode" not in config.lines  # the file's line no longer holds the value


def test_variables_apply_without_a_file():
    config = EICConfig.from_env({"AIBRIX_EIC_FAIL_OPEN": "false", "AIBRIX_EIC_METRICS_PORT": "9400"})
    assert config.fail_open is False and config.metrics_port == 9400
    assert config.remote_url == "local://"


def test_a_variable_can_supply_the_required_remote_url(tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), eic_kv_ns="x")
    config = EICConfig.from_env({ENV_CONFIG: path, "AIBRIX_EIC_REMOTE_URL": "local://named"})
    assert config.remote_url == "local://named"
    with pytest.raises(ConfigError, match="remote_url: is required"):
        EICConfig.from_env({ENV_CONFIG: path})


def test_every_bad_variable_is_named_with_its_key_and_what_it_takes(tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://", eic_thread_num="six")
    env = {ENV_CONFIG: path, "AIBRIX_EIC_PUT_MODE": "fast", "AIBRIX_EIC_BATCH_KEYS": "true"}
    with pytest.raises(ConfigError) as info:
        EICConfig.from_env(env)
    by_key = {p.key: p for p in info.value.problems}
    assert set(by_key) == {"eic_thread_num", "put_mode", "batch_keys"}  # the file's problem too
    assert by_key["eic_thread_num"].variable is None and by_key["eic_thread_num"].line == 1
    put_mode = by_key["put_mode"]
    assert put_mode.variable == "AIBRIX_EIC_PUT_MODE"
    assert put_mode.text(path).startswith("AIBRIX_EIC_PUT_MODE (overrides put_mode): expected one of write_behind")
    assert "set AIBRIX_EIC_BATCH_KEYS to an integer from 1 to 65536" in by_key["batch_keys"].fix
    assert by_key["batch_keys"].problem == "expected an integer, got str 'true'"


def test_a_rule_across_keys_broken_by_a_variable_names_the_variable(tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://", retry_backoff_ms=10)
    with pytest.raises(ConfigError) as info:
        EICConfig.from_env({ENV_CONFIG: path, "AIBRIX_EIC_RETRY_BACKOFF_MAX_MS": "5"})
    (problem,) = info.value.problems
    assert problem.key == "retry_backoff_max_ms" and problem.variable == "AIBRIX_EIC_RETRY_BACKOFF_MAX_MS"


def test_other_aibrix_eic_variables_are_not_config_and_not_refused():
    env = {
        "AIBRIX_EIC_DISABLE_AUTOLOAD": "1",
        "AIBRIX_EIC_BATCHED_INGESTION": "0",
        "AIBRIX_EIC_SOME_WORKAROUND": "0",
        "AIBRIX_EIC_PUT_MODE": "direct",
    }
    assert env_overrides(env) == {"put_mode": "direct"}
    assert EICConfig.from_env(env).put_mode == "direct"


@given(key=st.sampled_from(sorted(KEY_CHECKS)), text=st.text(max_size=12))
def test_a_variable_is_judged_as_the_same_text_in_the_file_would_be(tmp_path_factory, key, text):
    """Validated the same way: the variable's text and that text written
    (quoted) as the key's value in a file are both accepted with the same
    value, or both refused with the same problem."""
    folder = tmp_path_factory.mktemp("c")
    base = {"remote_url": "local://"} if key != "remote_url" else {}
    in_file = {ENV_CONFIG: write_config(str(folder / "in_file.yaml"), **base, **{key: text})}
    in_env = {ENV_CONFIG: write_config(str(folder / "base.yaml"), **base), env_variable(key): text}
    outcomes = []
    for env in (in_file, in_env):
        try:
            outcomes.append(("ok", getattr(EICConfig.from_env(env), key)))
        except ConfigError as e:
            outcomes.append(("refused", sorted(p.problem for p in e.problems)))
    assert outcomes[0] == outcomes[1]
