"""Request checks: what makes a request INVALID before anything is sent,
and the connector's own references on its memory regions (`hold`), which
refuse a region AIBrix already released.

Every rejection raises InvalidRequest with a message naming the index and the
limit (`keys[3]`, `mrs[0]`); the connector turns it into Status(INVALID).
`hold` answers with a Status instead, since it runs inside a request path:

- a region AIBrix already released (ref_count 0) is refused, and the check
  and the reference are one step under the region's own lock, so AIBrix's
  release cannot slip in between;
- a request whose caller has given up on it (AIBrix's timeout fired, see
  aibrix_compat/timeouts.py, which defines RequestGuard) carries an
  abandoned guard in its context; `hold` and the abandonment take the
  guard's lock, so either the connector holds its references before AIBrix
  releases (and the memory stays out of the allocator until the connector
  lets go), or it never touches the regions at all.
"""

from collections.abc import Sequence
from typing import Any

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from ..aibrix_compat.timeouts import CURRENT_GUARD
from ..keys.codec import KeyCodec
from ..link.regions import RegisteredRegions
from ..link.sdk import SdkBuffer
from ..util import device_memory

_MR_TYPES: set[type] = set()  # MemoryRegion subclasses seen; ABC isinstance is slow


class InvalidRequest(Exception):
    """Bad input; becomes Status(INVALID, message)."""


def check_lengths(keys: Sequence[Any], mrs: Sequence[Any]) -> None:
    if len(keys) == 0:
        raise InvalidRequest("empty request: no keys")
    if len(keys) != len(mrs):
        raise InvalidRequest(f"{len(keys)} keys but {len(mrs)} memory regions")


def check_keys(keys: Sequence[Any]) -> None:
    for i, key in enumerate(keys):
        if not isinstance(key, bytes):
            raise InvalidRequest(f"keys[{i}] is a {type(key).__name__}, expected bytes")
        if not key:
            raise InvalidRequest(f"keys[{i}] is empty")


def eic_keys(codec: KeyCodec, keys: Sequence[Any]) -> list[str]:
    """The EIC keys of a request's keys, once they are checked."""
    check_keys(keys)
    return codec.encode_many(keys)


class BlockChecker:
    """Checks the memory regions of a request and describes them as SDK
    buffers. In the compact layout every block has one size; the first
    request teaches it unless the config states `block_nbytes`."""

    def __init__(
        self, regions: RegisteredRegions, max_value_bytes: int, require_registration: bool, block_nbytes: int | None
    ) -> None:
        self._regions = regions
        self._max_nbytes = max_value_bytes
        self._require = require_registration
        self._configured_block_nbytes = block_nbytes
        self.block_nbytes = block_nbytes

    def forget(self) -> None:
        """Back to the configured block size (the connector was closed)."""
        self.block_nbytes = self._configured_block_nbytes

    def buffers(self, mrs: Sequence[Any], mark_registered: bool) -> list[SdkBuffer]:
        """(addr, nbytes, registered) for each region."""
        compact = MemoryRegion.use_compact_layout()
        block_nbytes = self.block_nbytes
        max_nbytes = self._max_nbytes
        regions = self._regions
        require = self._require
        known_types = _MR_TYPES
        buffers = []
        for i, mr in enumerate(mrs):
            if type(mr) not in known_types:
                if not isinstance(mr, MemoryRegion):
                    raise InvalidRequest(
                        f"mrs[{i}] is a {type(mr).__name__}, expected a MemoryRegion (GDR MR lists are not supported)"
                    )
                known_types.add(type(mr))
            nbytes = mr.length
            if nbytes <= 0:
                raise InvalidRequest(f"mrs[{i}] is empty")
            if nbytes > max_nbytes:
                raise InvalidRequest(f"mrs[{i}] holds {nbytes} bytes, more than max_value_bytes={max_nbytes}")
            if compact:
                if block_nbytes is None:
                    block_nbytes = self.block_nbytes = nbytes
                elif nbytes != block_nbytes:
                    raise InvalidRequest(
                        f"mrs[{i}] holds {nbytes} bytes but this connector's blocks are {block_nbytes} bytes"
                    )
            addr = mr.data_ptr()
            registered = regions.contains(addr, nbytes)
            if not registered and device_memory.device_of(mr.slab) is not None:
                # EIC (GDR) and the engine learn that memory is on a device only from its registration.
                raise InvalidRequest(
                    f"mrs[{i}] at {addr:#x} ({nbytes} bytes) is {device_memory.device_of(mr.slab)} memory "
                    "outside the slabs given to register_slabs; device memory must be registered"
                )
            if require and not registered:
                raise InvalidRequest(
                    f"mrs[{i}] at {addr:#x} ({nbytes} bytes) is not inside memory given to register_slabs "
                    "and require_registration is set"
                )
            buffers.append((addr, nbytes, registered and mark_registered))
        return buffers


def slab_regions(slabs: Sequence[Any]) -> tuple[list[tuple[int, int]], int | None]:
    """(addr, nbytes) of each slab given to register_slabs, and the CUDA
    device they live on (None for host memory). EIC registers host or CUDA
    memory, one kind per call."""
    import torch

    if not slabs:
        raise InvalidRequest("no slabs given")
    regions = []
    first_device = None
    for i, slab in enumerate(slabs):
        if not isinstance(slab, torch.Tensor):
            raise InvalidRequest(f"slabs[{i}] is a {type(slab).__name__}, expected a torch.Tensor")
        nbytes = slab.numel() * slab.element_size()
        if nbytes <= 0:
            raise InvalidRequest(f"slabs[{i}] is empty")
        device = device_memory.device_of(slab)
        if device is not None and device.type != "cuda":
            raise InvalidRequest(f"slabs[{i}] is on {device}: EIC registers host or CUDA memory only")
        if i == 0:
            first_device = device
        elif device != first_device:
            raise InvalidRequest(
                f"slabs[{i}] is on {device or 'the host'} but slabs[0] on {first_device or 'the host'}"
            )
        regions.append((slab.data_ptr(), nbytes))
    return regions, (None if first_device is None else first_device.index or 0)


# ------------------------------------------------------ region references
def _ref_up_if_alive(mr: MemoryRegion) -> bool:
    lock = getattr(mr, "_lock", None)  # RefCountedObj's; AIBrix's release takes it too
    if lock is None:
        if mr.ref_count <= 0:
            return False
        mr.ref_up()
        return True
    with lock:
        if mr.ref_count <= 0:
            return False
        mr.ref_count += 1
        return True


def hold(mrs: Sequence[MemoryRegion], op: str) -> Status | None:
    """Take one reference on every region, or none. None on success, else
    CANCELLED (the caller gave up on the request) or INVALID (a region was
    already released)."""
    guard = CURRENT_GUARD.get()
    if guard is None:
        return _hold_all(mrs, op)
    with guard.lock:
        if guard.abandoned:
            return Status(StatusCodes.CANCELLED, f"{op}: the caller gave up on this request (its timeout passed)")
        return _hold_all(mrs, op)


def _hold_all(mrs: Sequence[MemoryRegion], op: str) -> Status | None:
    for i, mr in enumerate(mrs):
        if not _ref_up_if_alive(mr):
            release(mrs[:i])
            return Status(StatusCodes.INVALID, f"{op}: mrs[{i}] was already released (ref_count {mr.ref_count})")
    return None


def release(mrs: Sequence[MemoryRegion]) -> None:
    for mr in mrs:
        mr.ref_down()
