"""Who may touch a request's memory regions, and until when.

The connector takes its own reference on every region of a request before
it touches any of them, through `hold`. Two things make that refusal-proof:

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

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from ..aibrix_compat.timeouts import CURRENT_GUARD


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
