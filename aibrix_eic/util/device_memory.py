"""Where a memory region's bytes live, and a copy between regions that is
right for both ends.

AIBrix's allocator keeps its slabs in host memory or, with
AIBRIX_KV_CACHE_OL_DEVICE=cuda, on a GPU. A host copy (ctypes.memmove) that
touches a device address kills the process, so a copy with a device end goes
through torch (cudaMemcpy), and host-to-host copies keep memmove, which
releases the GIL and costs no torch dispatch.
"""

import ctypes

import torch
from aibrix_kvcache.memory import MemoryRegion


def device_of(tensor: torch.Tensor) -> torch.device | None:
    """The device holding a tensor's bytes; None for host memory."""
    device = tensor.device
    return None if device.type == "cpu" else device


def region_view(mr: MemoryRegion) -> torch.Tensor:
    """The region's bytes as a uint8 tensor on its slab's device."""
    return mr.slab[mr.addr : mr.addr + mr.length]


def copy_region(source: MemoryRegion, dest: MemoryRegion) -> None:
    """Copy source's bytes into dest (same length); when it returns the
    bytes are in dest, whatever stream reads them next."""
    source_device, dest_device = device_of(source.slab), device_of(dest.slab)
    if source_device is None and dest_device is None:
        ctypes.memmove(dest.data_ptr(), source.data_ptr(), source.length)
        return
    source_view, dest_view = region_view(source), region_view(dest)
    dest_view.copy_(source_view)
    # The copy ran on this thread's current stream; AIBrix's reader (vLLM's
    # kernels) may use another, so wait for it here.
    for view in (source_view, dest_view):
        if view.is_cuda:
            torch.cuda.current_stream(view.device).synchronize()
