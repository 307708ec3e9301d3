"""Thread safety: vLLM's threads calling the cache manager at once (main
thread, KV event-loop thread, Type3's side channel asking exists), and
connector calls from several event loops on several threads."""

import asyncio
import threading

import torch
from connector_tools import ConnectorRig
from harness import BLOCK_NTOKENS, block_spec, make_manager, manager_env, pattern, tokens, use_config, wait_flushed

from aibrix_eic.engine import get_store

THREADS = 4
ROUNDS = 6


def test_manager_used_from_many_threads_stays_bit_exact(monkeypatch, tmp_path):
    manager_env(monkeypatch, AIBRIX_KV_CACHE_OL_L2_CACHE_NUM_ASYNC_WORKERS="8")
    use_config(monkeypatch, tmp_path, remote_url="local://threads?latency=200us", batch_keys=4)
    cache = make_manager(block_spec(), max_tokens=4096)
    nbytes = cache.block_spec.block_nbytes
    errors: list[str] = []
    stop = threading.Event()

    def worker(thread_index: int) -> None:
        try:
            for round_ in range(ROUNDS):
                seed = thread_index * 100 + round_
                query = tokens(12, seed=seed)
                handle = cache.allocate_for(None, query).get()
                for i, tensor in enumerate(handle.to_tensors()):
                    tensor.view(torch.uint8).view(-1).copy_(pattern(seed, i, nbytes))
                if not cache.put(None, query, handle).is_ok():
                    errors.append(f"put failed in thread {thread_index}")
                    continue
                status = cache.acquire(None, query)
                if not status.is_ok():
                    errors.append(f"acquire missed in thread {thread_index}")
                    continue
                ntokens, loaded = status.get()
                try:
                    for i, tensor in enumerate(loaded.to_tensors()):
                        if not torch.equal(tensor.view(torch.uint8).view(-1), pattern(seed, i, nbytes)):
                            errors.append(f"wrong bytes: thread {thread_index} block {i}")
                finally:
                    loaded.release()
                if ntokens != 12 * BLOCK_NTOKENS:
                    errors.append(f"short acquire {ntokens} in thread {thread_index}")
        except Exception as e:  # surfaced by the assertion below
            errors.append(repr(e))

    def side_channel() -> None:
        # Type3's rank-0 side channel asks exists for queries of its own.
        query = tokens(12, seed=0)
        while not stop.is_set():
            status = cache.exists(None, query)
            if not (status.is_ok() or status.is_not_found()):
                errors.append(f"side-channel exists: {status}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    prober = threading.Thread(target=side_channel)
    try:
        prober.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        stop.set()
        prober.join(timeout=30)
        assert not errors, errors[:5]
        wait_flushed(cache)  # the last puts may still be pending
        assert len(get_store("threads")) == THREADS * ROUNDS * 12
    finally:
        stop.set()
        cache.close()


def test_connector_shared_by_event_loops_on_several_threads():
    rig = ConnectorRig(remote_url="local://loops", batch_keys=3).open()
    errors: list[str] = []

    async def exists_all(keys):
        return await asyncio.gather(*[rig.conn.exists(key) for key in keys])

    def worker(thread_index: int) -> None:
        loop = asyncio.new_event_loop()
        try:
            for round_ in range(10):
                keys = [bytes([thread_index, round_, i]) * 5 + b"k" for i in range(7)]
                payloads = [bytes([thread_index * 16 + round_ % 16, i]) * 2048 for i in range(7)]
                put = loop.run_until_complete(rig.conn.mput(keys, rig.filled(payloads)))
                if not isinstance(put, list):
                    errors.append(f"mput: {put}")
                    continue
                if not rig.conn.write_behind.wait_idle(10):  # so exists asks EIC, not the pending writes
                    errors.append("write-behind did not flush")
                exists = loop.run_until_complete(exists_all(keys))
                if not all(status.is_ok() for status in exists):
                    errors.append("exists missed a stored key")
                mrs = rig.blocks(7)
                statuses = loop.run_until_complete(rig.conn.mget(keys, mrs))
                for mr, payload, status in zip(mrs, payloads, statuses):
                    if not status.is_ok() or rig.read(mr) != payload:
                        errors.append(f"thread {thread_index} round {round_}: {status}")
                rig.release(mrs)
        except Exception as e:
            errors.append(repr(e))
        finally:
            loop.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors[:5]
        assert rig.conn.health()["exists_calls"] < rig.conn.health()["exists"]  # calls were shared
    finally:
        rig.close()
