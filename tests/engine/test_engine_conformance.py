"""The SDK conformance suite: what callers of `import eic` rely on, checked on
the embedded engine and, with `pytest --eic-config FILE`, on a real cluster.

Tests that need engine-only controls (capacity, a manual clock, the strict
readings of unknown SDK behaviour listed in docs/engine.md) skip on the real
SDK; the rest hold for both.
"""

import ctypes
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MiB = 1024 * 1024


def payload(seed: int, nbytes: int) -> np.ndarray:
    """Bytes unique to `seed`, so a value from the wrong key never matches."""
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


class Session:
    """One client of a target plus shorthands that return plain lists.

    Values are numpy arrays; reads land in fresh arrays filled with a marker
    byte, so a test can tell an untouched buffer from a written one.
    """

    UNTOUCHED = 0x5A

    def __init__(self, target, client=None):
        self.target = target
        self.eic = target.module
        self.client = client or target.client()

    def keys(self, names):
        vector = self.eic.StringVector()
        for name in names:
            vector.append(self.target.key(name))
        return vector

    def iobuffers(self, arrays, registered=False):
        vals = self.eic.IOBuffers()
        for array in arrays:
            vals.append(array.ctypes.data, array.nbytes, registered)
        return vals

    def _ns(self, ns):
        return self.target.namespace if ns is None else ns

    def set(self, items: dict, ns=None, ttl=None, registered=False):
        option = self.eic.SetOption()
        option.ns = self._ns(ns)
        if ttl is None:
            # On a shared cluster, test values age out on their own.
            ttl = -1 if self.target.is_engine else 600
        option.ttl_second = ttl
        status, outcome = self.client.mset(self.keys(items), self.iobuffers(items.values(), registered), option)
        return status, list(outcome.status_codes)

    def get(self, sizes: dict, ns=None):
        """mget of {name: buffer nbytes}; (status, codes, arrays)."""
        arrays = [np.full(nbytes, self.UNTOUCHED, dtype=np.uint8) for nbytes in sizes.values()]
        option = self.eic.GetOption()
        option.ns = self._ns(ns)
        status, _, outcome = self.client.mget(self.keys(sizes), option, self.iobuffers(arrays))
        return status, list(outcome.status_codes), arrays

    def exist(self, names, ns=None):
        option = self.eic.ExistOption()
        option.ns = self._ns(ns)
        status, outcome = self.client.mexist(self.keys(names), option)
        return status, list(outcome.status_codes)

    def delete(self, names, ns=None):
        option = self.eic.DelOption()
        option.ns = self._ns(ns)
        status, outcome = self.client.mdel(self.keys(names), option)
        return status, list(outcome.status_codes)

    def read(self, name, nbytes, ns=None) -> bytes | None:
        """The bytes under `name`, or None on a miss."""
        _, codes, arrays = self.get({name: nbytes}, ns)
        return arrays[0].tobytes() if codes[0] == self.eic.StatusCode.SUCCESS else None


@pytest.fixture
def session(sdk_target):
    return Session(sdk_target)


@pytest.fixture
def engine_session(sdk_target):
    if not sdk_target.is_engine:
        pytest.skip("engine-only: needs engine controls or asserts an engine reading")
    return Session(sdk_target)


# ----------------------------------------------------------------- call shapes
def test_init_returns_zero(sdk_target):
    client = sdk_target.module.Client()
    assert client.init(sdk_target.instance_id, sdk_target.endpoint, sdk_target.init_option()) == 0


@pytest.mark.parametrize("none_at", ["instance_id", "endpoint", "option"])
def test_init_refuses_none_as_the_option_fields_do(sdk_target, none_at):
    """A std::string parameter, like a std::string field, takes no None;
    nor does a `const InitOption&`. The binding refuses before anything runs."""
    args = {"instance_id": sdk_target.instance_id, "endpoint": sdk_target.endpoint, "option": sdk_target.init_option()}
    args[none_at] = None
    with pytest.raises(TypeError):
        sdk_target.module.Client().init(args["instance_id"], args["endpoint"], args["option"])
    with pytest.raises(TypeError):
        sdk_target.module.InitOption().log_dir = None


def test_each_call_returns_the_tuple_shape_callers_unpack(session):
    eic = session.eic
    value = payload(1, 4096)
    names = ["shape-a", "shape-b"]
    set_option = eic.SetOption()
    set_option.ns = session.target.namespace
    set_option.ttl_second = -1
    status, outcome = session.client.mset(session.keys(names), session.iobuffers([value, value]), set_option)
    assert status == eic.StatusCode.SUCCESS
    assert len(outcome.status_codes) == 2

    get_option = eic.GetOption()
    get_option.ns = session.target.namespace
    out = [np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)]
    reply = session.client.mget(session.keys(names), get_option, session.iobuffers(out))
    assert len(reply) == 3
    status, _, outcome = reply
    assert status == eic.StatusCode.SUCCESS and len(outcome.status_codes) == 2

    exist_option = eic.ExistOption()
    exist_option.ns = session.target.namespace
    status, outcome = session.client.mexist(session.keys(names), exist_option)
    assert status == eic.StatusCode.SUCCESS and len(outcome.status_codes) == 2

    del_option = eic.DelOption()
    del_option.ns = session.target.namespace
    status, outcome = session.client.mdel(session.keys(names[:1]), del_option)
    assert status == eic.StatusCode.SUCCESS and len(outcome.status_codes) == 1


