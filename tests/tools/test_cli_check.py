"""`aibrix-eic check`: its verdicts, exit codes and advice against a healthy,
an unreachable and a faulty engine, bad configs, a missing SDK, and stores
that lie (wrong bytes, deletes that do nothing, namespaces that leak)."""

import ctypes
import json
import os
import subprocess
import sys
import time

import pytest
from harness import write_config

import aibrix_eic.engine as engine
from aibrix_eic.cli import main
from aibrix_eic.engine.enums import StatusCode
from aibrix_eic.engine.store import Store


def run_check(capsys, *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    return code, capsys.readouterr().out


def config_file(tmp_path, **values) -> str:
    values.setdefault("remote_url", "local://")
    values.setdefault("model_id", "check-test")  # else open warns that keys carry no model identity
    return write_config(os.path.join(str(tmp_path), "eic.yaml"), **values)


def verdict_of(output: str, step: str) -> str:
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == step:
            return fields[0]
    raise AssertionError(f"no line for step {step!r} in:\n{output}")


def steps_of(output: str) -> list[str]:
    verdicts = (["PASS"], ["WARN"], ["FAIL"], ["SKIP"])
    return [line.split()[1] for line in output.splitlines() if line.split()[:1] in verdicts]


STEPS = (
    "config",
    "patch-timeouts",
    "patch-ingestion",
    "patch-flush",
    "ingestion",
    "sdk",
    "connector",
    "open",
    "register",
    "put",
    "exists",
    "get",
    "delete",
    "exists-after-delete",
    "namespace",
    "ttl",
    "close",
)


@pytest.fixture(autouse=True)
def asynchronous_ingestion(monkeypatch):
    """AIBrix's settings of a healthy setup whatever put_mode a test picks:
    L1 ingestion writes L2 asynchronously (the ingestion step may warn otherwise)."""
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS", "16384")


def test_healthy_embedded_engine_passes_every_step(capsys, tmp_path):
    code, out = run_check(capsys, "--config", config_file(tmp_path))
    assert code == 0, out
    for step in STEPS:
        assert verdict_of(out, step) == "PASS", out
    assert "verdict: PASS" in out and "warning" not in out
    assert " ms " in out  # every step shows its latency


def test_without_a_config_the_steps_that_logged_warnings_say_warn_and_show_them(capsys):
    """No config: the connector would run on the embedded engine with no
    model identity. Both are logged as warnings; check shows them without -v."""
    code, out = run_check(capsys)
    assert code == 0, out
    assert "no config file" in out  # says it checked the embedded engine
    assert verdict_of(out, "config") == "WARN" and "warning: Neither AIBRIX_KV_CACHE_OL_EIC_CONFIG" in out
    assert verdict_of(out, "open") == "WARN" and "warning: EIC keys carry NO MODEL IDENTITY" in out
    for step in set(STEPS) - {"config", "open"}:
        assert verdict_of(out, step) == "PASS", out
    assert "2 warning(s)" in out


def test_check_leaves_no_keys_behind(capsys):
    code, out = run_check(capsys)
    assert code == 0, out
    assert engine.get_store("default").keys() == []


def test_ttl_and_namespace_from_the_config_are_checked(capsys, tmp_path):
    path = config_file(tmp_path, remote_url="local://ttl-check", eic_kv_ttl=5, eic_kv_ns="prod")
    code, out = run_check(capsys, "--config", path)
    assert code == 0, out
    assert "eic_kv_ttl=5" in out
    assert "namespace 'prod' is isolated" in out
    assert engine.get_store("ttl-check").keys() == []


def test_unreachable_engine_fails_open_with_the_reason(capsys, tmp_path):
    path = config_file(tmp_path, remote_url="local://down?unreachable=true")
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "open") == "FAIL"
    assert verdict_of(out, "put") == "SKIP"
    assert "verdict: FAIL at open: init returned -1" in out
    assert "unreachable" in out
    assert "fix: remote_url asks the embedded engine to act unreachable" in out


def test_unreachable_cluster_names_the_address_to_check(capsys, tmp_path, monkeypatch):
    # The engine stands in for the vendor SDK behind eic://, as in production.
    monkeypatch.setitem(sys.modules, "eic", engine)
    path = config_file(tmp_path, remote_url="eic://10.0.0.1:12500?unreachable=true", eic_instance_id="cluster-1")
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert "init returned -1: the EIC cluster at eic://10.0.0.1:12500" in out
    assert "fix: check that 10.0.0.1:12500" in out
    assert "eic_instance_id" in out


