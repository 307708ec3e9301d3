"""`aibrix-eic status`: per-rank state, rates and the exit code, from
recorded /metrics pages (a vLLM API server's page as it looks with the
workers' series merged in), from the series our own ConnectorMetrics
writes (so the names the reader looks for are the names we export), and
from a prometheus_client multiprocess directory written by another process.
The e2e suite (tests/e2e/test_faults.py) reads real vLLM servers."""

import http.server
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest
from prometheus_client import REGISTRY, generate_latest

from aibrix_eic.cli import main
from aibrix_eic.cli.status_judge import DEGRADED, DOWN, HEALTHY, UNREACHABLE, judge
from aibrix_eic.cli.status_read import Unreachable, metrics_url, parse_text, read_directory
from aibrix_eic.observability.metrics import ConnectorMetrics

RANK = 'eic_namespace="prod",model="llama",partition="h0_7_l0_79"'


def page(
    *,
    hits: float = 0,
    misses: float = 0,
    gets: float = 0,
    errors: float = 0,
    timeouts: float = 0,
    fast_fails: float = 0,
    breaker: float = 0,
    trips: float = 0,
    opened: float | None = 1,
    accepted: float = 0,
    lost: float = 0,
    store: bool = True,
    vllm_hits: float = 0,
    vllm_queries: float = 0,
) -> str:
    """A /metrics page of a one-rank server: vLLM's series and ours."""
    lines = [
        "# TYPE vllm:external_prefix_cache_queries counter",
        f'vllm:external_prefix_cache_queries_total{{engine="0",model_name="tiny"}} {vllm_queries}',
        "# TYPE vllm:external_prefix_cache_hits counter",
        f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="tiny"}} {vllm_hits}',
        "# TYPE aibrix_eic_requests counter",
        f'aibrix_eic_requests_total{{{RANK},op="get",outcome="hit"}} {gets}',
        f'aibrix_eic_requests_total{{{RANK},op="get",outcome="error"}} {errors}',
        f'aibrix_eic_requests_total{{{RANK},op="get",outcome="timeout"}} {timeouts}',
        f'aibrix_eic_requests_total{{{RANK},op="get",outcome="fast_fail"}} {fast_fails}',
        f'aibrix_eic_requests_total{{{RANK},op="put",outcome="ok"}} {gets}',
        "# TYPE aibrix_eic_blocks counter",
        f'aibrix_eic_blocks_total{{{RANK},op="get",outcome="hit"}} {hits}',
        f'aibrix_eic_blocks_total{{{RANK},op="get",outcome="miss"}} {misses}',
        "# TYPE aibrix_eic_bytes counter",
        f'aibrix_eic_bytes_total{{{RANK},direction="in"}} {hits * 65536}',
        "# TYPE aibrix_eic_breaker_open gauge",
        f"aibrix_eic_breaker_open{{{RANK}}} {breaker}",
        "# TYPE aibrix_eic_breaker_trips counter",
        f"aibrix_eic_breaker_trips_total{{{RANK}}} {trips}",
        "# TYPE aibrix_eic_write_behind_blocks counter",
        f'aibrix_eic_write_behind_blocks_total{{{RANK},outcome="accepted"}} {accepted}',
        f'aibrix_eic_write_behind_blocks_total{{{RANK},outcome="lost"}} {lost}',
        "# TYPE aibrix_eic_write_behind_pending_bytes gauge",
        f"aibrix_eic_write_behind_pending_bytes{{{RANK}}} 131072",
    ]
    if opened is not None:
        lines += [
            "# TYPE aibrix_eic_connector_open gauge",
            f'aibrix_eic_connector_open{{{RANK},identity="tok"}} {opened}',
        ]
    if store:
        lines += [
            "# TYPE aibrix_eic_store_used_bytes gauge",
            f"aibrix_eic_store_used_bytes{{{RANK}}} 1048576",
            "# TYPE aibrix_eic_store_capacity_bytes gauge",
            f"aibrix_eic_store_capacity_bytes{{{RANK}}} 4194304",
        ]
    return "\n".join(lines) + "\n"


def two(before: str, after: str, seconds: float = 2.0):
    return judge(parse_text(after, "url", at=10.0 + seconds), parse_text(before, "url", at=10.0))


