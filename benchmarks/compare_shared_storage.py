"""The measurement behind the shared mode's storage choice (docs/engine.md):
the calls of the shared-mode goals on candidate stores that several processes
can open, against the in-process engine store in the same run.

    python benchmarks/compare_shared_storage.py [--dir /dev/shm] [--reps 7]

The product's store first (`shared`: local://NAME?dir=DIR, what
`dir=` gives, checksums and locks included), then the candidates, each the
least code that gives whole-value-or-miss reads:
- files: one file per value on tmpfs, written aside and renamed into place;
  a read opens, checks the size and preadv()s into the destination;
- lmdb: one write transaction per call, reads copy out of the mapping;
- diskcache (if installed): SQLite index plus files, LRU eviction built in.
Ratios are in-process time / candidate time; higher is faster. `--only
shared` times the product's store alone (to compare two checkouts: run this
script with PYTHONPATH naming each, in turn, in one session).
"""

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import aibrix_eic.engine as eic

CASES = (("put", 2 << 20, 64), ("get", 2 << 20, 64), ("get", 64 << 10, 256), ("exists", 64 << 10, 256))


def caller_memory(addr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


class InProcess:
    def __init__(self, _directory: str) -> None:
        self.client = eic.Client()
        assert self.client.init("cmp", self.endpoint(_directory), eic.InitOption()) == 0

    @staticmethod
    def endpoint(_directory: str) -> str:
        return "compare-in-process?capacity=2GiB"

    @staticmethod
    def _buffers(addrs, nbytes):
        vals = eic.IOBuffers()
        for addr in addrs:
            vals.append(addr, nbytes, False)
        return vals

    def put(self, keys, addrs, nbytes):
        status = self.client.mset(eic.StringVector(keys), self._buffers(addrs, nbytes), eic.SetOption())[0]
        assert int(status) == 0, status  # a StatusCode: equal to its int only through int()

    def get(self, keys, addrs, nbytes):
        status = self.client.mget(eic.StringVector(keys), eic.GetOption(), self._buffers(addrs, nbytes))[0]
        assert int(status) == 0, status

    def exists(self, keys):
        return self.client.mexist(eic.StringVector(keys), eic.ExistOption())


class Shared(InProcess):
    """The product's shared store (local://NAME?dir=DIR)."""

    @staticmethod
    def endpoint(directory: str) -> str:
        return f"compare?dir={directory}&capacity=2GiB"


class Files:
    def __init__(self, directory: str) -> None:
        self.values, self.writing = os.path.join(directory, "v"), os.path.join(directory, "w")
        os.makedirs(self.values)
        os.makedirs(self.writing)
        self.serial = 0

    def put(self, keys, addrs, nbytes):
        for key, addr in zip(keys, addrs):
            self.serial += 1
            aside = os.path.join(self.writing, f"{os.getpid()}.{self.serial}")
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view, done = caller_memory(addr, nbytes), 0
                while done < nbytes:
                    done += os.write(fd, view[done:])
            finally:
                os.close(fd)
            os.rename(aside, os.path.join(self.values, key))

    def get(self, keys, addrs, nbytes):
        for key, addr in zip(keys, addrs):
            fd = os.open(os.path.join(self.values, key), os.O_RDONLY)
            try:
                stat = os.fstat(fd)
                assert stat.st_size == nbytes
                os.preadv(fd, [caller_memory(addr, nbytes)], 0)
                os.utime(fd, ns=(time.time_ns(), stat.st_mtime_ns))  # recency for LRU
            finally:
                os.close(fd)

    def exists(self, keys):
        return [os.path.exists(os.path.join(self.values, key)) for key in keys]


class Lmdb:
    def __init__(self, directory: str) -> None:
        import lmdb

        self.env = lmdb.open(directory, map_size=4 << 30, writemap=True, sync=False, metasync=False)

    def put(self, keys, addrs, nbytes):
        with self.env.begin(write=True) as txn:
            for key, addr in zip(keys, addrs):
                txn.put(key.encode(), caller_memory(addr, nbytes))

    def get(self, keys, addrs, nbytes):
        with self.env.begin(buffers=True) as txn:
            for key, addr in zip(keys, addrs):
                value = txn.get(key.encode())
                assert len(value) == nbytes
                ctypes.memmove(addr, np.frombuffer(value, np.uint8).ctypes.data, nbytes)

    def exists(self, keys):
        with self.env.begin(buffers=True) as txn:
            return [txn.get(key.encode()) is not None for key in keys]


class DiskCache:
    def __init__(self, directory: str) -> None:
        import diskcache

        self.cache = diskcache.Cache(directory, size_limit=4 << 30, eviction_policy="least-recently-used")

    def put(self, keys, addrs, nbytes):
        for key, addr in zip(keys, addrs):
            self.cache.set(key, bytes(caller_memory(addr, nbytes)))

    def get(self, keys, addrs, nbytes):
        for key, addr in zip(keys, addrs):
            ctypes.memmove(addr, self.cache.get(key), nbytes)

    def exists(self, keys):
        return [key in self.cache for key in keys]


def measure(store, reps: int) -> dict[str, float]:
    times = {}
    for op, nbytes, nkeys in CASES:
        src = np.random.default_rng(nbytes).integers(0, 256, nbytes * nkeys, dtype=np.uint8)
        dst = np.ones(nbytes * nkeys, dtype=np.uint8)
        src_addrs = [src.ctypes.data + i * nbytes for i in range(nkeys)]
        dst_addrs = [dst.ctypes.data + i * nbytes for i in range(nkeys)]
        keys = [f"cmp-{nbytes}-{i}" for i in range(nkeys)]
        for _ in range(3):
            store.put(keys, src_addrs, nbytes)
        store.get(keys, dst_addrs, nbytes)
        assert dst.tobytes() == src.tobytes()
        call, call_args = {
            "put": (store.put, (keys, src_addrs, nbytes)),
            "get": (store.get, (keys, dst_addrs, nbytes)),
            "exists": (store.exists, (keys,)),
        }[op]
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            call(*call_args)
            samples.append(time.perf_counter() - start)
        times[f"{op} {nkeys} x {nbytes >> 10} KiB"] = statistics.median(samples)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--only", choices=["shared"], help="time the product's store alone (beside the baseline)")
    args = parser.parse_args(argv)
    candidates: list[type] = [InProcess, Shared]
    if args.only is None:
        candidates += [Files, Lmdb]
        try:
            import diskcache  # noqa: F401

            candidates.append(DiskCache)
        except ImportError:
            print("diskcache is not installed: skipped")
    results = {}
    for candidate in candidates:
        directory = tempfile.mkdtemp(prefix="aibrix-eic-compare-", dir=args.dir)
        try:
            results[candidate.__name__] = measure(candidate(directory), args.reps)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    baseline = results["InProcess"]
    print(f"{'store':>10} " + " ".join(f"{case:>26}" for case in baseline))
    for name, times in results.items():
        cells = [f"{times[case] * 1e3:8.2f} ms ({baseline[case] / times[case]:4.2f}x)" for case in baseline]
        print(f"{name:>10} " + " ".join(f"{cell:>26}" for cell in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