def test_faulty_engine_fails_at_put_with_advice(capsys, tmp_path):
    path = config_file(tmp_path, remote_url="local://faulty?fail_rate=1")
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "open") == "PASS"
    assert verdict_of(out, "put") == "FAIL"
    assert "mset" in out and "FAILED" in out
    assert "fix: the embedded engine injects failures" in out


def test_put_is_written_behind_and_waited_for_by_default(capsys):
    code, out = run_check(capsys)
    assert code == 0, out
    put_line = next(line for line in out.splitlines() if line.split()[1:2] == ["put"])
    assert "written behind: in EIC" in put_line, put_line


def test_a_write_behind_flush_that_stores_nothing_fails_at_put(capsys, monkeypatch):
    """put returns OK before its block is sent (the default put_mode), so
    check waits for the flush and fails the put step when EIC refused it."""
    monkeypatch.setattr(Store, "put_many", lambda self, ns, keys, sources, ttl: [StatusCode.FAILED] * len(keys))
    code, out = run_check(capsys)
    assert code == 1
    assert verdict_of(out, "put") == "FAIL", out
    assert verdict_of(out, "exists") == "SKIP"
    assert "did not reach EIC" in out and "mset failed" in out
    assert "fix: the embedded engine injects failures" in out


def test_get_is_served_by_eic_not_by_the_pending_write(capsys, monkeypatch):
    """A store that acknowledges sets, slowly, and keeps nothing: a check
    whose exists and get were answered from the connector's pending write
    would pass."""

    def slow_and_forgetful(self, ns, keys, sources, ttl):
        time.sleep(0.2)
        return [StatusCode.SUCCESS] * len(keys)

    monkeypatch.setattr(Store, "put_many", slow_and_forgetful)
    code, out = run_check(capsys)
    assert code == 1
    assert verdict_of(out, "put") == "PASS", out
    assert verdict_of(out, "exists") == "FAIL", out
    assert verdict_of(out, "get") == "SKIP"
    assert "exists returned NOT_FOUND" in out


def test_a_flush_that_outlives_its_bound_fails_at_put(capsys, monkeypatch, tmp_path):
    def hangs(self, ns, keys, sources, ttl):
        time.sleep(0.5)
        return [StatusCode.SUCCESS] * len(keys)

    monkeypatch.setattr(Store, "put_many", hangs)
    path = config_file(tmp_path, remote_url="local://hung-flush", put_timeout_ms=50, write_behind_max_age_ms=50)
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "put") == "FAIL", out
    assert "still not written to EIC after 100 ms" in out
    assert "timeout_ms" in out.split("fix:")[1]


def test_slow_engine_fails_with_a_timeout_and_says_which_setting(capsys, tmp_path):
    path = config_file(tmp_path, remote_url="local://slow?latency=50ms", exists_timeout_ms=20, warmup_keys=0)
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "exists") == "FAIL"
    assert "TIMEOUT" in out
    assert "timeout_ms" in out.split("fix:")[1]


def test_missing_sdk_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "eic", None)  # `import eic` raises ImportError
    path = config_file(tmp_path, remote_url="eic://10.0.0.1:12500", eic_instance_id="cluster-1")
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "sdk") == "FAIL"
    assert "the EIC Python SDK is not installed" in out
    assert "pip install" in out


def test_bad_config_names_the_key(capsys, tmp_path):
    path = config_file(tmp_path, eic_kv_ttl=0)
    code, out = run_check(capsys, "--config", path)
    assert code == 1
    assert verdict_of(out, "config") == "FAIL"
    assert "eic_kv_ttl" in out
    assert f"EIC config {path}:" in out and "fix: write -1, or the seconds a value lives" in out


def test_missing_config_file_fails(capsys, tmp_path):
    code, out = run_check(capsys, "--config", str(tmp_path / "nope.yaml"))
    assert code == 1
    assert "file does not exist" in out


def test_config_from_the_environment_is_used(capsys, tmp_path, monkeypatch):
    from aibrix_eic.config import ENV_CONFIG

    monkeypatch.setenv(ENV_CONFIG, config_file(tmp_path, remote_url="local://down?unreachable=true"))
    code, out = run_check(capsys)
    assert code == 1
    assert "unreachable" in out


