"""AIBrix's own upstream EICConnector, unchanged, runs on the embedded engine:
it opens, round-trips memory regions byte for byte, and shows its known
namespace bug (put uses eic_kv_ns, exists does not) against our namespaces."""

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from aibrix_kvcache.memory import TensorPoolAllocator

from aibrix_eic.config import ENV_CONFIG_UPSTREAM
from aibrix_eic.engine import get_store

# The loader lives with the benchmarks that compare against upstream.
_spec = importlib.util.spec_from_file_location(
    "benchmarks_upstream", Path(__file__).resolve().parents[2] / "benchmarks" / "upstream.py"
)
assert _spec is not None and _spec.loader is not None
_upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_upstream)
load_upstream_connector_class = _upstream.load_upstream_connector_class
BLOCK_NBYTES = 4096


@pytest.fixture
def open_upstream(tmp_path, monkeypatch):
    """A factory: an opened upstream connector for a given eic_kv_ns."""
    opened = []
    executor = ThreadPoolExecutor(4)

    flag_file = tmp_path / "eic-flags"
    flag_file.write_text("")

    def make(namespace: str = ""):
        config = {
            "remote_url": "eic://compat",
            "eic_instance_id": "compat-instance",
            # Upstream's open() calls os.path.exists(eic_log_dir): None crashes it.
            "eic_log_dir": str(tmp_path / "eic-logs"),
            "eic_log_level": 1,
            "eic_trans_type": 3,
            "eic_kv_ttl": -1,
            "eic_kv_ns": namespace,
            # Upstream assigns it even when null; a typed binding refuses None.
            "eic_flag_file": str(flag_file),
        }
        path = tmp_path / f"eic-{namespace or 'default'}.yaml"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv(ENV_CONFIG_UPSTREAM, str(path))
        connector = load_upstream_connector_class().from_envs("conn0", executor)
        status = connector.open()
        assert status.is_ok(), status
        opened.append(connector)
        return connector

    yield make
    for connector in opened:
        connector.close()
    executor.shutdown(wait=True)


@pytest.fixture
def allocator():
    return TensorPoolAllocator.create(capacity_nbytes=16 * BLOCK_NBYTES)


def region(allocator, fill_seed: int | None = None):
    """A memory region of one block; filled with seeded bytes, or zeros."""
    mr = allocator.alloc([BLOCK_NBYTES]).get()[0]
    mr.block_nbytes = BLOCK_NBYTES
    view = mr.to_tensor()
    if fill_seed is None:
        view.zero_()
    else:
        generator = torch.Generator().manual_seed(fill_seed)
        view.copy_(torch.randint(0, 256, (BLOCK_NBYTES,), dtype=torch.uint8, generator=generator))
    return mr


def test_upstream_open_binds_to_the_store_its_remote_url_names(open_upstream):
    open_upstream()
    store = get_store("compat")
    # open() probes 2048 random keys with mexist before anything else.
    assert store.stats.exists == 2048
    assert len(store) == 0


async def test_upstream_put_then_get_round_trips_exact_bytes(open_upstream, allocator):
    connector = open_upstream()
    # Upstream's get always passes registered=True, so its slabs must be
    # registered first, as AIBrix's cache manager does at startup.
    assert connector.register_slabs(allocator.slabs).is_ok()
    written = region(allocator, fill_seed=1)
    assert (await connector.put(b"block-1", written)).is_ok()

    read = region(allocator)
    status = await connector.get(b"block-1", read)
    assert status.is_ok(), status
    assert torch.equal(read.to_tensor(), written.to_tensor())
    assert (await connector.exists(b"block-1")).is_ok()
    assert (await connector.exists(b"block-2")).is_not_found()


async def test_upstream_batch_put_and_get_round_trip(open_upstream, allocator):
    connector = open_upstream()
    assert connector.register_slabs(allocator.slabs).is_ok()
    written = [region(allocator, fill_seed=10 + i) for i in range(3)]
    keys = [f"batch-{i}".encode() for i in range(3)]
    assert all(s.is_ok() for s in await connector.mput(keys, written))

    read = [region(allocator) for _ in range(3)]
    statuses = await connector.mget(keys, read)
    assert all(s.is_ok() for s in statuses), statuses
    for got, want in zip(read, written):
        assert torch.equal(got.to_tensor(), want.to_tensor())


async def test_upstream_get_into_unregistered_slabs_finds_nothing(open_upstream, allocator):
    connector = open_upstream()
    written = region(allocator, fill_seed=2)
    assert (await connector.put(b"block", written)).is_ok()  # put passes registered=False

    read = region(allocator)
    # The engine refuses the registered=True buffer outside registered
    # memory; upstream reports any failed mget as NOT_FOUND.
    assert (await connector.get(b"block", read)).is_not_found()
    assert (read.to_tensor() == 0).all()


async def test_upstream_exists_ignores_its_namespace(open_upstream, allocator):
    """Upstream's known bug: put and get use eic_kv_ns, exists does not. On
    an engine with namespaces, a block it just stored is reported missing."""
    connector = open_upstream(namespace="tenant-a")
    assert connector.register_slabs(allocator.slabs).is_ok()
    written = region(allocator, fill_seed=3)
    assert (await connector.put(b"namespaced", written)).is_ok()

    read = region(allocator)
    assert (await connector.get(b"namespaced", read)).is_ok()
    assert torch.equal(read.to_tensor(), written.to_tensor())
    assert (await connector.exists(b"namespaced")).is_not_found()
    eic_key = connector._key(b"namespaced")
    assert get_store("compat").keys() == [("tenant-a", eic_key)]


async def test_upstream_sees_a_failing_engine_as_errors(open_upstream, allocator):
    connector = open_upstream()
    assert connector.register_slabs(allocator.slabs).is_ok()
    get_store("compat").faults.fail_rate = 1.0
    status = await connector.put(b"lost", region(allocator, fill_seed=4))
    assert not status.is_ok()
    get_store("compat").faults.fail_rate = 0.0
    assert (await connector.exists(b"lost")).is_not_found()
