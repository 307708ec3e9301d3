"""Whether a close() may wait, and the threads that make the answer "no".

An explicit close() flushes pending writes for a bounded time and stops the
threads. A close() reached from a finalizer must not wait for anything: a
manager with L1 on is a reference cycle, so a manager dropped without
close() is freed by the cyclic GC on whatever thread happened to trigger the
collection, and AIBrix's `L2Cache.__del__` (which we cannot change) calls
close() there. That thread may be one of ours holding the very lock close()
needs (a plain Lock: taking it again deadlocks, and the GC stays
"collecting" for the whole process), or another manager's event-loop
thread, which must not stall for a flush.

Telling the two apart, cheapest sure signal first:
- on one of our own threads (any connector's) close() never waits: the
  connector it closes may be waiting on this very thread, or on a lock it holds;
- a `__del__` anywhere up the stack means a finalizer (ours, AIBrix's, or
  a caller's object that closes a manager from its own `__del__`).
A flag set by the GC (gc.callbacks) was the alternative: it would also see
weakref callbacks, but costs a Python call at every collection of the
process, for a case no known caller has.
"""

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class OwnThread(threading.Thread):
    """A daemon thread the connector starts (pools, prober, watcher, warm-up)."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple = ()) -> None:
        super().__init__(target=target, name=name, args=args, daemon=True)


def close_may_wait() -> bool:
    """False on one of our threads or inside a finalizer: close() must then
    only signal the threads to stop."""
    if isinstance(threading.current_thread(), OwnThread):
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return False
        frame = frame.f_back
    return True
