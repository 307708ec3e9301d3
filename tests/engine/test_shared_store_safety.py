"""The shared store (local://NAME?dir=DIR) as operators deploy it: processes
that open it with different capacities, a filesystem that fills, a map
another process grew, readers SIGKILLed mid-read, a truncated or damaged
file, two PID namespaces (two pods on one node), file modes and a hostile
DIR. Real processes on real directories; each case once killed a worker,
served wrong bytes or trusted another user's files."""

import json
import os
import shutil
import signal
import stat
import subprocess

import numpy as np
import pytest
from engine_processes import MiB, child, client, mget, mset, small_tmpfs
from hypothesis import given, settings
from hypothesis import strategies as st

import aibrix_eic.engine as eic
from aibrix_eic.engine import get_store, reset_stores, shared_store
from aibrix_eic.engine.errors import StoreUnavailable
from aibrix_eic.engine.registry import open_store

SUCCESS, MISS = eic.StatusCode.SUCCESS, eic.StatusCode.KEY_NOT_EXIST
OUT_OF_CAPACITY = int(eic.StatusCode.OUT_OF_CAPACITY)
NOBODY = 65534

OPEN_AND_EXIT = """
    import sys, aibrix_eic.engine as eic
    assert eic.Client().init("opener", sys.argv[1], eic.InitOption()) == 0
"""

# Opens the store and says so; puts argv[2] values of 1 MiB, one call at a
# time, printing each call's code; waits for a line on stdin and does it again.
WRITE_WHEN_TOLD = """
    import sys, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("writer", sys.argv[1], eic.InitOption()) == 0
    print("open", flush=True)
    value = np.full(1 << 20, 7, np.uint8)
    vals = eic.IOBuffers()
    vals.append(value.ctypes.data, value.nbytes, False)
    for round_ in ("a", "b"):
        codes = [c.mset(eic.StringVector([f"{round_}{i}"]), vals, eic.SetOption())[1].status_codes[0]
                 for i in range(int(sys.argv[2]))]
        print(" ".join(str(int(code)) for code in codes), flush=True)
        if round_ == "a":
            sys.stdin.readline()
"""


def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (to mount a filesystem or give a file to another user)")


