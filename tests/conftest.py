"""Shared fixtures: a fresh embedded engine per test, AIBrix set up for CPU.

Environment that AIBrix reads at import time is set here, before any test
module imports aibrix_kvcache.
"""

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Timing is not what these properties test: a loaded CI host stalls past
# hypothesis's 200 ms deadline and its data-generation health check.
settings.register_profile("aibrix-eic", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("aibrix-eic")

# The real-vLLM suite needs its own venv and servers: `make e2e` runs it.
collect_ignore = ["e2e"]

# Read by aibrix_kvcache at import (memory_region.MR_USE_COMPACT_LAYOUT);
# tests that need the token-validation layout patch it per test.
os.environ.setdefault("AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED", "0")
for _name in ("AIBRIX_KV_CACHE_OL_EIC_CONFIG", "AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE"):
    os.environ.pop(_name, None)

import aibrix_kvcache.cache_manager as _cache_manager  # noqa: E402

import aibrix_eic  # noqa: E402
from aibrix_eic.config import ENV_CONFIG, ENV_CONFIG_UPSTREAM  # noqa: E402
from aibrix_eic.engine import reset_stores  # noqa: E402
from aibrix_eic.engine.store_pages import PREFAULT_ENV  # noqa: E402

# Stores made by tests, and by the processes they start, keep no pages
# faulted ahead unless a test asks (tests/engine/test_store_prefault.py):
# each would fault a default's worth in the background.
os.environ[PREFAULT_ENV] = "0"
# CPU-only torch cannot pin memory (pinning needs CUDA).
_cache_manager.TESTING_DISABLE_PIN_MEMORY = True
# Route AIBrix's EIC backend to us even when the .pth hook is disabled.
aibrix_eic.install()


def pytest_addoption(parser):
    parser.addoption(
        "--eic-config",
        action="store",
        default=None,
        help="YAML config of a real EIC cluster (remote_url: eic://...): the SDK "
        "conformance suite then also runs against the vendor SDK",
    )


@pytest.fixture(autouse=True)
def fresh_engine(monkeypatch):
    """Every test starts with no engine stores and no EIC config in env."""
    reset_stores()
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.delenv(ENV_CONFIG_UPSTREAM, raising=False)
    yield
    reset_stores()


@pytest.fixture(params=["success", "failed"])
def mexist_miss(request, monkeypatch) -> str:
    """Run the test under both readings of an mexist that finds keys absent
    (SUCCESS, or PARTIAL_FAILED/FAILED; docs/engine.md): every engine store
    of the test answers that way."""
    from aibrix_eic.engine import Store

    monkeypatch.setattr(Store, "mexist_miss", request.param)
    return request.param


@dataclass
class SdkTarget:
    """An SDK module plus what Client.init needs to reach a store."""

    name: str  # "engine" or "eic"
    module: ModuleType
    instance_id: str
    endpoint: str
    namespace: str = ""
    # A second namespace for isolation tests; on a real cluster namespaces
    # are provisioned, so it comes from AIBRIX_EIC_TEST_OTHER_NS or is None.
    other_namespace: str | None = "conformance-other"
    is_engine: bool = True
    config: Any = None  # the EICConfig of a real cluster, for InitOption
    # Keys on a shared cluster get a per-run prefix so runs never collide.
    key_prefix: str = ""

    def init_option(self):
        """InitOption as callers build it, from the cluster's config if any."""
        option = self.module.InitOption()
        if self.config is not None:
            option.log_level = self.module.LogLevel(self.config.eic_log_level)
            option.transport_type = self.module.TransportType(self.config.eic_trans_type)
            if self.config.eic_log_dir is not None:  # string fields refuse None
                option.log_dir = self.config.eic_log_dir
            if self.config.eic_flag_file is not None:
                option.flag_file = self.config.eic_flag_file
        else:
            option.log_level = self.module.LogLevel(1)
            option.transport_type = self.module.TransportType(3)
        return option

    def client(self):
        client = self.module.Client()
        assert client.init(self.instance_id, self.endpoint, self.init_option()) == 0
        return client

    def key(self, name: str) -> str:
        return self.key_prefix + name

    def endpoint_with(self, params: str) -> str:
        """This target's endpoint with more engine parameters."""
        return f"{self.endpoint}{'&' if '?' in self.endpoint else '?'}{params}"

    @property
    def store(self):
        """The engine's Store behind this target (engine targets only)."""
        assert self.is_engine, "only the embedded engine has a Store"
        from aibrix_eic.engine import get_store

        return get_store(self.endpoint)


@pytest.fixture
def shared_dir(tmp_path):
    """A directory for a shared engine store: on tmpfs where there is one
    (as in service), so tests write no pages back to disk."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = tempfile.mkdtemp(prefix="aibrix-eic-test-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["engine", "shared", "eic"])
def sdk_target(request) -> SdkTarget:
    """The embedded engine, in-process and shared (a store in a directory),
    always; the vendor SDK with --eic-config FILE."""
    if request.param in ("engine", "shared"):
        import aibrix_eic.engine as engine

        endpoint = "conformance"
        if request.param == "shared":
            endpoint += f"?dir={request.getfixturevalue('shared_dir')}"
        return SdkTarget(request.param, engine, "test-instance", endpoint)
    path = request.config.getoption("--eic-config")
    if not path:
        pytest.skip("vendor SDK conformance needs --eic-config FILE")
    from aibrix_eic.config import EICConfig
    from aibrix_eic.link.sdk import load_sdk_module

    config = EICConfig.load(path)
    module = load_sdk_module(config)
    return SdkTarget(
        "eic",
        module,
        config.eic_instance_id,
        config.endpoint,
        namespace=config.eic_kv_ns,
        other_namespace=os.environ.get("AIBRIX_EIC_TEST_OTHER_NS") or None,
        is_engine=module.__name__.startswith("aibrix_eic"),
        config=config,
        key_prefix=f"aibrix-eic-conformance-{uuid.uuid4().hex[:12]}-",
    )