def test_wrong_bytes_from_get_are_caught(capsys, monkeypatch):
    real_get_many = Store.get_many

    def corrupting_get_many(self, ns, keys, destinations):
        codes = real_get_many(self, ns, keys, destinations)
        for addr, _ in destinations:
            ctypes.c_ubyte.from_address(addr).value ^= 0xFF
        return codes

    monkeypatch.setattr(Store, "get_many", corrupting_get_many)
    code, out = run_check(capsys)
    assert code == 1
    assert verdict_of(out, "get") == "FAIL"
    assert "1 of 2097152 bytes differ" in out


def test_a_delete_that_deletes_nothing_is_caught(capsys, monkeypatch):
    monkeypatch.setattr(Store, "delete_many", lambda self, ns, keys: [StatusCode.SUCCESS] * len(keys))
    code, out = run_check(capsys)
    assert code == 1
    assert verdict_of(out, "delete") == "PASS"
    assert verdict_of(out, "exists-after-delete") == "FAIL"
    assert "still finds the block after delete" in out


def test_a_namespace_that_leaks_is_caught(capsys, monkeypatch):
    real_exist_many = Store.exist_many
    monkeypatch.setattr(Store, "exist_many", lambda self, ns, keys: real_exist_many(self, "", keys))
    code, out = run_check(capsys, "--block-size", "64KiB")
    assert code == 1
    assert verdict_of(out, "namespace") == "FAIL"
    assert "is visible from namespace" in out


def test_block_size_option_sets_the_test_block(capsys):
    code, out = run_check(capsys, "--block-size", "640KiB")
    assert code == 0, out
    assert "1 block of 640.0KiB" in out