def test_mdel_accepts_no_option(sdk_target):
    if sdk_target.namespace and not sdk_target.is_engine:
        pytest.skip("without an option mdel uses the default namespace, not the configured one")
    session = Session(sdk_target)
    assert session.set({"no-option": payload(2, 128)})[0] == session.eic.StatusCode.SUCCESS
    status, outcome = session.client.mdel(session.keys(["no-option"]))
    assert status == session.eic.StatusCode.SUCCESS
    assert list(outcome.status_codes) == [session.eic.StatusCode.SUCCESS]
    assert session.read("no-option", 128) is None


def test_status_codes_hold_one_code_per_key_in_input_order(session):
    codes = session.eic.StatusCode
    stored = {f"order-{i}": payload(10 + i, 1024) for i in range(0, 6, 2)}
    status, set_codes = session.set(stored)
    assert status == codes.SUCCESS and set_codes == [codes.SUCCESS] * 3

    asked = {f"order-{i}": 1024 for i in range(6)}
    status, get_codes, arrays = session.get(asked)
    assert status == codes.PARTIAL_FAILED
    assert get_codes == [codes.SUCCESS, codes.KEY_NOT_EXIST] * 3
    for i, array in enumerate(arrays):
        if i % 2 == 0:
            assert array.tobytes() == stored[f"order-{i}"].tobytes()
        else:
            assert (array == Session.UNTOUCHED).all()


def test_status_codes_print_like_pybind11_enums(session):
    assert str(session.eic.StatusCode.FAILED) == "StatusCode.FAILED"
    assert str(session.eic.StatusCode.SUCCESS) == "StatusCode.SUCCESS"


# ---------------------------------------------------------------- hits, misses
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.text(st.sampled_from("abcXYZ019/@#._-"), min_size=1, max_size=80),
    data=st.binary(min_size=1, max_size=9000),
)
def test_get_returns_exactly_the_bytes_set(sdk_target, name, data):
    # Arbitrary bytes include 0xa5 and other invalid UTF-8: values are bytes,
    # never decoded as text.
    session = Session(sdk_target)
    value = np.frombuffer(data, dtype=np.uint8).copy()
    assert session.set({name: value}) == (session.eic.StatusCode.SUCCESS, [session.eic.StatusCode.SUCCESS])
    assert session.read(name, len(data)) == data


def test_ctypes_buffers_work_like_numpy_ones(session):
    codes = session.eic.StatusCode
    source = ctypes.create_string_buffer(bytes(range(256)) * 4, 1024)
    vals = session.eic.IOBuffers()
    vals.append(ctypes.addressof(source), 1024, False)
    option = session.eic.SetOption()
    option.ns = session.target.namespace
    status, _ = session.client.mset(session.keys(["ctypes"]), vals, option)
    assert status == codes.SUCCESS

    target = (ctypes.c_uint8 * 1024)()
    out = session.eic.IOBuffers()
    out.append(ctypes.addressof(target), 1024, False)
    get_option = session.eic.GetOption()
    get_option.ns = session.target.namespace
    status, _, outcome = session.client.mget(session.keys(["ctypes"]), get_option, out)
    assert status == codes.SUCCESS
    assert bytes(target) == source.raw


def test_mget_of_only_missing_keys_is_failed_with_key_not_exist_per_key(session):
    codes = session.eic.StatusCode
    status, get_codes, arrays = session.get({"never-1": 64, "never-2": 64})
    assert status == codes.FAILED
    assert get_codes == [codes.KEY_NOT_EXIST, codes.KEY_NOT_EXIST]
    assert all((array == Session.UNTOUCHED).all() for array in arrays)


def test_mexist_reports_each_key(session):
    codes = session.eic.StatusCode
    session.set({"here": payload(3, 100)})
    status, exist_codes = session.exist(["here", "not-here", "here"])
    assert exist_codes[0] == codes.SUCCESS and exist_codes[2] == codes.SUCCESS
    assert exist_codes[1] != codes.SUCCESS
    # Either reading of a miss (docs/engine.md): callers must handle both.
    assert status in (codes.SUCCESS, codes.PARTIAL_FAILED)
    status, exist_codes = session.exist(["not-here", "nor-here"])
    assert status in (codes.SUCCESS, codes.FAILED)
    assert codes.SUCCESS not in exist_codes


