"""Cross-process reuse through AIBrix: OS processes, each with its own
PYTHONHASHSEED, its own BaseKVCacheManager and this connector, on one shared
engine store (remote_url local://xp?dir=...), as replicas on one node share
EIC. What one puts another acquires whole and bit-exact; the model identity
and every key are the same in each; concurrent overwrites and deletes, and a
writer SIGKILLed mid-put, never hand anyone a foreign or torn block; and no
process writes into memory AIBrix released (tests/support/poison.py).

Each process is tests/support/xproc_worker.py, driven over its stdin and stdout.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from harness import write_config

import aibrix_eic
from aibrix_eic.config import ENV_CONFIG

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
TESTS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"
)  # the worker, harness.py
SMALL_BLOCKS = {"heads": 2, "layers": 2, "head_size": 64}  # 16 KiB blocks
NBLOCKS = 8
BLOCK_NTOKENS = 16

# What harness.manager_env sets, for processes that pytest's monkeypatch cannot reach.
MANAGER_ENV = {
    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "8",
    "AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED": "0",
}


class WorkerProcess:
    """A running xproc_worker.py: call(op, **args) sends one command and
    returns its reply."""

    def __init__(self, config_path: str, hash_seed: int, blocks: dict, log_dir: str) -> None:
        env = {
            **os.environ,
            **MANAGER_ENV,
            "PYTHONHASHSEED": str(hash_seed),
            "PYTHONPATH": os.pathsep.join([REPO_ROOT, TESTS_DIR]),
            ENV_CONFIG: config_path,
        }
        self.log_path = os.path.join(log_dir, f"worker-{hash_seed}.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(TESTS_DIR, "xproc_worker.py"), json.dumps(blocks)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                cwd=REPO_ROOT,
            )
        self.hello: dict | None = None

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            with open(self.log_path) as log:
                raise AssertionError(f"worker {self.proc.pid} ended: {log.read()[-3000:]}")
        return json.loads(line)

    def ready(self) -> "WorkerProcess":
        self.hello = self.read()
        return self

    def send(self, op: str, **args) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def call(self, op: str, **args) -> dict:
        self.send(op, **args)
        return self.read()

    def finish(self) -> list[str]:
        """Close the manager; the poison watch's findings. The process is
        then killed: a graceful exit only spends time tearing torch down."""
        violations = self.call("finish")["poison_violations"]
        self.kill()
        return violations

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)


def start_workers(directory: str, hash_seeds: list[int], blocks: dict) -> list[WorkerProcess]:
    config = write_config(os.path.join(directory, "eic.yaml"), remote_url=f"local://xp?dir={directory}/store&create=1")
    workers = [WorkerProcess(config, seed, blocks, directory) for seed in hash_seeds]
    return [worker.ready() for worker in workers]  # they start in parallel


@pytest.fixture(scope="module")
def store_dir():
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="aibrix-eic-xproc-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def four(store_dir):
    """Four processes with hash seeds 1..4 on one store, checked at the end
    for writes into released memory."""
    workers = start_workers(store_dir, [1, 2, 3, 4], SMALL_BLOCKS)
    try:
        yield workers
        alive = [worker for worker in workers if worker.proc.poll() is None]  # one test kills one
        violations = {worker.hello["hash_of_text"]: worker.finish() for worker in alive}
        assert all(not found for found in violations.values()), violations
    finally:
        for worker in workers:
            worker.kill()


def test_the_processes_hash_text_differently(four):
    # Without this the tests below could not catch a key that hashes per process.
    assert len({worker.hello["hash_of_text"] for worker in four}) == 4


def test_model_identity_and_every_key_are_the_same_in_every_process(four):
    replies = [worker.call("identity", query_seeds=[1, 2, 3], nblocks=NBLOCKS) for worker in four]
    assert replies[0]["token"], "the identity must come from the published vLLM config"
    assert all(len(keys) == NBLOCKS for keys in replies[0]["keys"].values())
    assert all(reply == replies[0] for reply in replies[1:]), replies


def test_what_one_process_puts_another_acquires_whole_and_bit_exact(four):
    writer, reader = four[0], four[1]
    assert writer.call("put", query_seed=10, nblocks=NBLOCKS, payload_seed=501)["ok"]
    assert reader.call("get", query_seed=10, nblocks=NBLOCKS, payload_seed=501) == {
        "ntokens": NBLOCKS * BLOCK_NTOKENS,
        "exact": True,
    }
    # And back, from a process with yet another hash seed.
    assert reader.call("put", query_seed=11, nblocks=NBLOCKS, payload_seed=502)["ok"]
    assert writer.call("get", query_seed=11, nblocks=NBLOCKS, payload_seed=502)["ntokens"] == NBLOCKS * BLOCK_NTOKENS


def test_each_of_four_processes_reads_what_every_other_put(four):
    for i, worker in enumerate(four):
        assert worker.call("put", query_seed=20 + i, nblocks=NBLOCKS, payload_seed=600 + i)["ok"]
    for j, reader in enumerate(four):
        for i in range(len(four)):
            if i != j:
                reply = reader.call("get", query_seed=20 + i, nblocks=NBLOCKS, payload_seed=600 + i)
                assert reply == {"ntokens": NBLOCKS * BLOCK_NTOKENS, "exact": True}, (i, j, reply)


def test_concurrent_overwrites_and_deletes_never_hand_out_a_foreign_or_torn_block(four):
    queries = [30, 31, 32]
    # seed = query * 1000 + version * 100 + worker: each worker puts its own
    # versions, and a reader accepts any worker's version of that block.
    payload_seeds = {str(q): [q * 1000 + v * 100 + w for v in range(3) for w in range(4)] for q in queries}
    for w, worker in enumerate(four):
        worker.send("churn", steps=80, query_seeds=queries, nblocks=NBLOCKS, payload_seeds=payload_seeds, rng_seed=w)
    counts = [worker.read() for worker in four]
    assert [c["bad_blocks"] for c in counts] == [[]] * 4, counts
    assert sum(c["blocks_checked"] for c in counts) > 0 and sum(c["deletes"] for c in counts) > 0, counts


@pytest.mark.parametrize("how", ["leave", "leave_from_child"])
def test_writes_pending_when_a_process_exits_without_close_are_flushed(four, store_dir, how):
    """vLLM never closes AIBrix's cache manager (only its __del__ does, and a
    finalizer must not flush), so a process that exits normally must still
    flush what it accepted. `leave`: the interpreter exits; `leave_from_child`:
    a forked multiprocessing child returns from its target (os._exit), as
    vLLM's engine-core and worker processes do on SIGTERM."""
    query_seed = 50 if how == "leave" else 51
    slow = write_config(
        os.path.join(store_dir, f"slow-{how}.yaml"),
        remote_url=f"local://xp?dir={store_dir}/store&create=1&latency=400ms",
    )
    own_config, args = slow, {}
    if how == "leave_from_child":  # the child writes; the parent keeps to a store of its own (see leave_from_child)
        own_config = write_config(
            os.path.join(store_dir, "parent.yaml"), remote_url=f"local://parent?dir={store_dir}/p&create=1"
        )
        args["config"] = slow
    leaving = WorkerProcess(own_config, 9, SMALL_BLOCKS, store_dir).ready()
    try:
        reply = leaving.call(how, query_seed=query_seed, nblocks=NBLOCKS, payload_seed=700, **args)
        assert reply["ok"] and reply["pending"] > 0, f"nothing was pending at exit: the test proves nothing {reply}"
        assert reply.get("exitcode", 0) == 0, reply
        if how == "leave":
            assert leaving.proc.wait(timeout=60) == 0
    finally:
        leaving.kill()
    check = four[0].call("check", query_seed=query_seed, nblocks=NBLOCKS, payload_seeds=[700])
    assert check == {"blocks": NBLOCKS, "bad_blocks": []}, check


