"""aibrix_compat/registry.py's decisions: one opt-out of one polarity per
workaround (old names read, with a warning), version gates that agree with
pyproject.toml's pin, and a clear word on every version outside the tested one."""

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from aibrix_eic.aibrix_compat import ingestion, registry
from aibrix_eic.config import EICConfig

ROOT = Path(__file__).resolve().parents[2]
WORKAROUNDS = registry.WORKAROUNDS


def test_opt_out_variables_never_equal_a_config_keys_variable():
    """Config keys get AIBRIX_EIC_<KEY> variables; ours start with PATCH_,
    which no config key may."""
    keys = {field.name for field in dataclasses.fields(EICConfig)}
    assert not [key for key in keys if key.upper().startswith(registry.NAME_PREFIX)]
    per_key = {registry.ENV_PREFIX + key.upper() for key in keys}
    ours = {w.opt_out for w in WORKAROUNDS} | {alias.env for w in WORKAROUNDS for alias in w.aliases}
    assert not per_key & ours
    assert all(w.name.startswith(registry.NAME_PREFIX) and w.name.isupper() for w in WORKAROUNDS)
    assert len({w.name for w in WORKAROUNDS}) == len(WORKAROUNDS)


def test_every_gate_agrees_with_the_pyproject_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = next(dep for dep in project["dependencies"] if dep.startswith("aibrix-kvcache"))
    assert tuple(re.findall(r"[<>=]+[\d.]+", pin)) == registry.REQUIREMENT
    assert all(w.versions == registry.REQUIREMENT for w in WORKAROUNDS)
    assert registry.in_range(registry.TESTED, registry.REQUIREMENT)
    assert registry.INGESTION.opt_out == ingestion.OPT_OUT_ENV


def test_every_entry_names_its_report_and_what_it_fixes():
    reports = (ROOT / "docs" / "aibrix-upstream-reports.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", reports, re.M)}
    for w in WORKAROUNDS:
        assert w.report in anchors, w.name
        assert w.fixes and w.install is not None and w.needs
        assert w.untested in (registry.INSTALL, registry.SKIP)


@pytest.mark.parametrize("version", ["0.8", "0.8.0rc1", "0.8.9", "0.8.1.post1"])
def test_versions_inside_the_pin_are_in_range(version):
    assert registry.in_range(version, registry.REQUIREMENT)


@pytest.mark.parametrize("version", ["0.7.9", "0.9", "0.9.0", "1.0.0", "0.10.0"])
def test_versions_outside_the_pin_are_not(version):
    assert not registry.in_range(version, registry.REQUIREMENT)


@pytest.mark.parametrize("workaround", WORKAROUNDS, ids=lambda w: w.name)
def test_on_the_tested_version_each_is_on_and_says_how_to_turn_it_off(workaround):
    state = registry.decide(workaround, environ={}, version=registry.TESTED)
    assert state.on and not state.warn
    assert f"{workaround.opt_out}=0" in state.why


@pytest.mark.parametrize("workaround", WORKAROUNDS, ids=lambda w: w.name)
@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("1", True), ("on", True)])
def test_the_opt_out_has_one_polarity(workaround, value, on):
    state = registry.decide(workaround, environ={workaround.opt_out: value}, version=registry.TESTED)
    assert state.on is on and not state.warn
    if not on:
        assert state.why == f"opted out: {workaround.opt_out}={value}"


def test_a_value_that_is_not_a_flag_is_ignored_with_a_warning():
    state = registry.decide(registry.FLUSH, environ={"AIBRIX_EIC_PATCH_FLUSH": "nope"}, version=registry.TESTED)
    assert state.on and state.warn and "is not a flag" in state.why


@pytest.mark.parametrize(
    "workaround, old, off_value, on_value",
    [
        (registry.TIMEOUTS, "AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING", "1", "0"),
        (registry.INGESTION, "AIBRIX_EIC_BATCHED_INGESTION", "0", "1"),
    ],
)
def test_the_old_opt_outs_still_work_and_say_they_are_deprecated(workaround, old, off_value, on_value):
    off = registry.decide(workaround, environ={old: off_value}, version=registry.TESTED)
    assert not off.on and off.warn
    assert f"{old} is deprecated, set {workaround.opt_out}=0 instead" in off.why
    kept = registry.decide(workaround, environ={old: on_value}, version=registry.TESTED)
    assert kept.on and kept.warn and "deprecated" in kept.why
    # The new variable wins over the old one.
    both = registry.decide(workaround, environ={old: off_value, workaround.opt_out: "1"}, version=registry.TESTED)
    assert both.on and not both.warn


def test_an_untested_version_in_range_installs_or_skips_as_declared_and_warns():
    said = {w.name: registry.decide(w, environ={}, version="0.8.1") for w in WORKAROUNDS}
    assert said["PATCH_TIMEOUTS"].on and said["PATCH_FLUSH"].on
    assert not said["PATCH_INGESTION"].on
    for state in said.values():
        assert state.warn and "aibrix-kvcache 0.8.1 is not 0.8.0, the version it is tested on" in state.why
    assert "every AIBrix name it uses is there: installed" in said["PATCH_FLUSH"].why
    assert said["PATCH_INGESTION"].why.endswith("skipped")


@pytest.mark.parametrize("version", ["0.9.0", None])
def test_outside_the_range_or_without_aibrix_every_workaround_is_off_and_says_why(monkeypatch, version):
    monkeypatch.setattr(registry, "aibrix_version", lambda: version)
    for state in registry.states(environ={}):
        assert not state.on and state.warn
        assert ("outside >=0.8,<0.9" if version else "not installed") in state.why


def test_install_all_says_each_state_once_per_process(monkeypatch, caplog):
    installed: list[str] = []
    fakes = tuple(
        dataclasses.replace(w, install=lambda conn, counters, name=w.name: installed.append(name) or True)
        for w in WORKAROUNDS
    )
    monkeypatch.setattr(registry, "WORKAROUNDS", fakes)
    monkeypatch.setattr(registry, "_said", set())
    with caplog.at_level("INFO", logger=registry.__name__):
        first = registry.install_all(object(), environ={"AIBRIX_EIC_PATCH_FLUSH": "0"})
        registry.install_all(object(), environ={"AIBRIX_EIC_PATCH_FLUSH": "0"})
    assert [s.on for s in first] == [True, True, False]
    assert installed == ["PATCH_TIMEOUTS", "PATCH_INGESTION"] * 2
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "PATCH_FLUSH off: opted out: AIBRIX_EIC_PATCH_FLUSH=0" in lines[2]


def test_a_workaround_that_raises_while_installing_is_off_not_fatal(monkeypatch):
    def broken(_conn, _counters):
        raise AttributeError("L1Cache has no set_on_put_callback")

    monkeypatch.setattr(registry, "WORKAROUNDS", (dataclasses.replace(registry.INGESTION, install=broken),))
    [state] = registry.install_all(object(), environ={})
    assert not state.on and state.warn and "failed to install" in state.why and "set_on_put_callback" in state.why
