"""A storm of AIBrix timeouts through the real cache manager: tiny per-token
timeouts, an engine whose latency jumps around, two threads offloading and
reloading at once. Whatever AIBrix abandons, no byte may land in memory it
released, the allocator must stay consistent, nothing may raise to the
caller, and every reload reported loaded must hold exactly its bytes."""

import random
import threading

import pytest
import torch
from harness import BLOCK_NTOKENS, block_spec, make_manager, manager_env, pattern, tokens, use_config
from poison import PoisonWatch
from waiting import wait_until

from aibrix_eic.engine import get_store

REQUESTS = 500  # offloads and reloads together
NBLOCKS = 2
SEQUENCES = 16
LATENCIES_S = (0.0, 0.0, 0.002, 0.02, 0.05)
# AIBrix's timeout per request: 2 blocks x 16 tokens x this. 0 gives up at
# once, racing the loop thread that starts the request.
PER_TOKEN_TIMEOUTS_MS = (0, 0, 1, 1, 5)


@pytest.fixture
def manager(monkeypatch, tmp_path):
    manager_env(monkeypatch, AIBRIX_KV_CACHE_OL_L2_CACHE_PER_TOKEN_TIMEOUT_MS="1")
    use_config(monkeypatch, tmp_path, remote_url="local://stress?seed=7", batch_keys=1, get_timeout_ms=1000)
    cache = make_manager(block_spec(), max_tokens=NBLOCKS * BLOCK_NTOKENS * 4)
    try:
        yield cache
    finally:
        cache.close()
        get_store("stress").clear()


def test_no_byte_lands_in_released_memory_under_a_storm_of_timeouts(manager):
    watch = PoisonWatch(manager._allocator)
    store = get_store("stress")
    nbytes = manager.block_spec.block_nbytes
    queries = [tokens(NBLOCKS, seed=100 + i) for i in range(SEQUENCES)]
    errors: list[BaseException] = []
    wrong: list[int] = []
    counts = {"offloads": 0, "reloads": 0, "loaded": 0, "timeouts": 0}
    lock = threading.Lock()

    def offload(i: int) -> None:
        handle = manager.allocate_for(None, queries[i]).get()
        for block, tensor in enumerate(handle.to_tensors()):
            tensor.view(torch.uint8).view(-1).copy_(pattern(100 + i, block, nbytes))
        manager.put(None, queries[i], handle)

    def reload(i: int) -> None:
        status = manager.acquire(None, queries[i])
        if status.is_timeout():
            with lock:
                counts["timeouts"] += 1
        if not status.is_ok():
            return
        ntokens, handle = status.get()
        try:
            for block, tensor in enumerate(handle.to_tensors()[: ntokens // BLOCK_NTOKENS]):
                if not torch.equal(tensor.view(torch.uint8).view(-1), pattern(100 + i, block, nbytes)):
                    wrong.append(i)
        finally:
            handle.release()
        with lock:
            counts["loaded"] += 1

    def worker(seed: int, nrequests: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(nrequests):
                store.faults.latency_s = rng.choice(LATENCIES_S)
                manager._l2_cache_per_token_timeout_ms = rng.choice(PER_TOKEN_TIMEOUTS_MS)
                i = rng.randrange(SEQUENCES)
                if rng.random() < 0.3:
                    offload(i)
                    kind = "offloads"
                else:
                    reload(i)
                    kind = "reloads"
                with lock:
                    counts[kind] += 1
        except BaseException as e:  # nothing may reach the caller
            errors.append(e)

    for i in range(SEQUENCES):
        offload(i)
    threads = [threading.Thread(target=worker, args=(seed, REQUESTS // 2)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    store.faults.latency_s = 0.0
    # let late SDK calls land before the final check
    wait_until(
        lambda: len(manager._allocator) == 0, what="late SDK calls to land", show=lambda: len(manager._allocator)
    )

    assert errors == []
    assert counts["offloads"] + counts["reloads"] == REQUESTS
    assert counts["timeouts"] > 0 and counts["loaded"] > 0, counts  # the storm really mixed both
    assert wrong == []
    assert watch.check_all() == [], watch.violations[:3]
    manager._allocator.assert_consistency()
    assert len(manager._allocator) == 0
