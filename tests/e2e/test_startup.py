"""Start-up: which connector AIBrix gets through each install route, and a
bad config stopping the worker at start with our message."""

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

# Builds AIBrix's EIC connector the way its L2Cache does, after vLLM's own
# plugin loader ran as in every vLLM process, and prints its class.
CREATE_EIC = textwrap.dedent(
    """
    from concurrent.futures import ThreadPoolExecutor
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from aibrix_kvcache.l2.connectors import Connector, ConnectorConfig
    config = ConnectorConfig("EIC", "aibrix", "h0_1_l0_1", ThreadPoolExecutor(1))
    try:
        connector = Connector.create(config)
    except Exception as e:
        print(f"FAILED {type(e).__name__}: {e}")
    else:
        print(f"CREATED {type(connector).__module__}.{type(connector).__name__}")
    """
)


def _create_eic(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "AIBRIX_"))}
    clean.update(env, AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND="EIC")
    run = subprocess.run([sys.executable, "-c", CREATE_EIC], env=clean, capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("CREATED", "FAILED"))]
    assert run.returncode == 0 and lines, f"rc={run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    return lines[-1]


OURS = "CREATED aibrix_eic.connector.EICConnector"
NOT_OURS_PLUGINS = {"VLLM_PLUGINS": "lora_filesystem_resolver"}
ROUTES = {  # route: (environment, what AIBrix's Connector.create gives)
    "pth hook alone": (NOT_OURS_PLUGINS, OURS),
    "entry point alone": ({"AIBRIX_EIC_DISABLE_AUTOLOAD": "1"}, OURS),
    # AIBrix falls back to its own EIC connector, which needs the vendor SDK
    "both disabled": (
        {"AIBRIX_EIC_DISABLE_AUTOLOAD": "1", **NOT_OURS_PLUGINS},
        "FAILED ModuleNotFoundError: No module named 'eic'",
    ),
}


@pytest.fixture(scope="module")
def created() -> dict[str, str]:
    """Each route's result; the processes run side by side (each is mostly
    one core importing vLLM)."""
    with ThreadPoolExecutor(len(ROUTES)) as pool:
        return dict(zip(ROUTES, pool.map(_create_eic, (env for env, _ in ROUTES.values()))))


@pytest.mark.parametrize("route", ROUTES)
def test_install_routes(route, created):
    assert created[route] == ROUTES[route][1], route


def test_yaml_typo_stops_the_worker_at_start(typo_server):
    config = typo_server.config_path
    assert typo_server.wait_exit() != 0
    assert not typo_server.healthy()
    # our message, naming the file and the key, reaches the log
    typo_server.wait_log(rf"EIC config {config}:\d+: eic_kv_nss: unknown key; did you mean 'eic_kv_ns'\?", timeout_s=1)