@pytest.mark.parametrize(
    "reading, some_missing, all_missing",
    [("", "SUCCESS", "SUCCESS"), ("mexist_miss=success", "SUCCESS", "SUCCESS"),
     ("mexist_miss=failed", "PARTIAL_FAILED", "FAILED")],
    ids=["default", "success", "failed"],
)  # fmt: skip
def test_engine_mexist_status_for_missing_keys_follows_mexist_miss(engine_session, reading, some_missing, all_missing):
    eic = engine_session.eic
    target = engine_session.target
    client = eic.Client()
    endpoint = target.endpoint
    if reading:  # the shared target's endpoint already has a query (dir=...)
        endpoint += ("&" if "?" in endpoint else "?") + reading
    assert client.init(target.instance_id, endpoint, target.init_option()) == 0
    session = Session(target, client)
    session.set({"here": payload(3, 100)})
    status, exist_codes = session.exist(["here", "not-here"])
    assert (status, exist_codes) == (
        getattr(eic.StatusCode, some_missing),
        [eic.StatusCode.SUCCESS, eic.StatusCode.KEY_NOT_EXIST],
    )
    status, exist_codes = session.exist(["not-here", "nor-here"])
    assert (status, exist_codes) == (getattr(eic.StatusCode, all_missing), [eic.StatusCode.KEY_NOT_EXIST] * 2)
    assert session.exist(["here"])[0] == eic.StatusCode.SUCCESS


def test_overwrite_wins(session):
    codes = session.eic.StatusCode
    session.set({"over": payload(4, 2048)})
    newer = payload(5, 2048)
    assert session.set({"over": newer})[0] == codes.SUCCESS
    assert session.read("over", 2048) == newer.tobytes()
    # A new size replaces the old one too: the old size now mismatches.
    smaller = payload(6, 512)
    assert session.set({"over": smaller})[0] == codes.SUCCESS
    assert session.read("over", 512) == smaller.tobytes()
    assert session.read("over", 2048) is None


def test_delete_removes_the_value(session):
    codes = session.eic.StatusCode
    session.set({"doomed": payload(7, 256), "kept": payload(8, 256)})
    status, del_codes = session.delete(["doomed"])
    assert status == codes.SUCCESS and del_codes == [codes.SUCCESS]
    assert session.read("doomed", 256) is None
    assert session.exist(["doomed"])[1][0] != codes.SUCCESS
    assert session.read("kept", 256) == payload(8, 256).tobytes()


def test_deleting_an_absent_key_reports_it_per_key(session):
    codes = session.eic.StatusCode
    session.set({"present": payload(9, 64)})
    status, del_codes = session.delete(["present", "absent"])
    assert del_codes[0] == codes.SUCCESS and del_codes[1] != codes.SUCCESS
    if session.target.is_engine:
        assert status == codes.PARTIAL_FAILED
        assert del_codes[1] == codes.KEY_NOT_EXIST


def test_clients_of_one_endpoint_share_the_data(sdk_target):
    writer, reader = Session(sdk_target), Session(sdk_target)
    value = payload(11, 777)
    writer.set({"shared": value})
    assert reader.read("shared", 777) == value.tobytes()


# ------------------------------------------------------------------ namespaces
def test_namespaces_are_isolated_for_get_exist_and_del(sdk_target):
    if sdk_target.other_namespace is None:
        pytest.skip("needs a second provisioned namespace (AIBRIX_EIC_TEST_OTHER_NS)")
    session = Session(sdk_target)
    codes = session.eic.StatusCode
    ns_a, ns_b = sdk_target.namespace, sdk_target.other_namespace
    in_a = payload(12, 1000)
    session.set({"ns-key": in_a}, ns=ns_a)

    assert session.read("ns-key", 1000, ns=ns_b) is None
    assert session.exist(["ns-key"], ns=ns_b)[1] != [codes.SUCCESS]
    assert session.delete(["ns-key"], ns=ns_b)[1] != [codes.SUCCESS]
    assert session.read("ns-key", 1000, ns=ns_a) == in_a.tobytes()

    in_b = payload(13, 1000)
    session.set({"ns-key": in_b}, ns=ns_b)
    assert session.read("ns-key", 1000, ns=ns_a) == in_a.tobytes()
    assert session.read("ns-key", 1000, ns=ns_b) == in_b.tobytes()

    assert session.delete(["ns-key"], ns=ns_b)[1] == [codes.SUCCESS]
    assert session.read("ns-key", 1000, ns=ns_a) == in_a.tobytes()


