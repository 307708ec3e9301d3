"""The engine's shared mode (local://NAME?dir=DIR) across OS processes: what
one process writes another reads, a writer killed mid-put never leaves a
partial value, and the store outlives every process that used it. The SDK
behaviour common to both modes is in test_engine_conformance.py."""

import signal
import time

import numpy as np
import pytest
from engine_processes import MiB, child, client, mget, mset

import aibrix_eic.engine as eic
from aibrix_eic.engine import get_store, parse_endpoint, reset_stores

WRITE_AND_EXIT = """
    import sys, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("writer", sys.argv[1], eic.InitOption()) == 0
    value = np.arange(4096, dtype=np.uint32).view(np.uint8)
    vals = eic.IOBuffers()
    vals.append(value.ctypes.data, value.nbytes, False)
    status, _ = c.mset(eic.StringVector(["from-child"]), vals, eic.SetOption())
    print(int(status), eic.get_store(sys.argv[1]).capacity)
"""


def test_a_value_written_by_a_process_that_exited_is_read_by_another(shared_dir):
    endpoint = f"xp?dir={shared_dir}&capacity=64MiB"
    writer = child(WRITE_AND_EXIT, endpoint)
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0 and out.split() == ["0", str(64 * MiB)]

    reader = client(f"xp?dir={shared_dir}")  # no capacity given: the store's own
    codes, arrays = mget(reader, {"from-child": 4 * 4096, "absent": 16})
    assert codes == [eic.StatusCode.SUCCESS, eic.StatusCode.KEY_NOT_EXIST]
    assert arrays[0].tobytes() == np.arange(4096, dtype=np.uint32).tobytes()
    assert get_store(f"xp?dir={shared_dir}").capacity == 64 * MiB


FORK_AFTER_OPEN = """
    import os, sys, numpy as np, aibrix_eic.engine as eic
    parent = eic.Client()
    assert parent.init("parent", sys.argv[1], eic.InitOption()) == 0
    value = np.full(4096, 9, np.uint8)
    vals = eic.IOBuffers()
    vals.append(value.ctypes.data, value.nbytes, False)
    assert parent.mset(eic.StringVector(["k"]), vals, eic.SetOption())[0] == eic.StatusCode.SUCCESS
    pid = os.fork()
    if pid == 0:
        out = np.zeros(4096, np.uint8)
        into = eic.IOBuffers()
        into.append(out.ctypes.data, out.nbytes, False)
        # The parent's handle fails with a code (LMDB's handle is the parent's) ...
        print("inherited:", parent.mget(eic.StringVector(["k"]), eic.GetOption(), into)[2].status_codes[0])
        # ... and a new init opens the store afresh, no "damaged" in sight.
        fresh = eic.Client()
        print("init:", fresh.init("child", sys.argv[1], eic.InitOption()), fresh.last_error)
        print("fresh:", fresh.mget(eic.StringVector(["k"]), eic.GetOption(), into)[2].status_codes[0], out[0])
        print("put:", fresh.mset(eic.StringVector(["c"]), vals, eic.SetOption())[0])
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    print("parent:", parent.mexist(eic.StringVector(["c"]))[1].status_codes[0])
"""


def test_a_forked_child_opens_the_store_afresh_and_its_inherited_handle_fails_with_a_code(shared_dir):
    """A child reopening a healthy store was told it was damaged (LMDB
    refused a second handle on the file the parent's still held)."""
    forking = child(FORK_AFTER_OPEN, f"fork?dir={shared_dir}")
    out, _ = forking.communicate(timeout=60)
    assert forking.returncode == 0, out
    lines = out.splitlines()
    assert lines == [
        "inherited: StatusCode.FAILED",
        "init: 0 ",
        "fresh: StatusCode.SUCCESS 9",
        "put: StatusCode.SUCCESS",
        "parent: StatusCode.SUCCESS",
    ], out


def test_the_store_outlives_every_handle_on_it(shared_dir):
    endpoint = f"again?dir={shared_dir}"
    value = np.random.default_rng(1).integers(0, 256, 3 * MiB, dtype=np.uint8)
    assert mset(client(endpoint), {"kept": value})[0] == eic.StatusCode.SUCCESS
    reset_stores()  # this process forgets its handle, as a restart would
    codes, arrays = mget(client(endpoint), {"kept": value.nbytes})
    assert codes == [eic.StatusCode.SUCCESS] and arrays[0].tobytes() == value.tobytes()
    # A different name in the same directory is a different store.
    assert mget(client(f"other?dir={shared_dir}"), {"kept": value.nbytes})[0] == [eic.StatusCode.KEY_NOT_EXIST]


