"""Prometheus metrics, scraped the way an operator's Prometheus would: over
HTTP from the per-process exporter (metrics_port), and through a
MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR, which is how vLLM's
API server serves its workers' series. A workload through AIBrix's real
BaseKVCacheManager: a hit, a miss, an outage and the recovery each move
their series, and the series read the same numbers as health()."""

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from collections import defaultdict

import pytest
from harness import (
    BLOCK_NTOKENS,
    block_spec,
    connector_of,
    make_manager,
    manager_env,
    receive,
    send,
    tokens,
    use_config,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

import aibrix_eic
from aibrix_eic.config import EICConfig
from aibrix_eic.engine import get_store
from aibrix_eic.observability import metrics
from aibrix_eic.request import statuses as outcomes

PROBE_INTERVAL_S = 0.2
NBLOCKS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse(text: str) -> dict:
    """{(sample name, frozenset of labels): value}"""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


class Scrape:
    def __init__(self, samples: dict, namespace: str) -> None:
        self.samples = samples
        self.namespace = namespace

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` in our namespace matching labels."""
        wanted = {("eic_namespace", self.namespace), *labels.items()}
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        wanted = {("eic_namespace", self.namespace), *labels.items()}
        for (n, ls), v in self.samples.items():
            if n == name and wanted <= ls:
                totals[dict(ls)[label]] += v
        return dict(totals)


def offload(cache, query, seed):
    return send(cache, query, seed)


def reload_tokens(cache, query) -> int:
    return receive(cache, query)[0]


def config_values(**values):
    values.setdefault("remote_url", "local://metrics")
    if "put_mode" in EICConfig.__dataclass_fields__:
        values.setdefault("put_mode", "direct")  # puts counted when they are stored
    return values


@pytest.fixture
def scraped_manager(monkeypatch, tmp_path):
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"  # our series only
    manager_env(monkeypatch)
    use_config(
        monkeypatch, tmp_path,
        **config_values(
            eic_kv_ns=namespace, metrics_port=free_port(), probe_interval_s=PROBE_INTERVAL_S,
            get_timeout_ms=150, exists_timeout_ms=100, put_timeout_ms=200, breaker_failures=2, retry_attempts=1,
        ),
    )  # fmt: skip
    cache = make_manager(block_spec())
    port = metrics.exporter_port()
    assert port is not None

    def scrape() -> Scrape:
        metrics.publish_all()  # the sampled series, without waiting for the sampler
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return Scrape(parse(reply.read().decode()), namespace)

    yield cache, scrape
    get_store("metrics").faults.clear()
    cache.close()


def test_hit_miss_outage_and_recovery_move_their_series(scraped_manager):
    cache, scrape = scraped_manager
    block_nbytes = cache.block_spec.block_nbytes
    query = tokens(NBLOCKS, seed=1)
    before = scrape()
    assert before.value("aibrix_eic_breaker_open") == 0
    assert before.value("aibrix_eic_registered_bytes") > 0  # AIBrix registered its slabs
    assert before.value("aibrix_eic_requests_total", op="get", outcome="hit") == 0

    # A put, then a hit.
    assert offload(cache, query, seed=1).is_ok()
    assert reload_tokens(cache, query) == NBLOCKS * BLOCK_NTOKENS
    after_hit = scrape()
    assert after_hit.value("aibrix_eic_requests_total", op="put", outcome="ok") == 1
    assert after_hit.value("aibrix_eic_blocks_total", op="put", outcome="ok") == NBLOCKS
    assert after_hit.value("aibrix_eic_requests_total", op="get", outcome="hit") == 1
    assert after_hit.value("aibrix_eic_blocks_total", op="get", outcome="hit") == NBLOCKS
    assert after_hit.value("aibrix_eic_bytes_total", direction="out") == NBLOCKS * block_nbytes
    assert after_hit.value("aibrix_eic_bytes_total", direction="in") == NBLOCKS * block_nbytes
    assert after_hit.value("aibrix_eic_request_seconds_count", op="get") == 1
    assert after_hit.value("aibrix_eic_sdk_calls_total", op="get") >= 1
    assert after_hit.value("aibrix_eic_sdk_calls_in_flight") == 0

    # The scheduler's lookup: exists of every block, in mexist rounds.
    assert cache.exists(None, query).get() == NBLOCKS * BLOCK_NTOKENS
    after_exists = scrape()
    assert after_exists.value("aibrix_eic_requests_total", op="exists", outcome="hit") == NBLOCKS
    assert after_exists.value("aibrix_eic_request_seconds_count", op="exists") >= 1  # one per round
    assert after_exists.value("aibrix_eic_sdk_calls_total", op="exists") >= 1

    # A miss: a prompt never offloaded.
    assert reload_tokens(cache, tokens(4, seed=2)) == 0
    assert not cache.exists(None, tokens(4, seed=2)).is_ok()
    after_miss = scrape()
    assert after_miss.value("aibrix_eic_requests_total", op="get", outcome="miss") == 1
    assert after_miss.value("aibrix_eic_blocks_total", op="get", outcome="miss") == 4
    assert after_miss.value("aibrix_eic_blocks_total", op="get", outcome="hit") == NBLOCKS  # unchanged
    assert after_miss.value("aibrix_eic_requests_total", op="exists", outcome="miss") >= 1
    assert after_miss.value("aibrix_eic_requests_total", op="exists", outcome="hit") == NBLOCKS

    # An outage: EIC stops answering; the breaker opens, requests fail fast.
    store = get_store("metrics")
    store.faults.unreachable = True
    deadline = time.monotonic() + 10
    while not connector_of(cache).breaker.tripped:
        assert time.monotonic() < deadline, "the breaker never opened"
        reload_tokens(cache, query)
    assert reload_tokens(cache, query) == 0  # a fast miss
    during = scrape()
    assert during.value("aibrix_eic_breaker_open") == 1
    assert during.value("aibrix_eic_breaker_trips_total") == 1
    assert during.value("aibrix_eic_requests_total", op="get", outcome="error") >= 1
    assert during.value("aibrix_eic_blocks_total", op="get", outcome="error") >= NBLOCKS
    assert during.value("aibrix_eic_requests_total", op="get", outcome="fast_fail") >= 1
    assert during.value("aibrix_eic_blocks_total", op="get", outcome="fast_fail") >= NBLOCKS
    assert during.value("aibrix_eic_requests_total", op="get", outcome="hit") == 1

    # Recovery: the probe closes the breaker and hits resume.
    store.faults.clear()
    wait_until(lambda: reload_tokens(cache, query) == NBLOCKS * BLOCK_NTOKENS, what="hits to resume")
    after = scrape()
    assert after.value("aibrix_eic_breaker_open") == 0
    assert after.value("aibrix_eic_breaker_trips_total") == 1
    assert after.value("aibrix_eic_requests_total", op="get", outcome="hit") == 2
    assert after.value("aibrix_eic_bytes_total", direction="in") == 2 * NBLOCKS * block_nbytes

    # The series and health() read the same numbers.
    health = connector_of(cache).health()
    requests = after.by("aibrix_eic_requests_total", "outcome", op="get")
    blocks = after.by("aibrix_eic_blocks_total", "outcome", op="get")
    assert sum(requests.values()) - requests.get("fast_fail", 0) - requests.get("invalid", 0) == health["gets"]
    assert sum(blocks.values()) - blocks.get("fast_fail", 0) == health["get_blocks"]
    assert blocks["hit"] == health["get_hits"]
    assert blocks.get("error", 0) == health["get_errors"]
    assert blocks.get("timeout", 0) == health["get_timeouts"]
    put_blocks = after.by("aibrix_eic_blocks_total", "outcome", op="put")
    assert put_blocks.get("ok", 0) + put_blocks.get("error", 0) == health["put_blocks"]
    assert put_blocks.get("error", 0) == health["put_failures"]
    assert after.value("aibrix_eic_retries_total") == health["retries"]
    assert after.value("aibrix_eic_deadline_timeouts_total") == health["timeouts"]
    assert after.value("aibrix_eic_breaker_trips_total") == health["breaker_trips"]
    exists = after.by("aibrix_eic_requests_total", "outcome", op="exists")
    assert sum(exists.values()) - exists.get("fast_fail", 0) - exists.get("invalid", 0) == health["exists"]
    # ... and so does the process-wide aibrix_eic.health().
    assert any(h["conn_id"] == health["conn_id"] and h["gets"] == health["gets"] for h in aibrix_eic.health())


@pytest.mark.skipif("put_mode" not in EICConfig.__dataclass_fields__, reason="no write-behind in this build")
def test_exists_answered_from_queued_writes_is_counted(monkeypatch, tmp_path):
    namespace = f"metrics-wb-{uuid.uuid4().hex[:8]}"
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, remote_url="local://metrics-wb", eic_kv_ns=namespace, put_mode="write_behind")
    cache = make_manager(block_spec())
    store = get_store("metrics-wb")
    try:
        store.faults.latency_s = 0.5  # the flush is still in flight when exists asks
        query = tokens(4, seed=6)
        assert offload(cache, query, seed=6).is_ok()
        assert cache.exists(None, query).get() == 4 * BLOCK_NTOKENS
        text = generate_latest().decode()
        hits = Scrape(parse(text), namespace).value("aibrix_eic_requests_total", op="exists", outcome="hit")
        assert hits == 4
    finally:
        store.faults.clear()
        cache.close()


def test_labels_name_eic_namespace_model_and_partition_never_a_key(scraped_manager):
    cache, scrape = scraped_manager
    query = tokens(2, seed=3)
    assert offload(cache, query, seed=3).is_ok()
    samples = scrape().samples
    ours = [labels for (name, labels) in samples if name.startswith("aibrix_eic_")]
    assert ours
    label_names = {name for labels in ours for name, _ in labels}
    assert {"eic_namespace", "model", "partition"} <= label_names
    # identity: the model identity token (connector_open), the same for every key of a connector
    assert label_names <= {"eic_namespace", "model", "partition", "op", "outcome", "direction", "le", "identity"}
    # Not `namespace`: Prometheus attaches the pod's Kubernetes namespace under
    # that name when it scrapes, and the Prometheus Operator renames a clashing
    # series label to exported_namespace (docs/operations.md#metrics).
    assert "namespace" not in label_names
    partitions = {value for labels in ours for name, value in labels if name == "partition"}
    conn_id = connector_of(cache).conn_id
    assert metrics.partition_of(conn_id) in partitions and metrics.partition_of(conn_id) != conn_id


def test_metrics_false_records_nothing(monkeypatch, tmp_path):
    namespace = f"metrics-off-{uuid.uuid4().hex[:8]}"
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, **config_values(eic_kv_ns=namespace, metrics=False))
    cache = make_manager(block_spec())
    try:
        assert offload(cache, tokens(2, seed=4), seed=4).is_ok()
        assert reload_tokens(cache, tokens(2, seed=4)) == 2 * BLOCK_NTOKENS
        text = generate_latest().decode()
        assert namespace not in text
        assert connector_of(cache).health()["get_hits"] == 2  # health() still counts
    finally:
        cache.close()


@pytest.mark.parametrize(
    "op,result,outcome",
    [
        ("get", "all-ok", "hit"),
        ("get", "ok-then-miss", "partial"),
        ("get", "miss", "miss"),
        ("get", "fast", "fast_fail"),
        ("get", "timeout", "timeout"),
        ("get", "error", "error"),
        ("get", "invalid", "invalid"),
        ("put", "all-ok", "ok"),
        ("put", "put-skipped", "fast_fail"),
        ("put", "error", "error"),
        ("exists", "ok", "hit"),
        ("exists", "miss", "miss"),
        ("exists", "fast", "fast_fail"),
        ("delete", "ok", "ok"),
        ("delete", "miss", "miss"),
        ("delete", "delete-skipped", "fast_fail"),
    ],
)
def test_request_outcomes(op, result, outcome):
    from aibrix_kvcache.status import Status, StatusCodes

    ok, miss = Status.ok(), Status(StatusCodes.NOT_FOUND)
    results = {
        "all-ok": [ok, ok],
        "ok-then-miss": [ok, miss],
        "miss": [miss, miss] if op == "get" else miss,
        "fast": [outcomes.FAST_MISS] * 2 if op == "get" else outcomes.FAST_MISS,
        "timeout": [Status(StatusCodes.TIMEOUT, "t")] * 2,
        "error": Status(StatusCodes.ERROR, "e"),
        "invalid": Status(StatusCodes.INVALID, "i"),
        "put-skipped": outcomes.PUT_SKIPPED,
        "delete-skipped": outcomes.DELETE_SKIPPED,
        "ok": ok,
    }
    assert outcomes.request_outcome(op, results[result]) == outcome


@pytest.mark.parametrize(
    "conn_id,partition",
    [
        ("aibrix_h0_7_l0_79_lcnd16roc", "h0_7_l0_79"),
        ("my_ns_h8_15_l0_79", "h8_15_l0_79"),
        ("check", "check"),
    ],
)
def test_partition_is_the_tp_ranks_slice_of_the_conn_id(conn_id, partition):
    assert metrics.partition_of(conn_id) == partition


WORKER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    import aibrix_kvcache.cache_manager as cache_manager
    cache_manager.TESTING_DISABLE_PIN_MEMORY = True
    import aibrix_eic
    aibrix_eic.install()
    from harness import block_spec, make_manager, receive, send, tokens
    cache = make_manager(block_spec(first_head={first_head}))
    assert send(cache, tokens(4, seed=5), seed=5).is_ok()
    assert receive(cache, tokens(4, seed=5))[0] == 64
    cache.close()
    """
)


def test_worker_processes_reach_a_multiprocess_collector(tmp_path):
    """What vLLM does: TP workers are separate processes with
    PROMETHEUS_MULTIPROC_DIR in their environment; the API server's
    /metrics is a MultiProcessCollector over that directory."""
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    namespace = f"metrics-mp-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "eic.yaml"
    import yaml

    config.write_text(yaml.safe_dump(config_values(remote_url="local://mp", eic_kv_ns=namespace)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_")}
    env.update(
        {
            metrics.MULTIPROC_ENV: str(multiproc_dir),
            "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
            "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
            "AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED": "0",
        }
    )
    tests_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    workers = [  # two TP ranks: heads 0-1 and 2-3
        subprocess.Popen(
            [sys.executable, "-c", WORKER.format(tests=tests_dir, first_head=first_head)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for first_head in (0, 2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc_dir))
    scrape = Scrape(parse(generate_latest(registry).decode()), namespace)
    by_partition = scrape.by("aibrix_eic_blocks_total", "partition", op="get", outcome="hit")
    assert by_partition == {"h0_1_l0_1": 4.0, "h2_3_l0_1": 4.0}
    assert scrape.value("aibrix_eic_requests_total", op="put", outcome="ok") == 2
    assert scrape.value("aibrix_eic_request_seconds_count", op="get") == 2
    assert scrape.by("aibrix_eic_breaker_open", "partition") == {"h0_1_l0_1": 0.0, "h2_3_l0_1": 0.0}


def test_write_behind_series_show_pending_bytes_and_lost_blocks(monkeypatch, tmp_path):
    namespace = f"metrics-wbs-{uuid.uuid4().hex[:8]}"
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, remote_url="local://metrics-wbs", eic_kv_ns=namespace, put_mode="write_behind",
               retry_attempts=0)  # fmt: skip
    cache = make_manager(block_spec())
    store = get_store("metrics-wbs")
    write_behind = connector_of(cache).write_behind
    block_nbytes = cache.block_spec.block_nbytes

    def scrape() -> Scrape:
        metrics.publish_all()  # the sampled gauge, without waiting for the sampler
        return Scrape(parse(generate_latest().decode()), namespace)

    try:
        store.faults.latency_s = 0.5  # the flush is still in flight while we look
        assert send(cache, tokens(4, seed=7), seed=7).is_ok()
        held = scrape()
        assert held.value("aibrix_eic_write_behind_pending_bytes") == 4 * block_nbytes
        assert held.value("aibrix_eic_write_behind_blocks_total", outcome="accepted") == 4
        assert write_behind.wait_idle(10)
        flushed = scrape()
        assert flushed.value("aibrix_eic_write_behind_pending_bytes") == 0
        assert flushed.value("aibrix_eic_write_behind_flushes_total") >= 1
        assert flushed.value("aibrix_eic_write_behind_blocks_total", outcome="lost") == 0

        store.faults.latency_s = 0.0
        store.faults.key_fail_rate = 1.0  # every key of the next flush fails
        query = tokens(3, seed=8)
        assert send(cache, query, seed=8).is_ok()  # accepted: the caller does not hear of the failure
        assert write_behind.wait_idle(10)
        store.faults.key_fail_rate = 0.0
        assert scrape().value("aibrix_eic_write_behind_blocks_total", outcome="lost") == 3
        assert receive(cache, query, seed=8) == (0, True)  # a miss, never other bytes
    finally:
        store.faults.clear()
        cache.close()
    assert scrape().value("aibrix_eic_write_behind_pending_bytes") == 0