def test_healthy_with_hits_reports_rates_over_the_window():
    report = two(page(hits=10, misses=10, gets=2), page(hits=40, misses=20, gets=6, vllm_hits=960, vllm_queries=1280))
    assert report.code == HEALTHY and report.verdict == "healthy: 1 rank"
    (rank,) = report.ranks
    assert (rank.partition, rank.eic_namespace, rank.model, rank.identity, rank.state) == (
        "h0_7_l0_79",
        "prod",
        "llama",
        "tok",
        "open",
    )
    assert rank.hit_rate == pytest.approx(30 / 40)  # the window's blocks, not the totals
    assert rank.hit_rate_total == pytest.approx(40 / 60)
    assert rank.get_requests == 4 and rank.get_requests_per_s == pytest.approx(2.0)  # 4 gets in 2 s
    assert judge(parse_text(page(gets=6))).ranks[0].get_requests_per_s is None  # one reading: no rate
    assert rank.bytes_loaded == 30 * 65536
    assert rank.store_used_bytes == 1 << 20 and rank.store_capacity_bytes == 4 << 20
    assert report.vllm_model == "tiny" and (report.vllm_reused_tokens, report.vllm_queried_tokens) == (960, 1280)


def test_idle_is_healthy():
    assert two(page(), page()).code == HEALTHY


def test_errors_in_the_window_degrade_but_old_ones_do_not():
    failing = two(page(gets=10, errors=5), page(gets=20, errors=9))
    assert failing.code == DEGRADED
    assert "errors 17%" in failing.verdict  # 4 of the window's 24 requests (10 gets, 10 puts, 4 failed)
    recovered = two(page(gets=10, errors=5), page(gets=30, errors=5))
    assert recovered.code == HEALTHY


def test_exists_calls_do_not_dilute_failing_gets():
    """As in the e2e suite: one get failing, with the 31 exists calls AIBrix
    made for its prompt's blocks in the same window."""
    exists = f'aibrix_eic_requests_total{{{RANK},op="exists",outcome="hit"}} '
    before = page(gets=1).replace("# TYPE aibrix_eic_blocks", exists + "0\n# TYPE aibrix_eic_blocks")
    after = page(gets=1, errors=1).replace("# TYPE aibrix_eic_blocks", exists + "31\n# TYPE aibrix_eic_blocks")
    report = two(before, after)
    assert report.code == DEGRADED and report.ranks[0].requests == 1 and report.ranks[0].error_rate == 1.0


def test_timeouts_lost_writes_and_flapping_breaker_degrade():
    assert two(page(gets=10), page(gets=20, timeouts=2)).code == DEGRADED
    lost = two(page(accepted=100), page(accepted=200, lost=20))
    assert lost.code == DEGRADED and "write-behind lost 20 blocks" in lost.verdict
    assert two(page(trips=1), page(trips=2)).code == DEGRADED  # opened and closed again in the window


def test_breaker_open_is_down():
    report = two(page(gets=5), page(gets=5, fast_fails=8, breaker=1, trips=1))
    assert report.code == DOWN and report.ranks[0].state == "breaker open"
    assert report.verdict.startswith("down: h0_7_l0_79: circuit breaker open")


def test_closed_connector_is_down_and_old_builds_read_as_unknown():
    assert two(page(), page(opened=0)).ranks[0].state == "closed"
    assert two(page(), page(opened=0)).code == DOWN
    unknown = two(page(opened=None), page(opened=None))
    assert unknown.ranks[0].state == "unknown" and unknown.ranks[0].identity is None and unknown.code == HEALTHY


def test_restarted_worker_counts_from_zero():
    report = two(page(hits=100, misses=0, gets=50), page(hits=3, misses=1, gets=1))
    assert report.ranks[0].hit_rate == pytest.approx(3 / 4)


def test_a_page_without_our_series_is_unreachable():
    vllm_only = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="tiny"} 0\n'
    report = judge(parse_text(vllm_only))
    assert report.code == UNREACHABLE and "no aibrix_eic_* series" in report.verdict


def test_metrics_url_forms():
    assert metrics_url("10.0.0.1:8000") == "http://10.0.0.1:8000/metrics"
    assert metrics_url("http://pod:8000") == "http://pod:8000/metrics"
    assert metrics_url("http://pod:8000/metrics") == "http://pod:8000/metrics"


def test_the_series_our_connectors_export_are_the_ones_read():
    """ConnectorMetrics itself, scraped from the default registry: a renamed
    series would leave status reading nothing."""
    ns = f"status-{uuid.uuid4().hex[:8]}"
    metrics = ConnectorMetrics(ns, "m", "h0_1_l0_1")
    metrics.opened("ident")
    before = parse_text(generate_latest(REGISTRY).decode(), at=0.0)
    metrics.counted({"get_blocks": 8, "get_hits": 6, "get_errors": 2})
    metrics.count_requests("get", "partial", 1)
    metrics.count_requests("get", "error", 1)
    metrics.counted({"write_behind_blocks": 10, "write_behind_lost": 1})
    metrics.breaker_changed(True)
    after = parse_text(generate_latest(REGISTRY).decode(), at=1.0)
    (rank,) = [r for r in judge(after, before).ranks if r.eic_namespace == ns]
    assert (rank.identity, rank.state, rank.get_blocks, rank.hit_blocks) == ("ident", "breaker open", 8, 6)
    assert rank.error_rate == pytest.approx(0.5) and rank.write_behind_lost == 1 and rank.breaker_trips == 1
    assert rank.code == DOWN and "errors 50%" in ", ".join(rank.reasons)
    metrics.breaker_changed(False)
    metrics.closed()
    (closed,) = [r for r in judge(parse_text(generate_latest(REGISTRY).decode())).ranks if r.eic_namespace == ns]
    assert closed.state == "closed"