# ------------------------------------------------------------ partial failures
def test_mset_with_some_bad_keys_is_partial_failed_with_per_key_codes(engine_session):
    codes = engine_session.eic.StatusCode
    too_large = np.zeros(engine_session.target.store.max_value_bytes + 1, dtype=np.uint8)
    status, set_codes = engine_session.set(
        {"good-1": payload(14, 100), "too-large": too_large, "good-2": payload(15, 100)}
    )
    assert status == codes.PARTIAL_FAILED
    assert set_codes == [codes.SUCCESS, codes.VALUE_TOO_LARGE, codes.SUCCESS]
    assert engine_session.exist(["good-1", "too-large", "good-2"])[1] == [
        codes.SUCCESS,
        codes.KEY_NOT_EXIST,
        codes.SUCCESS,
    ]


def test_mset_where_no_key_succeeds_is_failed(engine_session):
    codes = engine_session.eic.StatusCode
    too_large = np.zeros(engine_session.target.store.max_value_bytes + 1, dtype=np.uint8)
    status, set_codes = engine_session.set({"big-1": too_large, "big-2": too_large})
    assert status == codes.FAILED
    assert set_codes == [codes.VALUE_TOO_LARGE, codes.VALUE_TOO_LARGE]


def test_value_up_to_max_value_size_is_stored_and_one_byte_more_is_rejected(engine_session):
    codes = engine_session.eic.StatusCode
    limit = engine_session.target.store.max_value_bytes
    at_limit = payload(16, limit)
    status, set_codes = engine_session.set({"at-limit": at_limit, "over": np.zeros(limit + 1, np.uint8)})
    assert set_codes == [codes.SUCCESS, codes.VALUE_TOO_LARGE]
    assert engine_session.read("at-limit", limit) == at_limit.tobytes()
    assert engine_session.read("over", limit + 1) is None


# What public EIC callers write as one value (docs/engine.md, "Largest value"):
# an LMCache chunk of Llama-3-8B (256 tokens x 32 layers x K,V x 8 heads x 128
# x 2 bytes), a DeepSeek-V3 MLA page of SGLang's HiCache (64 tokens x 61
# layers x 576 x 2 bytes), the bytedance-iaas model loader's largest value.
SINGLE_VALUES_OF_PUBLIC_CALLERS = {
    "lmcache-8b-chunk": 256 * 32 * 2 * 8 * 128 * 2,
    "sglang-dsv3-mla-page": 64 * 61 * 576 * 2,
    "model-loader-part": 20 * MiB,
}


def test_the_default_max_value_takes_what_public_callers_write_as_one_value(engine_session):
    from aibrix_eic.engine.store import DEFAULT_MAX_VALUE_BYTES

    assert engine_session.target.store.max_value_bytes == DEFAULT_MAX_VALUE_BYTES == 64 * MiB
    values = {name: payload(i, nbytes) for i, (name, nbytes) in enumerate(SINGLE_VALUES_OF_PUBLIC_CALLERS.items())}
    status, set_codes = engine_session.set(values)
    assert status == engine_session.eic.StatusCode.SUCCESS, set_codes
    for name, value in values.items():
        assert engine_session.read(name, value.nbytes) == value.tobytes()


def test_a_store_with_the_4mib_value_class_refuses_them(engine_session):
    """`max_value=4MiB` is the agent the bytedance-iaas fork splits for."""
    eic = engine_session.eic
    client = eic.Client()
    assert client.init("i", engine_session.target.endpoint_with("max_value=4MiB"), eic.InitOption()) == 0
    small = Session(engine_session.target, client)
    values = {name: np.zeros(nbytes, np.uint8) for name, nbytes in SINGLE_VALUES_OF_PUBLIC_CALLERS.items()}
    assert small.set(values)[1] == [eic.StatusCode.VALUE_TOO_LARGE] * len(values)


def test_max_value_size_is_set_by_the_endpoint(engine_session):
    eic = engine_session.eic
    client = eic.Client()
    assert client.init("i", engine_session.target.endpoint_with("max_value=1KiB"), eic.InitOption()) == 0
    small = Session(engine_session.target, client)
    assert small.set({"fits": payload(17, 1024), "not": payload(18, 1025)})[1] == [
        eic.StatusCode.SUCCESS,
        eic.StatusCode.VALUE_TOO_LARGE,
    ]


def test_mismatched_key_and_buffer_counts_fail_every_key(engine_session):
    eic = engine_session.eic
    vals = engine_session.iobuffers([payload(19, 10)])
    status, outcome = engine_session.client.mset(engine_session.keys(["a", "b"]), vals, eic.SetOption())
    assert status == eic.StatusCode.FAILED
    assert list(outcome.status_codes) == [eic.StatusCode.INVALID_ARGUMENT] * 2
    assert len(engine_session.target.store) == 0


def test_zero_length_buffer_is_an_invalid_argument(engine_session):
    codes = engine_session.eic.StatusCode
    status, set_codes = engine_session.set({"empty": np.zeros(0, np.uint8), "full": payload(20, 8)})
    assert status == codes.PARTIAL_FAILED
    assert set_codes == [codes.INVALID_ARGUMENT, codes.SUCCESS]


