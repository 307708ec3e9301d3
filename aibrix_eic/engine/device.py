"""Caller memory the engine must not memmove: CUDA device memory.

A real EIC moves registered device memory by GDR; the engine copies it with
torch (cudaMemcpy). The engine only sees addresses, so the kind comes from
`register_memory`: a MEMORY_CUDA registration is device memory when torch
has CUDA and the address is not host memory CUDA knows as pinned (callers
such as SGLang and LMCache register pinned host memory as MEMORY_CUDA).
Everything else is host memory. torch is imported only for MEMORY_CUDA
registrations, so plain host use of the engine never loads it.
"""

import ctypes
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def is_device_memory(addr: int, nbytes: int) -> bool:
    """Whether [addr, addr + nbytes), registered as MEMORY_CUDA, is device memory."""
    try:
        import torch
    except ImportError:  # no torch, no CUDA memory in this process
        return False
    if not torch.cuda.is_available():
        return False
    # A host view of the first byte, never read: is_pinned() asks CUDA about the pointer.
    probe = torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * 1).from_address(addr)))
    return not probe.is_pinned()


class _CudaBytes:
    """A raw device address as __cuda_array_interface__ (torch reads its device from the pointer)."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 2}


def device_bytes(addr: int, nbytes: int) -> "torch.Tensor":
    """A uint8 torch tensor over device memory at addr (no copy)."""
    import torch

    return torch.as_tensor(_CudaBytes(addr, nbytes))


def copy_from_device(host: np.ndarray, addr: int) -> None:
    """Device memory at addr -> host buffer (whole buffer); done on return."""
    import torch

    torch.from_numpy(host).copy_(device_bytes(addr, host.nbytes))


def copy_to_device(addr: int, host: np.ndarray) -> None:
    """Host buffer -> device memory at addr; done on return, for any stream."""
    import torch

    dest = device_bytes(addr, host.nbytes)
    dest.copy_(torch.from_numpy(host))
    if dest.is_cuda:
        torch.cuda.current_stream(dest.device).synchronize()