def test_keys_longer_than_lmdb_allows_are_stored_under_a_digest(shared_dir):
    endpoint = f"long?dir={shared_dir}"
    c = client(endpoint)
    names = ["k" * 600, "k" * 601, "short"]
    values = {name: np.full(64, i + 1, np.uint8) for i, name in enumerate(names)}
    assert mset(c, values)[0] == eic.StatusCode.SUCCESS
    codes, arrays = mget(c, dict.fromkeys(names, 64))
    assert codes == [eic.StatusCode.SUCCESS] * 3
    assert [int(a[0]) for a in arrays] == [1, 2, 3]
    assert sorted(get_store(endpoint).keys()) == sorted(("", name) for name in names)


def test_an_empty_dir_is_rejected_naming_the_parameter():
    with pytest.raises(ValueError, match="dir"):
        parse_endpoint("kv?dir=")


KEYS = 16
VALUE_BYTES = 2 * MiB

# Writes every key with the round's fill, round after round, announcing each
# round just before its mset. One mset of 32 MiB takes tens of ms, so a kill
# a few ms after an announcement lands inside that round's transaction.
WRITE_ROUNDS = f"""
    import sys, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("writer", sys.argv[1], eic.InitOption()) == 0
    keys = eic.StringVector([f"k{{i}}" for i in range({KEYS})])
    values = [np.empty({VALUE_BYTES}, np.uint8) for _ in range({KEYS})]
    vals = eic.IOBuffers()
    for value in values:
        vals.append(value.ctypes.data, value.nbytes, False)
    for round_ in range(1, 10**6):
        for value in values:
            value.fill(round_ % 251)
        print(round_, flush=True)
        status, _ = c.mset(keys, vals, eic.SetOption())
        assert int(status) == 0, status
"""


@pytest.mark.parametrize("kill_after_s", [0.0, 0.005, 0.02])
def test_a_writer_killed_mid_put_leaves_whole_values_or_none(shared_dir, kill_after_s):
    """A SIGKILLed writer: every key reads one whole round's value, every key
    the same round (one mset is one transaction), and writing goes on."""
    endpoint = f"killed?dir={shared_dir}"
    writer = child(WRITE_ROUNDS, endpoint)
    try:
        for line in writer.stdout:
            if int(line) == 3:  # rounds 1 and 2 are committed, round 3 is being written
                break
        time.sleep(kill_after_s)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL

    c = client(endpoint)
    codes, arrays = mget(c, {f"k{i}": VALUE_BYTES for i in range(KEYS)})
    assert codes == [eic.StatusCode.SUCCESS] * KEYS
    rounds = set()
    for i, array in enumerate(arrays):
        assert (array == array[0]).all(), f"k{i} is torn: it holds more than one round's bytes"
        rounds.add(int(array[0]))
    assert len(rounds) == 1 and rounds <= {2, 3}, rounds

    store = get_store(endpoint)
    assert len(store) == KEYS and store.live_bytes == KEYS * VALUE_BYTES
    fresh = {f"k{i}": np.full(VALUE_BYTES, 250, np.uint8) for i in range(KEYS)}
    assert mset(c, fresh)[0] == eic.StatusCode.SUCCESS  # the killed writer's lock was recovered
    assert all((a == 250).all() for a in mget(c, dict.fromkeys(fresh, VALUE_BYTES))[1])


def test_fault_knobs_and_namespaces_apply_to_this_process_handle(shared_dir):
    base = f"faulty?dir={shared_dir}"
    healthy = client(base)
    value = {"k": np.full(256, 7, np.uint8)}
    assert mset(healthy, value)[0] == eic.StatusCode.SUCCESS

    failing = client(f"{base}&fail_rate=1")  # the same store, this process's knob
    status, outcome = mset(failing, value)
    assert status == eic.StatusCode.FAILED and list(outcome.status_codes) == [eic.StatusCode.FAILED]
    get_store(base).faults.clear()

    assert eic.Client().init("test", f"{base}&unreachable=true", eic.InitOption()) == -1
    get_store(base).faults.clear()

    restricted = client(f"{base}&namespaces=kv")
    option = eic.ExistOption()
    option.ns = "other"
    status, outcome = restricted.mexist(eic.StringVector(["k"]), option)
    assert list(outcome.status_codes) == [eic.StatusCode.NAMESPACE_NOT_FOUND]
    get_store(base).namespaces = None  # like every parameter, it stays until changed
    # The data was never touched by the knobs.
    assert mget(client(base), {"k": 256})[0] == [eic.StatusCode.SUCCESS]
