"""The shared store's own costs (docs/engine.md, "Shared mode"), each against
a baseline timed in the same run:

1. checksums of a whole value against the copy a get makes: xxh3_64 (the
   one the store verifies on every read and computes on every put), hardware
   CRC-32C (google-crc32c, measured on a bytes object: its binding takes no
   memoryview of the map, so the store would first pay a copy, timed as
   "crc32c+copy"), and zlib's CRC-32;
2. how long a reader waits for a writer in another process: gets of
   1 x 64 KiB and 64 x 64 KiB timed while another process commits puts of
   16 or 64 x 2 MiB back to back, to this store and, as the baseline with
   the same load on the CPUs and the filesystem, to another store (the
   reader waits only while a commit writes its pages).

    python benchmarks/bench_shared_store.py [--dir /dev/shm] [--samples 300]
"""

import argparse
import ctypes
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import aibrix_eic.engine as eic
from aibrix_eic.engine.shared_records import value_checksum

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = """
    import sys, numpy as np, aibrix_eic.engine as eic
    endpoint, nkeys = sys.argv[1], int(sys.argv[2])
    c = eic.Client()
    assert c.init("writer", endpoint, eic.InitOption()) == 0
    values = np.random.default_rng(1).integers(0, 256, nkeys * (2 << 20), dtype=np.uint8)
    vals = eic.IOBuffers()
    for i in range(nkeys):
        vals.append(values.ctypes.data + i * (2 << 20), 2 << 20, False)
    keys = eic.StringVector(f"w{i}" for i in range(nkeys))
    print("writing", flush=True)
    while True:
        c.mset(keys, vals, eic.SetOption())
"""


def _median_us(call, reps: int) -> float:
    call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def checksum_row(nbytes: int, reps: int) -> str:
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    view, whole = memoryview(src), src.tobytes()
    copy = _median_us(lambda: ctypes.memmove(dst.ctypes.data, src.ctypes.data, nbytes), reps)
    calls = [lambda: value_checksum(view), *_crc32c(view, whole), lambda: zlib.crc32(view)]
    ratios = [math.nan if call is None else _median_us(call, reps) / copy for call in calls]
    return f"{nbytes >> 10:>5} KiB {copy:>8.1f} " + " ".join(
        f"{ratio:>{width}.2f}" for ratio, width in zip(ratios, (8, 8, 13, 7))
    )


def _crc32c(view: memoryview, whole: bytes) -> list:
    """Hardware CRC-32C (google-crc32c, Apache-2.0: `pip install
    google-crc32c`), where it is installed (None: not timed)."""
    try:
        import google_crc32c
    except ImportError:
        return [None, None]
    return [lambda: google_crc32c.value(whole), lambda: google_crc32c.value(bytes(view))]


def checksums(reps: int) -> list[str]:
    header = "value    copy us  xxh3_64  crc32c  crc32c+copy  zlib crc32   (each x the copy, same run)"
    return [header, *(checksum_row(nbytes, reps) for nbytes in (64 << 10, 2 << 20))]


def _percentiles(times: list[float]) -> tuple[float, float, float]:
    times = sorted(times)
    return (
        times[len(times) // 2] * 1e3,
        times[int(len(times) * 0.99)] * 1e3,
        times[-1] * 1e3,
    )


@contextmanager
def writing(endpoint: str, nkeys: int) -> Iterator[None]:
    """Another process putting nkeys x 2 MiB to `endpoint`, back to back."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), endpoint, str(nkeys)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        time.sleep(0.5)  # into its first commits (a benchmark: no synchronisation is needed)
        yield
    finally:
        writer.kill()
        writer.wait()


def reader_latency(directory: str, samples: int) -> list[str]:
    endpoint = f"contention?dir={directory}&capacity=1GiB"
    c = eic.Client()
    assert c.init("reader", endpoint, eic.InitOption()) == 0
    value = np.random.default_rng(2).integers(0, 256, 64 * (64 << 10), dtype=np.uint8)
    keys = eic.StringVector(f"r{i}" for i in range(64))

    def buffers(array):
        vals = eic.IOBuffers()
        for i in range(64):
            vals.append(array.ctypes.data + i * (64 << 10), 64 << 10, False)
        return vals

    assert c.mset(keys, buffers(value), eic.SetOption())[0] == eic.StatusCode.SUCCESS
    out = np.zeros_like(value)
    dests = buffers(out)
    one_key, one_dest = eic.StringVector(["r0"]), eic.IOBuffers()
    one_dest.append(out.ctypes.data, 64 << 10, False)

    def timed(keys, dests) -> list[float]:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            assert c.mget(keys, eic.GetOption(), dests)[0] == eic.StatusCode.SUCCESS
            times.append(time.perf_counter() - start)
        return times

    lines = ["get          writer puts     store    p50 ms  p99 ms  max ms   p50 x other  p99 x other"]
    for writer_keys in (16, 64):
        baseline: dict[int, tuple[float, float, float]] = {}
        for target in ("other", "same"):
            with writing(
                f"{'contention' if target == 'same' else 'elsewhere'}?dir={directory}&capacity=1GiB", writer_keys
            ):
                for n, k, d in ((1, one_key, one_dest), (64, keys, dests)):
                    p50, p99, worst = _percentiles(timed(k, d))
                    row = (
                        f"{n:>2} x 64 KiB  {writer_keys:>2} x 2 MiB  {target:>6}  {p50:>7.2f} {p99:>7.2f} {worst:>7.2f}"
                    )
                    if target == "other":
                        baseline[n] = (p50, p99, worst)
                    else:
                        row += f"   {p50 / baseline[n][0]:>11.2f} {p99 / baseline[n][1]:>11.2f}"
                    lines.append(row)
    if not (out == value).all():
        raise AssertionError("a get under a concurrent writer returned other bytes")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--samples", type=int, default=300, help="timed gets per case")
    parser.add_argument("--reps", type=int, default=200, help="timed checksums per size")
    args = parser.parse_args(argv)
    print("\n".join(checksums(args.reps)))
    print()
    directory = tempfile.mkdtemp(prefix="aibrix-eic-contention-", dir=args.dir)
    try:
        print("\n".join(reader_latency(directory, args.samples)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
