"""A hypothesis state machine that drives one engine Client against a plain
model of what EIC should hold, eviction included.

The model is exact, not a capacity large enough to avoid eviction: it is an
OrderedDict of (ns, key) -> bytes in LRU order (oldest first), where a write
or a successful read moves a key to the end and mexist does not. An mset
first reserves room for each of its values in turn, evicting from the front
while live bytes + bytes reserved so far + the new value exceed the
capacity (the values it overwrites still count until it publishes), then
publishes them in order. A value larger than max_value, or than the whole
capacity, fails without evicting anything.
"""

import ctypes
import random
from collections import OrderedDict

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import aibrix_eic.engine as eic
from aibrix_eic.engine import get_store, reset_stores

Code = eic.StatusCode
NAMESPACES = st.sampled_from(["", "ns-b"])
KEYS = st.sampled_from([f"k{i}" for i in range(5)])
MAX_VALUE = 2048
# 1500 is below MAX_VALUE, so some values fit no capacity at all.
CAPACITIES = st.sampled_from([1500, 6000, 10000])
VALUE_SIZES = st.integers(0, MAX_VALUE + 300)  # 0 is invalid; > MAX_VALUE too large
UNTOUCHED = 0x5A


def overall(codes: list) -> Code:
    ok = codes.count(Code.SUCCESS)
    return Code.SUCCESS if ok == len(codes) else Code.FAILED if ok == 0 else Code.PARTIAL_FAILED


def value_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


class EngineAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        reset_stores()  # the autouse fixture resets per test, not per example
        self.capacity = 6000
        self.client = eic.Client()
        endpoint = f"stateful?capacity={self.capacity}&max_value={MAX_VALUE}"
        assert self.client.init("stateful", endpoint, eic.InitOption()) == 0
        self.store = get_store("stateful")
        self.model: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def live(self) -> int:
        return sum(len(v) for v in self.model.values())

    # ---------------------------------------------------------------- rules
    @rule(
        ns=NAMESPACES,
        items=st.lists(st.tuples(KEYS, VALUE_SIZES, st.integers(0, 2**16)), min_size=1, max_size=4),
    )
    def mset(self, ns, items):
        datas = [value_bytes(size, seed) for _, size, seed in items]
        # A 0-byte value still needs a valid address to point at.
        buffers = [ctypes.create_string_buffer(data, max(1, len(data))) for data in datas]
        vals = eic.IOBuffers()
        for data, buffer in zip(datas, buffers):
            vals.append(ctypes.addressof(buffer), len(data), False)
        option = eic.SetOption()
        option.ns = ns
        status, outcome = self.client.mset(eic.StringVector(k for k, _, _ in items), vals, option)

        expected, reserved, publish = [], 0, []
        for (key, _, _), data in zip(items, datas):
            n = len(data)
            if n == 0:
                expected.append(Code.INVALID_ARGUMENT)
            elif n > MAX_VALUE:
                expected.append(Code.VALUE_TOO_LARGE)
            elif n > self.capacity:
                expected.append(Code.OUT_OF_CAPACITY)
            else:
                while self.live() + reserved + n > self.capacity and self.model:
                    self.model.popitem(last=False)
                if self.live() + reserved + n > self.capacity:
                    expected.append(Code.OUT_OF_CAPACITY)
                else:
                    reserved += n
                    expected.append(Code.SUCCESS)
                    publish.append(((ns, key), data))
        for full_key, data in publish:
            self.model.pop(full_key, None)
            self.model[full_key] = data
        assert list(outcome.status_codes) == expected
        assert status == overall(expected)

    @rule(
        ns=NAMESPACES,
        asks=st.lists(st.tuples(KEYS, st.booleans(), st.integers(1, MAX_VALUE)), min_size=1, max_size=4),
    )
    def mget(self, ns, asks):
        # Each ask reads into a buffer of the stored size, or of another size.
        sizes = []
        for key, exact, other_size in asks:
            stored = self.model.get((ns, key))
            sizes.append(len(stored) if exact and stored is not None else other_size)
        arrays = [np.full(size, UNTOUCHED, np.uint8) for size in sizes]
        vals = eic.IOBuffers()
        for array in arrays:
            vals.append(array.ctypes.data, array.nbytes, False)
        option = eic.GetOption()
        option.ns = ns
        status, _, outcome = self.client.mget(eic.StringVector(k for k, _, _ in asks), option, vals)
        codes = list(outcome.status_codes)

        for (key, _, _), array, code in zip(asks, arrays, codes):
            stored = self.model.get((ns, key))
            if stored is None:
                assert code == Code.KEY_NOT_EXIST, f"{ns}/{key} is absent from the model"
            elif len(stored) != array.nbytes:
                assert code == Code.BUFFER_SIZE_MISMATCH
            else:
                assert code == Code.SUCCESS
                assert array.tobytes() == stored
                self.model.move_to_end((ns, key))
            if code != Code.SUCCESS:
                assert (array == UNTOUCHED).all()
        assert status == overall(codes)

    @rule(ns=NAMESPACES, keys=st.lists(KEYS, min_size=1, max_size=5))
    def mexist(self, ns, keys):
        option = eic.ExistOption()
        option.ns = ns
        status, outcome = self.client.mexist(eic.StringVector(keys), option)
        expected = [Code.SUCCESS if (ns, key) in self.model else Code.KEY_NOT_EXIST for key in keys]
        assert list(outcome.status_codes) == expected
        # A miss is no failure of mexist unless the store reads it so (docs/engine.md).
        assert status == (overall(expected) if self.store.mexist_miss == "failed" else Code.SUCCESS)

    @rule(ns=NAMESPACES, keys=st.lists(KEYS, min_size=1, max_size=5))
    def mdel(self, ns, keys):
        option = eic.DelOption()
        option.ns = ns
        status, outcome = self.client.mdel(eic.StringVector(keys), option)
        expected = []
        for key in keys:
            removed = self.model.pop((ns, key), None)
            expected.append(Code.SUCCESS if removed is not None else Code.KEY_NOT_EXIST)
        assert list(outcome.status_codes) == expected
        assert status == overall(expected)

    @rule(capacity=CAPACITIES)
    def set_capacity(self, capacity):
        self.store.set_capacity(capacity)
        self.capacity = capacity
        while self.live() > capacity:
            self.model.popitem(last=False)

    # ----------------------------------------------------------- invariants
    @invariant()
    def same_keys_in_the_same_lru_order(self):
        assert self.store.keys() == list(self.model.keys())

    @invariant()
    def byte_accounting_matches(self):
        assert self.store.live_bytes == self.live()
        assert self.store.held_bytes <= self.capacity


EngineAgainstModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_engine_matches_an_lru_model = EngineAgainstModel.TestCase
