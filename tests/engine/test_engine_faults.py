"""The embedded engine's fault knobs and endpoint parameters: each knob makes
the engine fail the way a real EIC does, and only that way."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aibrix_eic.engine as eic
from aibrix_eic.engine import ENDPOINT_PARAMS, Faults, get_store, parse_endpoint

SUCCESS = eic.StatusCode.SUCCESS
FAILED = eic.StatusCode.FAILED
PARTIAL_FAILED = eic.StatusCode.PARTIAL_FAILED
KEY_NOT_EXIST = eic.StatusCode.KEY_NOT_EXIST


def connect(endpoint: str) -> eic.Client:
    client = eic.Client()
    assert client.init("fault-test", endpoint, eic.InitOption()) == 0
    return client


def keys(names) -> eic.StringVector:
    vector = eic.StringVector()
    vector.extend(names)
    return vector


def values(arrays) -> eic.IOBuffers:
    vals = eic.IOBuffers()
    for array in arrays:
        vals.append(array.ctypes.data, array.nbytes, False)
    return vals


def mset(client, names, nbytes=256, seed=0):
    arrays = [np.full(nbytes, (seed + i) % 256, np.uint8) for i in range(len(names))]
    status, outcome = client.mset(keys(names), values(arrays), eic.SetOption())
    return status, list(outcome.status_codes)


def mget(client, names, nbytes=256):
    arrays = [np.full(nbytes, 0x5A, np.uint8) for _ in names]
    status, _, outcome = client.mget(keys(names), eic.GetOption(), values(arrays))
    return status, list(outcome.status_codes), arrays


def mexist(client, names):
    status, outcome = client.mexist(keys(names), eic.ExistOption())
    return status, list(outcome.status_codes)


def names(n, prefix="k"):
    return [f"{prefix}{i}" for i in range(n)]


# --------------------------------------------------------------------- latency
def test_latency_is_added_once_per_call_not_per_key():
    client = connect("slow?latency=100ms")
    mset(client, names(20))  # keys exist, so mexist below does real lookups
    start = time.perf_counter()
    mexist(client, names(20))
    elapsed = time.perf_counter() - start
    assert 0.1 <= elapsed < 0.1 * 10  # one delay for 20 keys, not twenty (2 s)


def test_latency_applies_to_every_data_call():
    client = connect("slow2?latency=20ms")
    calls = [
        lambda: mset(client, ["a"]),
        lambda: mget(client, ["a"]),
        lambda: mexist(client, ["a"]),
        lambda: client.mdel(keys(["a"])),
    ]
    for call in calls:
        start = time.perf_counter()
        call()
        assert time.perf_counter() - start >= 0.02


def test_latency_can_be_changed_while_clients_run():
    client = connect("live")
    get_store("live").faults.latency_s = 0.5
    start = time.perf_counter()
    mexist(client, ["x"])
    assert time.perf_counter() - start >= 0.5
    get_store("live").faults.latency_s = 0.0
    start = time.perf_counter()
    mexist(client, ["x"])
    assert time.perf_counter() - start < 0.25  # margins a loaded CI host's stalls do not cross


# ------------------------------------------------------------------- fail_rate
def test_failed_call_stores_nothing_and_copies_nothing():
    client = connect("broken")
    mset(client, ["old"], seed=7)
    get_store("broken").faults.fail_rate = 1.0

    status, codes = mset(client, ["new-1", "new-2"])
    assert status == FAILED and codes == [FAILED, FAILED]
    status, codes, arrays = mget(client, ["old"])
    assert status == FAILED and codes == [FAILED]
    assert (arrays[0] == 0x5A).all()
    assert mexist(client, ["old"]) == (FAILED, [FAILED])

    get_store("broken").faults.fail_rate = 0.0
    assert mexist(client, ["new-1", "new-2", "old"])[1] == [KEY_NOT_EXIST, KEY_NOT_EXIST, SUCCESS]
    assert get_store("broken").stats.puts == 1  # only the write before the fault


def test_fail_rate_fails_about_that_share_of_calls():
    client = connect("flaky")
    mset(client, ["x"])
    get_store("flaky").faults.fail_rate = 0.5
    get_store("flaky").faults.reseed(1)
    failed = sum(mexist(client, ["x"]) == (FAILED, [FAILED]) for _ in range(400))
    assert 140 <= failed <= 260  # 0.5 +- 6 sigma


# --------------------------------------------------------------- key_fail_rate
def test_key_fail_rate_fails_single_keys_inside_partial_failed():
    client = connect("keyflaky?key_fail_rate=0.5&seed=3")
    status, codes = mset(client, names(100))
    assert status == PARTIAL_FAILED
    assert set(codes) == {SUCCESS, FAILED}
    get_store("keyflaky").faults.key_fail_rate = 0.0
    # Exactly the keys reported SUCCESS were stored.
    assert mexist(client, names(100))[1] == [SUCCESS if c == SUCCESS else KEY_NOT_EXIST for c in codes]


def test_key_failures_on_mget_leave_those_buffers_untouched():
    client = connect("keyflaky-get")
    mset(client, names(50), seed=9)
    get_store("keyflaky-get").faults.key_fail_rate = 0.5
    get_store("keyflaky-get").faults.reseed(4)
    status, codes, arrays = mget(client, names(50))
    assert status == PARTIAL_FAILED
    for i, (code, array) in enumerate(zip(codes, arrays)):
        expected = np.full(256, 0x5A if code == FAILED else (9 + i) % 256, np.uint8)
        assert array.tobytes() == expected.tobytes(), f"key {i} with {code}"
    assert FAILED in codes and SUCCESS in codes


def test_key_fail_rate_leaves_mexist_and_mdel_alone():
    client = connect("keyflaky-exist")
    mset(client, names(30))
    get_store("keyflaky-exist").faults.key_fail_rate = 1.0
    assert mexist(client, names(30)) == (SUCCESS, [SUCCESS] * 30)
    status, outcome = client.mdel(keys(names(30)))
    assert status == SUCCESS


# ------------------------------------------------------------------ unreachable
def test_unreachable_store_refuses_init_with_minus_one():
    client = eic.Client()
    assert client.init("x", "down?unreachable=true", eic.InitOption()) == -1
    # The client stays unbound, as after any failed init.
    assert mset(client, ["a"]) == (FAILED, [eic.StatusCode.NOT_INITIALIZED])
    assert len(get_store("down")) == 0


def test_store_going_unreachable_fails_every_call_of_a_connected_client():
    client = connect("flapping")
    mset(client, ["kept"])
    get_store("flapping").faults.unreachable = True
    assert mset(client, ["a", "b"]) == (FAILED, [FAILED, FAILED])
    assert mget(client, ["kept"])[:2] == (FAILED, [FAILED])
    assert mexist(client, ["kept"]) == (FAILED, [FAILED])
    status, outcome = client.mdel(keys(["kept"]))
    assert status == FAILED and list(outcome.status_codes) == [FAILED]

    get_store("flapping").faults.unreachable = False
    assert mget(client, ["kept"])[:2] == (SUCCESS, [SUCCESS])


# ------------------------------------------------------------------ phantom_rate
def test_phantom_hits_are_reported_by_mexist_but_not_delivered_by_mget():
    client = connect("phantom?phantom_rate=1")
    assert mexist(client, ["ghost-1", "ghost-2"]) == (SUCCESS, [SUCCESS, SUCCESS])
    status, codes, arrays = mget(client, ["ghost-1", "ghost-2"])
    assert status == FAILED and codes == [KEY_NOT_EXIST, KEY_NOT_EXIST]
    assert all((array == 0x5A).all() for array in arrays)


def test_phantom_rate_only_invents_hits_for_missing_keys():
    client = connect("phantom-half?phantom_rate=0.5&seed=5")
    mset(client, names(10, "real"))
    status, codes = mexist(client, names(10, "real") + names(200, "ghost"))
    assert codes[:10] == [SUCCESS] * 10
    phantoms = codes[10:].count(SUCCESS)
    assert 50 <= phantoms <= 150


# ---------------------------------------------------------- gdr_write_fail_rate
def registered_client(endpoint: str, arrays) -> eic.Client:
    client = connect(endpoint)
    assert client.register_memory(buffers(arrays, True), eic.MemoryInfo())
    return client


def buffers(arrays, registered: bool) -> eic.IOBuffers:
    vals = eic.IOBuffers()
    for array in arrays:
        vals.append(array.ctypes.data, array.nbytes, registered)
    return vals


def test_gdr_write_fail_rate_refuses_registered_writes_only():
    sources = [np.full(256, i, np.uint8) for i in range(4)]
    dests = [np.zeros(256, np.uint8) for _ in sources]
    client = registered_client("gdr?gdr_write_fail_rate=1", sources + dests)
    status, outcome = client.mset(keys(names(4)), buffers(sources, True), eic.SetOption())
    assert (status, list(outcome.status_codes)) == (FAILED, [eic.StatusCode.GDR_TRANSFER_ERROR] * 4)
    assert len(get_store("gdr")) == 0
    # The same memory passed as unregistered is stored; registered reads are not affected.
    assert client.mset(keys(names(4)), buffers(sources, False), eic.SetOption())[0] == SUCCESS
    status, _, outcome = client.mget(keys(names(4)), eic.GetOption(), buffers(dests, True))
    assert status == SUCCESS and [a.tobytes() for a in dests] == [a.tobytes() for a in sources]


def test_gdr_write_failures_are_per_key_inside_partial_failed():
    sources = [np.full(64, i, np.uint8) for i in range(100)]
    client = registered_client("gdr-half?gdr_write_fail_rate=0.5&seed=2", sources)
    status, outcome = client.mset(keys(names(100)), buffers(sources, True), eic.SetOption())
    codes = list(outcome.status_codes)
    assert status == PARTIAL_FAILED and set(codes) == {SUCCESS, eic.StatusCode.GDR_TRANSFER_ERROR}
    get_store("gdr-half").faults.gdr_write_fail_rate = 0.0
    # Exactly the keys reported SUCCESS were stored.
    assert mexist(client, names(100))[1] == [SUCCESS if c == SUCCESS else KEY_NOT_EXIST for c in codes]


# ------------------------------------------------------- default_codes_fail_rate
def test_failed_call_with_default_codes_does_nothing_yet_every_code_says_success():
    client = connect("liar")
    mset(client, ["old"], seed=7)
    get_store("liar").faults.default_codes_fail_rate = 1.0

    assert mset(client, ["old", "new"], seed=9) == (FAILED, [SUCCESS, SUCCESS])
    status, codes, arrays = mget(client, ["old"])
    assert (status, codes) == (FAILED, [SUCCESS]) and (arrays[0] == 0x5A).all()
    assert mexist(client, ["old", "absent"]) == (FAILED, [SUCCESS, SUCCESS])
    status, outcome = client.mdel(keys(["old"]), eic.DelOption())
    assert (status, list(outcome.status_codes)) == (FAILED, [SUCCESS])

    get_store("liar").faults.clear()
    assert mexist(client, ["old", "new"])[1] == [SUCCESS, KEY_NOT_EXIST]
    status, codes, arrays = mget(client, ["old"])
    assert codes == [SUCCESS] and (arrays[0] == 7).all()  # neither overwritten nor deleted


# ---------------------------------------------------------------------- seeds
def _key_codes_for(seed: int) -> list:
    client = connect(f"seeded-{seed}?key_fail_rate=0.3&seed={seed}")
    return mset(client, names(64))[1]


def test_same_seed_gives_the_same_faults():
    first = _key_codes_for(11)
    from aibrix_eic.engine import reset_stores

    reset_stores()
    assert _key_codes_for(11) == first
    assert _key_codes_for(12) != first


def test_reseeding_replays_the_sequence():
    client = connect("replay?key_fail_rate=0.5&seed=21")
    first = mset(client, names(32))[1]
    get_store("replay").faults.reseed(21)
    assert mset(client, names(32))[1] == first


def test_clearing_faults_keeps_the_seed():
    faults = Faults(latency_s=1.0, fail_rate=0.5, key_fail_rate=0.5, unreachable=True, phantom_rate=0.5,
                    gdr_write_fail_rate=0.5, seed=8)  # fmt: skip
    faults.clear()
    assert faults == Faults(seed=8)
    assert faults.seed == 8


# ------------------------------------------------------------------ namespaces
def test_namespaces_param_restricts_which_namespaces_exist():
    client = connect("provisioned?namespaces=kv,meta")
    for ns, expected in [("kv", SUCCESS), ("meta", SUCCESS), ("", FAILED), ("made-up", FAILED)]:
        option = eic.SetOption()
        option.ns = ns
        status, outcome = client.mset(keys(["a"]), values([np.ones(8, np.uint8)]), option)
        assert status == expected, ns
        if expected == FAILED:
            assert list(outcome.status_codes) == [eic.StatusCode.NAMESPACE_NOT_FOUND]
    for option_type in (eic.GetOption, eic.ExistOption, eic.DelOption):
        option = option_type()
        option.ns = "made-up"
        if option_type is eic.GetOption:
            status, _, outcome = client.mget(keys(["a"]), option, values([np.ones(8, np.uint8)]))
        elif option_type is eic.ExistOption:
            status, outcome = client.mexist(keys(["a"]), option)
        else:
            status, outcome = client.mdel(keys(["a"]), option)
        assert status == FAILED
        assert list(outcome.status_codes) == [eic.StatusCode.NAMESPACE_NOT_FOUND]


def test_an_empty_entry_in_namespaces_allows_the_default_namespace():
    client = connect("with-default?namespaces=,kv")
    assert mset(client, ["a"])[0] == SUCCESS


# ------------------------------------------------------------- endpoint parsing
def test_endpoint_names_the_store_and_carries_params():
    name, params = parse_endpoint("bench?capacity=1GiB&latency=250us&fail_rate=0.1&unreachable=no&seed=7")
    assert name == "bench"
    assert params == {
        "capacity": 1024**3,
        "latency": pytest.approx(250e-6),
        "fail_rate": 0.1,
        "unreachable": False,
        "seed": 7,
    }
    assert parse_endpoint("") == ("default", {})
    assert parse_endpoint("?max_value=1MiB") == ("default", {"max_value": 1024**2})
    assert parse_endpoint("10.0.0.1:12500")[0] == "10.0.0.1:12500"


def test_every_documented_param_is_parsed():
    assert set(ENDPOINT_PARAMS) == {
        "capacity",
        "max_value",
        "namespaces",
        "latency",
        "fail_rate",
        "key_fail_rate",
        "unreachable",
        "phantom_rate",
        "gdr_write_fail_rate",
        "mexist_miss",
        "default_codes_fail_rate",
        "seed",
        "dir",
        "create",
        "mode",
        "lock_timeout",
        "prefault",
    }


def test_unknown_param_suggests_the_closest_one():
    with pytest.raises(ValueError, match=r"unknown engine parameter 'latncy'; did you mean 'latency'\?"):
        parse_endpoint("x?latncy=1ms")
    with pytest.raises(ValueError, match="unknown engine parameter 'zzz' \\(known: capacity"):
        parse_endpoint("x?zzz=1")


@pytest.mark.parametrize(
    "query, named",
    [
        ("fail_rate=1.5", "fail_rate"),
        ("key_fail_rate=-0.1", "key_fail_rate"),
        ("phantom_rate=often", "phantom_rate"),
        ("gdr_write_fail_rate=2", "gdr_write_fail_rate"),
        ("mexist_miss=partial", "mexist_miss"),
        ("latency=5", "latency"),
        ("capacity=lots", "capacity"),
        ("max_value=4XB", "max_value"),
        ("unreachable=maybe", "unreachable"),
        ("seed=abc", "seed"),
    ],
)
def test_bad_param_value_is_rejected_naming_the_param(query, named):
    with pytest.raises(ValueError, match=f"engine parameter {named}="):
        parse_endpoint(f"x?{query}")
    assert eic.Client().init("x", f"x?{query}", eic.InitOption()) == -22


@settings(max_examples=50, deadline=None)
@given(
    rate=st.floats(0.0, 1.0),
    capacity=st.integers(0, 2**40),
    latency_us=st.integers(0, 10**6),
)
def test_params_round_trip_through_the_endpoint(rate, capacity, latency_us):
    name, params = parse_endpoint(f"p?fail_rate={rate!r}&capacity={capacity}&latency={latency_us}us")
    assert params["fail_rate"] == rate
    assert params["capacity"] == capacity
    assert params["latency"] == pytest.approx(latency_us * 1e-6)


def test_a_later_init_reapplies_given_params_and_keeps_the_rest():
    connect("evolving?capacity=1MiB&latency=1ms&fail_rate=0.25")
    connect("evolving?fail_rate=0")
    store = get_store("evolving")
    assert store.capacity == 1024**2
    assert store.faults.latency_s == pytest.approx(0.001)
    assert store.faults.fail_rate == 0.0
