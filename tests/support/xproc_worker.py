"""One OS process of test_cross_process.py: its own AIBrix BaseKVCacheManager
with this connector on a shared engine store, driven by JSON commands on
stdin, one JSON reply per line on stdout.

    python tests/support/xproc_worker.py '{"heads": 2, "layers": 2, "head_size": 64}'

The parent sets the environment: the EIC config (remote_url with ?dir=),
AIBrix's L2-only settings and a PYTHONHASHSEED of its own.
"""

import asyncio
import hashlib
import json
import random
import sys
import types

import torch


def block_hashes(query_seed: int, payload_seeds, nblocks: int, nbytes: int) -> list[set[str]]:
    """For block i of a query: the digests of every payload a writer may have
    put there. A block whose digest is not among them is foreign or torn."""
    from harness import pattern

    return [
        {hashlib.sha1(pattern(seed, i, nbytes).numpy().tobytes()).hexdigest() for seed in payload_seeds}
        for i in range(nblocks)
    ]


class Worker:
    def __init__(self, spec_args: dict) -> None:
        import aibrix_kvcache.cache_manager as cache_manager

        import aibrix_eic

        cache_manager.TESTING_DISABLE_PIN_MEMORY = True  # CPU-only torch cannot pin
        aibrix_eic.install()
        from harness import block_spec, connector_of
        from poison import PoisonWatch

        self.spec = block_spec(**spec_args)
        self.manager = self.new_manager()
        self.poison = PoisonWatch(self.manager._allocator)
        self.connector = connector_of(self.manager)
        self.loop = asyncio.new_event_loop()

    def new_manager(self):
        """A manager built while vLLM's config is published, so that the model
        identity is made of vLLM's factors, as in a server."""
        from fake_vllm import fake_vllm_config
        from harness import make_manager

        vllm_config = types.ModuleType("vllm.config")
        published = fake_vllm_config(hf_overrides={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
        vllm_config.get_current_vllm_config_or_none = lambda: published
        sys.modules["vllm.config"] = vllm_config
        try:
            return make_manager(self.spec)
        finally:
            del sys.modules["vllm.config"]  # vLLM clears it after building the connector

    # ------------------------------------------------------------- commands
    def identity(self, query_seeds: list[int], nblocks: int) -> dict:
        from harness import tokens

        keys = {}
        for seed in query_seeds:
            block_keys = [key for _, key in self.manager._l2_cache._cache_block_keys(None, tokens(nblocks, seed))]
            keys[str(seed)] = self.connector._codec.encode_many(block_keys)
        return {"token": self.connector.model_identity.token, "keys": keys}

    def put(self, query_seed: int, nblocks: int, payload_seed: int) -> dict:
        from harness import send, tokens, wait_flushed

        status = send(self.manager, tokens(nblocks, query_seed), payload_seed)
        wait_flushed(self.manager)  # visible to other processes from here on
        return {"ok": status.is_ok(), "status": str(status)}

    def put_then_flush(self, query_seed: int, nblocks: int, payload_seed: int) -> dict:
        """Put, then the manager's flush(), as AIBrix's PD prefiller does
        before its response sends a decoder to read the prompt; no other
        wait. What the flush left pending is in the reply."""
        from harness import send, tokens

        status = send(self.manager, tokens(nblocks, query_seed), payload_seed)
        pending_after_put = self.connector.health()["write_behind_pending"]
        flushed = self.manager.flush()
        return {
            "ok": status.is_ok(),
            "flush": str(flushed),
            "pending_after_put": pending_after_put,
            "pending_after_flush": self.connector.health()["write_behind_pending"],
        }

    def get(self, query_seed: int, nblocks: int, payload_seed: int) -> dict:
        from harness import receive, tokens

        ntokens, exact = receive(self.manager, tokens(nblocks, query_seed), payload_seed)
        return {"ntokens": ntokens, "exact": exact}

    def churn(self, steps: int, query_seeds: list[int], nblocks: int, payload_seeds: dict, rng_seed: int) -> dict:
        """Random puts (of this worker's payloads), acquires and deletes of a
        few shared queries; every block acquired is checked against the
        payloads any worker may have put under its key."""
        from harness import BLOCK_NTOKENS, send, tokens

        nbytes = self.spec.block_nbytes
        allowed = {q: block_hashes(q, payload_seeds[str(q)], nblocks, nbytes) for q in query_seeds}
        mine = {q: [s for s in payload_seeds[str(q)] if s % 100 == rng_seed % 100] for q in query_seeds}
        rng = random.Random(rng_seed)
        counts = {"puts": 0, "acquires": 0, "blocks_checked": 0, "deletes": 0, "bad_blocks": []}
        for step in range(steps):
            query_seed = rng.choice(query_seeds)
            query = tokens(nblocks, query_seed)
            action = rng.random()
            if action < 0.4:
                send(self.manager, query, rng.choice(mine[query_seed]))
                counts["puts"] += 1
            elif action < 0.85:
                status = self.manager.acquire(None, query)
                counts["acquires"] += 1
                if not status.is_ok():
                    continue
                ntokens, handle = status.get()
                try:
                    for i, tensor in enumerate(handle.to_tensors()):
                        digest = hashlib.sha1(tensor.view(torch.uint8).view(-1).numpy().tobytes())
                        if digest.hexdigest() not in allowed[query_seed][i]:
                            counts["bad_blocks"].append(f"step {step}: query {query_seed} block {i}")
                        counts["blocks_checked"] += 1
                    assert ntokens == len(handle.to_tensors()) * BLOCK_NTOKENS
                finally:
                    handle.release()
            else:
                block_keys = [key for _, key in self.manager._l2_cache._cache_block_keys(None, query)]
                self.loop.run_until_complete(self.connector.delete(rng.choice(block_keys)))
                counts["deletes"] += 1
        return counts

    def stream(self, query_seed: int, nblocks: int, rounds: int) -> dict:
        """Overwrite one query round after round (payload seed = round),
        saying which round it is about to send: the parent kills it mid-way."""
        from harness import send, tokens

        query = tokens(nblocks, query_seed)
        for round_ in range(1, rounds + 1):
            print(json.dumps({"round": round_}), flush=True)
            send(self.manager, query, round_)
        return {"rounds": rounds}

    def check(self, query_seed: int, nblocks: int, payload_seeds: list[int]) -> dict:
        """Acquire a query once; which blocks came back, and whether each is
        one of the payloads a writer put there."""
        from harness import tokens

        allowed = block_hashes(query_seed, payload_seeds, nblocks, self.spec.block_nbytes)
        status = self.manager.acquire(None, tokens(nblocks, query_seed))
        if not status.is_ok():
            return {"blocks": 0, "bad_blocks": []}
        _, handle = status.get()
        bad = []
        try:
            tensors = handle.to_tensors()
            for i, tensor in enumerate(tensors):
                data = tensor.view(torch.uint8).view(-1).numpy().tobytes()
                if hashlib.sha1(data).hexdigest() not in allowed[i]:
                    bad.append(i)
        finally:
            handle.release()
        return {"blocks": len(tensors), "bad_blocks": bad}

    def leave(self, query_seed: int, nblocks: int, payload_seed: int) -> dict:
        """Put a query and exit at once without closing anything, as a vLLM
        process does: the writes are still pending (the store is slow in
        this process), and the manager is never closed."""
        from harness import send, tokens

        status = send(self.manager, tokens(nblocks, query_seed), payload_seed)
        return {"ok": status.is_ok(), "pending": self.connector.health()["write_behind_pending"], "exit": True}

    def leave_from_child(self, query_seed: int, nblocks: int, payload_seed: int, config: str) -> dict:
        """leave() in a multiprocessing child forked from this process, with
        its own manager on `config`, whose target returns (vLLM's engine-core
        and worker processes end that way, in os._exit: atexit never runs).
        `config` must name a store this process has not opened: LMDB cannot
        open one environment twice in a process, and a fork copies the handle."""
        import multiprocessing
        import os

        from harness import connector_of, send, tokens

        from aibrix_eic.config import ENV_CONFIG

        def child(conn) -> None:
            os.environ[ENV_CONFIG] = config
            manager = self.new_manager()
            status = send(manager, tokens(nblocks, query_seed), payload_seed)
            conn.send({"ok": status.is_ok(), "pending": connector_of(manager).health()["write_behind_pending"]})

        receiver, sender = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.get_context("fork").Process(target=child, args=(sender,))
        process.start()
        reply = receiver.recv()
        process.join(60)
        return {**reply, "exitcode": process.exitcode}

    def finish(self) -> dict:
        self.manager.close()
        return {"poison_violations": self.poison.check_all()}


def main() -> None:
    worker = Worker(json.loads(sys.argv[1]))
    print(json.dumps({"ready": True, "hash_of_text": hash("aibrix-eic")}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        reply = getattr(worker, command.pop("op"))(**command)
        print(json.dumps(reply), flush=True)
        if "poison_violations" in reply or reply.get("exit"):
            return


if __name__ == "__main__":
    main()
