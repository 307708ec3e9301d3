"""The in-process store's ready pages (`prefault=`, engine/store_pages.py).

A hypothesis state machine drives puts, gets, deletes, capacity changes,
clears and refills over a store whose buffers come from ready pages, and
checks after every step what a broken pool would break: a read returns the
bytes last written under its key or a miss (never another value's bytes,
never zeros from an unwritten page), no two buffers share a byte, and the
store's held_bytes is exactly its values, spare buffers and ready pages,
within capacity. The refiller runs inline there (deterministic); the other
tests run its real thread.
"""

import ctypes
import os
import random
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from waiting import wait_until

from aibrix_eic.config import ConfigError, EICConfig
from aibrix_eic.engine import Store, open_store, parse_endpoint, store_memory, store_pages
from aibrix_eic.engine.enums import StatusCode
from aibrix_eic.engine.store import DEFAULT_PREFAULT_BYTES
from aibrix_eic.engine.store_pages import MIN_POOLED, PAGE

pytestmark = pytest.mark.skipif(not store_pages.supported(), reason="ready pages are Linux's")

KIB = 1024
# Pooled sizes (whole pages, a page and a byte, neither), a size malloc
# serves (too small to pool) and one too large for the chunks below.
SIZES = [MIN_POOLED, MIN_POOLED + 1, 100_000, 128 * KIB, 1000, 200 * KIB]
CAPACITIES = [2 * 1024 * KIB, 4 * 1024 * KIB]  # chunks of 256 and 512 KiB
KEYS = st.sampled_from([f"k{i}" for i in range(8)])


def pattern(size: int, seed: int) -> np.ndarray:
    # Never all zeros: an unwritten fresh page would read as zeros.
    data = np.frombuffer(random.Random(seed).randbytes(size), dtype=np.uint8).copy()
    data[0] = 1 + seed % 255
    return data


class PoolAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._supported = store_memory.supported
        store_memory.supported = lambda: False  # no thread: refill() below is the refiller
        self.store = Store(name="pool-model", capacity=CAPACITIES[1], prefault=1024 * KIB)
        self.written: dict[str, bytes] = {}  # the last bytes written under each key
        self.deleted: set[str] = set()

    def teardown(self) -> None:
        self.store.close()
        store_memory.supported = self._supported

    @rule()
    def refill(self) -> None:
        nbytes = self.store.reserve_ready()
        if nbytes:
            self.store.deliver_ready(store_pages.map_faulted(nbytes), nbytes)

    @rule(items=st.lists(st.tuples(KEYS, st.sampled_from(SIZES), st.integers(0, 2**16)), min_size=1, max_size=6))
    def put(self, items) -> None:
        datas = [pattern(size, seed) for _, size, seed in items]
        keys = [key for key, _, _ in items]
        codes = self.store.put_many("", keys, [(d.ctypes.data, d.nbytes) for d in datas], 0)
        for key, data, code in zip(keys, datas, codes):
            if code == StatusCode.SUCCESS:
                self.written[key] = data.tobytes()
                self.deleted.discard(key)

    @rule(key=KEYS)
    def get(self, key) -> None:
        nbytes = self.store.value_size("", key)
        if nbytes is None:
            return  # never written, deleted or evicted: a miss is always allowed
        assert key not in self.deleted, f"{key} was deleted, yet the store still holds a value"
        dest = np.zeros(nbytes, dtype=np.uint8)
        (code,) = self.store.get_many("", [key], [(dest.ctypes.data, nbytes)])
        assert code == StatusCode.SUCCESS
        assert dest.tobytes() == self.written[key], f"{key}: the store returned bytes that were not last written there"

    @rule(key=KEYS)
    def delete(self, key) -> None:
        self.store.delete_many("", [key])
        self.deleted.add(key)

    @rule(capacity=st.sampled_from(CAPACITIES))
    def resize(self, capacity) -> None:
        self.store.set_capacity(capacity)

    @precondition(lambda self: self.store.prefault)
    @rule()
    def clear(self) -> None:
        self.store.clear()
        self.deleted.update(self.written)

    @rule(prefault=st.sampled_from([0, 512 * KIB, 1024 * KIB]))
    def set_prefault(self, prefault) -> None:
        self.store.set_prefault(prefault)

    @invariant()
    def bookkeeping_is_exact_and_within_capacity(self) -> None:
        store = self.store
        values = [(v.addr, v.nbytes) for v in store._index.values()]
        spares = [(addr, nbytes) for nbytes, bufs in store._free.items() for _, addr in bufs]
        ready = store._pages.ready_bytes
        assert store.held_bytes == sum(n for _, n in values + spares) + ready
        assert store.held_bytes <= store.capacity
        assert ready == 0 or store.prefault, "prefault=0 kept ready pages"
        ranges = sorted(values + spares + [(c.next, c.end - c.next) for c in store._pages._chunks])
        for (a, n), (b, _) in zip(ranges, ranges[1:]):
            assert a + n <= b, "two buffers share bytes"


PoolAgainstModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
TestPoolAgainstModel = PoolAgainstModel.TestCase


def test_puts_take_ready_pages_filled_in_the_background():
    store = Store(name="bg", capacity=64 * 1024 * KIB, prefault=16 * 1024 * KIB)
    wait_until(lambda: store._pages.ready_bytes >= 16 * 1024 * KIB, what="16 MiB of ready pages")
    assert store.held_bytes == store._pages.ready_bytes  # ready pages count against the capacity
    data = pattern(1536 * KIB, 3)
    codes = store.put_many("", [f"v{i}" for i in range(8)], [(data.ctypes.data, data.nbytes)] * 8, 0)
    assert codes == [StatusCode.SUCCESS] * 8
    assert store.stats.prefaulted == 8
    dest = np.zeros_like(data)
    assert store.get_many("", ["v7"], [(dest.ctypes.data, dest.nbytes)]) == [StatusCode.SUCCESS]
    assert dest.tobytes() == data.tobytes()
    store.close()
    assert store.held_bytes == 0 and store._pages.ready_bytes == 0
    wait_until(lambda: store._refiller is None, what="close() to drop the refiller")


def test_the_refiller_ends_with_its_store():
    store = Store(name="gone", capacity=8 * 1024 * KIB, prefault=1024 * KIB)
    assert store._refiller is not None
    thread, pages = store._refiller._thread, store._pages
    wait_until(lambda: pages.ready_bytes, what="ready pages")
    del store
    wait_until(lambda: not thread.is_alive(), what="the refiller of a store nobody holds to end")


def test_stores_of_one_process_share_one_prefault_budget():
    first = Store(name="one", capacity=64 * 1024 * KIB, prefault=4 * 1024 * KIB)
    wait_until(lambda: first._pages.ready_bytes >= 4 * 1024 * KIB, what="the first store's ready pages")
    second = Store(name="two", capacity=64 * 1024 * KIB, prefault=4 * 1024 * KIB)
    assert second.reserve_ready() == 0  # the process already keeps 4 MiB ready
    first.close()
    wait_until(lambda: second._pages.ready_bytes >= 4 * 1024 * KIB, what="the second store's turn")
    assert store_pages.process_total.nbytes == second._pages.ready_bytes
    second.close()
    assert store_pages.process_total.nbytes == 0


def test_the_refiller_runs_at_the_lowest_priority():
    store = Store(name="nice", capacity=8 * 1024 * KIB, prefault=1024 * KIB)
    refiller = store._refiller
    assert refiller is not None
    tid = wait_until(lambda: refiller._thread.native_id, what="the refiller's thread id")
    assert os.getpriority(os.PRIO_PROCESS, tid) == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 19  # only that thread
    store.close()


def test_a_dropped_value_gives_its_pages_back():
    store = Store(name="unmap", capacity=8 * 1024 * KIB, prefault=2 * 1024 * KIB)
    wait_until(lambda: store._pages.ready_bytes >= 1024 * KIB, what="ready pages")
    data = pattern(256 * KIB, 1)
    assert store.put_many("", ["a"], [(data.ctypes.data, data.nbytes)], 0) == [StatusCode.SUCCESS]
    addr = store._index[("", "a")].addr
    assert mapped(addr)
    store.set_prefault(0)  # so no chunk is mapped again at that address
    store.delete_many("", ["a"])
    store.set_capacity(0)  # drops the spare buffer the delete kept
    assert not mapped(addr)
    store.close()


