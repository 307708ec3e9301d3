"""A process that exits with never-closed connectors (AIBrix 0.8's vLLM
connector closes its cache manager only from a finalizer) flushes them
side by side: the exit waits about one write_behind_close_timeout_ms
however many connectors it has, not one after another, and what they held
still reaches EIC when it answers within that window.

Each case is a real process exit. The child registers its report with
atexit before anything imports multiprocessing, so it runs after the exit
flush (atexit runs handlers last-registered first) and says how long that
took and what the store holds by then."""

import json
import os
import subprocess
import sys
import textwrap

import aibrix_eic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
SUPPORT = os.path.join(REPO_ROOT, "tests", "support")
CONNECTORS = 3
BLOCKS = 4  # per connector
# Large against any stall of a loaded CI host: the bound below leaves a
# whole timeout of slack, while one flush after another takes 3 timeouts.
CLOSE_TIMEOUT_S = 5.0

CHILD = """
    import atexit, json, sys, time
    marks = {}

    def report():
        marks["exit_wait_s"] = time.monotonic() - marks["main_ended"]
        from aibrix_eic.engine import get_store

        marks["stored"] = len(get_store("exit-flush").keys())
        print(json.dumps(marks), flush=True)

    atexit.register(report)  # first registered: runs after the exit flush

    import aibrix_kvcache.cache_manager as cache_manager
    import aibrix_eic
    from aibrix_eic.engine import get_store
    from connector_tools import ConnectorRig

    cache_manager.TESTING_DISABLE_PIN_MEMORY = True
    aibrix_eic.install()
    latency_s, recovers, timeout_ms = float(sys.argv[1]), sys.argv[2] == "recovers", float(sys.argv[3])
    connectors, blocks = int(sys.argv[4]), int(sys.argv[5])
    store = get_store("exit-flush")
    rigs = [
        ConnectorRig(
            remote_url="local://exit-flush", put_mode="write_behind",
            write_behind_close_timeout_ms=timeout_ms, conn_id=f"c{n}",
        ).open()
        for n in range(connectors)
    ]
    store.faults.latency_s = latency_s  # the store stalls: every call takes this long
    for n, rig in enumerate(rigs):
        for i in range(blocks):
            mrs = rig.filled([bytes([n * blocks + i + 1]) * rig.block_nbytes])
            assert rig.run(rig.conn.put(b"%08d%08d" % (n, i), mrs[0])).is_ok()
            rig.release(mrs)
    marks["pending"] = [rig.conn.health()["write_behind_pending"] for rig in rigs]
    if recovers:
        store.faults.latency_s = 0.0  # new calls are answered; those in flight still take latency_s
    marks["main_ended"] = time.monotonic()
    # The connectors are never closed: the process exits with their writes pending.
"""


def exit_with_pending_writes(latency_s: float, recovers: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, SUPPORT])}
    env.pop("AIBRIX_KV_CACHE_OL_EIC_CONFIG", None)
    args = [str(latency_s), "recovers" if recovers else "stalled", str(CLOSE_TIMEOUT_S * 1000)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), *args, str(CONNECTORS), str(BLOCKS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(pending > 0 for pending in report["pending"]), f"nothing pending at exit: proves nothing {report}"
    return report


def test_a_stalled_store_costs_the_exit_one_close_timeout_not_one_per_connector():
    report = exit_with_pending_writes(latency_s=600.0, recovers=False)
    assert report["stored"] == 0  # stalled throughout: nothing could be sent
    assert report["exit_wait_s"] < 2 * CLOSE_TIMEOUT_S, (
        f"{CONNECTORS} never-closed connectors made the exit wait {report['exit_wait_s']:.1f} s "
        f"with write_behind_close_timeout_ms {CLOSE_TIMEOUT_S * 1000:g}: they were flushed one after another"
    )


def test_writes_pending_at_exit_are_sent_when_the_store_recovers_within_the_window():
    # The calls in flight at exit still take 1.5 s; every later one is answered at once.
    report = exit_with_pending_writes(latency_s=1.5, recovers=True)
    assert report["stored"] == CONNECTORS * BLOCKS, report
    assert report["exit_wait_s"] < 2 * CLOSE_TIMEOUT_S, report
