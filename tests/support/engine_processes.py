"""Helpers for tests of the engine's shared mode across OS processes: a
fresh interpreter running a snippet on this checkout, and SDK-shaped mset/mget
on numpy arrays."""

import os
import subprocess
import sys
import textwrap

import numpy as np

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