def test_empty_key_list_succeeds_with_no_codes(engine_session):
    eic = engine_session.eic
    status, outcome = engine_session.client.mexist(eic.StringVector(), eic.ExistOption())
    assert status == eic.StatusCode.SUCCESS and list(outcome.status_codes) == []


def test_calls_before_init_fail_every_key(engine_session):
    eic = engine_session.eic
    status, outcome = eic.Client().mexist(engine_session.keys(["x", "y"]), eic.ExistOption())
    assert status == eic.StatusCode.FAILED
    assert list(outcome.status_codes) == [eic.StatusCode.NOT_INITIALIZED] * 2


# ----------------------------------------------------------------- size checks
@pytest.mark.parametrize("buffer_nbytes", [1024 - 1, 1024 + 1, 1], ids=["shorter", "longer", "one-byte"])
def test_mget_into_wrong_size_buffer_fails_and_leaves_it_untouched(session, buffer_nbytes):
    codes = session.eic.StatusCode
    session.set({"sized": payload(21, 1024)})
    # The buffer is carved from a larger block with guard bytes after it, so
    # an SDK that wrote past `buffer_nbytes` would be caught, not crash.
    block = np.full(buffer_nbytes + 4096, Session.UNTOUCHED, dtype=np.uint8)
    vals = session.eic.IOBuffers()
    vals.append(block.ctypes.data, buffer_nbytes, False)
    option = session.eic.GetOption()
    option.ns = session.target.namespace
    status, _, outcome = session.client.mget(session.keys(["sized"]), option, vals)
    assert status != codes.SUCCESS
    assert outcome.status_codes[0] != codes.SUCCESS
    assert (block == Session.UNTOUCHED).all()
    if session.target.is_engine:
        assert outcome.status_codes[0] == codes.BUFFER_SIZE_MISMATCH
    # A failed read does not damage the stored value.
    assert session.read("sized", 1024) == payload(21, 1024).tobytes()


# ---------------------------------------------------------------- registration
def test_registered_buffers_inside_registered_memory_work(session):
    codes = session.eic.StatusCode
    pool = np.zeros(64 * 1024, dtype=np.uint8)
    region = session.eic.IOBuffers()
    region.append(pool.ctypes.data, pool.nbytes, True)
    info = session.eic.MemoryInfo()
    info.type = session.eic.MemoryType.MEMORY_DEFAULT
    assert session.client.register_memory(region, info)

    value = payload(22, 4096)
    pool[8192 : 8192 + 4096] = value
    status, set_codes = session.set({"reg": pool[8192 : 8192 + 4096]}, registered=True)
    assert status == codes.SUCCESS

    # The read lands in a registered slice at the very end of the pool.
    tail = pool[-4096:]
    vals = session.iobuffers([tail], registered=True)
    option = session.eic.GetOption()
    option.ns = session.target.namespace
    status, _, outcome = session.client.mget(session.keys(["reg"]), option, vals)
    assert status == codes.SUCCESS
    assert tail.tobytes() == value.tobytes()


def test_registered_buffer_outside_registered_memory_fails_and_is_untouched(engine_session):
    eic = engine_session.eic
    codes = eic.StatusCode
    pool = np.zeros(16 * 1024, dtype=np.uint8)
    region = eic.IOBuffers()
    region.append(pool.ctypes.data, pool.nbytes, True)
    assert engine_session.client.register_memory(region, eic.MemoryInfo())
    engine_session.set({"stored": payload(23, 4096)})

    outside = np.full(4096, Session.UNTOUCHED, dtype=np.uint8)
    straddling = pool[-2048:]  # the view ends exactly at the pool's end...
    straddling_vals = eic.IOBuffers()
    straddling_vals.append(straddling.ctypes.data, 4096, True)  # ...but claims 4096 bytes
    option = eic.GetOption()
    status, _, outcome = engine_session.client.mget(
        engine_session.keys(["stored"]), option, engine_session.iobuffers([outside], registered=True)
    )
    assert status == codes.FAILED
    assert list(outcome.status_codes) == [codes.MEMORY_NOT_REGISTERED]
    assert (outside == Session.UNTOUCHED).all()
    status, _, outcome = engine_session.client.mget(engine_session.keys(["stored"]), option, straddling_vals)
    assert list(outcome.status_codes) == [codes.MEMORY_NOT_REGISTERED]
    assert (pool == 0).all()

    # The same rule on writes: the value is not stored.
    status, set_codes = engine_session.set({"unregistered-write": payload(24, 4096)}, registered=True)
    assert set_codes == [codes.MEMORY_NOT_REGISTERED]
    assert engine_session.exist(["unregistered-write"])[1] == [codes.KEY_NOT_EXIST]
    # registered=False needs no registration at all.
    assert engine_session.set({"plain-write": payload(24, 4096)})[1] == [codes.SUCCESS]


