"""The shared store's locks against the processes an operator's node has: one
frozen (SIGSTOP) inside a read or inside a commit, one forked from a thread
mid-put and then SIGKILLed, a lock file or store directory replaced while
processes run, a process out of file descriptors, one store reached through
two paths. Real processes; each case hung, crashed or misreported on
f131f80, where every lock wait was F_OFD_SETLKW with no deadline."""

import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from engine_processes import child, client, frozen_process, mget, mset

import aibrix_eic.engine as eic
from aibrix_eic.engine import get_store

SUCCESS, MISS = eic.StatusCode.SUCCESS, eic.StatusCode.KEY_NOT_EXIST
DEADLINE_S = 1.0  # the default lock_timeout: the tests rely on it, so they also ran on f131f80
SLACK_S = 1.5  # a loaded CI host's scheduling, on top of a deadline

# What the other processes do meanwhile: a Client.init, printed as [return,
# seconds, last_error]; then (after a line on stdin with argv[3] "wait")
# `rounds` puts of 1 MiB and gets of "seed", each printed as [code, seconds].
OTHERS = """
    import json, sys, time, numpy as np, aibrix_eic.engine as eic
    endpoint, rounds = sys.argv[1], int(sys.argv[2])
    c = eic.Client()
    started = time.monotonic()
    ret = c.init("other", endpoint, eic.InitOption())
    print(json.dumps({"init": [ret, time.monotonic() - started, c.last_error]}), flush=True)
    if ret != 0:
        sys.exit(0)
    if sys.argv[3:] == ["wait"]:
        sys.stdin.readline()
    value = np.full(1 << 20, 5, np.uint8)
    out = np.zeros(1 << 20, np.uint8)
    for i in range(rounds):
        for op in ("put", "get"):
            vals = eic.IOBuffers()
            vals.append((value if op == "put" else out).ctypes.data, value.nbytes, False)
            started = time.monotonic()
            if op == "put":
                code = c.mset(eic.StringVector([f"p{i}"]), vals, eic.SetOption())[1].status_codes[0]
            else:
                code = c.mget(eic.StringVector(["seed"]), eic.GetOption(), vals)[2].status_codes[0]
                assert code != eic.StatusCode.SUCCESS or (out == 3).all(), "wrong bytes"
            print(json.dumps({op: [str(code), time.monotonic() - started]}), flush=True)
"""


