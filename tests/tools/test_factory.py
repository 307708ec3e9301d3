"""AIBrix's own factory returns our connector: fresh interpreters, the vLLM
plugin entry point, the .pth hook and its opt-out, and bad configs surfacing
from open() with their messages."""

import importlib.metadata
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from aibrix_kvcache.l2.connectors import Connector, ConnectorConfig
from harness import use_config

from aibrix_eic import plugin
from aibrix_eic.connector import EICConnector

CREATE_AND_REPORT = """
from concurrent.futures import ThreadPoolExecutor
from aibrix_kvcache.l2.connectors import Connector, ConnectorConfig
try:
    conn = Connector.create(ConnectorConfig(
        backend_name="EIC", namespace="aibrix", partition_id="h0_7_l0_31",
        executor=ThreadPoolExecutor(1), block_spec_signature="lcnd16",
        key_builder_signature="ro", layout_signature="c"))
    print(type(conn).__module__ + "." + type(conn).__name__, conn.conn_id)
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


def run_fresh(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_")}
    environ.update(env)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_fresh_interpreter_gets_our_connector_from_aibrix_factory():
    out = run_fresh(CREATE_AND_REPORT)
    assert out == "aibrix_eic.connector.EICConnector aibrix_h0_7_l0_31_lcnd16roc"


def test_opt_out_leaves_aibrix_untouched():
    out = run_fresh(CREATE_AND_REPORT, AIBRIX_EIC_DISABLE_AUTOLOAD="1")
    # Upstream's connector needs the vendor SDK, which is not installed here.
    assert out.startswith("ERROR ModuleNotFoundError") and "'eic'" in out


def test_explicit_install_works_with_autoload_off():
    code = "import aibrix_eic; aibrix_eic.install()\n" + CREATE_AND_REPORT
    out = run_fresh(code, AIBRIX_EIC_DISABLE_AUTOLOAD="1")
    assert out.startswith("aibrix_eic.connector.EICConnector")


def test_hook_does_not_import_torch_or_aibrix_at_startup():
    out = run_fresh("import sys; print('torch' in sys.modules, 'aibrix_kvcache' in sys.modules)")
    assert out == "False False"


def test_install_replaces_an_upstream_module_imported_first(monkeypatch):
    import types

    fake_upstream = types.ModuleType(plugin.SHIM_MODULE)
    fake_upstream.EICConnector = object
    monkeypatch.setitem(sys.modules, plugin.SHIM_MODULE, fake_upstream)
    plugin.install()
    conn = Connector.create(
        ConnectorConfig(backend_name="EIC", namespace="n", partition_id="p", executor=ThreadPoolExecutor(1))
    )
    assert isinstance(conn, EICConnector)


def test_vllm_general_plugin_entry_point_is_declared():
    entry_points = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in entry_points if ep.name == "aibrix_eic"]
    assert len(ours) == 1
    assert ours[0].load() is plugin.register


def test_backend_alias_sets_aibrix_backend_variable():
    env = {"AIBRIX_KV_CACHE_OL_L2_BACKEND": "EIC"}
    plugin.apply_backend_alias(env)
    assert env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] == "EIC"
    explicit = {"AIBRIX_KV_CACHE_OL_L2_BACKEND": "EIC", "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "MOCK"}
    plugin.apply_backend_alias(explicit)
    assert explicit["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] == "MOCK"


def test_backend_alias_reaches_aibrix_in_a_fresh_interpreter():
    code = "import aibrix_kvcache.envs as e; print(e.AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND)"
    assert run_fresh(code, AIBRIX_KV_CACHE_OL_L2_BACKEND="eic") == "EIC"


def test_upstream_config_variable_is_honoured(monkeypatch, tmp_path):
    path = tmp_path / "upstream.yaml"
    path.write_text("remote_url: local://upstream-name\neic_kv_ns: tenant\n")
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE", str(path))
    conn = EICConnector.from_envs("conn", ThreadPoolExecutor(1))
    assert conn.config.remote_url == "local://upstream-name"
    assert conn.config.eic_kv_ns == "tenant"


def create_and_open(monkeypatch):
    conn = Connector.create(
        ConnectorConfig(backend_name="EIC", namespace="n", partition_id="p", executor=ThreadPoolExecutor(1))
    )
    assert isinstance(conn, EICConnector)
    return conn, conn.open()


BAD_CONFIGS = [
    ("missing file", None, "does not exist"),
    ("unparsable", "remote_url: [local://\n", "not valid YAML"),
    ("wrong type", "remote_url: local://\neic_thread_num: many\n", "eic_thread_num: expected an integer, got str"),
    ("unknown key", "remote_url: local://\neic_kv_namespace: a\n", "did you mean 'eic_kv_ns'"),
    ("bad url", "remote_url: redis://x:1\n", "remote_url: expected eic://host:port or local://"),
    ("sdk missing", "remote_url: eic://10.0.0.1:12500\neic_instance_id: abc\n", "needs the EIC Python SDK"),
    (
        "transport the sdk does not document",
        "remote_url: local://\neic_trans_type: 1\n",
        "eic_trans_type: expected one of 0 (TCP), 2 (RDMA), 3 (GDR), got 1",
    ),
]


@pytest.mark.parametrize("case, text, fragment", BAD_CONFIGS, ids=[case for case, _, _ in BAD_CONFIGS])
def test_bad_config_fails_open_with_a_message_naming_the_file(monkeypatch, tmp_path, case, text, fragment):
    path = tmp_path / "eic.yaml"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_EIC_CONFIG", str(path))
    conn, status = create_and_open(monkeypatch)
    assert status.is_invalid()
    assert str(path) in str(status.value)
    assert fragment in str(status.value)
    # Every other entry point refuses with the same message instead of raising.
    assert conn.register_slabs([]).is_invalid()


def test_no_config_runs_on_the_embedded_engine_with_one_warning(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="aibrix_eic"):
        conn, status = create_and_open(monkeypatch)
    assert status.is_ok()
    assert conn.config.uses_embedded_engine
    warnings = [r for r in caplog.records if "embedded engine" in r.getMessage()]
    assert len(warnings) == 1
    conn.close()


def test_config_file_routes_to_the_named_engine_store(monkeypatch, tmp_path):
    use_config(monkeypatch, tmp_path, remote_url="local://named?capacity=1MiB")
    conn, status = create_and_open(monkeypatch)
    assert status.is_ok()
    from aibrix_eic.engine import get_store

    assert get_store("named").capacity == 1024 * 1024
    conn.close()
