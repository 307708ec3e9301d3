"""Helpers for tests of the engine's shared mode across OS processes: a
fresh interpreter running a snippet on this checkout, SDK-shaped mset/mget
on numpy arrays, and a process frozen (SIGSTOP) inside a read or a commit."""

import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from waiting import wait_until

import aibrix_eic
import aibrix_eic.engine as eic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
MiB = 1 << 20


def child(
    code: str, *args: str, stdout=subprocess.PIPE, stdin=None, stderr=None, prefix: tuple[str, ...] = ()
) -> subprocess.Popen:
    """A fresh interpreter running `code` on this checkout's package
    (`prefix`: a command it runs under, such as unshare)."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=stdout,
        stdin=stdin,
        stderr=stderr,
        env=env,
        text=True,
        cwd=REPO_ROOT,
    )


def client(endpoint: str):
    c = eic.Client()
    assert c.init("test", endpoint, eic.InitOption()) == 0
    return c


def mset(c, items: dict[str, np.ndarray]):
    vals = eic.IOBuffers()
    for array in items.values():
        vals.append(array.ctypes.data, array.nbytes, False)
    return c.mset(eic.StringVector(items), vals, eic.SetOption())


def mget(c, sizes: dict[str, int]) -> tuple[list, list[np.ndarray]]:
    arrays = [np.zeros(n, np.uint8) for n in sizes.values()]
    vals = eic.IOBuffers()
    for array in arrays:
        vals.append(array.ctypes.data, array.nbytes, False)
    _, _, outcome = c.mget(eic.StringVector(sizes), eic.GetOption(), vals)
    return list(outcome.status_codes), arrays


# Opens the store, writes "seed" (1 MiB of 3s), then freezes itself inside
# its next read (test-only hook: SIGSTOP from inside the copy, while the
# read holds its snapshot) or inside its next commit (while it holds the
# commit gate), as argv[2] says.
FREEZE_INSIDE = """
    import os, signal, sys, numpy as np, aibrix_eic.engine as eic
    from aibrix_eic.engine import shared_lock, shared_store
    c = eic.Client()
    assert c.init("frozen", sys.argv[1], eic.InitOption()) == 0
    store = eic.get_store(sys.argv[1])
    seed = np.full(1 << 20, 3, np.uint8)
    assert store.put_many("", ["seed"], [(seed.ctypes.data, seed.nbytes)], -1) == [eic.StatusCode.SUCCESS]

    def freeze():
        print("frozen", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    if sys.argv[2] == "read":
        copy = shared_store._memmove
        def frozen_copy(*args):
            freeze()
            return copy(*args)
        shared_store._memmove = frozen_copy
        out = np.zeros(1 << 20, np.uint8)
        print(store.get_many("", ["seed"], [(out.ctypes.data, out.nbytes)]), int(out[0]), flush=True)
    else:
        lock = shared_lock.StoreLock._lock
        def frozen_lock(self, fd, byte, kind, *deadline):  # f131f80's took no deadline
            lock(self, fd, byte, kind, *deadline)
            if byte == 1 and kind == shared_lock.fcntl.F_WRLCK:  # the commit gate, for a commit
                freeze()
        shared_lock.StoreLock._lock = frozen_lock
        print(store.put_many("", ["late"], [(seed.ctypes.data, seed.nbytes)], -1), flush=True)
"""


def frozen_process(endpoint: str, where: str) -> subprocess.Popen:
    """A process running FREEZE_INSIDE, once it stopped."""
    proc = child(FREEZE_INSIDE, endpoint, where)
    assert proc.stdout.readline().strip() == "frozen"

    def stopped() -> bool:  # 'T' in /proc/PID/stat
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    wait_until(stopped, what="the process to stop")
    return proc


@contextlib.contextmanager
def small_tmpfs(where: str, size: str):
    """A tmpfs of `size` (mount's syntax: 24m) mounted at `where`, as a
    container's small /dev/shm; skips the test where mount is refused (not
    root, or no CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    os.makedirs(where, mode=0o700, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", where], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