def others(endpoint: str, rounds: int, proc: subprocess.Popen | None = None) -> list[dict]:
    """OTHERS' lines (`proc`: one started with "wait", told to go now)."""
    if proc is None:
        proc = child(OTHERS, endpoint, str(rounds))
    else:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    try:
        out, _ = proc.communicate(timeout=rounds * 2 * (DEADLINE_S + SLACK_S) + 30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    return [json.loads(line) for line in out.splitlines()]


def calls(lines: list[dict], op: str) -> list[tuple[str, float]]:
    return [tuple(line[op]) for line in lines if op in line]  # type: ignore[misc]


def test_a_reader_frozen_in_its_snapshot_never_stalls_writers_readers_or_openers(shared_dir):
    """f131f80: the second put after the freeze hung forever (the writer
    waited on the frozen reader's snapshot with F_OFD_SETLKW, holding the
    writer mutex), and so did every new process's Client.init."""
    endpoint = f"frozen-reader?dir={shared_dir}&capacity=64MiB"
    frozen = frozen_process(endpoint, "read")
    try:
        lines = others(endpoint, 4)
        ret, init_s, why = lines[0]["init"]
        assert ret == 0 and init_s < DEADLINE_S + SLACK_S, why
        # Gets keep being served; puts complete or fail with TIMEOUT within the deadline.
        assert calls(lines, "get") == [(str(SUCCESS), s) for _, s in calls(lines, "get")]
        assert all(s < DEADLINE_S + SLACK_S for _, s in calls(lines, "put") + calls(lines, "get"))
        puts = [code for code, _ in calls(lines, "put")]
        assert set(puts) <= {str(SUCCESS), "StatusCode.STORE_BUSY"} and "StatusCode.STORE_BUSY" in puts, puts
        # Once a write of a process timed out on the frozen snapshot, its
        # next ones fail at once instead of waiting out the deadline again.
        later = [s for code, s in calls(lines, "put")[1:] if code == "StatusCode.STORE_BUSY"]
        assert later and min(later) < 0.2, calls(lines, "put")
        frozen.send_signal(signal.SIGCONT)
        out, _ = frozen.communicate(timeout=60)
        assert out.split()[-1] == "3", out  # the frozen read finished with the right bytes
        after = others(endpoint, 2)
        assert [code for code, _ in calls(after, "put")] == [str(SUCCESS)] * 2  # recovered at once
    finally:
        frozen.send_signal(signal.SIGCONT)
        frozen.kill()
        frozen.stdout.close()


def test_a_writer_frozen_in_its_commit_fails_others_calls_within_their_deadline(shared_dir):
    """f131f80: every reader (and every new Client.init) hung on the commit
    gate the frozen writer held."""
    endpoint = f"frozen-writer?dir={shared_dir}&capacity=64MiB"
    client(endpoint)  # the store exists before anyone freezes
    opened_before = child(OTHERS, endpoint, "2", "wait", stdin=subprocess.PIPE)
    assert json.loads(opened_before.stdout.readline())["init"][0] == 0
    frozen = frozen_process(endpoint, "commit")
    try:
        ret, init_s, why = others(endpoint, 0)[0]["init"]
        # Opening reads the meta page the frozen commit may be writing: refused in time, naming why.
        assert ret == -1 and init_s < DEADLINE_S + SLACK_S and "past this call's deadline" in why, why
        lines = others(endpoint, 2, opened_before)
        assert len(calls(lines, "put")) == len(calls(lines, "get")) == 2, lines
        for op, expected in (("put", "StatusCode.STORE_BUSY"), ("get", "StatusCode.TIMEOUT")):
            for code, seconds in calls(lines, op):
                assert code == expected and seconds < DEADLINE_S + SLACK_S, lines
        frozen.send_signal(signal.SIGCONT)
        out, _ = frozen.communicate(timeout=60)
        assert "SUCCESS" in out, out
        after = others(endpoint, 2)
        assert after[0]["init"][0] == 0
        assert [code for code, _ in calls(after, "put") + calls(after, "get")] == [str(SUCCESS)] * 4
    finally:
        opened_before.kill()
        frozen.send_signal(signal.SIGCONT)
        frozen.kill()
        frozen.stdout.close()


# Forks from the thread doing a put, inside the put's transaction (it holds
# the writer mutex), then hangs there; the child sleeps.
FORK_MID_PUT = """
    import os, sys, time, numpy as np, aibrix_eic.engine as eic
    from aibrix_eic.engine import shared_store
    c = eic.Client()
    assert c.init("forker", sys.argv[1], eic.InitOption()) == 0
    source_bytes = shared_store.source_bytes
    def fork_then_hang(*args):
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(120)
    shared_store.source_bytes = fork_then_hang
    value = np.full(4096, 1, np.uint8)
    vals = eic.IOBuffers()
    vals.append(value.ctypes.data, value.nbytes, False)
    c.mset(eic.StringVector(["k"]), vals, eic.SetOption())
"""


def test_a_writer_killed_after_forking_mid_put_leaves_no_lock_held_by_its_child(shared_dir):
    """f131f80: the child's inherited descriptor shares the parent's open
    file description, so the writer mutex stayed held until the child
    exited, and every put on the node hung."""
    endpoint = f"fork-mid-put?dir={shared_dir}"
    forker = child(FORK_MID_PUT, endpoint)
    grandchild = int(forker.stdout.readline())
    try:
        forker.send_signal(signal.SIGKILL)
        forker.wait(timeout=30)
        lines = others(endpoint, 2)
        assert lines[0]["init"][0] == 0
        assert [code for code, _ in calls(lines, "put")] == [str(SUCCESS)] * 2, lines
        os.kill(grandchild, 0)  # the child still lives: it just holds no lock
    finally:
        try:
            os.kill(grandchild, signal.SIGKILL)
        except ProcessLookupError:
            pass
        forker.stdout.close()


def test_one_store_reached_through_two_paths_is_one_handle(shared_dir):
    """f131f80 reported the healthy store as damaged ("remove the
    directory") on the second path: LMDB refuses a second handle on one file."""
    real = os.path.join(shared_dir, "real")
    os.mkdir(real, 0o700)
    alias = os.path.join(shared_dir, "alias")
    os.symlink(real, alias)
    a = client(f"two?dir={real}")
    b = client(f"two?dir={alias}/")
    assert mset(a, {"k": np.full(4096, 4, np.uint8)})[0] == SUCCESS
    codes, arrays = mget(b, {"k": 4096})
    assert codes == [SUCCESS] and (arrays[0] == 4).all()
    assert get_store(f"two?dir={real}") is get_store(f"two?dir={alias}")


# Puts and gets in a loop, each value derived from its key; prints a JSON
# summary when told (a line on stdin) or after argv[2] seconds.
CHURN = """
    import json, select, sys, time, numpy as np, aibrix_eic.engine as eic
    endpoint, seconds, me = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    c = eic.Client()
    assert c.init(me, endpoint, eic.InitOption()) == 0
    print("open", flush=True)
    counts = {"ok": 0, "wrong": 0, "failed": 0, "miss": 0}
    out = np.zeros(256 << 10, np.uint8)
    until = time.monotonic() + seconds
    i = 0
    while time.monotonic() < until and not select.select([sys.stdin], [], [], 0)[0]:
        key = f"{me}-{i % 50}"
        value = np.full(256 << 10, hash(key) % 251, np.uint8)
        vals = eic.IOBuffers()
        vals.append(value.ctypes.data, value.nbytes, False)
        c.mset(eic.StringVector([key]), vals, eic.SetOption())
        into = eic.IOBuffers()
        into.append(out.ctypes.data, out.nbytes, False)
        code = c.mget(eic.StringVector([key]), eic.GetOption(), into)[2].status_codes[0]
        if code == eic.StatusCode.SUCCESS:
            counts["ok" if (out == hash(key) % 251).all() else "wrong"] += 1
        else:
            counts["miss" if code == eic.StatusCode.KEY_NOT_EXIST else "failed"] += 1
        i += 1
    print(json.dumps(counts), flush=True)
"""


def churners(endpoint: str, n: int) -> list[subprocess.Popen]:
    procs = [child(CHURN, endpoint, "120", f"w{i}", stdin=subprocess.PIPE) for i in range(n)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "open"
    return procs


def finish(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    for proc in procs:
        out, _ = proc.communicate("stop\n", timeout=120)
        assert proc.returncode == 0, f"a worker died ({proc.returncode}): {out}"
        results.append(json.loads(out.splitlines()[-1]))
    return results


@pytest.mark.parametrize("replaced", ["store.lock", "the directory"])
def test_a_replaced_lock_file_or_store_directory_is_refused_never_a_second_lock_domain(shared_dir, replaced):
    """f131f80: processes that opened after the "stale lock" was deleted (or
    DIR/NAME removed and made again, the fix every damaged-store message
    printed) locked a new inode while the first ones locked the old: two
    writers in one data.mdb (SIGSEGV, LMDB assertion aborts, MDB_CORRUPTED).
    Now the first ones refuse every call, and only the new domain writes."""
    endpoint = f"relock?dir={shared_dir}&capacity=64MiB"
    procs = churners(endpoint, 2)
    try:
        time.sleep(1)
        if replaced == "store.lock":
            os.unlink(os.path.join(shared_dir, "relock", "store.lock"))
        else:
            shutil.rmtree(os.path.join(shared_dir, "relock"))
        procs += churners(endpoint, 2)  # they make a new store.lock (and store)
        time.sleep(3)
        old, new = finish(procs[:2]), finish(procs[2:])
    finally:
        for proc in procs:
            proc.kill()
    assert all(r["wrong"] == 0 for r in old + new), old + new
    assert all(r["failed"] > 0 for r in old), old
    assert all(r["ok"] > 0 for r in new), new


# 300 live threads each doing an mget at a 256-descriptor limit.
MANY_THREADS = """
    import json, resource, sys, threading, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("threads", sys.argv[1], eic.InitOption()) == 0
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    codes, raised = [], []
    hold = threading.Barrier(301)
    def read():
        out = np.zeros(16, np.uint8)
        vals = eic.IOBuffers()
        vals.append(out.ctypes.data, out.nbytes, False)
        try:
            codes.append(str(c.mget(eic.StringVector(["k"]), eic.GetOption(), vals)[2].status_codes[0]))
        except BaseException as e:
            raised.append(repr(e))
        hold.wait()  # alive, holding its descriptor, until all have read
    threads = [threading.Thread(target=read) for _ in range(300)]
    for t in threads:
        t.start()
    hold.wait()
    for t in threads:
        t.join()
    print(json.dumps({"codes": sorted(set(codes)), "raised": raised[:3]}), flush=True)
"""


def test_running_out_of_descriptors_is_a_code_never_an_oserror_or_a_traceback(shared_dir):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 256:
        pytest.skip("the hard open-files limit is below 256")
    endpoint = f"fds?dir={shared_dir}"
    assert mset(client(endpoint), {"k": np.full(16, 1, np.uint8)})[0] == SUCCESS
    proc = child(MANY_THREADS, endpoint, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    result = json.loads(out)
    assert result["raised"] == [], result
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert set(result["codes"]) == {str(SUCCESS), "StatusCode.FAILED"}, result


def test_the_lock_timeout_is_an_endpoint_parameter_of_shared_stores_only(shared_dir):
    store = get_store(f"lt?dir={shared_dir}&lock_timeout=250ms")
    assert store.lock_timeout_s == 0.25
    c = eic.Client()
    assert c.init("x", "lt?lock_timeout=1s", eic.InitOption()) == -22
    assert "apply only to a shared store" in c.last_error


def test_a_device_get_holds_no_snapshot_while_it_waits_for_the_device(shared_dir, monkeypatch):
    """A device copy waits for the caller's stream (copy_to_device
    synchronises it); f131f80 made it inside the read, so a busy GPU stream
    held the snapshot, and every writer of the node, for as long."""
    from aibrix_eic.engine import device, shared_store

    store = get_store(f"dev?dir={shared_dir}")
    value = np.arange(8192, dtype=np.uint8)
    assert store.put_many("", ["k"], [(value.ctypes.data, value.nbytes)], -1) == [SUCCESS]
    seen = []

    def waiting_copy(addr, host):
        seen.append(store._active)  # transactions this process has open
        np.copyto(np.ctypeslib.as_array((ctypes.c_uint8 * host.nbytes).from_address(addr)), host)

    monkeypatch.setattr(device, "copy_to_device", waiting_copy)
    monkeypatch.setattr(shared_store.device, "copy_to_device", waiting_copy)
    out = np.zeros(8192, np.uint8)
    assert store.get_many("", ["k"], [(out.ctypes.data, out.nbytes)], on_device=[True]) == [SUCCESS]
    assert seen == [0] and (out == value).all()
