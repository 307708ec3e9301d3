"""The tier's config (tier/settings.py, config/'s overridden): the
connector's file and variable, the secondary_tiers entry's keys over them,
every problem of both in one error naming file, entry and key."""

import pytest

from aibrix_eic.config import ENV_CONFIG, ConfigError, EICConfig
from aibrix_eic.tier.settings import tier_config

TIER = "EICSecondaryTier"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "eic.yaml"
    path.write_text(text)
    return str(path)


def test_no_config_is_the_embedded_engine(monkeypatch):
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    config = tier_config({}, TIER, environ={})
    assert config == EICConfig() and config.uses_embedded_engine


def test_the_connectors_variable_names_the_file(tmp_path):
    path = write(tmp_path, "remote_url: local://shared\neic_kv_ns: prod\n")
    config = tier_config({}, TIER, environ={ENV_CONFIG: path})
    assert (config.remote_url, config.eic_kv_ns, config.source) == ("local://shared", "prod", path)


def test_the_entrys_keys_override_the_file(tmp_path):
    path = write(tmp_path, "remote_url: local://shared\neic_kv_ns: prod\nget_timeout_ms: 100\n")
    config = tier_config({"config_file": path, "eic_kv_ns": "tier", "model_id": "llama"}, TIER, environ={})
    assert (config.remote_url, config.eic_kv_ns, config.model_id, config.get_timeout_ms) == (
        "local://shared",
        "tier",
        "llama",
        100,
    )
    assert path in config.source and TIER in config.source


def test_every_problem_of_the_entry_at_once():
    with pytest.raises(ConfigError) as info:
        tier_config(
            {"remote_url": "local://x", "eic_thread_num": "six", "batch_keyz": 4, "fail_open": "maybe"},
            TIER,
            environ={},
        )
    error = info.value
    assert {p.key for p in error.problems} == {"eic_thread_num", "batch_keyz", "fail_open"}
    assert "secondary_tiers entry 'EICSecondaryTier'" in str(error)
    assert "did you mean 'batch_keys'" in str(error)


def test_keys_checked_together_across_file_and_entry(tmp_path):
    path = write(tmp_path, "remote_url: local://\nretry_backoff_max_ms: 10\n")
    with pytest.raises(ConfigError) as info:
        tier_config({"config_file": path, "retry_backoff_ms": 20}, TIER, environ={})
    assert info.value.key == "retry_backoff_max_ms"
    assert path in str(info.value)


def test_a_bad_file_names_the_file(tmp_path):
    path = write(tmp_path, "remote_url: ftp://x\n")
    with pytest.raises(ConfigError) as info:
        tier_config({}, TIER, environ={ENV_CONFIG: path})
    assert info.value.key == "remote_url" and path in str(info.value)
