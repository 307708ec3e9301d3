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

A finalizer's close() never waits, yet AIBrix 0.8's vLLM connector closes
its cache manager only from `__del__`: so the connector's threads go on
sending the pending writes by themselves, for a bounded time, and
`call_at_exit` makes the process wait for them before it ends: every
connector's flush is started first, then each is waited for, so a process
with N connectors waits about one write_behind_close_timeout_ms, not N. It is a
multiprocessing finalizer, which runs both at interpreter exit (through
atexit) and when a multiprocessing child returns from its target, where
atexit never runs (a forked child ends in os._exit). vLLM's engine-core and
worker processes are such children, and return that way on SIGTERM when
vLLM shuts down gracefully (`--shutdown-timeout`). The daemon threads that
flush still run then.
"""

import logging
import multiprocessing.util
import os
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)


class OwnThread(threading.Thread):
    """A daemon thread the connector starts (pools, prober, watcher, warm-up)."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> None:
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


# (pid, begin, finish): bound methods of one object, this process's only.
_at_exit: list[tuple[int, weakref.WeakMethod[Callable[[], object]], weakref.WeakMethod[Callable[[], object]]]] = []
_at_exit_hooked: set[int] = set()  # pids whose multiprocessing finalizer is registered
_at_exit_lock = threading.Lock()


def call_at_exit(begin: Callable[[], object], finish: Callable[[], object]) -> None:
    """When this process exits normally, call every registered `begin`, then
    every `finish` (bound methods of one object; skipped once it is gone).
    `begin` must not wait: it starts what `finish` waits for, so N objects
    flushing at exit wait side by side, about as long as the slowest one,
    not one after another. Entries made before a fork are not the child's
    (its copies have no threads to flush with) and are skipped there."""
    pid = os.getpid()
    with _at_exit_lock:
        _at_exit[:] = [
            entry for entry in _at_exit if entry[0] == pid and entry[1]() is not None and entry[1]() != begin
        ]
        _at_exit.append((pid, weakref.WeakMethod(begin), weakref.WeakMethod(finish)))
        if pid not in _at_exit_hooked:
            _at_exit_hooked.add(pid)
            # exitpriority >= 0 runs before multiprocessing terminates this process's daemonic children.
            multiprocessing.util.Finalize(None, _run_at_exit, exitpriority=100)


def _run_at_exit() -> None:
    pid = os.getpid()
    with _at_exit_lock:
        hooks = [(begin(), finish()) for p, begin, finish in _at_exit if p == pid]
        _at_exit.clear()
    for phase in (0, 1):
        for hook in hooks:
            method = hook[phase]
            if method is None:
                continue
            try:
                method()
            except Exception:  # a bug; the exit goes on
                logger.warning("EIC exit hook %r failed", method, exc_info=True)
