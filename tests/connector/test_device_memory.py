"""Every copy the connector and the engine make is right for the memory it
touches: a host copy (memmove) of a device address kills the process, so
regions on a device are copied with torch (aibrix_eic.util.device_memory,
aibrix_eic.engine.device).

Without a GPU, a "fake device" stands in: host memory that the code under
test is told is CUDA memory, with every host memmove into or out of it
refused. With CUDA, the same paths run on real device memory."""

import ctypes
import threading

import numpy as np
import pytest
import torch
from aibrix_kvcache.memory import TensorPoolAllocator
from connector_tools import ConnectorRig

from aibrix_eic.engine import device as engine_device
from aibrix_eic.engine import get_store
from aibrix_eic.engine import store as engine_store
from aibrix_eic.engine import surface as engine_surface
from aibrix_eic.util import device_memory

BLOCK = 4096
HAS_CUDA = torch.cuda.is_available()


def payload(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, BLOCK, dtype=np.uint8).tobytes()


class HostCopyGuard:
    """Refuses, and counts, host memmoves that touch [start, end)."""

    def __init__(self, start: int, end: int, memmove) -> None:
        self.start, self.end = start, end
        self.refused = 0
        self._memmove = memmove

    def _touches(self, addr: int, nbytes: int) -> bool:
        return addr < self.end and self.start < addr + nbytes

    def __call__(self, dst, src, nbytes):
        if self._touches(int(dst), nbytes) or self._touches(int(src), nbytes):
            self.refused += 1
            raise AssertionError("host memmove of device memory (a SIGSEGV on a real device)")
        return self._memmove(dst, src, nbytes)


def hold_msets(monkeypatch) -> threading.Event:
    """Engine msets wait until the returned event is set, so a put stays
    pending in write-behind while the test reads it."""
    let_go = threading.Event()
    original = engine_surface.Client.mset

    def held(self, *args, **kwargs):
        let_go.wait(30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(engine_surface.Client, "mset", held)
    return let_go


def pending_write_reads_back(rig, monkeypatch) -> None:
    """Put a block (held pending), read it from the pending write, then from
    the engine once stored: both exact."""
    assert rig.conn.register_slabs(rig.allocator.slabs).is_ok()
    let_go = hold_msets(monkeypatch)
    src = rig.filled([payload(1)])
    assert rig.run(rig.conn.put(b"k" * 16, src[0])).is_ok()
    rig.release(src)
    assert rig.conn.health()["write_behind_pending"] == 1
    dest = rig.blocks(1)
    assert rig.run(rig.conn.get(b"k" * 16, dest[0])).is_ok()
    assert rig.read(dest[0]) == payload(1)
    assert rig.conn.health()["write_behind_served"] == 1
    rig.release(dest)
    let_go.set()
    assert rig.conn.write_behind.wait_idle(10)
    dest = rig.blocks(1)
    assert rig.run(rig.conn.get(b"k" * 16, dest[0])).is_ok()
    assert rig.read(dest[0]) == payload(1)
    rig.release(dest)


@pytest.fixture
def make_rig():
    rigs = []

    def make(**kwargs) -> ConnectorRig:
        rig = ConnectorRig(block_nbytes=BLOCK, remote_url="local://devmem", **kwargs).open()
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


# ------------------------------------------------------------ fake device
def test_a_pending_write_on_device_memory_is_served_by_a_device_copy(make_rig, monkeypatch):
    rig = make_rig()
    (slab,) = rig.allocator.slabs
    fake = torch.device("cuda", 0)
    real_device_of = device_memory.device_of
    monkeypatch.setattr(device_memory, "device_of", lambda t: fake if t.data_ptr() == slab.data_ptr() or (
        slab.data_ptr() <= t.data_ptr() < slab.data_ptr() + slab.numel()) else real_device_of(t))  # fmt: skip
    guard = HostCopyGuard(slab.data_ptr(), slab.data_ptr() + slab.numel(), ctypes.memmove)
    monkeypatch.setattr(ctypes, "memmove", guard)
    pending_write_reads_back(rig, monkeypatch)
    assert guard.refused == 0


def test_the_engine_copies_registered_device_memory_with_torch(monkeypatch):
    """A client whose MEMORY_CUDA registration is device memory: mset and
    mget move its bytes through torch, never a host memmove."""
    buf = np.zeros(4 * BLOCK, dtype=np.uint8)
    start = buf.ctypes.data
    monkeypatch.setattr(engine_device, "is_device_memory", lambda addr, nbytes: True)
    monkeypatch.setattr(engine_device, "device_bytes", lambda addr, nbytes: torch.from_numpy(
        np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))))  # fmt: skip
    guard = HostCopyGuard(start, start + buf.nbytes, engine_store._memmove)
    monkeypatch.setattr(engine_store, "_memmove", guard)
    client = engine_surface.Client()
    assert client.init("t", "devmem", engine_surface.InitOption()) == 0
    regions = engine_surface.IOBuffers()
    regions.append(start, buf.nbytes, True)
    info = engine_surface.MemoryInfo()
    info.type = engine_surface.MemoryType.MEMORY_CUDA
    assert client.register_memory(regions, info)
    buf[:BLOCK] = np.frombuffer(payload(2), dtype=np.uint8)
    vals = engine_surface.IOBuffers()
    vals.append(start, BLOCK, True)
    status, _ = client.mset(engine_surface.StringVector(["a"]), vals, engine_surface.SetOption())
    assert status == engine_surface.StatusCode.SUCCESS
    out = engine_surface.IOBuffers()
    out.append(start + BLOCK, BLOCK, False)  # flagged unregistered, still inside the device registration
    status, _, outcome = client.mget(engine_surface.StringVector(["a"]), engine_surface.GetOption(), out)
    assert status == engine_surface.StatusCode.SUCCESS, outcome
    assert buf[BLOCK : 2 * BLOCK].tobytes() == payload(2)
    assert guard.refused == 0
    assert get_store("devmem").stats.bytes_out == BLOCK