def test_registration_is_per_client(engine_session):
    eic = engine_session.eic
    pool = np.zeros(4096, dtype=np.uint8)
    region = eic.IOBuffers()
    region.append(pool.ctypes.data, pool.nbytes, True)
    assert engine_session.client.register_memory(region, eic.MemoryInfo())
    other = Session(engine_session.target)
    assert other.set({"k": pool}, registered=True)[1] == [eic.StatusCode.MEMORY_NOT_REGISTERED]
    assert engine_session.set({"k": pool}, registered=True)[1] == [eic.StatusCode.SUCCESS]


def test_register_memory_rejects_empty_and_null_regions(engine_session):
    eic = engine_session.eic
    assert not engine_session.client.register_memory(eic.IOBuffers(), eic.MemoryInfo())
    null = eic.IOBuffers()
    null.append(0, 4096, True)
    assert not engine_session.client.register_memory(null, eic.MemoryInfo())


# ------------------------------------------------------------------------- TTL
class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(engine_session):
    manual = ManualClock()
    engine_session.target.store.clock = manual
    return manual


def test_value_expires_after_its_ttl(engine_session, clock):
    session = engine_session
    session.set({"short": payload(25, 64)}, ttl=3)
    clock.now += 2.9
    assert session.read("short", 64) == payload(25, 64).tobytes()
    clock.now += 0.1
    assert session.read("short", 64) is None
    assert session.exist(["short"])[1] == [session.eic.StatusCode.KEY_NOT_EXIST]


def test_ttl_minus_one_never_expires(engine_session, clock):
    engine_session.set({"forever": payload(26, 64)}, ttl=-1)
    clock.now += 10 * 365 * 24 * 3600
    assert engine_session.read("forever", 64) == payload(26, 64).tobytes()


def test_reads_do_not_extend_a_ttl(engine_session, clock):
    engine_session.set({"read-often": payload(27, 64)}, ttl=2)
    for _ in range(3):
        clock.now += 0.6
        assert engine_session.read("read-often", 64) is not None
    clock.now += 0.2
    assert engine_session.read("read-often", 64) is None


def test_overwrite_restarts_the_ttl_with_the_new_option(engine_session, clock):
    session = engine_session
    session.set({"renewed": payload(28, 64)}, ttl=2)
    clock.now += 1.5
    session.set({"renewed": payload(29, 64)}, ttl=2)
    clock.now += 1.5
    assert session.read("renewed", 64) == payload(29, 64).tobytes()
    session.set({"renewed": payload(30, 64)}, ttl=-1)  # -1 drops the expiry
    clock.now += 100
    assert session.read("renewed", 64) == payload(30, 64).tobytes()


def test_expired_values_free_their_capacity(engine_session, clock):
    store = engine_session.target.store
    store.set_capacity(4096)
    engine_session.set({f"ttl-{i}": payload(31 + i, 1024) for i in range(4)}, ttl=5)
    clock.now += 5
    assert engine_session.set({"after": payload(40, 4096)})[1] == [engine_session.eic.StatusCode.SUCCESS]
    assert store.stats.expirations == 4 and store.stats.evictions == 0


@pytest.mark.parametrize("ttl", [0, -2])
def test_ttl_zero_or_below_minus_one_is_rejected(engine_session, ttl):
    codes = engine_session.eic.StatusCode
    status, set_codes = engine_session.set({"bad-ttl": payload(41, 64)}, ttl=ttl)
    assert status == codes.FAILED and set_codes == [codes.INVALID_ARGUMENT]
    assert len(engine_session.target.store) == 0


def test_ttl_expires_in_real_time(sdk_target):
    # The engine's TTL is covered with a manual clock above; this is for a
    # real cluster, where seconds are the only clock there is.
    if sdk_target.is_engine:
        pytest.skip("covered with a manual clock on the engine")
    import time

    session = Session(sdk_target)
    session.set({"real-ttl": payload(42, 64)}, ttl=1)
    assert session.read("real-ttl", 64) is not None
    time.sleep(2.5)
    assert session.read("real-ttl", 64) is None


# ------------------------------------------------------------- LRU and capacity
def test_least_recently_read_or_written_is_evicted_first(engine_session):
    session = engine_session
    codes = session.eic.StatusCode
    store = session.target.store
    store.set_capacity(4 * 1024)
    for name in ["a", "b", "c", "d"]:
        session.set({name: payload(ord(name), 1024)})
    assert session.read("a", 1024) is not None  # a is now the most recent
    assert session.exist(["b"])[1] == [codes.SUCCESS]  # mexist does not refresh b
    session.set({"c": payload(99, 1024)})  # overwrite refreshes c

    session.set({"e": payload(ord("e"), 1024)})
    assert session.exist(["a", "b", "c", "d", "e"])[1] == [
        codes.SUCCESS,
        codes.KEY_NOT_EXIST,
        codes.SUCCESS,
        codes.SUCCESS,
        codes.SUCCESS,
    ]
    session.set({"f": payload(ord("f"), 1024)})
    assert session.exist(["d"])[1] == [codes.KEY_NOT_EXIST]
    assert store.stats.evictions == 2
    assert store.held_bytes <= store.capacity


