"""The embedded store's put into fresh pages ("cold") and into reused ones
("warm"), today's path against pages faulted ahead (`prefault=`), in one run
with the repetitions alternated, so drift from other load hits both:

1. the in-process store: `prefault=0` (a fresh np.empty buffer per value)
   against ready pages faulted in the background before the puts (their
   refill held off while timed, so the figure is the put's alone); the
   time and CPU the pages took to fault, and the resident memory they add;
2. the shared store (`dir=`, LMDB on tmpfs): a fresh file against the same
   keys written again, and against a fresh file whose reservation was
   faulted ahead (posix_fallocate, then MADV_POPULATE_WRITE on the store's
   mapping): the measurement behind the proposal in RESULTS.md.

CPU is the process's (`time.process_time`: every thread, page faults
included) per GiB put; GiB/s is wall time.

    python benchmarks/bench_prefault.py [--reps 3] [--value 1.5MiB] [--total 1.5GiB]
        [--capacity 4GiB] [--dir /dev/shm] [--no-shared]
"""

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from aibrix_eic.engine import store_pages
from aibrix_eic.engine.enums import StatusCode
from aibrix_eic.engine.shared_store import SharedStore
from aibrix_eic.engine.store import Store
from aibrix_eic.util.units import parse_size

GIB = 1024**3
BATCH = 16  # values per put_many, as AIBrix's batched ingestion sends a run of blocks


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed_puts(store, keys: list[str], src: np.ndarray) -> tuple[float, float]:
    """(process CPU-s/GiB, GiB/s) of putting `src` under every key."""
    moved = len(keys) * src.nbytes / GIB
    sources = [(src.ctypes.data, src.nbytes)] * BATCH
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(0, len(keys), BATCH):
        batch = keys[i : i + BATCH]
        codes = store.put_many("", batch, sources[: len(batch)], 0)
        if codes != [StatusCode.SUCCESS] * len(batch):
            raise AssertionError(f"put failed: {set(codes)}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / moved, moved / wall


def wait_ready(store: Store, nbytes: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while store._pages.ready_bytes < nbytes:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {store._pages.ready_bytes} of {nbytes} bytes ready after {timeout_s:.0f} s")
        time.sleep(0.01)  # a benchmark polling its own store: no other thread waits on it


def in_process(prefault: bool, capacity: int, keys: list[str], src: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    total = len(keys) * src.nbytes
    chunk = store_pages.chunk_bytes_for(capacity, capacity)
    # The chunks' tails a value does not fit in: a chunk holds whole values only.
    per_chunk = chunk // (-(-src.nbytes // store_pages.PAGE) * store_pages.PAGE)
    ready = -(-len(keys) // per_chunk) * chunk
    rss, cpu, wall = rss_bytes(), time.process_time(), time.perf_counter()
    store = Store(name="bench-prefault", capacity=capacity, prefault=ready if prefault else 0)
    if prefault:
        wait_ready(store, ready)
        store.reserve_ready = lambda: 0  # type: ignore[method-assign]  # hold the refill off while timed
        out["prefault_cpu"] = (time.process_time() - cpu) / (ready / GIB)
        out["prefault_s"] = time.perf_counter() - wall
        out["ready_rss_gib"] = (rss_bytes() - rss) / GIB
    prefaulted = store.stats.prefaulted
    out["cold_cpu"], out["cold_gbps"] = timed_puts(store, keys, src)
    out["from_ready"] = (store.stats.prefaulted - prefaulted) / len(keys)
    out["warm_cpu"], out["warm_gbps"] = timed_puts(store, keys, src)
    out["held_gib"] = store.held_bytes / GIB
    assert store.held_bytes <= capacity and store.live_bytes == total
    store.close()
    return out


def _mapping_of(path: str) -> int:
    """Where this process mapped `path` (the store's data file)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path:
                return int(fields[0].split("-")[0], 16)
    raise AssertionError(f"{path} is not mapped")


def prefault_reservation(store: SharedStore, nbytes: int) -> None:
    """What the proposal would do ahead of the writes: give the data file
    its pages (tmpfs zeroes them) and fault them into this process's map."""
    os.posix_fallocate(store._data_fd, 0, nbytes)
    addr = _mapping_of(os.path.join(store.path, "data.mdb"))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(addr, nbytes, 23) != 0:  # MADV_POPULATE_WRITE
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE) on the store's map")


def shared(directory: str, prefault: bool, capacity: int, keys: list[str], src: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    workdir = tempfile.mkdtemp(prefix="bench-prefault-", dir=directory)
    try:
        store = SharedStore("bench", workdir, capacity=capacity)
        if prefault:
            nbytes = len(keys) * src.nbytes + (64 << 20)  # the values and their trees' pages
            cpu, wall = time.process_time(), time.perf_counter()
            prefault_reservation(store, nbytes)
            out["prefault_cpu"] = (time.process_time() - cpu) / (nbytes / GIB)
            out["prefault_s"] = time.perf_counter() - wall
        out["cold_cpu"], out["cold_gbps"] = timed_puts(store, keys, src)
        out["warm_cpu"], out["warm_gbps"] = timed_puts(store, keys, src)
        store.env.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def median(runs: list[dict[str, float]], key: str) -> str:
    values = [run[key] for run in runs if key in run]
    if not values:
        return "—"
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def report(title: str, variants: dict[str, list[dict[str, float]]], keys: list[str]) -> None:
    print(f"\n{title}: median (min–max) of {len(next(iter(variants.values())))} alternated repetitions")
    for name, runs in variants.items():
        print(f"  {name}")
        for key in keys:
            if any(key in run for run in runs):
                print(f"    {key:<14} {median(runs, key)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--value", default="1.5MiB")
    parser.add_argument("--total", default="1.5GiB")
    parser.add_argument("--capacity", default="4GiB")
    parser.add_argument("--dir", default="/dev/shm", help="where the shared stores are made (tmpfs)")
    parser.add_argument("--no-shared", action="store_true")
    args = parser.parse_args()
    if not store_pages.supported():
        raise SystemExit("ready pages need Linux")
    value, total, capacity = parse_size(args.value), parse_size(args.total), parse_size(args.capacity)
    keys = [f"v{i}" for i in range(total // value)]
    src = np.random.default_rng(0).integers(0, 256, value, dtype=np.uint8)
    print(
        f"{len(keys)} values of {value} bytes ({len(keys) * value / GIB:.2f} GiB) into a {capacity / GIB:g} GiB store"
    )
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        "in-process": {"today (prefault=0)": [], "ready pages (prefault=)": []},
        "shared": {"today": [], "reservation faulted ahead": []},
    }
    variants: list[tuple[str, str, Callable[[], dict[str, float]]]] = [
        ("in-process", "today (prefault=0)", lambda: in_process(False, capacity, keys, src)),
        ("in-process", "ready pages (prefault=)", lambda: in_process(True, capacity, keys, src)),
    ]
    if not args.no_shared:
        variants += [
            ("shared", "today", lambda: shared(args.dir, False, capacity, keys, src)),
            ("shared", "reservation faulted ahead", lambda: shared(args.dir, True, capacity, keys, src)),
        ]
    for rep in range(args.reps):
        order = variants if rep % 2 == 0 else variants[::-1]  # alternated
        for where, name, run in order:
            runs[where][name].append(run())
    columns = ["cold_cpu", "cold_gbps", "warm_cpu", "warm_gbps", "from_ready"]
    columns += ["prefault_cpu", "prefault_s", "ready_rss_gib"]
    print("cpu: process CPU-s per GiB put; gbps: GiB/s; prefault_cpu: CPU-s per GiB faulted ahead")
    report("in-process store", runs["in-process"], columns)
    if not args.no_shared:
        report("shared store (LMDB on tmpfs)", runs["shared"], columns)


if __name__ == "__main__":
    main()