@pytest.mark.parametrize("disable_autoload", ["0", "1"])
def test_python_m_runs_check_in_a_fresh_interpreter(tmp_path, disable_autoload):
    """The real entry: a new process, routed to us by the .pth hook (or,
    with the hook off, by the command itself, with a warning)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_KV_CACHE_OL_EIC_CONFIG")}
    env["AIBRIX_EIC_DISABLE_AUTOLOAD"] = disable_autoload
    done = subprocess.run(
        [sys.executable, "-m", "aibrix_eic", "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS" in done.stdout
    connector_verdict = verdict_of(done.stdout, "connector")
    assert connector_verdict == ("WARN" if disable_autoload == "1" else "PASS"), done.stdout


def test_unreachable_check_exits_1_from_the_console_script(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "aibrix-eic")
    assert os.path.exists(script), "pip install -e . installs the aibrix-eic script"
    path = config_file(tmp_path, remote_url="local://down?unreachable=true")
    done = subprocess.run([script, "check", "--config", path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "init returned -1" in done.stdout


def test_sdk_step_shows_the_store_as_remote_url_configures_it(capsys, tmp_path):
    # The store's default capacity is 4 GiB; the step must show the 16 GiB
    # that remote_url asks for, which Client.init applies.
    path = config_file(tmp_path, remote_url="local://sized?capacity=16GiB&latency=1ms")
    code, out = run_check(capsys, "--config", path)
    assert code == 0, out
    sdk_line = next(line for line in out.splitlines() if line.split()[1:2] == ["sdk"])
    assert "capacity 16.0GiB" in sdk_line and "latency 1 ms" in sdk_line


def test_json_gives_one_object_per_step(capsys, tmp_path):
    code, out = run_check(capsys, "--config", config_file(tmp_path), "--json")
    assert code == 0
    document = json.loads(out)  # nothing but the document on stdout
    assert document["verdict"] == "PASS" and document["failed_step"] is None
    assert [step["name"] for step in document["steps"]] == list(STEPS)
    for step in document["steps"]:
        assert step["verdict"] == "PASS"
        assert step["ms"] >= 0 and step["detail"]
        assert step["fix"] is None


def test_json_failure_names_the_step_and_the_fix(capsys, tmp_path):
    path = config_file(tmp_path, remote_url="local://down?unreachable=true")
    code, out = run_check(capsys, "--config", path, "--json")
    assert code == 1
    document = json.loads(out)
    assert document["verdict"] == "FAIL" and document["failed_step"] == "open"
    steps = {step["name"]: step for step in document["steps"]}
    assert "unreachable" in steps["open"]["detail"]
    assert "unreachable=true" in steps["open"]["fix"]
    assert steps["register"]["verdict"] == "SKIP"


def test_version_names_ours_and_what_we_run_with(capsys):
    from aibrix_eic import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"aibrix-eic {__version__} (aibrix-kvcache 0.8")
    assert "torch " in out and "Python 3." in out


def test_every_step_passes_on_a_shared_store_and_the_sdk_step_says_where_it_is(capsys, tmp_path, shared_dir):
    path = config_file(tmp_path, remote_url=f"local://checked?dir={shared_dir}", eic_kv_ttl=60)
    code, out = run_check(capsys, "--config", path)
    assert code == 0, out
    for step in STEPS:
        assert verdict_of(out, step) == "PASS", out
    assert f"shared store 'checked' in {shared_dir}/checked" in out
    assert len(engine.get_store(f"checked?dir={shared_dir}")) == 0  # check leaves no keys behind


@pytest.mark.parametrize("put_mode, l1_enabled", [("direct", None), ("direct", "1"), ("coalesce", None)])
def test_synchronous_ingestion_that_waits_for_eic_is_a_warning_naming_the_setting(
    capsys, monkeypatch, tmp_path, put_mode, l1_enabled
):
    """AIBrix's defaults (L1 on, MAX_INFLIGHT_TOKENS 0) with a put that
    waits for EIC: one round trip per block inside the request, 1.9-7.7x
    slower than async in benchmarks/RESULTS.md. A warning, not a failure."""
    monkeypatch.delenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS")
    if l1_enabled is None:
        monkeypatch.delenv("AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED", raising=False)
    else:
        monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED", l1_enabled)
    code, out = run_check(capsys, "--config", config_file(tmp_path, put_mode=put_mode))
    assert code == 0, out
    assert verdict_of(out, "ingestion") == "WARN", out
    assert "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS=0" in out and f"put_mode is {put_mode}" in out
    assert "1 warning(s)" in out


@pytest.mark.parametrize(
    "put_mode, l1_enabled, inflight", [("direct", "0", "0"), ("direct", "1", "65536"), ("write_behind", "1", "0")]
)
def test_asynchronous_ingestion_no_l1_or_write_behind_passes_the_ingestion_step(
    capsys, monkeypatch, tmp_path, put_mode, l1_enabled, inflight
):
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED", l1_enabled)
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS", inflight)
    code, out = run_check(capsys, "--config", config_file(tmp_path, put_mode=put_mode))
    assert code == 0 and verdict_of(out, "ingestion") == "PASS", out


# ------------------------------------------------------------ --config-only
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_config_only_validates_a_production_config_away_from_its_node(capsys):
    """The cluster overlay names /etc/eic/flags, which exists only in its pod:
    a warning here, and nothing is connected (its eic:// has no SDK here)."""
    path = os.path.join(REPO, "deploy", "kustomize", "overlays", "cluster", "eic.yaml")
    code, out = run_check(capsys, "--config-only", "--config", path)
    assert code == 0, out
    assert verdict_of(out, "config") == "WARN"
    with open(path) as f:
        line = next(n for n, text in enumerate(f, 1) if text.startswith("eic_flag_file:"))
    assert f"{path}:{line}: eic_flag_file: /etc/eic/flags does not exist" in out and "ConfigMap" in out
    assert "verdict: PASS: the config is valid for eic://10.0.0.11:12500 (not connected, 1 warning(s))" in out
    assert steps_of(out) == ["config"]


def test_without_config_only_the_missing_flag_file_fails_the_config_step(capsys, tmp_path):
    path = config_file(tmp_path, eic_flag_file=str(tmp_path / "flags"))
    code, out = run_check(capsys, "--config", path)
    assert code == 1 and verdict_of(out, "config") == "FAIL"
    assert "eic_flag_file" in out and verdict_of(out, "open") == "SKIP"


def test_config_only_connects_to_nothing(capsys, tmp_path):
    code, out = run_check(
        capsys, "--config-only", "--config", config_file(tmp_path, remote_url="local://down?unreachable=true")
    )
    assert code == 0 and verdict_of(out, "config") == "PASS", out
    assert steps_of(out) == ["config"]  # the full check fails at open


def test_config_only_lists_every_problem_of_the_file_with_its_line(capsys, tmp_path):
    path = tmp_path / "eic.yaml"
    path.write_text("remote_url: local://\neic_thread_num: six\neic_kv_nss: a\neic_thread_num: 4\n")
    code, out = run_check(capsys, "--config-only", "--config", str(path))
    assert code == 1 and verdict_of(out, "config") == "FAIL"
    assert f"{path}: 3 problems" in out
    for fragment in (
        f"{path}:2: eic_thread_num: expected an integer, got str 'six'",
        f"{path}:3: eic_kv_nss: unknown key; did you mean 'eic_kv_ns'? (fix: rename eic_kv_nss to eic_kv_ns)",
        f"{path}:4: eic_thread_num: is set twice, on lines 2 and 4",
    ):
        assert fragment in out, out


def test_config_variables_that_differ_make_the_config_step_warn_without_verbose(capsys, tmp_path, monkeypatch):
    from aibrix_eic.config import ENV_CONFIG, ENV_CONFIG_UPSTREAM

    ours = config_file(tmp_path)
    monkeypatch.setenv(ENV_CONFIG, ours)
    monkeypatch.setenv(ENV_CONFIG_UPSTREAM, str(tmp_path / "theirs.yaml"))
    code, out = run_check(capsys, "--config-only")
    assert code == 0
    assert verdict_of(out, "config") == "WARN"
    assert (
        f"warning: {ENV_CONFIG}={ours} and {ENV_CONFIG_UPSTREAM}={tmp_path / 'theirs.yaml'} differ; using {ours}" in out
    )


@pytest.mark.parametrize("size", ["0", "0MiB", "0.1"])
def test_a_block_size_of_zero_is_refused_not_read_as_the_default(capsys, size):
    with pytest.raises(SystemExit) as info:
        main(["check", "--block-size", size])
    assert info.value.code == 2
    assert "expected a size > 0" in capsys.readouterr().err


@pytest.mark.parametrize("flag, said", [(None, "batched L1 ingestion on"), ("0", "AIBRIX_EIC_PATCH_INGESTION=0")])
def test_the_ingestion_step_says_whether_l1_ingestion_is_batched(capsys, monkeypatch, tmp_path, flag, said):
    if flag is None:
        monkeypatch.delenv("AIBRIX_EIC_PATCH_INGESTION", raising=False)
    else:
        monkeypatch.setenv("AIBRIX_EIC_PATCH_INGESTION", flag)
    code, out = run_check(capsys, "--config", config_file(tmp_path, put_mode="write_behind"))
    assert code == 0 and verdict_of(out, "ingestion") == "PASS", out
    line = next(line for line in out.splitlines() if line.split()[1:2] == ["ingestion"])
    assert said in line, line
    assert ("batched L1 ingestion off" in line) == (flag == "0"), line


def test_a_direct_put_behind_batched_ingestion_is_warned_per_l1_call(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS")
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED", "1")
    code, out = run_check(capsys, "--config", config_file(tmp_path, put_mode="direct"))
    assert code == 0 and verdict_of(out, "ingestion") == "WARN", out
    assert "every L1 acquire or put that ingests blocks" in out and "batched L1 ingestion on" in out


def test_each_workaround_has_a_line_saying_its_state_and_why(capsys, monkeypatch, tmp_path):
    from aibrix_eic.aibrix_compat import registry

    monkeypatch.setenv("AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING", "1")
    monkeypatch.setattr(registry, "aibrix_version", lambda: "0.8.1")
    code, out = run_check(capsys, "--config", config_file(tmp_path))
    assert code == 0, out
    lines = {
        line.split()[1]: line for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith("patch-")
    }
    assert set(lines) == {"patch-timeouts", "patch-ingestion", "patch-flush"}, out
    assert (
        verdict_of(out, "patch-timeouts") == "WARN"
        and "AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING is deprecated" in lines["patch-timeouts"]
    )
    assert verdict_of(out, "patch-ingestion") == "WARN" and "0.8.1 is not 0.8.0" in lines["patch-ingestion"]
    assert "skipped" in lines["patch-ingestion"]
    assert verdict_of(out, "patch-flush") == "WARN" and "installed" in lines["patch-flush"]
    for line in lines.values():
        assert "fixes: " in line and "/docs/aibrix-upstream-reports.md#" in line


def test_config_only_prints_each_problem_once_and_the_verdict_counts_them(capsys, tmp_path):
    path = tmp_path / "eic.yaml"
    path.write_text("remote_url: local://\neic_thread_num: six\nput_mode: fast\n")
    code, out = run_check(capsys, "--config-only", "--config", str(path))
    assert code == 1
    assert out.count("eic_thread_num: expected an integer") == 1 and out.count("put_mode: expected one of") == 1, out
    assert "verdict: FAIL at config: 2 problems, listed above" in out


def test_config_only_json_gives_each_problem_as_a_record(capsys, tmp_path, monkeypatch):
    path = tmp_path / "eic.yaml"
    path.write_text("remote_url: local://\neic_thread_num: six\nput_mode: fast\n")
    monkeypatch.setenv("AIBRIX_EIC_FAIL_OPEN", "maybe")
    code, out = run_check(capsys, "--config-only", "--json", "--config", str(path))
    assert code == 1
    (step,) = json.loads(out)["steps"]
    assert step["problems"] == [
        {
            "file": None,
            "line": None,
            "variable": "AIBRIX_EIC_FAIL_OPEN",
            "key": "fail_open",
            "problem": "expected true or false, got str 'maybe'",
            "fix": "set AIBRIX_EIC_FAIL_OPEN to true or false, or unset it to use the file's value or the default",
        },
        {
            "file": str(path),
            "line": 2,
            "variable": None,
            "key": "eic_thread_num",
            "problem": "expected an integer, got str 'six'",
            "fix": "write an integer from 1 to 1024, or remove the line to get the default, 6",
        },
        {
            "file": str(path),
            "line": 3,
            "variable": None,
            "key": "put_mode",
            "problem": "expected one of write_behind, coalesce, direct, got str 'fast'",
            "fix": "write one of write_behind, coalesce, direct, or remove the line to get the default, write_behind",
        },
    ]
    assert "six" not in step["detail"] and "3 problem(s)" in step["detail"]  # each problem once in the document


def test_config_only_json_records_what_the_node_needs_as_warnings(capsys):
    path = os.path.join(REPO, "deploy", "kustomize", "overlays", "cluster", "eic.yaml")
    code, out = run_check(capsys, "--config-only", "--json", "--config", path)
    assert code == 0
    (step,) = json.loads(out)["steps"]
    assert step["verdict"] == "WARN"
    assert [(record["key"], record["file"]) for record in step["problems"]] == [("eic_flag_file", path)]


@pytest.mark.parametrize("sdk_here", [False, True])
def test_config_only_notes_that_an_eic_node_needs_the_vendor_sdk(capsys, tmp_path, monkeypatch, sdk_here):
    if sdk_here:  # a module named eic that `import eic` would find
        (tmp_path / "eic.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "eic", raising=False)
    path = config_file(tmp_path, remote_url="eic://10.0.0.1:12500", eic_instance_id="uuid")
    code, out = run_check(capsys, "--config-only", "--config", path)
    assert code == 0 and verdict_of(out, "config") == "PASS", out
    note = "this host has no vendor EIC SDK (`import eic` fails); the node that runs this config needs it"
    assert (note in out) == (not sdk_here), out


def test_check_names_the_variables_that_overrode_the_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AIBRIX_EIC_EIC_KV_NS", "from-env")
    code, out = run_check(capsys, "--config-only", "--config", config_file(tmp_path, eic_kv_ns="from-file"))
    assert code == 0
    assert "eic_kv_ns 'from-env'" in out and "overridden by AIBRIX_EIC_EIC_KV_NS" in out


@pytest.mark.parametrize(
    "put_mode, l1_enabled, inflight, said",
    [
        ("direct", "0", "0", "L1 is off (AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED): nothing is ingested behind it"),
        (
            "direct",
            "1",
            "65536",
            "L1 ingestion is asynchronous (AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS=65536)",
        ),
        ("write_behind", "1", "0", "L1 ingestion is synchronous, but put_mode is write_behind: a put returns at once"),
    ],
)
def test_the_ingestion_step_says_which_condition_makes_it_pass(
    capsys, monkeypatch, tmp_path, put_mode, l1_enabled, inflight, said
):
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED", l1_enabled)
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS", inflight)
    code, out = run_check(capsys, "--config", config_file(tmp_path, put_mode=put_mode))
    assert code == 0 and verdict_of(out, "ingestion") == "PASS", out
    line = next(line for line in out.splitlines() if line.split()[1:2] == ["ingestion"])
    assert said in line and " or " not in line.split(";")[0], line