def test_a_value_larger_than_the_capacity_fails_without_evicting(engine_session):
    session = engine_session
    store = session.target.store
    store.set_capacity(4 * 1024)
    session.set({name: payload(ord(name), 1024) for name in "abcd"})
    status, set_codes = session.set({"huge": payload(50, 8 * 1024)})
    assert set_codes == [session.eic.StatusCode.OUT_OF_CAPACITY]
    assert len(store) == 4 and store.stats.evictions == 0


def test_lowering_the_capacity_evicts_down_to_it(engine_session):
    store = engine_session.target.store
    engine_session.set({f"v{i}": payload(60 + i, 1024) for i in range(8)})
    store.set_capacity(3 * 1024)
    assert len(store) == 3 and store.held_bytes <= 3 * 1024
    # The three most recent survive.
    assert engine_session.exist(["v5", "v6", "v7"])[1] == [engine_session.eic.StatusCode.SUCCESS] * 3


def test_clear_gives_back_all_capacity(engine_session):
    store = engine_session.target.store
    store.set_capacity(4 * 1024)
    engine_session.set({name: payload(ord(name), 1024) for name in "abcd"})
    store.clear()
    assert len(store) == 0 and store.live_bytes == 0 and store.held_bytes == 0
    status, set_codes = engine_session.set({name: payload(ord(name), 1024) for name in "wxyz"})
    assert set_codes == [engine_session.eic.StatusCode.SUCCESS] * 4
    assert store.stats.evictions == 0


def test_writes_of_mixed_sizes_near_capacity_keep_working(engine_session):
    # Reusing the last spare buffer of one size, then needing room for
    # another size, once crashed the engine (IndexError from its free list).
    codes = engine_session.eic.StatusCode
    store = engine_session.target.store
    store.set_capacity(6000)
    engine_session.set({"b": payload(1, 1629)}, ns="other")
    for seed, nbytes in enumerate([532, 946, 2048]):  # leaves spares of 532 and 946
        engine_session.set({"a": payload(seed, nbytes)})
    status, set_codes = engine_session.set({"x": payload(5, 532), "y": payload(6, 846)})
    assert set_codes == [codes.SUCCESS, codes.SUCCESS]
    assert engine_session.read("y", 846) == payload(6, 846).tobytes()
    assert store.held_bytes <= store.capacity


def test_overwritten_and_deleted_buffers_are_reused(engine_session):
    if engine_session.target.name == "shared":
        pytest.skip("buffer reuse is the in-process store's; LMDB reuses its own pages")
    store = engine_session.target.store
    engine_session.set({f"r{i}": payload(70 + i, 4096) for i in range(4)})
    engine_session.set({f"r{i}": payload(80 + i, 4096) for i in range(4)})
    allocated = store.stats.allocations
    for round_ in range(5):
        engine_session.set({f"r{i}": payload(round_ + i, 4096) for i in range(4)})
    engine_session.delete(["r0", "r1"])
    engine_session.set({"s0": payload(90, 4096), "s1": payload(91, 4096)})
    assert store.stats.allocations == allocated
    assert store.live_bytes == 4 * 4096


# ------------------------------------------------------- strict engine readings
def test_mget_without_buffers_returns_str_as_the_model_loader_reads_it(session):
    """The bytedance-iaas model loader, the one public caller of this form,
    calls `.encode()` on each value: the binding returns str."""
    eic = session.eic
    text = '{"file_name_list": ["config.json"], "note": "é ✓"}'
    session.set({"text": np.frombuffer(text.encode(), np.uint8).copy()})
    option = eic.GetOption()
    option.ns = session.target.namespace
    _, values, outcome = session.client.mget(session.keys(["text", "gone"]), option, None)
    assert list(outcome.status_codes)[0] == eic.StatusCode.SUCCESS
    assert outcome.status_codes[1] != eic.StatusCode.SUCCESS
    assert values[0] == text and values[0].encode() == text.encode()


def test_mget_without_buffers_reads_a_miss_as_an_empty_str(engine_session):
    eic = engine_session.eic
    status, values, outcome = engine_session.client.mget(engine_session.keys(["gone"]), eic.GetOption(), None)
    assert (status, values, list(outcome.status_codes)) == (eic.StatusCode.FAILED, [""], [eic.StatusCode.KEY_NOT_EXIST])