def test_after_the_writers_flush_another_process_reads_every_block(four, store_dir):
    """AIBrix's PD prefiller puts a prompt, calls the manager's flush() and
    then answers, and the decoder reads the prompt from the L2 in another
    process at once. With write-behind (the default) a put returns before
    its blocks are stored; flush() must not (aibrix_compat/flush.py). The
    writer's store is slow, so without that wait the reader would miss."""
    slow = write_config(
        os.path.join(store_dir, "slow-flush.yaml"),
        remote_url=f"local://xp?dir={store_dir}/store&create=1&latency=300ms",
    )
    writer = WorkerProcess(slow, 8, SMALL_BLOCKS, store_dir).ready()
    try:
        reply = writer.call("put_then_flush", query_seed=60, nblocks=NBLOCKS, payload_seed=800)
        assert reply["ok"] and reply["pending_after_put"] > 0, f"nothing was pending: the test proves nothing {reply}"
        assert reply["pending_after_flush"] == 0 and reply["flush"].endswith("OK)"), reply
        assert four[1].call("get", query_seed=60, nblocks=NBLOCKS, payload_seed=800) == {
            "ntokens": NBLOCKS * BLOCK_NTOKENS,
            "exact": True,
        }
    finally:
        writer.kill()


def test_a_writer_killed_mid_put_never_makes_another_process_read_a_partial_block(four):
    """The writer overwrites one query round after round (payload seed =
    round) and is SIGKILLed in the middle; the reader gets blocks that are
    each one round's whole block, or none. Last in this file: it kills one
    of the four."""
    writer, reader = four[3], four[0]
    nblocks = 64
    writer.send("stream", query_seed=40, nblocks=nblocks, rounds=10_000)
    while (last_round := writer.read()["round"]) < 6:
        pass
    writer.proc.send_signal(signal.SIGKILL)
    writer.proc.wait(timeout=60)
    reply = reader.call("check", query_seed=40, nblocks=nblocks, payload_seeds=list(range(1, last_round + 1)))
    assert reply["bad_blocks"] == [], reply
    assert reply["blocks"] > 0, "nothing the writer flushed before it died was read"
