"""Bad input gets INVALID with a message, never an exception or exit()."""

import pytest
import torch
from aibrix_kvcache.status import StatusCodes
from connector_tools import ConnectorRig

from aibrix_eic.keys.codec import KeyCodec


@pytest.fixture
def rig():
    rig = ConnectorRig()
    rig.open()
    yield rig
    rig.close()


def outcome(result):
    """The Status a caller sees: mget/mput may answer one Status for all."""
    return result if not isinstance(result, list) else result[0]


def test_calls_on_a_closed_connector_are_invalid(rig):
    mrs = rig.blocks(1)
    rig.conn.close()
    for result in (
        rig.run(rig.conn.get(b"k", mrs[0])),
        rig.run(rig.conn.put(b"k", mrs[0])),
        rig.run(rig.conn.exists(b"k")),
        rig.run(rig.conn.delete(b"k")),
        outcome(rig.run(rig.conn.mget([b"k"], mrs))),
        outcome(rig.run(rig.conn.mput([b"k"], mrs))),
    ):
        assert result.error_code == StatusCodes.INVALID
        assert "closed" in str(result.value)


def test_unregistered_memory_is_invalid_when_registration_is_required():
    rig = ConnectorRig(require_registration=True).open()
    try:
        registered = torch.zeros(1 << 20, dtype=torch.uint8)
        assert rig.conn.register_slabs([registered]).is_ok()
        status = rig.run(rig.conn.put(b"k", rig.blocks(1)[0]))
        assert status.is_invalid()
        assert "not inside memory given to register_slabs" in str(status.value)
        assert "mrs[0]" in str(status.value)
    finally:
        rig.close()


def test_block_of_the_wrong_size_is_invalid(rig):
    assert rig.run(rig.conn.put(b"a", rig.blocks(1)[0])).is_ok()
    status = rig.run(rig.conn.put(b"b", rig.blocks(1, nbytes=8192)[0]))
    assert status.is_invalid()
    assert "mrs[0] holds 8192 bytes but this connector's blocks are 4096 bytes" in str(status.value)
    status = outcome(rig.run(rig.conn.mget([b"a", b"b"], rig.blocks(1) + rig.blocks(1, nbytes=8192))))
    assert status.is_invalid() and "mrs[1]" in str(status.value)


def test_empty_request_is_invalid(rig):
    for result in (rig.run(rig.conn.mget([], [])), rig.run(rig.conn.mput([], []))):
        assert result.is_invalid()
        assert "empty request" in str(result.value)


def test_mismatched_keys_and_regions_are_invalid(rig):
    mrs = rig.blocks(2)
    for result in (rig.run(rig.conn.mget([b"a"], mrs)), rig.run(rig.conn.mput([b"a", b"b", b"c"], mrs))):
        assert result.is_invalid()
        assert "keys but" in str(result.value)


def test_value_over_the_maximum_size_is_invalid():
    rig = ConnectorRig(block_nbytes=8192, max_value_bytes=4096).open()
    try:
        status = rig.run(rig.conn.put(b"k", rig.blocks(1)[0]))
        assert status.is_invalid()
        assert "more than max_value_bytes=4096" in str(status.value)
    finally:
        rig.close()


@pytest.mark.parametrize("bad_key", ["text", 7, None, b""])
def test_keys_that_are_not_bytes_are_invalid(rig, bad_key):
    mr = rig.blocks(1)[0]
    for result in (
        rig.run(rig.conn.get(bad_key, mr)),
        rig.run(rig.conn.put(bad_key, mr)),
        rig.run(rig.conn.exists(bad_key)),
        rig.run(rig.conn.delete(bad_key)),
    ):
        assert result.is_invalid()
        assert "keys[0]" in str(result.value)


def test_gdr_style_region_lists_are_invalid(rig):
    status = rig.run(rig.conn.put(b"k", rig.blocks(2)))
    assert status.is_invalid()
    assert "expected a MemoryRegion" in str(status.value)


def test_register_slabs_rejects_non_tensors_and_empty_lists(rig):
    assert rig.conn.register_slabs([]).is_invalid()
    status = rig.conn.register_slabs([b"not a tensor"])
    assert status.is_invalid() and "slabs[0]" in str(status.value)


def test_internal_errors_become_error_statuses(rig, monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("boom")

    monkeypatch.setattr(KeyCodec, "encode_many", broken)
    status = rig.run(rig.conn.get(b"k", rig.blocks(1)[0]))
    assert status.is_error() and "boom" in str(status.value)
