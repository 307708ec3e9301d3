"""Cross-engine reuse: separate vLLM servers on one shared engine store
(`local://cross?dir=...`), each with its own PYTHONHASHSEED.

Servers run in three stages (this machine fits two at once), and the store
carries what the first stage wrote into the later ones:

1. replicas A (AIBrix L1 off) and B (L1 on, AIBrix's defaults: ingestion
   HOT, synchronous writes), side by side: A computes and offloads p0-p2,
   B's reload of p0 comes from L2 (its L1 is empty), and A reuses p3 that B
   computed and then read twice (the read makes p3 hot, which is when HOT
   ingestion writes it to L2);
2. with A and B stopped (no process has the store open), a restart of A's
   settings reuses p1, and A's weights under a second path without model_id
   reuse nothing of p0 and give their own computed outputs;
3. a different model with the same KV shapes reuses nothing of p0 either;
   the suite's baseline server starts beside it.

TP=2 replicas, and replicas sharing through model_id across mount paths,
are in test_tp2.py.
"""

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    assert_same_output,
    identity_token,
    open_line,
    ready,
    shared_store_url,
    start_server,
    start_servers,
    stop_server,
    write_config,
)
from server import ENGINE_BLOCK, Completion, Server, metric_value

STORE = "cross"
NAMESPACE = "e2e-cross"  # every server here: only the model identity keeps models apart
BLOCKS = FULL_REUSE // ENGINE_BLOCK  # engine keys of one prompt's offload
# the bar for a replica's reuse of a prompt another server computed
MIN_REUSE = 0.95 * FULL_REUSE

_live: list[Server] = []  # this module's current stage


def _stop_stage() -> None:
    stop_server(*_live)
    _live.clear()


def _stage(*specs: dict) -> list[Server]:
    """Stop the previous stage's servers, start these side by side."""
    _stop_stage()
    servers = start_servers(*specs)
    _live.extend(servers)
    return servers


@pytest.fixture(scope="module", autouse=True)
def _stop_last_stage():
    yield
    _stop_stage()


@pytest.fixture(scope="module")
def url(workdir) -> str:
    return shared_store_url(workdir, STORE)


