"""Fault injection for the embedded engine: the ways a real EIC misbehaves.

Each knob models a way a real EIC fails: slow calls, whole calls that fail,
per-key failures inside a PARTIAL_FAILED reply, registered (GDR) writes
refused with GDR_TRANSFER_ERROR, an unreachable cluster, mexist hits that
mget cannot deliver, mexist keys that time out (at random, or each key's
first probe: a flapping exists), and failed calls whose per-key codes
still say SUCCESS.
Knobs are plain attributes, so tests flip them while a workload runs.
"""

import random
import threading
from dataclasses import dataclass, field


@dataclass
class Faults:
    latency_s: float = 0.0  # added to every data call, outside any lock
    fail_rate: float = 0.0  # chance a whole call returns FAILED
    key_fail_rate: float = 0.0  # chance each key fails inside PARTIAL_FAILED
    unreachable: bool = False  # init returns -1, every call returns FAILED
    phantom_rate: float = 0.0  # chance mexist reports a missing key present
    gdr_write_fail_rate: float = 0.0  # chance each registered mset buffer gets GDR_TRANSFER_ERROR
    # chance a whole call returns FAILED with every per-key code left at its
    # default, SUCCESS (a reply public SDK callers are written to survive)
    default_codes_fail_rate: float = 0.0
    # mexist per-key TIMEOUT codes: at random, or on each key's first mexist
    # since the knob was set (bytedance-iaas/sglang #772 saw mexist flap 318
    # times in 173k probes on a real EIC cluster)
    exist_key_fail_rate: float = 0.0
    exist_flaps: bool = False
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False, compare=False)
    _rng_lock: threading.Lock = field(init=False, repr=False, compare=False, default_factory=threading.Lock)
    _flapped: set[str] = field(init=False, repr=False, compare=False, default_factory=set)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reseed(self, seed: int | None) -> None:
        self.seed = seed
        with self._rng_lock:
            self._rng = random.Random(seed)

    def clear(self) -> None:
        """Back to a healthy engine (the seed is kept)."""
        self.latency_s = 0.0
        self.fail_rate = 0.0
        self.key_fail_rate = 0.0
        self.unreachable = False
        self.phantom_rate = 0.0
        self.gdr_write_fail_rate = 0.0
        self.default_codes_fail_rate = 0.0
        self.exist_key_fail_rate = 0.0
        self.exist_flaps = False
        with self._rng_lock:
            self._flapped.clear()

    def _chance(self, rate: float) -> bool:
        if rate <= 0.0:
            return False
        with self._rng_lock:
            return self._rng.random() < rate

    def call_fails(self) -> bool:
        return self.unreachable or self._chance(self.fail_rate)

    def key_fails(self) -> bool:
        return self._chance(self.key_fail_rate)

    def gdr_write_fails(self) -> bool:
        return self._chance(self.gdr_write_fail_rate)

    def exist_key_fails(self, key: str) -> bool:
        """Whether this key's mexist code is TIMEOUT."""
        if self.exist_flaps:
            with self._rng_lock:
                first = key not in self._flapped
                self._flapped.add(key)
            if first:
                return True
        return self._chance(self.exist_key_fail_rate)

    def phantom_hit(self) -> bool:
        return self._chance(self.phantom_rate)

    def call_fails_with_default_codes(self) -> bool:
        return self._chance(self.default_codes_fail_rate)
