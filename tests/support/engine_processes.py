"""Helpers for tests of the engine's shared mode across OS processes: a
fresh interpreter running a snippet on this checkout, and SDK-shaped mset/mget
on numpy arrays."""

import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import aibrix_eic
import aibrix_eic.engine as eic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
MiB = 1 << 20


def child(code: str, *args: str, stdout=subprocess.PIPE, stdin=None, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """A fresh interpreter running `code` on this checkout's package
    (`prefix`: a command it runs under, such as unshare)."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=stdout,
        stdin=stdin,
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
