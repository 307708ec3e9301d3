"""Many writer processes on one shared store (8 TP ranks x N replicas on a
node): 1, 2, 4 and 8 processes each putting `--keys` values of `--value`
bytes per call, back to back for `--seconds`, against the same store. One
writer is the baseline, in the same run: the table gives the aggregate
throughput and each put's p50 and p99 latency, and their ratios to it.

Writers are serialised by the store's writer lock (one LMDB transaction at a
time, in any process), so the aggregate stays near one writer's and a put's
latency grows with the writers queued ahead of it; a put that waits past
`lock_timeout` fails with STORE_BUSY (counted as `busy`).

    python benchmarks/bench_shared_writers.py [--dir /dev/shm] [--seconds 5] [--lock-timeout 1s]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = """
    import json, sys, time, numpy as np, aibrix_eic.engine as eic
    endpoint, me, nkeys, nbytes, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    c = eic.Client()
    assert c.init(me, endpoint, eic.InitOption()) == 0
    values = np.random.default_rng(int(me)).integers(0, 256, nkeys * nbytes, dtype=np.uint8)
    vals = eic.IOBuffers()
    for i in range(nkeys):
        vals.append(values.ctypes.data + i * nbytes, nbytes, False)
    print("ready", flush=True)
    sys.stdin.readline()
    times, busy, rounds = [], 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        keys = eic.StringVector(f"{me}-{rounds % 8}-{i}" for i in range(nkeys))
        started = time.perf_counter()
        status, outcome = c.mset(keys, vals, eic.SetOption())
        elapsed = time.perf_counter() - started
        if status == eic.StatusCode.SUCCESS:
            times.append(elapsed)
        else:
            busy += 1
        rounds += 1
    print(json.dumps({"times": times, "busy": busy}), flush=True)
"""


def run(directory: str, writers: int, nkeys: int, nbytes: int, seconds: float, lock_timeout: str) -> dict:
    endpoint = f"writers{writers}?dir={directory}&capacity=2GiB" + (
        f"&lock_timeout={lock_timeout}" if lock_timeout else ""
    )
    env = {"PYTHONPATH": REPO_ROOT, **os.environ}  # a PYTHONPATH given wins: another checkout's package
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), endpoint, str(w), str(nkeys), str(nbytes), str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(writers)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:  # all start together
        proc.stdin.write("go\n")
        proc.stdin.flush()
    times: list[float] = []
    busy = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds * 4 + 60)
        result = json.loads(out.splitlines()[-1])
        times += result["times"]
        busy += result["busy"]
    times.sort()
    return {
        "gbps": len(times) * nkeys * nbytes / seconds / 1e9,
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        "puts": len(times),
        "busy": busy,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each case puts")
    parser.add_argument("--keys", type=int, default=16, help="values per put")
    parser.add_argument("--value", type=int, default=256 << 10, help="bytes per value")
    parser.add_argument("--writers", default="1,2,4,8")
    parser.add_argument(
        "--lock-timeout",
        default="1s",
        help="the store's lock_timeout= for the writers ('' leaves it out, for versions without it)",
    )
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="aibrix-eic-writers-", dir=args.dir)
    try:
        print(
            f"puts of {args.keys} x {args.value >> 10} KiB, {args.seconds:g} s per case, lock_timeout={args.lock_timeout}"
        )
        print("writers | GB/s (x 1 writer) | put p50 ms (x) | put p99 ms (x) | puts | STORE_BUSY")
        base = None
        for writers in (int(w) for w in args.writers.split(",")):
            row = run(directory, writers, args.keys, args.value, args.seconds, args.lock_timeout)
            base = base or row
            print(
                f"{writers:7d} | {row['gbps']:.2f} ({row['gbps'] / base['gbps']:.2f}x) | "
                f"{row['p50_ms']:.1f} ({row['p50_ms'] / base['p50_ms']:.1f}x) | "
                f"{row['p99_ms']:.1f} ({row['p99_ms'] / base['p99_ms']:.1f}x) | {row['puts']} | {row['busy']}",
                flush=True,
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
