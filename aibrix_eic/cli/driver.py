"""Builds AIBrix's BaseKVCacheManager on backend EIC and drives one request
at a time through it, the way vLLM's AIBrix connectors do in a TP rank.

Send (turn 1 of a conversation, as AIBrix's vLLM connector does it:
https://github.com/vllm-project/aibrix/blob/main/python/aibrix_kvcache/aibrix_kvcache/integration/vllm/kv_connector/aibrix_offloading_connector_type1.py):
`exists` -> `allocate_for` -> copy KV into `handle.to_tensors()` (on a GPU
this is the device-to-host copy) -> `put`. Receive (turn 2 reuses the
prompt): `exists` (the scheduler's lookup) -> `acquire` -> compare every byte
with what was sent -> `release`. Each call is timed on its own.

L1 is off (with it on, puts reach L2 only when re-read), puts are
synchronous, and the allocator's slabs are pre-faulted, as pinned slabs are
in production, so timings measure the L2 path rather than page faults.

With `put_mode: write_behind` (the default) `put` returns before its blocks
are in EIC. Each request then times the wait for them (`flush`) before the
receive turn, so the reload reads EIC, not the connector's pending writes.
"""

import contextlib
import ctypes
import ctypes.util
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import yaml

from ..config import ENV_CONFIG, config_path_from_env
from .runtime import scoped_env
from .shapes import ModelShape