def _spec(name: str, model_dir, workdir, url: str, hash_seed: int, **env: str) -> dict:
    yaml = write_config(workdir, name, f"remote_url: {url}\neic_kv_ns: {NAMESPACE}\n")
    env = {"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(yaml), "PYTHONHASHSEED": str(hash_seed), **env}
    return dict(name=name, model_dir=model_dir, workdir=workdir, env=env)


def _series(samples: dict, name: str, **labels: str) -> float:
    return metric_value(samples, name, eic_namespace=NAMESPACE, **labels)


def _hits(server: Server) -> int:
    """Blocks this server's engine processes read from the shared store."""
    return sum(s["stores"][STORE]["hits"] for s in server.fresh_stats().values())


class Replicas:
    def __init__(self, a: Server, b: Server) -> None:
        self.a, self.b = a, b
        self.computed: dict[str, Completion] = {}  # A's first sends: computed prefill


@pytest.fixture(scope="module")
def replicas(model_dir, workdir, url) -> Replicas:
    """Stage 1. Both servers are up before A writes anything, so B sees
    writes made after it opened the store."""
    metrics_dir = workdir / "cross-b-prometheus"
    metrics_dir.mkdir(exist_ok=True)
    a, b = _stage(
        _spec("cross-a", model_dir, workdir, url, hash_seed=1),
        _spec(
            "cross-b",
            model_dir,
            workdir,
            url,
            hash_seed=2,
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
            AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED="1",  # AIBrix's default; ingestion and writes stay its defaults
            AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB="0.05",  # the default 10 GB does not fit here
        ),
    )
    replicas = Replicas(a, b)
    for name in ("p0", "p1", "p2"):
        first = a.complete(PROMPTS[name])
        assert a.sent(first) == FULL_REUSE and a.reuse(first) == 0, name
        replicas.computed[name] = first
    a.flushed_stats()  # written behind: in the store once flushed
    return replicas


# ------------------------------------------------------------ 1: replicas


def test_replicas_open_one_store_with_one_identity(replicas, url):
    a, b = replicas.a, replicas.b
    for server in (a, b):
        server.wait_log(open_line(url, NAMESPACE))
    assert a.env["PYTHONHASHSEED"] != b.env["PYTHONHASHSEED"]
    assert identity_token(a) == identity_token(b)


def test_replica_reuses_what_the_other_computed(replicas):
    b = replicas.b
    assert b.env["AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED"] == "1"
    before = b.metrics()
    hits_before = _hits(b)
    reload = b.complete(PROMPTS["p0"])
    assert b.reuse(reload) >= MIN_REUSE, f"B reused {b.reuse(reload)} of p0's {FULL_REUSE} tokens"
    assert b.reuse(reload) == FULL_REUSE
    assert_same_output(reload, replicas.computed["p0"], "B's reload of A's p0")
    # B's L1 is on but empty: every block was read from the shared store by
    # B's own worker, and counted on B's /metrics
    assert _hits(b) - hits_before == BLOCKS, "B's reload did not read p0's blocks from our L2"
    after = b.metrics()
    for name in ("aibrix_eic_requests_total", "aibrix_eic_blocks_total"):
        moved = _series(after, name, op="get", outcome="hit") - _series(before, name, op="get", outcome="hit")
        assert moved > 0, f"B's /metrics counted no {name} get hit for the reload"


def test_reuse_goes_both_ways(replicas):
    a, b = replicas.a, replicas.b
    first = b.complete(PROMPTS["p3"])
    assert b.sent(first) == FULL_REUSE and b.reuse(first) == 0
    # HOT ingestion: p3 reaches L2 when B reads it from its L1
    hits_before = _hits(b)
    again = b.complete(PROMPTS["p3"])
    assert b.reuse(again) == FULL_REUSE
    assert _hits(b) == hits_before, "B read p3 from L2, not from its L1"
    b.flushed_stats()
    reload = a.complete(PROMPTS["p3"])
    assert a.reuse(reload) == FULL_REUSE
    assert_same_output(reload, first, "A's reload of B's p3")


def test_vllm_metrics_shows_our_series(replicas):
    """After the tests above, B has reloaded (p0) and offloaded (p3): our
    series from its TP worker are on vLLM's own /metrics
    (PROMETHEUS_MULTIPROC_DIR set)."""
    samples = replicas.b.metrics()
    assert any(name.startswith("vllm:") for name, _ in samples), "vLLM's own series are missing"
    # AIBrix's cache blocks are not the engine's; count what moved.
    assert _series(samples, "aibrix_eic_blocks_total", op="put", outcome="ok") > 0
    assert _series(samples, "aibrix_eic_blocks_total", op="get", outcome="hit") > 0
    assert _series(samples, "aibrix_eic_requests_total", op="get", outcome="hit") >= 1
    # puts were written behind (the default put_mode), and no hit was served from a pending write
    accepted, served = (
        _series(samples, "aibrix_eic_write_behind_blocks_total", outcome=outcome) for outcome in ("accepted", "served")
    )
    assert accepted > 0 and served == 0, (accepted, served)
    assert _series(samples, "aibrix_eic_bytes_total", direction="in") > 0
    partitions = {dict(ls).get("partition") for (n, ls) in samples if n == "aibrix_eic_breaker_open"}
    assert partitions and all(p.startswith("h0_1_l0_1") for p in partitions), partitions
    assert _series(samples, "aibrix_eic_breaker_open") == 0


# ------------------------------------------------------------ 2: restart, another mount


@pytest.fixture(scope="module")
def restarted(replicas, model_dir, second_mount, workdir, url) -> tuple[Server, Server]:
    """Stage 2: A and B stop first, so every process that had the store open
    has exited; the data must come from the store's directory."""
    return _stage(
        _spec("cross-a-restarted", model_dir, workdir, url, hash_seed=3),
        _spec("cross-other-mount", second_mount, workdir, url, hash_seed=4),  # no model_id
    )


def test_a_restart_reuses_what_the_stopped_servers_stored(replicas, restarted):
    server, _ = restarted
    assert replicas.a.proc.poll() is not None and replicas.b.proc.poll() is not None
    reload = server.complete(PROMPTS["p1"])  # computed by A only, read by nobody before
    assert server.reuse(reload) == FULL_REUSE
    assert_same_output(reload, replicas.computed["p1"], "restart's reload of p1")


def test_another_mount_path_without_model_id_shares_nothing(replicas, restarted, second_mount):
    _, server = restarted
    assert identity_token(server) != identity_token(replicas.a)
    assert f'model="{second_mount}"' in server.log(), "vLLM resolved the second mount to the first path"
    first = server.complete(PROMPTS["p0"])
    assert server.reuse(first) == 0, "a server at another weights path without model_id reused A's p0"
    assert_same_output(first, replicas.computed["p0"], "same weights, computed")


# ------------------------------------------------------------ 3: another model


@pytest.fixture(scope="module")
def stranger(replicas, model_dir, alt_model_dir, workdir, url, request) -> Server:
    """Stage 3: a server whose KV must not be A's, on A's store. The suite's
    baseline (a session fixture) starts beside it, on the core it leaves."""
    _stop_stage()
    server = start_server(wait=False, **_spec("cross-other-model", alt_model_dir, workdir, url, hash_seed=5))
    _live.append(server)
    request.getfixturevalue("baseline")
    return ready(server)


def test_another_model_reuses_nothing_and_computes(replicas, stranger):
    server = stranger
    assert identity_token(server) != identity_token(replicas.a)
    first = server.complete(PROMPTS["p0"])
    assert server.reuse(first) == 0, "another model reused p0's KV from A"
    # the models really differ, so KV read across them would show
    assert first.token_ids != replicas.computed["p0"].token_ids
    # and its own entries serve it: the store works for this model
    server.flushed_stats()
    again = server.complete(PROMPTS["p0"])
    assert server.reuse(again) == FULL_REUSE
    assert_same_output(again, first, "other model's reload of its own p0")
