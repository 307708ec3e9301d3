"""Byte-level damage to a shared store's values: a flipped byte anywhere in
a value inside data.mdb (any process maps the store writable, so a stray
write or a bit flip is byte-sized) and a torn 512-byte sector. Each is a
miss with the destination untouched, never SUCCESS with wrong bytes; the
sampled check of format 1 (8 bytes a page) served all of them."""

import json
import os
import struct

import numpy as np
import pytest
from engine_processes import child, client, mget, mset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aibrix_eic.engine as eic
from aibrix_eic.engine import get_store, reset_stores
from aibrix_eic.engine.errors import StoreUnavailable

SUCCESS, MISS = eic.StatusCode.SUCCESS, eic.StatusCode.KEY_NOT_EXIST
SIZES = [64 << 10, 2 << 20]
SECTOR = 512


_stored: dict[str, tuple[str, np.ndarray, int]] = {}


def stored_value(shared_dir: str, name: str, nbytes: int) -> tuple[str, np.ndarray, int]:
    """A random value (no zero byte) put under "v" once; the endpoint, the
    value and the file offset of its first byte in data.mdb (LMDB keeps a
    large value whole, on consecutive overflow pages). Put once: a second
    put would leave the old copy's freed pages in the file too."""
    endpoint = f"{name}?dir={shared_dir}&capacity=64MiB"
    if endpoint not in _stored:
        _stored[endpoint] = _store_value(endpoint, nbytes)
    return _stored[endpoint]


def _store_value(endpoint: str, nbytes: int) -> tuple[str, np.ndarray, int]:
    value = np.random.default_rng(nbytes).integers(1, 256, nbytes, dtype=np.uint8)
    assert mset(client(endpoint), {"v": value})[0] == SUCCESS
    data = os.path.join(get_store(endpoint).path, "data.mdb")
    with open(data, "rb") as f:
        contents = f.read(16 << 20)  # the values are near the start of a file as long as the map
    at = contents.find(value[:64].tobytes())
    assert at > 0 and contents[at : at + nbytes] == value.tobytes()
    return endpoint, value, at


def overwrite(data: str, offset: int, payload: bytes) -> bytes:
    """Write `payload` into data.mdb at `offset` (through the file: every
    process's mapping of it sees it); what was there."""
    fd = os.open(data, os.O_RDWR)
    try:
        before = os.pread(fd, len(payload), offset)
        os.pwrite(fd, payload, offset)
    finally:
        os.close(fd)
    return before


def sector_inside(at: int, nbytes: int, index: int) -> int:
    """The file offset of a whole 512-byte sector inside the value at `at`
    (`index` picks which)."""
    first = -(-at // SECTOR) * SECTOR
    count = (at + nbytes - first) // SECTOR
    return first + (index % count) * SECTOR


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("nbytes", SIZES)
def test_a_byte_flipped_or_a_sector_torn_anywhere_in_a_value_is_a_miss(shared_dir, nbytes, data):
    """One byte of the value's bytes in data.mdb, at any offset, XORed with
    any nonzero mask, or any whole 512-byte sector inside it zeroed (the
    value has no zero byte): a get is a miss and never writes the destination."""
    endpoint, value, at = stored_value(shared_dir, f"flip{nbytes}", nbytes)
    path = os.path.join(get_store(endpoint).path, "data.mdb")
    if data.draw(st.booleans(), label="torn sector"):
        where = sector_inside(at, nbytes, data.draw(st.integers(0, nbytes // SECTOR), label="sector"))
        payload = bytes(SECTOR)
    else:
        offset = data.draw(st.integers(0, nbytes - 1), label="offset")
        where = at + offset
        payload = bytes([int(value[offset]) ^ data.draw(st.integers(1, 255), label="mask")])
    before = overwrite(path, where, payload)
    try:
        codes, arrays = mget(client(endpoint), {"v": nbytes})
        assert codes == [MISS], f"a value damaged at file offset {where} (value offset {where - at}) was served"
        assert not arrays[0].any(), "the destination was written"
    finally:
        overwrite(path, where, before)
    codes, arrays = mget(client(endpoint), {"v": nbytes})
    assert codes == [SUCCESS] and (arrays[0] == value).all()  # the same value, whole again, is served


READ_V = """
    import json, sys, numpy as np, aibrix_eic.engine as eic
    endpoint, nbytes = sys.argv[1], int(sys.argv[2])
    c = eic.Client()
    assert c.init("reader", endpoint, eic.InitOption()) == 0
    out = np.zeros(nbytes, np.uint8)
    back = eic.IOBuffers(); back.append(out.ctypes.data, nbytes, False)
    code = int(c.mget(eic.StringVector(["v"]), eic.GetOption(), back)[2].status_codes[0])
    expected = np.random.default_rng(nbytes).integers(1, 256, nbytes, dtype=np.uint8)
    store = eic.get_store(endpoint)
    print(json.dumps({"code": code, "untouched": not out.any(), "right": bool((out == expected).all()),
                      "damaged": getattr(store.stats, "damaged", None)}))  # None: a tree without the counter
"""


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("damage", ["flipped byte", "torn sector"])
def test_damage_seen_by_another_process_is_a_miss_and_counted(shared_dir, nbytes, damage):
    """The reader is another process, which maps the damaged file afresh.
    The damage avoids the bytes format 1 sampled (8 at each 4 KiB of the
    value), as most of a value is."""
    endpoint, value, at = stored_value(shared_dir, f"{damage.split()[0]}{nbytes}", nbytes)
    path = os.path.join(get_store(endpoint).path, "data.mdb")
    if damage == "flipped byte":
        offset = 3 * 4096 + 1000
        overwrite(path, at + offset, bytes([int(value[offset]) ^ 0x10]))
    else:  # a torn write: the sector holds none of what was written there
        overwrite(path, sector_inside(at, nbytes, 5), bytes(SECTOR))
    reader = child(READ_V, endpoint, str(nbytes))
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0, f"the reader died ({reader.returncode})"
    assert json.loads(out) == {"code": int(MISS), "untouched": True, "right": False, "damaged": 1}


def test_a_store_of_the_sampled_format_is_refused_whole_naming_the_fix(shared_dir):
    """A store written by an aibrix-eic whose values carry the sampled
    checksum: opening it fails with the format and a fix that leaves the
    processes still using it alone; no value of it is read."""
    endpoint = f"old?dir={shared_dir}"
    assert mset(client(endpoint), {"v": np.ones(4096, np.uint8)})[0] == SUCCESS
    header = os.path.join(get_store(endpoint).path, "format")
    reset_stores()
    with open(header, "r+b") as f:  # format's layout: magic, version, reserved, map size
        f.seek(8)
        f.write(struct.pack("<I", 1))
    c = eic.Client()
    assert c.init("test", endpoint, eic.InitOption()) != 0
    with pytest.raises(StoreUnavailable) as raised:
        get_store(endpoint)
    message = str(raised.value)
    assert "store format 1" in message and "older aibrix-eic" in message
    assert "another NAME or dir=" in message and "fuser" in message