MANAGER_ENV = {
    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
}
# AIBrix's own in-memory L2 backend, through the same L2Cache path as ours
# (mput/mget, which we advertise too): the bench's floor.
MOCK_ENV = {"AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "MOCK", "AIBRIX_KV_CACHE_OL_MOCK_USE_MPUT_MGET": "1"}
EMBEDDED_STORE = "aibrix-eic-bench"
# Distinct random blocks the KV bytes are drawn from; each sent block also
# carries a stamp of (request, block), so a block loaded into the wrong
# place never compares equal.
SOURCE_BLOCKS = 8
STAMP_NBYTES = 16
VOCAB_SIZE = 128_000
OPS = ("exists", "allocate", "copy_in", "put", "flush", "lookup", "acquire", "verify", "release")


class ManagerUnavailable(RuntimeError):
    """AIBrix could not build the cache manager (its open() failed)."""


# AIBrix's Status.raise_if_not_ok raises RuntimeError(repr(status)).
_STATUS_REPR = re.compile(r"Status\(error_code=StatusCodes\.(\w+)(?:, value=(.*?))?\)(?:, trace:.*)?", re.S)


def readable_failure(error: Exception) -> str:
    """The message inside AIBrix's `Status(...)` repr, with its code when
    the status carries no message; other errors unchanged."""
    text = str(error)
    match = _STATUS_REPR.fullmatch(text.strip())
    if match is None:
        return text
    code, value = match.groups()
    return value if value and value != "None" else f"status {code}"


@dataclass
class RequestResult:
    """What one request did and how long each call took (seconds)."""

    index: int
    warmup: bool
    tokens: int
    offloaded_tokens: int = 0
    reloaded_tokens: int = 0
    looked_up_tokens: int = 0
    mismatched_blocks: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def offload_seconds(self) -> float:
        """From put until the blocks are in EIC."""
        return self.seconds.get("put", 0.0) + self.seconds.get("flush", 0.0)

    @property
    def send_seconds(self) -> float:
        return sum(self.seconds.get(op, 0.0) for op in ("exists", "allocate", "copy_in", "put"))

    @property
    def receive_seconds(self) -> float:
        return sum(self.seconds.get(op, 0.0) for op in ("lookup", "acquire", "verify", "release"))


def embedded_engine_config(directory: str, capacity_nbytes: int, shared_dir: str | None = None) -> str:
    """A config for the embedded engine sized for the workload; with
    shared_dir, its shared mode: a store other processes can open too."""
    path = os.path.join(directory, "bench-eic.yaml")
    capacity_mib = -(-capacity_nbytes // 1024**2)
    url = f"local://{EMBEDDED_STORE}?capacity={capacity_mib}MiB"
    if shared_dir:
        url += f"&dir={os.path.abspath(shared_dir)}&create=1"  # --shared-dir is made if missing
    with open(path, "w", encoding="utf-8") as fout:
        yaml.safe_dump({"remote_url": url}, fout)
    return path


class ManagerDriver:
    """One BaseKVCacheManager for one model shape and prompt length."""

    def __init__(
        self, shape: ModelShape, tokens: int, seed: int = 0, shared_dir: str | None = None, mock: bool = False
    ) -> None:
        self.shape = shape
        self.tokens = tokens - tokens % shape.block_ntokens
        if self.tokens <= 0:
            raise ValueError(f"--tokens must be at least one block ({shape.block_ntokens} tokens)")
        self.nblocks = self.tokens // shape.block_ntokens
        self.block_nbytes = shape.block_nbytes
        self.seed = seed
        self.shared_dir = shared_dir  # the embedded engine's shared mode, when set
        self.mock = mock  # AIBrix's MOCK backend instead of EIC: the baseline
        self.manager: Any = None  # aibrix_kvcache's BaseKVCacheManager once started
        self.config_path = ""  # the user's config; "" for the embedded engine
        rng = np.random.default_rng(seed)
        self.source = torch.from_numpy(rng.integers(0, 256, size=(SOURCE_BLOCKS, self.block_nbytes), dtype=np.uint8))

    @property
    def request_nbytes(self) -> int:
        return self.nblocks * self.block_nbytes

    # ------------------------------------------------------------ lifecycle
    @contextlib.contextmanager
    def opened(self, planned_requests: int) -> Iterator["ManagerDriver"]:
        """Build the manager; the environment it needs is undone on exit.
        planned_requests bounds how much of the allocator gets pre-faulted."""
        with contextlib.ExitStack() as stack:
            env = dict(MANAGER_ENV)
            self.config_path = config_path_from_env()  # "" when none: we write one
            if self.mock:
                env.update(MOCK_ENV)
            elif not self.config_path:
                directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="aibrix-eic-bench-"))
                # Room for two requests: the one being reloaded and the last.
                capacity = max(2 * self.request_nbytes, 64 * 1024**2)
                env[ENV_CONFIG] = embedded_engine_config(directory, capacity, self.shared_dir)
            stack.enter_context(scoped_env(env))
            saved_threads = torch.get_num_threads()
            # One thread for the stand-in copies: idle OpenMP workers spin and
            # would take the CPUs from the connector's I/O threads.
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, saved_threads)
            try:
                self.manager = self._build_manager()
            except Exception as e:  # AIBrix raises RuntimeError(Status) when open fails
                raise ManagerUnavailable(readable_failure(e)) from e
            stack.callback(self._close_manager)
            # Each request allocates twice (send and receive), and AIBrix's
            # pool carves fresh memory before it reuses freed regions.
            self._prefault_slabs(2 * planned_requests * self.request_nbytes)
            yield self

    def _build_manager(self):
        from aibrix_kvcache import BaseKVCacheManager, KVCacheConfig
        from aibrix_kvcache.spec import ModelSpec

        config = KVCacheConfig(
            block_spec=self.shape.block_spec(),
            # Sized for one whole request per call: a bigger acquire than the
            # allocator holds silently returns fewer tokens.
            model_spec=ModelSpec(max_model_len=self.tokens, max_num_batched_tokens=self.tokens),
            multi_threaded=True,  # as Type3 builds it
        )
        return BaseKVCacheManager(config=config)

    def _close_manager(self) -> None:
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.close()

    def _prefault_slabs(self, nbytes: int) -> None:
        """Touch the first `nbytes` of the allocator's slabs now, so the
        timed calls do not pay first-touch page faults (~1 ms/MiB on small
        VMs); production slabs are pinned, hence always resident."""
        allocator = getattr(self.manager, "_allocator", None)
        for slab in getattr(allocator, "slabs", []):
            if nbytes <= 0:
                break
            length = min(nbytes, slab.numel() * slab.element_size())
            ctypes.memset(slab.data_ptr(), 0, length)
            nbytes -= length

    @property
    def connector(self):
        """The L2 connector AIBrix built (for its health counters)."""
        l2_cache = getattr(self.manager, "_l2_cache", None)
        return getattr(l2_cache, "_backend", None)

    def wait_for_eic(self) -> str | None:
        """Wait until the connector has sent every accepted put to EIC; what
        went wrong, or None."""
        connector = self.connector
        write_behind = getattr(connector, "write_behind", None)
        if write_behind is None:
            return None
        config = connector.config
        bound_ms = config.put_timeout_ms + config.write_behind_max_age_ms  # queued at most max_age, then one round
        if write_behind.wait_idle(bound_ms / 1000):
            return None
        return f"flush: write-behind had not written the blocks to EIC after {bound_ms:g} ms"

    def forget(self, index: int) -> None:
        """Delete request `index`'s blocks (untimed): AIBrix's MOCK backend
        never evicts, and would hold every request otherwise."""
        self.manager.delete(None, self.prompt(index))

    # ------------------------------------------------------------- requests
    def prompt(self, index: int) -> Any:
        from aibrix_kvcache import TokenListView

        rng = np.random.default_rng([self.seed, index])
        return TokenListView(rng.integers(0, VOCAB_SIZE, size=self.tokens, dtype=np.int32))

    def _stamp(self, index: int, block: int) -> torch.Tensor:
        return torch.tensor([index, block], dtype=torch.int64).view(torch.uint8)

    def fill_block(self, index: int, block: int, out: torch.Tensor) -> None:
        """Write block `block` of request `index`: source bytes plus a stamp."""
        out.copy_(self.source[(index + block) % SOURCE_BLOCKS])
        out[:STAMP_NBYTES].copy_(self._stamp(index, block))

    def block_matches(self, index: int, block: int, data: torch.Tensor) -> bool:
        source = self.source[(index + block) % SOURCE_BLOCKS]
        return _bytes_equal(data[:STAMP_NBYTES], self._stamp(index, block)) and _bytes_equal(
            data[STAMP_NBYTES:], source[STAMP_NBYTES:]
        )

    def run_request(self, index: int, warmup: bool = False) -> RequestResult:
        """Offload one new prompt's KV, then reload it; every call timed."""
        manager = self.manager
        assert manager is not None, "run_request before start"
        result = RequestResult(index, warmup, self.tokens)
        prompt = self.prompt(index)
        timer = _Timer(result.seconds)

        with timer("exists"):
            status = manager.exists(None, prompt)
        cached = status.get() if status.is_ok() else 0
        if cached >= self.tokens:
            result.errors.append(f"a new random prompt was already cached ({cached} tokens)")
        with timer("allocate"):
            status = manager.allocate_for(None, prompt)
        if not status.is_ok():
            result.errors.append(f"allocate_for: {status}")
            return result
        handle = status.get()
        with timer("copy_in"):
            for block, tensor in enumerate(handle.to_tensors()):
                self.fill_block(index, block, _as_bytes(tensor))
        with timer("put"):
            status = manager.put(None, prompt, handle)  # put owns the handle now
        if status.is_ok():
            result.offloaded_tokens = status.get()
        else:
            result.errors.append(f"put: {status}")
        with timer("flush"):
            problem = self.wait_for_eic()
        if problem is not None:
            result.errors.append(problem)

        with timer("lookup"):
            status = manager.exists(None, prompt)
        result.looked_up_tokens = status.get() if status.is_ok() else 0
        with timer("acquire"):
            status = manager.acquire(None, prompt)
        if not status.is_ok():
            if not status.is_not_found():
                result.errors.append(f"acquire: {status}")
            return result
        ntokens, handle = status.get()
        result.reloaded_tokens = ntokens
        with timer("verify"):
            for block, tensor in enumerate(handle.to_tensors()):
                if not self.block_matches(index, block, _as_bytes(tensor)):
                    result.mismatched_blocks += 1
        with timer("release"):
            handle.release()
        return result


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _load_memcmp():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    memcmp = ctypes.CDLL(name).memcmp
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return memcmp


_memcmp = _load_memcmp()


def _bytes_equal(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Byte equality of two contiguous uint8 tensors; libc memcmp is about
    ten times faster than torch.equal here."""
    if left.numel() != right.numel():
        return False
    if _memcmp is None:
        return bool(np.array_equal(left.numpy(), right.numpy()))
    return _memcmp(left.data_ptr(), right.data_ptr(), left.numel()) == 0


class _Timer:
    """`with timer("put"):` adds the block's wall time to seconds["put"]."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self._seconds = seconds

    @contextlib.contextmanager
    def __call__(self, op: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[op] = self._seconds.get(op, 0.0) + time.perf_counter() - started