def mapped(addr: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= addr < end:
                return True
    return False


def test_carved_buffers_are_page_aligned_and_exactly_sized():
    pages = store_pages.ReadyPages()
    addr = store_pages.map_faulted(16 * PAGE * 8)
    pages.add(addr, 16 * PAGE * 8)
    buf, got = pages.take(16 * PAGE + 1)
    assert got == addr and buf.nbytes == 16 * PAGE + 1 and buf.ctypes.data == addr
    buf2, got2 = pages.take(16 * PAGE)
    assert got2 == addr + 17 * PAGE  # the next page after the rounded one
    assert pages.ready_bytes == 16 * PAGE * 8 - 33 * PAGE
    ctypes.memset(got2, 7, 16 * PAGE)
    assert buf.max() == 0  # a neighbour's write never reaches it
    del buf, buf2
    pages.clear()


def test_prefault_parameter_is_parsed_and_bounded():
    assert parse_endpoint("x?prefault=2GiB")[1]["prefault"] == 2 * 1024**3
    assert parse_endpoint("x?prefault=off")[1]["prefault"] == 0
    assert parse_endpoint("x?prefault=0")[1]["prefault"] == 0
    with pytest.raises(ValueError, match="engine parameter prefault='lots'"):
        parse_endpoint("x?prefault=lots")
    with pytest.raises(ValueError, match="engine parameter prefault='2PiB'"):
        parse_endpoint("x?prefault=2PiB")
    with pytest.raises(ValueError, match="prefault applies only to a store in this process"):
        open_store("x?prefault=1GiB&dir=/nonexistent")


def test_a_bad_prefault_fails_the_config_naming_the_key():
    with pytest.raises(ConfigError, match="prefault"):
        EICConfig.from_mapping({"remote_url": "local://kv?prefault=much"})


def test_a_store_without_prefault_never_starts_a_refiller():
    store = Store(name="none", capacity=8 * 1024 * KIB, prefault=0)
    data = pattern(256 * KIB, 2)
    for _ in range(2):  # a write after clear() too
        assert store.put_many("", ["a"], [(data.ctypes.data, data.nbytes)], 0) == [StatusCode.SUCCESS]
        store.clear()
    assert store._refiller is None and store.stats.prefaulted == 0


def test_the_default_comes_from_the_environment_then_the_class(monkeypatch):
    monkeypatch.setenv(store_pages.PREFAULT_ENV, "3MiB")
    assert open_store("dflt?capacity=64MiB").prefault == 3 * 1024 * KIB
    monkeypatch.setenv(store_pages.PREFAULT_ENV, "lots")
    with pytest.raises(ValueError, match="AIBRIX_EIC_ENGINE_PREFAULT='lots'"):
        open_store("bad")
    monkeypatch.delenv(store_pages.PREFAULT_ENV)
    store = Store(name="unset", capacity=8 * 1024 * KIB)
    assert store.prefault == DEFAULT_PREFAULT_BYTES == 1024**3  # the documented default
    store.close()


def test_open_store_applies_prefault_at_creation_and_later(monkeypatch):
    monkeypatch.setenv(store_pages.PREFAULT_ENV, "3MiB")
    assert open_store("dflt?capacity=64MiB").prefault == 3 * 1024 * KIB
    store = open_store("given?capacity=64MiB&prefault=0")
    assert store.prefault == 0 and store._refiller is None  # never started for the default
    assert open_store("given?prefault=2MiB").prefault == 2 * 1024 * KIB


def test_threads_writing_and_reading_over_a_refilling_pool_never_see_wrong_bytes():
    """Four threads put and get while the real refiller maps chunks and the
    store evicts: every value read is whole and is one that was written
    under its key (its bytes derive from the key and a version number)."""
    store = Store(name="busy", capacity=4 * 1024 * KIB, prefault=2 * 1024 * KIB)
    wait_until(lambda: store._pages.ready_bytes, what="ready pages")
    keys = [f"k{i}" for i in range(12)]
    failures: list[str] = []

    def expected(key: str, version: int, nbytes: int) -> bytes:
        return pattern(nbytes, hash((key, version)) & 0xFFFF).tobytes()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for step in range(150):
            key = rng.choice(keys)
            if rng.random() < 0.5:
                version, nbytes = seed * 1000 + step, rng.choice([MIN_POOLED, 100_000, 128 * KIB])
                data = np.frombuffer(expected(key, version, nbytes), dtype=np.uint8)
                header = np.array([version, nbytes], dtype=np.int64).view(np.uint8)
                buf = np.concatenate([header, data])
                store.put_many("", [key], [(buf.ctypes.data, buf.nbytes)], 0)
                continue
            nbytes = store.value_size("", key)
            if nbytes is None:
                continue
            dest = np.zeros(nbytes, dtype=np.uint8)
            if store.get_many("", [key], [(dest.ctypes.data, nbytes)]) != [StatusCode.SUCCESS]:
                continue  # overwritten with another size in between: left untouched
            version, size = (int(x) for x in dest[:16].view(np.int64))
            if size != nbytes - 16 or dest[16:].tobytes() != expected(key, version, size):
                failures.append(f"{key}: read bytes that were never written there")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a worker is stuck"
    assert not failures, failures[:3]
    assert store.stats.prefaulted > 0 and store.held_bytes <= store.capacity
    store.close()