# ------------------------------------------------------------ map and space
def test_processes_opening_with_different_capacities_never_kill_a_writer(shared_dir):
    """The last opener once resized data.mdb to its own, smaller map, under
    the first one's mapping: the first one's next writes died of SIGBUS."""
    endpoint = f"caps?dir={shared_dir}"
    writer = child(WRITE_WHEN_TOLD, f"{endpoint}&capacity=256MiB", "150", stdin=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == "open"
        assert writer.stdout.readline().split() == ["0"] * 150
        assert child(OPEN_AND_EXIT, f"{endpoint}&capacity=16MiB").wait(timeout=120) == 0
        out, _ = writer.communicate("go\n", timeout=300)
    finally:
        writer.kill()
    assert writer.returncode == 0, f"the writer died ({writer.returncode})"
    assert out.split() == ["0"] * 150  # the 16 MiB capacity is the shared one now: older values were evicted
    assert get_store(endpoint).capacity == 16 * MiB


ROUNDS = """
    import sys, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("rounds", sys.argv[1], eic.InitOption()) == 0
    print("open", flush=True)
    sys.stdin.readline()
    ok = 0
    for i in range(30):
        value = np.full(4096, i, np.uint8)
        vals = eic.IOBuffers(); vals.append(value.ctypes.data, value.nbytes, False)
        out = np.zeros(4096, np.uint8)
        back = eic.IOBuffers(); back.append(out.ctypes.data, out.nbytes, False)
        try:
            put = c.mset(eic.StringVector([f"r{i}"]), vals, eic.SetOption())[0]
            got = c.mget(eic.StringVector([f"r{i}"]), eic.GetOption(), back)[0]
            ok += int(put) == 0 and int(got) == 0 and (out == i).all()
        except Exception as e:
            print(type(e).__name__, e, file=sys.stderr)
    print(ok, flush=True)
"""


def test_a_store_opened_again_with_a_larger_capacity_keeps_serving_every_process(shared_dir):
    """A later opener with a larger capacity once grew the map, and every
    call of the process with the smaller one raised MapResizedError."""
    endpoint = f"grow?dir={shared_dir}"
    small = child(ROUNDS, f"{endpoint}&capacity=16MiB", stdin=subprocess.PIPE)
    try:
        assert small.stdout.readline().strip() == "open"
        large = client(f"{endpoint}&capacity=1GiB")
        value = np.ones(MiB, np.uint8)
        assert [mset(large, {f"big{i}": value})[0] for i in range(120)] == [SUCCESS] * 120  # past the small map
        out, _ = small.communicate("go\n", timeout=300)
    finally:
        small.kill()
    assert small.returncode == 0 and out.split() == ["30"]


GROW_MAP = """
    import sys, lmdb
    env = lmdb.open(sys.argv[1], map_size=int(sys.argv[2]), lock=False, writemap=False, max_dbs=8)
    pad = b"x" * (1 << 20)
    with env.begin(write=True) as txn:
        for i in range(120):
            txn.put(b"grown-by-another-tool-%d" % i, pad)
    print(env.info()["map_size"])
"""


def test_a_map_another_process_grew_is_adopted(shared_dir, monkeypatch):
    """A map grown past this process's (by a tool, or an older aibrix-eic)
    once made every call raise MapResizedError, for good."""
    monkeypatch.setattr(shared_store, "_MIN_MAP", 0)  # a map as small as the capacity allows: 96 MiB
    endpoint = f"adopt?dir={shared_dir}&capacity=16MiB"
    c = client(endpoint)
    assert mset(c, {"before": np.full(8192, 3, np.uint8)})[0] == SUCCESS
    store = get_store(endpoint)
    assert store.map_size == 96 * MiB
    grower = child(GROW_MAP, store.path, str(512 * MiB))
    out, _ = grower.communicate(timeout=60)
    assert grower.returncode == 0 and int(out) == 512 * MiB
    codes, arrays = mget(c, {"before": 8192})
    assert codes == [SUCCESS] and (arrays[0] == 3).all()
    assert store.map_size == 512 * MiB
    assert mset(c, {"after": np.full(8192, 4, np.uint8)})[0] == SUCCESS
    assert mget(c, {"after": 8192})[0] == [SUCCESS]
    # A later opener keeps the grown map: a smaller one would shrink the
    # file under this process's mapping.
    assert child(OPEN_AND_EXIT, endpoint).wait(timeout=120) == 0
    assert os.path.getsize(os.path.join(store.path, "data.mdb")) >= 512 * MiB


@pytest.fixture
def small_fs(tmp_path):
    """A 24 MiB tmpfs, as a container's small /dev/shm."""
    with small_tmpfs(str(tmp_path / "small"), "24m") as mount:
        yield mount


FILL = """
    import json, os, sys, numpy as np, aibrix_eic.engine as eic
    endpoint, ballast = sys.argv[1], sys.argv[2]
    with open(ballast, "wb") as f:
        f.write(b"x" * (8 << 20))
    c = eic.Client()
    assert c.init("filler", endpoint, eic.InitOption()) == 0
    def put(key, fill):
        value = np.full(1 << 20, fill, np.uint8)
        vals = eic.IOBuffers(); vals.append(value.ctypes.data, value.nbytes, False)
        return int(c.mset(eic.StringVector([key]), vals, eic.SetOption())[1].status_codes[0])
    def get(key):
        out = np.zeros(1 << 20, np.uint8)
        back = eic.IOBuffers(); back.append(out.ctypes.data, out.nbytes, False)
        return int(c.mget(eic.StringVector([key]), eic.GetOption(), back)[2].status_codes[0]), int(out[0])
    codes = [put(f"k{i}", i + 1) for i in range(40)]
    stored = [i for i, code in enumerate(codes) if code == 0]
    read = [get(f"k{i}") == (0, i + 1) for i in stored]
    os.remove(ballast)  # space frees
    after = put("after", 99), get("after")
    print(json.dumps({"codes": codes, "read": read, "after": after}), flush=True)
"""


def test_a_full_filesystem_fails_puts_and_the_store_serves_on(small_fs):
    """A store bigger than its filesystem (the default 4 GiB on a 24 MiB
    tmpfs) once died of SIGBUS when the filesystem filled."""
    filler = child(FILL, f"full?dir={small_fs}", os.path.join(small_fs, "ballast"))
    out, _ = filler.communicate(timeout=300)
    assert filler.returncode == 0, f"the writer died ({filler.returncode})"
    result = json.loads(out)
    codes = result["codes"]
    assert OUT_OF_CAPACITY in codes and 0 in codes, codes
    assert set(codes) <= {0, OUT_OF_CAPACITY}
    assert all(result["read"]), "a value stored before the filesystem filled is read whole"
    assert result["after"] == [0, [0, 99]], "once space frees, puts succeed again"


# ---------------------------------------------------------- killed readers
READ_FOREVER = """
    import sys, numpy as np, aibrix_eic.engine as eic
    c = eic.Client()
    assert c.init("reader", sys.argv[1], eic.InitOption()) == 0
    keys = eic.StringVector([f"v{i}" for i in range(8)])
    outs = [np.zeros(1 << 20, np.uint8) for _ in range(8)]
    back = eic.IOBuffers()
    for out in outs:
        back.append(out.ctypes.data, out.nbytes, False)
    n = 0
    while True:
        assert int(c.mget(keys, eic.GetOption(), back)[0]) == 0
        n += 1
        if n in (1, 50):
            print(n, flush=True)
"""


def test_readers_sigkilled_mid_read_never_hold_up_writers(shared_dir):
    endpoint = f"killed-readers?dir={shared_dir}&capacity=32MiB"
    c = client(endpoint)
    assert mset(c, {f"v{i}": np.full(MiB, i, np.uint8) for i in range(8)})[0] == SUCCESS
    readers = [child(READ_FOREVER, endpoint) for _ in range(3)]
    try:
        for reader in readers:
            assert reader.stdout.readline().strip() == "1"
            assert reader.stdout.readline().strip() == "50"  # reading in a loop: killed inside a read
            reader.send_signal(signal.SIGKILL)
            reader.wait(timeout=60)
    finally:
        for reader in readers:
            reader.kill()
            reader.stdout.close()
    value = np.full(MiB, 5, np.uint8)
    codes = [mset(c, {f"w{i}": value})[0] for i in range(150)]  # 150 MiB through a 32 MiB store
    assert codes == [SUCCESS] * 150
    after = child(WRITE_WHEN_TOLD, endpoint, "1", stdin=subprocess.PIPE)
    out, _ = after.communicate("go\n", timeout=120)
    assert after.returncode == 0 and out.split() == ["open", "0", "0"]


# -------------------------------------------------------- damaged storage
def write_values(endpoint: str, count: int, nbytes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    values = {f"v{i}": rng.integers(1, 256, nbytes, dtype=np.uint8) for i in range(count)}
    assert mset(client(endpoint), values)[0] == SUCCESS
    return values


READ_ALL = """
    import json, sys, numpy as np, aibrix_eic.engine as eic
    from aibrix_eic.engine.errors import StoreUnavailable
    endpoint, count, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        store = eic.get_store(endpoint)
    except StoreUnavailable as e:
        print(json.dumps({"unavailable": str(e)}))
        sys.exit(0)
    outs = [np.zeros(nbytes, np.uint8) for _ in range(count)]
    codes = store.get_many("", [f"v{i}" for i in range(count)], [(o.ctypes.data, nbytes) for o in outs])
    rng = np.random.default_rng(7)
    written = [rng.integers(1, 256, nbytes, dtype=np.uint8) for _ in range(count)]
    wrong = sum(int(code) == 0 and not (out == value).all() for code, out, value in zip(codes, outs, written))
    print(json.dumps({"hits": sum(int(code) == 0 for code in codes), "wrong": wrong}))
"""


def read_all(endpoint: str, count: int, nbytes: int) -> dict:
    reader = child(READ_ALL, endpoint, str(count), str(nbytes))
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0, f"the reader died ({reader.returncode})"
    return json.loads(out)


def test_a_truncated_store_is_refused_never_read_as_zeros(shared_dir):
    """40 values of 64 KiB, data.mdb cut to 1.5 MiB (what a host crash can
    leave): 19 of 40 gets once returned SUCCESS with zeroed bytes."""
    endpoint = f"cut?dir={shared_dir}"
    write_values(endpoint, 40, 64 << 10)
    data = os.path.join(get_store(endpoint).path, "data.mdb")
    reset_stores()
    os.truncate(data, 1536 << 10)
    result = read_all(endpoint, 40, 64 << 10)
    assert result.get("wrong", 0) == 0
    message = result["unavailable"]
    assert data in message and "truncated" in message and "remove the directory" in message
    shutil.rmtree(os.path.dirname(data))  # the fix it names: the store is rebuilt empty
    assert read_all(endpoint, 40, 64 << 10) == {"hits": 0, "wrong": 0}


def test_a_value_with_a_damaged_page_is_a_miss(shared_dir):
    endpoint = f"torn?dir={shared_dir}"
    values = write_values(endpoint, 4, 256 << 10)
    data = os.path.join(get_store(endpoint).path, "data.mdb")
    with open(data, "rb") as f:  # the file may be as long as the map, mostly holes: the values are near its start
        contents = f.read(16 * MiB)
    at = contents.find(values["v2"][100_000:100_064].tobytes())
    assert at > 0
    with open(data, "r+b") as f:  # a page a crash never wrote back
        f.seek(at - at % 4096)
        f.write(bytes(4096))
    assert read_all(endpoint, 4, 256 << 10) == {"hits": 3, "wrong": 0}
    c = client(endpoint)
    codes, arrays = mget(c, {"v2": 256 << 10, "v3": 256 << 10})
    assert codes == [MISS, SUCCESS] and not arrays[0].any()  # the destination was left untouched


def test_a_store_that_is_not_lmdb_is_refused_naming_the_fix(shared_dir):
    endpoint = f"garbage?dir={shared_dir}"
    write_values(endpoint, 1, 4096)
    data = os.path.join(get_store(endpoint).path, "data.mdb")
    reset_stores()
    with open(data, "r+b") as f:
        f.write(os.urandom(16384))
    message = read_all(endpoint, 1, 4096)["unavailable"]
    assert data in message and "damaged store" in message and "remove the directory" in message


@settings(max_examples=200, deadline=None)
@given(nbytes=st.integers(1, 300_000), page=st.integers(0, 80), seed=st.integers(0, 2**32 - 1))
def test_the_checksum_sees_any_lmdb_page_of_a_value_zeroed(nbytes, page, seed):
    """LMDB stores a large value from byte 16 of its first overflow page
    on, so its page k holds value bytes [4096 k - 16, 4096 (k + 1) - 16)."""
    from aibrix_eic.engine.shared_records import value_checksum  # imported here: older trees lack it

    value = np.random.default_rng(seed).integers(1, 256, nbytes, dtype=np.uint8)  # no zero byte
    start = max(page * 4096 - 16, 0)
    if start >= nbytes:
        return
    damaged = value.copy()
    damaged[start : page * 4096 + 4096 - 16] = 0
    assert value_checksum(damaged) != value_checksum(value)


# ------------------------------------------------------------ namespaces
NS_PEER = """
    import os, sys, numpy as np, aibrix_eic.engine as eic
    endpoint, me, other = sys.argv[1:]
    c = eic.Client()
    assert c.init(me, endpoint, eic.InitOption()) == 0
    def put(key):
        value = np.full(65536, ord(key), np.uint8)
        vals = eic.IOBuffers(); vals.append(value.ctypes.data, value.nbytes, False)
        return int(c.mset(eic.StringVector([key]), vals, eic.SetOption())[0])
    def get(key):
        out = np.zeros(65536, np.uint8)
        back = eic.IOBuffers(); back.append(out.ctypes.data, out.nbytes, False)
        return int(c.mget(eic.StringVector([key]), eic.GetOption(), back)[0]) == 0 and bool((out == ord(key)).all())
    print(os.getpid(), put(me), get(me), flush=True)
    sys.stdin.readline()
    print(get(other), flush=True)
"""


def test_processes_in_two_pid_namespaces_share_one_store(shared_dir):
    """Two pods on one node: each process is pid 1 in its own namespace.
    LMDB's lock file keys readers by pid, so the second one's reads once
    failed with 'Resource temporarily unavailable'."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a PID namespace here (needs CAP_SYS_ADMIN): {probe.stderr.strip()}")
    endpoint = f"pods?dir={shared_dir}"
    unshare = ("unshare", "--pid", "--fork")
    a = child(NS_PEER, endpoint, "a", "b", stdin=subprocess.PIPE, prefix=unshare)
    b = None
    try:
        assert a.stdout.readline().split() == ["1", "0", "True"]
        b = child(NS_PEER, endpoint, "b", "a", stdin=subprocess.PIPE, prefix=unshare)
        assert b.stdout.readline().split() == ["1", "0", "True"]  # the same pid as a, in another namespace
        out_b, _ = b.communicate("go\n", timeout=120)
        out_a, _ = a.communicate("go\n", timeout=120)
    finally:
        for peer in (a, b):
            if peer is not None:
                peer.kill()
    assert out_a.split() == ["True"] and out_b.split() == ["True"]


# ------------------------------------------------------------ permissions
def modes(store_path: str) -> dict[str, int]:
    found = {".": stat.S_IMODE(os.stat(store_path).st_mode)}
    for name in os.listdir(store_path):
        found[name] = stat.S_IMODE(os.stat(os.path.join(store_path, name)).st_mode)
    return found


def test_a_store_is_private_whatever_the_umask(shared_dir):
    previous = os.umask(0)
    try:
        store = get_store(f"private?dir={shared_dir}/made&create=1")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(f"{shared_dir}/made").st_mode) == 0o700
    assert modes(store.path) == {".": 0o700, "data.mdb": 0o600, "format": 0o600, "store.lock": 0o600}


def test_mode_shares_the_store_with_a_group(shared_dir):
    store = get_store(f"group?dir={shared_dir}&mode=0770")
    assert modes(store.path) == {".": 0o770, "data.mdb": 0o660, "format": 0o660, "store.lock": 0o660}


@pytest.mark.parametrize("mode", ["0777", "0600", "9", "0o7777"])
def test_a_mode_that_is_world_writable_or_locks_out_the_owner_is_rejected(mode):
    with pytest.raises(ValueError, match="engine parameter mode=.*(octal|0700|world)"):
        open_store(f"x?dir=/nonexistent&mode={mode}")


def test_a_dir_that_does_not_exist_is_an_error_unless_create_is_given(shared_dir):
    missing = os.path.join(shared_dir, "typo")
    with pytest.raises(StoreUnavailable) as refused:
        open_store(f"kv?dir={missing}")
    assert refused.value.path == missing and "does not exist" in refused.value.cause
    assert "create=1" in refused.value.fix and not os.path.exists(missing)
    assert os.path.isdir(get_store(f"kv?dir={missing}&create=1").path)


def test_a_dir_that_is_a_file_is_refused(shared_dir):
    path = os.path.join(shared_dir, "file")
    open(path, "w").close()
    with pytest.raises(StoreUnavailable, match="not a directory"):
        open_store(f"kv?dir={path}")


@pytest.mark.parametrize("writable", [0o777, 0o770])
def test_a_dir_others_can_write_needs_the_sticky_bit(shared_dir, writable):
    os.chmod(shared_dir, writable)
    with pytest.raises(StoreUnavailable, match="sticky"):
        open_store(f"kv?dir={shared_dir}")
    os.chmod(shared_dir, 0o1777)  # as /dev/shm and /tmp are
    assert get_store(f"kv?dir={shared_dir}").capacity > 0


@pytest.mark.parametrize("owned", ["dir", "store"])
def test_another_users_dir_or_store_is_refused(shared_dir, owned):
    root_only()
    os.chmod(shared_dir, 0o755)
    if owned == "dir":
        os.chown(shared_dir, NOBODY, NOBODY)
    else:
        os.mkdir(os.path.join(shared_dir, "kv"), 0o700)
        os.chown(os.path.join(shared_dir, "kv"), NOBODY, NOBODY)
    with pytest.raises(StoreUnavailable, match=f"owned by uid {NOBODY}"):
        open_store(f"kv?dir={shared_dir}")


@pytest.mark.parametrize("planted", ["data.mdb", "format", "store.lock", "lock.mdb", "."])
def test_a_planted_symlink_is_never_followed(shared_dir, tmp_path, planted):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root-only secret")
    victim.chmod(0o600)
    store = os.path.join(shared_dir, "kv")
    if planted == ".":
        os.symlink(tmp_path, store)
    else:
        os.mkdir(store, 0o700)
        os.symlink(victim, os.path.join(store, planted))
    try:
        open_store(f"kv?dir={shared_dir}")
    except StoreUnavailable as refused:
        assert "symlink" in refused.cause
    else:
        assert planted == "lock.mdb", "a symlinked store file was opened"  # a name the store does not use
    assert victim.read_bytes() == b"root-only secret"


OPEN_AS_NOBODY = """
    import os, sys
    import aibrix_eic.engine as eic
    import aibrix_eic.engine.shared_store  # imported while root: the interpreter may live in /root
    eic.get_store  # the engine's names load on first use (engine/__init__.py): while root too
    from aibrix_eic.engine.errors import StoreUnavailable
    os.setgid(65534)
    os.setuid(65534)
    try:
        eic.get_store(sys.argv[1])
    except StoreUnavailable as e:
        print(e.path, "|", e.cause, "|", e.fix)
"""


def test_a_dir_this_user_cannot_write_is_refused_naming_it(shared_dir):
    root_only()
    os.chmod(shared_dir, 0o755)  # root's, readable by all, writable by root only
    opener = child(OPEN_AS_NOBODY, f"kv?dir={shared_dir}")
    out, _ = opener.communicate(timeout=60)
    assert opener.returncode == 0, out
    path, cause, fix = out.strip().split(" | ")
    assert path == os.path.join(shared_dir, "kv") and "permission denied" in cause and "dir=" in fix


MISSING_LMDB = """
    import sys
    sys.modules["lmdb"] = None  # as if it were not installed
    import aibrix_eic.engine as eic
    from aibrix_eic.engine.errors import StoreUnavailable
    try:
        eic.get_store(sys.argv[1])
    except StoreUnavailable as e:
        print(e)
"""


def test_a_missing_lmdb_module_is_a_store_error_naming_the_fix(shared_dir):
    reader = child(MISSING_LMDB, f"kv?dir={shared_dir}")
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0 and "lmdb" in out and "pip install" in out, out