WRITER = textwrap.dedent(
    """
    from aibrix_eic.observability.metrics import ConnectorMetrics
    for partition in ("h0_0_l0_1", "h1_1_l0_1"):
        m = ConnectorMetrics("ns", "m", partition)
        m.opened("ident")
        m.counted({"get_blocks": 4, "get_hits": 4})
        m.count_requests("get", "hit", 2)
    m.breaker_changed(True)  # the second rank's
    """
)


def test_multiprocess_directory_of_another_process(tmp_path):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", WRITER], env=env, check=True, timeout=60)
    report = judge(read_directory(str(tmp_path)))
    states = {r.partition: (r.state, r.hit_blocks, r.identity) for r in report.ranks}
    assert states == {"h0_0_l0_1": ("open", 4, "ident"), "h1_1_l0_1": ("breaker open", 4, "ident")}
    assert report.code == DOWN
    with pytest.raises(Unreachable, match="no such directory"):
        read_directory(str(tmp_path / "absent"))


class _Pages:
    """An HTTP server answering /metrics with the next page of a list."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages
        self.served = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.pages[min(outer.served, len(outer.pages) - 1)].encode()
                outer.served += 1
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pages():
    made = []

    def make(*texts: str) -> _Pages:
        made.append(_Pages(list(texts)))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(["status", *argv])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("second", "want"),
    [
        (page(hits=20, gets=4), HEALTHY),
        (page(gets=4, errors=3), DEGRADED),
        (page(gets=2, breaker=1, trips=1), DOWN),
    ],
)
def test_exit_code_over_http(pages, capsys, second, want):
    server = pages(page(gets=2), second)
    code, out = _run([server.url, "--interval", "0.1"], capsys)
    assert code == want, out
    assert out.splitlines()[-1].startswith("verdict: " + ("healthy", "degraded", "", "down")[want])


def test_text_report_names_what_an_operator_looks_for(pages, capsys):
    server = pages(page(hits=10, misses=10, gets=2), page(hits=40, misses=20, gets=6, vllm_hits=64, vllm_queries=128))
    code, out = _run([server.url, "--interval", "0.1"], capsys)
    assert code == HEALTHY
    assert "vLLM model tiny; external prefix cache: 64 of 128 tokens reused (50.0%)" in out
    assert "rank h0_7_l0_79  ns='prod' model='llama' identity=tok  open (breaker trips 0)" in out
    assert "hit rate 75.0% (30 of 40 blocks" in out
    assert "write-behind: pending 128.0KiB" in out
    assert "embedded store: 1.0MiB of 4.0MiB (25.0%)" in out


def test_json_and_watch(pages, capsys):
    server = pages(page(gets=1), page(gets=3, errors=1), page(gets=9, errors=1))
    code, out = _run([server.url, "--watch", "0.05", "--count", "3", "--json"], capsys)
    reports = [json.loads(line) for line in out.splitlines()]
    assert [r["code"] for r in reports] == [HEALTHY, DEGRADED, HEALTHY]  # each over the last period
    assert reports[0]["window_s"] is None and reports[1]["window_s"] > 0
    assert reports[1]["ranks"][0]["partition"] == "h0_7_l0_79" and reports[1]["verdict_code"] == "degraded"
    assert code == HEALTHY  # the last report's


def test_unreachable_and_not_metrics(pages, capsys):
    server = pages(page())
    code, out = _run([server.url + "/nothing", "--interval", "0"], capsys)
    assert code == UNREACHABLE and "HTTP 404" in out
    server.server.shutdown()
    server.server.server_close()
    code, out = _run([server.url, "--interval", "0", "--timeout", "2"], capsys)
    assert code == UNREACHABLE and "cannot read" in out


def test_status_imports_neither_torch_nor_aibrix():
    """It must run in a second on a pod, whatever the worker imports."""
    probe = "import sys; from aibrix_eic.cli import main; main(['status', '127.0.0.1:1', '--interval', '0']); " + (
        "print(sorted(m for m in ('torch', 'aibrix_kvcache', 'vllm') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines()[-1] == "[]", run.stdout + run.stderr


def test_unreachable_report_text():
    out = io.StringIO()
    from aibrix_eic.cli.status import render
    from aibrix_eic.cli.status_judge import unreachable

    out.write(render(unreachable("http://x/metrics", "boom")))
    assert out.getvalue() == "http://x/metrics\nverdict: unreachable: boom"
