"""aibrix_eic_connector_open{identity}: 1 from a successful open() to
close(), labelled with the model identity the keys carry; what
`aibrix-eic status` reads a rank's state from."""

import uuid

from connector_tools import ConnectorRig
from prometheus_client import REGISTRY


def open_series(eic_namespace: str) -> dict[str, float]:
    """identity -> value of the connector_open samples of one EIC namespace."""
    return {
        sample.labels["identity"]: sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == "aibrix_eic_connector_open" and sample.labels.get("eic_namespace") == eic_namespace
    }


def test_open_then_close_with_the_key_identity():
    namespace = f"open-{uuid.uuid4().hex[:8]}"
    rig = ConnectorRig(block_nbytes=4096, remote_url=f"local://{namespace}", eic_kv_ns=namespace, model_id="m-1")
    assert open_series(namespace) == {}  # built, not open yet
    rig.open()
    try:
        token = rig.conn.model_identity.token
        assert token and open_series(namespace) == {token: 1.0}
    finally:
        rig.close()
    assert open_series(namespace) == {token: 0.0}


def test_unreachable_at_start_is_open_with_the_breaker_open():
    """fail_open: open() succeeds and the breaker starts open; status reads
    the breaker first."""
    namespace = f"open-{uuid.uuid4().hex[:8]}"
    rig = ConnectorRig(
        block_nbytes=4096, remote_url=f"local://{namespace}?unreachable=true", eic_kv_ns=namespace
    ).open()
    try:
        assert list(open_series(namespace).values()) == [1.0]
        assert rig.conn.health()["breaker"] == "open"
    finally:
        rig.close()