def test_mget_without_buffers_raises_on_a_value_that_is_not_utf8(engine_session):
    """A reply cast to str fails on bytes such as 0xa5, as the
    bytedance-iaas EIC gate warns: only IOBuffers read binary values."""
    eic = engine_session.eic
    value = bytes([0xA5, 0x00, 0xFF]) * 100
    engine_session.set({"raw": np.frombuffer(value, np.uint8).copy()})
    with pytest.raises(UnicodeDecodeError):
        engine_session.client.mget(engine_session.keys(["raw"]), eic.GetOption(), None)
    assert engine_session.read("raw", len(value)) == value  # through IOBuffers it is whole


def test_enum_numbers_are_the_documented_ones(engine_session):
    eic = engine_session.eic
    assert [eic.TransportType(n).name for n in (0, 2, 3)] == ["TRANSPORT_TCP", "TRANSPORT_RDMA", "TRANSPORT_GDR"]
    assert eic.TransportType(1).name == "???"  # pybind11 casts any int
    assert int(eic.StatusCode.SUCCESS) == 0 and int(eic.StatusCode.KEY_NOT_EXIST) == 5
    assert all(int(code) > 100 for code in (eic.StatusCode.VALUE_TOO_LARGE, eic.StatusCode.NOT_INITIALIZED))


def test_string_vector_holds_only_str(engine_session):
    with pytest.raises(TypeError):
        engine_session.eic.StringVector().append(b"bytes-key")


# ----------------------------------------------------------------- concurrency
def test_concurrent_clients_never_see_a_mix_of_two_values(sdk_target):
    """8 threads mset/mget/mexist/mdel 4 shared keys; every successful mget
    returns exactly one of the values written for that key."""
    names = [f"race-{i}" for i in range(4)]
    nbytes = 256 * 1024  # large enough that copies overlap in time
    # Each value is uniform except a header naming its writer, so a torn read
    # would show two different fills.
    written: dict[str, set[bytes]] = {name: set() for name in names}
    written_lock = threading.Lock()
    errors: list[str] = []
    reads: list[str] = []
    shared = Session(sdk_target)
    codes = shared.eic.StatusCode

    def worker(thread_id: int) -> None:
        session = shared if thread_id % 2 else Session(sdk_target)  # shared and own clients
        rng = np.random.default_rng(thread_id)
        for step in range(40):
            name = names[rng.integers(len(names))]
            action = rng.integers(4)
            if action == 0:
                value = np.full(nbytes, (thread_id * 40 + step) % 251, dtype=np.uint8)
                value[:8] = np.frombuffer(np.int64(thread_id * 1000 + step).tobytes(), np.uint8)
                with written_lock:
                    written[name].add(value.tobytes())
                session.set({name: value})
            elif action == 1:
                status, get_codes, arrays = session.get({name: nbytes})
                if get_codes[0] == codes.SUCCESS:
                    reads.append(name)
                    with written_lock:
                        if arrays[0].tobytes() not in written[name]:
                            errors.append(f"thread {thread_id} step {step}: {name} read a value never written")
                elif get_codes[0] != codes.KEY_NOT_EXIST:
                    errors.append(f"thread {thread_id} step {step}: mget {get_codes[0]}")
            elif action == 2:
                session.exist([name])
            else:
                session.delete([name])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert reads, "no mget hit: the check above saw nothing"
    if sdk_target.is_engine:
        store = sdk_target.store
        assert store.live_bytes == len(store) * nbytes
        assert store.held_bytes <= store.capacity


def test_a_reader_holding_a_value_survives_its_eviction(engine_session):
    """Eviction and overwrite while a read copies: the reader still gets
    the whole old value, and its buffer is only reused afterwards."""
    session = engine_session
    store = session.target.store
    store.set_capacity(2 * MiB)
    original = payload(100, MiB)
    session.set({"pinned": original})
    started, release = threading.Event(), threading.Event()
    real_memmove = ctypes.memmove

    # Slow down the engine's copy so eviction happens mid-read.
    store_module = sys.modules[type(store).__module__]

    def slow_memmove(dst, src, n):
        started.set()
        release.wait(5)
        return real_memmove(dst, src, n)

    result = {}

    def reader():
        result["bytes"] = session.read("pinned", MiB)

    store_module._memmove = slow_memmove
    try:
        thread = threading.Thread(target=reader)
        thread.start()
        assert started.wait(5)
        store_module._memmove = real_memmove  # writers below copy at full speed
        writer = Session(session.target)
        assert writer.set({"pinned": payload(101, MiB)})[1] == [session.eic.StatusCode.SUCCESS]
        writer.set({"other": payload(102, MiB)})  # over capacity with the pinned one: evicts
        release.set()
        thread.join(5)
    finally:
        store_module._memmove = real_memmove
        release.set()
    assert result["bytes"] == original.tobytes()
    assert store.held_bytes <= store.capacity
