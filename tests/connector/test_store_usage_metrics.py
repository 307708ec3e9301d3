"""aibrix_eic_store_{used_bytes,capacity_bytes,evictions_total}: the
store's fill where the backend reports it (the embedded engine), absent,
not 0, where it does not (the vendor SDK)."""

import uuid
from types import SimpleNamespace

from connector_tools import ConnectorRig
from prometheus_client import REGISTRY

from aibrix_eic.config import EICConfig
from aibrix_eic.engine import get_store
from aibrix_eic.link.sdk import SdkClient
from aibrix_eic.observability import metrics
from aibrix_eic.observability.metrics import ConnectorMetrics, StoreUsage

BLOCK = 4096
STORE_SERIES = ("aibrix_eic_store_used_bytes", "aibrix_eic_store_capacity_bytes", "aibrix_eic_store_evictions_total")


def series(eic_namespace: str) -> dict[str, float]:
    """Our store series of one EIC namespace, by sample name."""
    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in STORE_SERIES and sample.labels.get("eic_namespace") == eic_namespace:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def test_the_embedded_engine_reports_its_fill_and_evictions():
    namespace, store_name = f"usage-{uuid.uuid4().hex[:8]}", f"usage-{uuid.uuid4().hex[:8]}"
    rig = ConnectorRig(
        block_nbytes=BLOCK, remote_url=f"local://{store_name}?capacity=64KiB", eic_kv_ns=namespace, put_mode="direct"
    ).open()
    try:
        store = get_store(store_name)
        for round_ in range(4):  # 4 x 8 blocks of 4 KiB into 64 KiB: the last two rounds evict
            keys = [f"{round_:02d}{i:014d}".encode() for i in range(8)]
            mrs = rig.filled([bytes([i]) * BLOCK for i in range(8)])
            assert all(s.is_ok() for s in rig.run(rig.conn.mput(keys, mrs)))
            rig.release(mrs)
        metrics.publish_all()
        assert store.stats.evictions >= 16
        assert series(namespace) == {
            "aibrix_eic_store_used_bytes": store.held_bytes,
            "aibrix_eic_store_capacity_bytes": 64 * 1024,
            "aibrix_eic_store_evictions_total": store.stats.evictions,
        }
    finally:
        rig.close()


def test_a_backend_that_does_not_say_has_no_store_series():
    namespace = f"usage-{uuid.uuid4().hex[:8]}"
    connector_metrics = ConnectorMetrics(namespace, "m", "h0_0_l0_0")
    connector_metrics.watch_store_usage(lambda: None)
    connector_metrics.publish()
    assert series(namespace) == {}  # absent, not 0


def test_the_vendor_sdk_is_never_asked():
    """A vendor client's attribute named like the engine's is not taken for it."""
    codes = SimpleNamespace(SUCCESS=0, PARTIAL_FAILED=1, KEY_NOT_EXIST=2)
    options = lambda: SimpleNamespace()  # noqa: E731
    vendor = SimpleNamespace(
        __name__="eic", StatusCode=codes, SetOption=options, GetOption=options, ExistOption=options, DelOption=options
    )
    client = SimpleNamespace(store_usage=lambda: (1, 2, 3))
    assert SdkClient(vendor, client, EICConfig()).store_usage() is None


def test_evictions_count_up_from_each_reading_and_restart_with_a_new_store():
    namespace = f"usage-{uuid.uuid4().hex[:8]}"
    readings = iter([StoreUsage(10, 100, 0), StoreUsage(20, 100, 3), StoreUsage(20, 100, 5), StoreUsage(5, 100, 1)])
    connector_metrics = ConnectorMetrics(namespace, "m", "h0_0_l0_0")
    connector_metrics.watch_store_usage(lambda: next(readings))
    totals = []
    for _ in range(4):
        connector_metrics.publish()
        totals.append(series(namespace)["aibrix_eic_store_evictions_total"])
    assert totals == [0, 3, 5, 6]  # the last store was opened anew and evicted 1
    assert series(namespace)["aibrix_eic_store_used_bytes"] == 5