def test_host_memory_registered_as_cuda_is_copied_on_the_host():
    """Callers register pinned host memory as MEMORY_CUDA (SGLang, LMCache);
    without CUDA, or for host memory, the engine keeps its host copy."""
    buf = np.zeros(2 * BLOCK, dtype=np.uint8)
    if not HAS_CUDA:
        assert not engine_device.is_device_memory(buf.ctypes.data, buf.nbytes)
    pinned = torch.zeros(BLOCK, dtype=torch.uint8, pin_memory=HAS_CUDA)
    assert not engine_device.is_device_memory(pinned.data_ptr(), BLOCK)


def test_device_regions_outside_registered_memory_are_refused(make_rig, monkeypatch):
    rig = make_rig()
    monkeypatch.setattr(device_memory, "device_of", lambda t: torch.device("cuda", 0))
    mrs = rig.filled([payload(3)])
    status = rig.run(rig.conn.put(b"u" * 16, mrs[0]))
    assert status.is_invalid() and "mrs[0]" in str(status.value) and "register_slabs" in str(status.value)
    rig.release(mrs)


def test_slabs_on_unsupported_or_mixed_devices_are_refused(make_rig, monkeypatch):
    rig = make_rig()
    slabs = [torch.zeros(BLOCK, dtype=torch.uint8), torch.zeros(BLOCK, dtype=torch.uint8)]
    monkeypatch.setattr(device_memory, "device_of", lambda t: torch.device("xpu", 0))
    status = rig.conn.register_slabs(slabs)
    assert status.is_invalid() and "slabs[0]" in str(status.value) and "xpu" in str(status.value)
    monkeypatch.setattr(
        device_memory, "device_of", lambda t: None if t.data_ptr() == slabs[0].data_ptr() else torch.device("cuda", 0)
    )
    status = rig.conn.register_slabs(slabs)
    assert status.is_invalid() and "slabs[1]" in str(status.value)


# ------------------------------------------------------------- real CUDA
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_copy_region_between_cuda_and_host_regions_is_exact():
    gpu = TensorPoolAllocator.create(capacity_nbytes=8 << 20, device="cuda")
    cpu = TensorPoolAllocator.create(capacity_nbytes=8 << 20)
    data = torch.frombuffer(bytearray(payload(4)), dtype=torch.uint8)
    a, b = gpu.alloc([BLOCK, BLOCK]).get()
    (c,) = cpu.alloc([BLOCK]).get()
    device_memory.region_view(a).copy_(data.cuda())
    device_memory.copy_region(a, b)  # device to device
    device_memory.copy_region(b, c)  # device to host
    assert bytes(device_memory.region_view(c).numpy()) == payload(4)
    device_memory.region_view(a).zero_()
    device_memory.copy_region(c, a)  # host to device
    assert bytes(device_memory.region_view(a).cpu().numpy()) == payload(4)
    for mr in (a, b, c):
        mr.ref_down()


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_a_pending_write_on_cuda_memory_reads_back_exact(make_rig, monkeypatch):
    rig = make_rig()
    rig.allocator = TensorPoolAllocator.create(capacity_nbytes=32 << 20, device="cuda")
    rig.read = lambda mr: bytes(device_memory.region_view(mr).cpu().numpy())

    def filled(payloads):
        mrs = rig.blocks(len(payloads))
        for mr, data in zip(mrs, payloads):
            device_memory.region_view(mr).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).cuda())
        return mrs

    rig.filled = filled
    pending_write_reads_back(rig, monkeypatch)
