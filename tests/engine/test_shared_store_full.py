"""A shared store on a filesystem that is nearly full: every write
transaction, the one that creates the store and the ones that free a lot
(a smaller capacity= evicting, a burst of expiries) included, fails its
calls with a code, never SIGBUS. LMDB writes through a writable map, where
a page the filesystem has no room for kills the process.

The transactions that free a lot write LMDB's free list: 8 bytes per freed
page, so the once fixed slack (4 MiB) was outgrown only by evicting some
2 GiB. The tests scale that down by setting the slack to 16 KiB in the
child process: what they show is that the reservation covers the free list
whatever the slack."""

import json
import signal
import textwrap

import pytest
from engine_processes import child, small_tmpfs

PAGE = 4096


FILL = """
    def fill(mount, leave):
        # Fill the filesystem at `mount` but `leave` bytes.
        ballast = os.path.join(mount, "ballast")
        with open(ballast, "ab") as f:
            try:
                while True:
                    f.write(b"x" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        st = os.statvfs(mount)
        size = os.path.getsize(ballast)
        os.truncate(ballast, max(size - max(leave - st.f_bavail * st.f_frsize, 0), 0) // 4096 * 4096)
"""


def run(code: str, *args: str) -> dict:
    process = child(textwrap.dedent(FILL) + textwrap.dedent(code), *args)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, (
        f"the process died ({signal.Signals(-process.returncode).name if process.returncode < 0 else process.returncode})"
    )
    return json.loads(out.strip().splitlines()[-1])


INIT = """
    import json, os, sys, aibrix_eic.engine as eic
    fill(sys.argv[2], int(sys.argv[3]))
    c = eic.Client()
    code = c.init("creator", sys.argv[1], eic.InitOption())
    print(json.dumps({"init": code, "error": c.last_error}))
"""


@pytest.mark.parametrize("pages_free", list(range(9)))
def test_creating_a_store_on_a_nearly_full_filesystem_fails_init_with_a_code(tmp_path, pages_free):
    """With 3 pages free the creating transaction once died of SIGBUS
    inside Client.init (it reserved nothing)."""
    with small_tmpfs(str(tmp_path / "fs"), "4m") as mount:
        result = run(INIT, f"new?dir={mount}", mount, str(pages_free * PAGE))
        if result["init"] != 0:
            assert result["init"] == -1 and "no space" in result["error"] and "damaged" not in result["error"], result


# Puts 48 values of 1 MiB (with ttl= argv[3] seconds, -1: none) into a
# 64 MiB store, fills the filesystem, then frees them all in one transaction:
# by reopening with capacity=1MiB ("capacity") or, once they expired, by one
# more call ("expiry": a delete, which writes no value). Prints the codes; alive is what matters.
BURST = """
    import json, os, sys, time, numpy as np, aibrix_eic.engine as eic
    from aibrix_eic.engine import shared_store
    shared_store._RESERVE_SLACK = 16 << 10  # scaled down: see the module's docstring
    endpoint, how, ttl, mount = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    c = eic.Client()
    assert c.init("burst", endpoint + "&capacity=64MiB", eic.InitOption()) == 0
    value = np.full(1 << 20, 3, np.uint8)
    def put(key):
        vals = eic.IOBuffers(); vals.append(value.ctypes.data, value.nbytes, False)
        option = eic.SetOption(); option.ttl_second = ttl
        return int(c.mset(eic.StringVector([key]), vals, option)[1].status_codes[0])
    codes = [put(f"k{i}") for i in range(48)]
    fill(mount, 0)
    if how == "capacity":
        again = eic.Client()
        after = again.init("smaller", endpoint + "&capacity=1MiB", eic.InitOption())
    else:
        time.sleep(ttl + 0.5)
        after = int(c.mdel(eic.StringVector(["absent"]), eic.DelOption())[1].status_codes[0])
    print(json.dumps({"puts": codes, "after": after}))
"""


@pytest.mark.parametrize("how", ["capacity", "expiry"])
def test_freeing_many_values_on_a_full_filesystem_returns_codes(tmp_path, how):
    """48 MiB of values freed in one transaction with the filesystem full:
    the free list outgrew the slack and the process died of SIGBUS."""
    with small_tmpfs(str(tmp_path / "fs"), "72m") as mount:
        endpoint = f"burst?dir={mount}"
        result = run(BURST, endpoint, how, "1" if how == "expiry" else "-1", mount)
    assert result["puts"] == [0] * 48
    assert result["after"] in ((0, -1) if how == "capacity" else (5, 104)), result  # KEY_NOT_EXIST, OUT_OF_CAPACITY


# Puts 4 values, fills the filesystem, and deletes and clears once with a
# reservation the filesystem has no room for (the slack raised to 8 MiB),
# then again once space frees.
DELETE_WHEN_FULL = """
    import json, os, sys, numpy as np, aibrix_eic.engine as eic
    from aibrix_eic.engine import shared_store
    endpoint, mount = sys.argv[1], sys.argv[2]
    c = eic.Client()
    assert c.init("deleter", endpoint, eic.InitOption()) == 0
    value = np.full(1 << 20, 3, np.uint8)
    vals = eic.IOBuffers()
    for _ in range(4):
        vals.append(value.ctypes.data, value.nbytes, False)
    assert int(c.mset(eic.StringVector(["a", "b", "c", "d"]), vals, eic.SetOption())[0]) == 0
    fill(mount, 0)
    store, slack = eic.get_store(endpoint), shared_store._RESERVE_SLACK
    def delete(*keys):
        return [int(code) for code in c.mdel(eic.StringVector(keys), eic.DelOption())[1].status_codes]
    shared_store._RESERVE_SLACK = 8 << 20
    full = {"delete": delete("a", "b"), "clear": int(store.clear())}
    shared_store._RESERVE_SLACK = slack
    os.remove(os.path.join(mount, "ballast"))
    room = {"delete": delete("a", "x"), "clear": int(store.clear()), "left": len(store)}
    print(json.dumps({"full": full, "room": room}))
"""


def test_deletes_and_clear_on_a_full_filesystem_return_codes(tmp_path):
    """They raised StoreFull out of the SDK call."""
    with small_tmpfs(str(tmp_path / "fs"), "24m") as mount:
        result = run(DELETE_WHEN_FULL, f"del?dir={mount}", mount)
    assert result["full"] == {"delete": [104, 104], "clear": 104}  # OUT_OF_CAPACITY, nothing removed
    assert result["room"] == {"delete": [0, 5], "clear": 0, "left": 0}
