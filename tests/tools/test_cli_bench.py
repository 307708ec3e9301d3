"""`aibrix-eic bench` on small workloads: it runs through AIBrix's real
BaseKVCacheManager, its JSON has the promised fields, it verifies what it
reloads, and it fails loudly when EIC is down or returns wrong bytes."""

import ctypes
import io
import json
import os
import re
import stat
import subprocess
import sys

import pytest
from harness import write_config

import aibrix_eic
from aibrix_eic.cli import main
from aibrix_eic.cli.driver import EMBEDDED_STORE
from aibrix_eic.cli.progress import ProgressBar
from aibrix_eic.cli.report import render_text
from aibrix_eic.cli.shapes import SHAPES
from aibrix_eic.cli.verdict import grade, noise, spread
from aibrix_eic.engine import get_store
from aibrix_eic.engine.store import Store

SMALL = ["--tokens", "64", "--requests", "2", "--warmup", "1", "--no-progress"]


def run_bench(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_has_the_fields(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--json")
    assert code == 0
    summary = json.loads(out)
    for direction in ("offload", "reload"):
        assert summary[direction]["gb_per_s"] > 0
        assert summary[direction]["bytes"] == 2 * 64 * 131072
    for op in ("put", "acquire", "lookup", "exists"):
        latency = summary["latency_ms"][op]
        assert latency["count"] == 2
        assert 0 < latency["p50"] <= latency["max"]
        assert latency["p99"] is None, "a p99 of 2 samples is their max"
    assert summary["hit_rate"] == 1.0
    assert summary["bytes_per_token"] == 131072
    assert summary["model"]["block_nbytes"] == 2 * 1024**2
    assert summary["workload"] == {
        "requests": 2,
        "warmup_requests": 1,
        "tokens_per_request": 64,
        "blocks_per_request": 4,
        "bytes_per_request": 64 * 131072,
        "seed": 0,
    }
    assert summary["verified_bytes"] == 2 * 64 * 131072
    assert summary["mismatched_blocks"] == 0
    assert summary["backend"]["manager"] == "BaseKVCacheManager"
    assert summary["backend"]["connector"] == "aibrix_eic.connector.EICConnector"
    assert summary["backend"]["embedded_engine"] is True
    assert summary["connector_health"]["put_blocks"] == 3 * 4  # warm-up included
    assert len(summary["per_request"]) == 3


def test_reloads_come_from_eic_after_the_write_behind_flush(capsys):
    """With the default put_mode, put returns before the blocks are in EIC;
    the bench waits for them (timed as flush) so no reload is served from
    the connector's pending writes, and offload counts that wait."""
    code, out, _ = run_bench(capsys, *SMALL, "--json")
    assert code == 0
    summary = json.loads(out)
    health = summary["connector_health"]
    assert health["write_behind_blocks"] == 3 * 4, "the puts were written behind"
    assert health["write_behind_served"] == 0, "a reload was served from a pending write"
    assert summary["latency_ms"]["flush"]["count"] == 2
    timed = [r for r in summary["per_request"] if not r["warmup"]]
    assert summary["offload"]["seconds"] == pytest.approx(sum(r["put_s"] + r["flush_s"] for r in timed))


def test_seventy_b_tp8_shape_is_forty_kib_per_token(capsys):
    code, out, _ = run_bench(
        capsys,
        "--model",
        "llama3-70b-tp8",
        "--tokens",
        "100",
        "--requests",
        "1",
        "--warmup",
        "0",
        "--json",
        "--no-progress",
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["bytes_per_token"] == 40 * 1024
    assert summary["model"]["layers"] == 80 and summary["model"]["kv_heads_per_rank"] == 1
    # 100 tokens round down to whole 16-token blocks.
    assert summary["workload"]["tokens_per_request"] == 96
    assert summary["tokens"]["reloaded"] == 96


def test_text_report(capsys):
    code, out, _ = run_bench(capsys, *SMALL)
    assert code == 0
    assert "offload" in out and "GB/s" in out and "p99" in out
    assert "hit rate  100.0%" in out
    assert "0 mismatched blocks" in out


def test_text_report_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    png = tmp_path / "bench.png"
    code, out, _ = run_bench(capsys, *SMALL, "--plot", str(png))
    assert code == 0
    assert "hit rate  100.0%" in out
    assert f"plot      {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_fails_before_the_benchmark_runs(capsys, tmp_path, monkeypatch):
    import aibrix_eic.cli.bench as bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError

    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran although --plot cannot draw")

    monkeypatch.setattr(bench, "ManagerDriver", must_not_run)
    png = tmp_path / "bench.png"
    code, out, err = run_bench(capsys, *SMALL, "--plot", str(png))
    assert code == 2
    assert out == ""
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in err
    assert not png.exists()


def test_unreachable_engine_exits_1_and_points_to_check(capsys, tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://down?unreachable=true")
    code, _, err = run_bench(capsys, *SMALL, "--config", path)
    assert code == 1
    assert "EIC is unavailable" in err and "init returned -1" in err
    assert "aibrix-eic check" in err


def test_bad_config_exits_1_with_a_readable_message(capsys, tmp_path):
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://", eic_kv_ttl="soon")
    code, _, err = run_bench(capsys, *SMALL, "--config", path)
    assert code == 1
    assert f"aibrix-eic bench: EIC config {path}:1: eic_kv_ttl: expected an integer, got str 'soon'" in err
    assert "Status(" not in err and "StatusCodes" not in err


def test_manager_failures_are_shown_without_the_status_repr():
    from aibrix_eic.cli.driver import readable_failure

    message = "EIC config /etc/eic.yaml: eic_kv_ns: expected a string, got int 3"
    assert readable_failure(RuntimeError(f"Status(error_code=StatusCodes.INVALID, value={message})")) == message
    assert readable_failure(RuntimeError("Status(error_code=StatusCodes.ERROR)")) == "status ERROR"
    traced = "Status(error_code=StatusCodes.ERROR, value=boom), trace:\nTraceback (most recent call last):\n  ...)"
    assert readable_failure(RuntimeError(traced)) == "boom"
    assert readable_failure(RuntimeError("something else")) == "something else"


def test_corrupted_reload_is_counted_and_fails(capsys, monkeypatch):
    real_get_many = Store.get_many

    def corrupting_get_many(self, ns, keys, destinations):
        codes = real_get_many(self, ns, keys, destinations)
        ctypes.c_ubyte.from_address(destinations[-1][0] + 100).value ^= 0x01
        return codes

    monkeypatch.setattr(Store, "get_many", corrupting_get_many)
    code, out, err = run_bench(capsys, *SMALL, "--json")
    assert code == 1
    assert json.loads(out)["mismatched_blocks"] >= 2  # one per timed request at least
    assert "differ" in err


def test_a_store_too_small_for_a_request_lowers_the_hit_rate(capsys, tmp_path):
    # 8 MiB per request into 6 MiB: blocks are evicted (LRU) before they are
    # reloaded. The bench reports it; it fails only if nothing was reloaded.
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://tiny?capacity=6MiB")
    code, out, err = run_bench(capsys, *SMALL, "--config", path, "--json")
    summary = json.loads(out)
    assert summary["hit_rate"] < 1.0
    assert summary["mismatched_blocks"] == 0
    if summary["tokens"]["reloaded"] == 0:
        assert code == 1 and "nothing was reloaded" in err
    else:
        assert code == 0


def test_environment_is_restored(capsys):
    before = dict(os.environ)
    code, _, _ = run_bench(capsys, *SMALL, "--json")
    assert code == 0
    changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
    assert changed <= {"TQDM_DISABLE"}, changed


def test_progress_bar_draws_in_place():
    stream = io.StringIO()
    bar = ProgressBar(3, stream, enabled=True, width=6)
    for done in (1, 2, 3):
        bar.update(done, "offload 1.00 GB/s")
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 3
    assert "[######] 3/3" in text and text.endswith("\n")


def test_progress_bar_is_silent_when_piped():
    stream = io.StringIO()  # not a TTY
    bar = ProgressBar(3, stream)
    bar.update(1)
    bar.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    "name, bytes_per_token",
    [
        ("llama3-8b", 128 * 1024),
        ("llama3-70b-tp8", 40 * 1024),
        ("llama3-70b-tp4", 80 * 1024),
        ("qwen2.5-7b", 56 * 1024),
    ],
)
def test_shapes_bytes_per_token(name, bytes_per_token):
    shape = SHAPES[name]
    assert shape.bytes_per_token == bytes_per_token
    spec = shape.block_spec(rank=1)
    assert spec.block_nbytes == shape.block_nbytes
    # Rank 1 owns the next slice of kv heads, as in vLLM's TP split.
    assert list(spec.tensor_spec.heads) == list(range(shape.kv_heads_per_rank, 2 * shape.kv_heads_per_rank))


def test_console_script_bench_json():
    script = os.path.join(os.path.dirname(sys.executable), "aibrix-eic")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_KV_CACHE_OL_EIC_CONFIG")}
    done = subprocess.run(
        [script, "bench", "--tokens", "32", "--requests", "1", "--warmup", "0", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hit_rate"] == 1.0
    assert done.stderr == ""  # no progress bar when piped, no library noise


def test_the_report_says_the_store_was_in_process(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--json")
    assert code == 0
    assert json.loads(out)["backend"]["store_mode"] == "in-process"
    code, out, _ = run_bench(capsys, *SMALL)
    assert "store     the embedded engine, in-process" in out


def test_two_bench_processes_run_against_one_shared_store(capsys, shared_dir):
    """The first run is another OS process: its blocks are in the store this
    process opens, and a second run here uses that store."""
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_KV_CACHE_OL_EIC_CONFIG")}
    first = subprocess.run(
        [sys.executable, "-m", "aibrix_eic", "bench", *SMALL, "--json", "--shared-dir", shared_dir, "--keep"],
        env={**env, "PYTHONPATH": repo_root},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    first_summary = json.loads(first.stdout)
    assert (first_summary["backend"]["store_mode"], first_summary["backend"]["store_dir"]) == ("shared", shared_dir)

    written_by_first = len(get_store(f"{EMBEDDED_STORE}?dir={shared_dir}"))
    assert written_by_first >= first_summary["workload"]["blocks_per_request"]

    code, out, _ = run_bench(capsys, *SMALL, "--json", "--shared-dir", shared_dir)
    assert code == 0
    assert json.loads(out)["backend"]["store_mode"] == "shared"
    code, out, _ = run_bench(capsys, *SMALL, "--shared-dir", shared_dir)
    assert f"store     the embedded engine, shared: a store in {shared_dir}" in out
    store = os.path.join(shared_dir, EMBEDDED_STORE)
    assert f"left {store} as it was: it existed before this run" in out
    assert os.path.isdir(store), "a store this run did not create was removed"


def test_a_shared_dir_the_bench_creates_is_private_as_create_1_documents(capsys, shared_dir):
    """It was made 0755 (the umask's), where the store's create=1 makes 0700."""
    missing = os.path.join(shared_dir, "new", "dir")
    old_umask = os.umask(0o022)
    try:
        code, _, _ = run_bench(capsys, *SMALL, "--shared-dir", missing, "--keep")
    finally:
        os.umask(old_umask)
    assert code == 0
    assert stat.S_IMODE(os.stat(missing).st_mode) == 0o700


def test_shared_dir_with_a_config_is_refused(capsys, tmp_path):
    config = write_config(str(tmp_path / "eic.yaml"), remote_url="local://")
    code, _, err = run_bench(capsys, *SMALL, "--config", config, "--shared-dir", str(tmp_path))
    assert code == 2 and "--shared-dir" in err


# ------------------------------------------------- what a result means


def test_the_verdict_is_against_baselines_measured_in_the_same_run(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--json")
    assert code == 0
    summary = json.loads(out)
    mock = summary["baseline"]["mock"]
    assert mock["offload_gb_per_s"] > 0 and mock["reload_gb_per_s"] > 0
    assert mock["mismatched_blocks"] == 0 and mock["errors"] == [], "the MOCK floor verified its reloads too"
    assert summary["baseline"]["memcpy"]["gb_per_s"] > 0
    verdict = summary["verdict"]
    assert verdict["thresholds"] == {"good": 0.7, "fair": 0.4, "noisy_spread": 0.5}
    for direction in ("offload", "reload"):
        vs_mock = verdict[direction]["vs_mock"]
        assert vs_mock == pytest.approx(summary[direction]["gb_per_s"] / mock[f"{direction}_gb_per_s"])
        assert verdict[direction]["rounds"]["min"] <= verdict[direction]["rounds"]["max"]
        assert verdict[direction]["grade"] == grade(vs_mock)
    code, out, _ = run_bench(capsys, *SMALL)
    assert code == 0
    number = r"\d+\.\d\d"
    for direction in ("offload", "reload"):
        assert re.search(
            rf"^verdict   {direction} {number} / {number} GB/s = {number}x of the MOCK floor: (good|fair|slow) \(rounds ",
            out,
            re.M,
        ), out
    assert "good >= 0.7x of the floor, fair >= 0.4x, else slow" in out
    assert "baseline  same run, same bytes: AIBrix MOCK backend offload" in out and "memcpy" in out


def test_no_baseline_skips_the_floor(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--json", "--no-baseline")
    assert code == 0
    summary = json.loads(out)
    assert "baseline" not in summary and "verdict" not in summary


@pytest.mark.parametrize(
    "ratio, expected", [(1.3, "good"), (0.7, "good"), (0.69, "fair"), (0.4, "fair"), (0.39, "slow")]
)
def test_grades(ratio, expected):
    assert grade(ratio) == expected


def test_spread_is_the_range_around_the_median():
    assert spread([3.7, 7.0, 5.0, 4.0]) == pytest.approx({"median": 4.5, "min": 3.7, "max": 7.0})
    assert spread([2.0, 1.0, 3.0])["median"] == 2.0


def test_a_wide_spread_of_rounds_prints_a_noise_note(capsys):
    quiet = noise({"offload": [5.0, 5.2, 4.9], "reload": [6.0, 6.1, 6.2]}, {"offload": 5.0, "reload": 6.1})
    assert quiet["noisy"] is False and quiet["note"] is None
    loud = noise({"offload": [3.7, 7.0, 5.0, 4.0], "reload": [6.0, 6.1, 6.2]}, {"offload": 4.6, "reload": 6.1})
    assert loud["noisy"] is True
    assert loud["offload"]["relative"] == pytest.approx(3.3 / 4.6)
    assert "offload 3.70-7.00 GB/s (the run's 4.60)" in loud["note"] and "reload" not in loud["note"]
    summary = _small_summary(capsys)
    assert "noise" not in render_text({**summary, "noise": quiet})
    assert f"noise     {loud['note']}" in render_text({**summary, "noise": loud})


def _small_summary(capsys) -> dict:
    code, out, _ = run_bench(capsys, *SMALL, "--json", "--no-baseline")
    assert code == 0
    return json.loads(out)


def test_the_exists_row_prints_exists_and_the_lookup_row_lookup(capsys):
    summary = _small_summary(capsys)
    summary["latency_ms"]["exists"].update(p50=111.0, max=112.0)
    summary["latency_ms"]["lookup"].update(p50=222.0, max=223.0)
    text = render_text(summary)
    (exists_row,) = [line for line in text.splitlines() if " exists   p50" in line]
    (lookup_row,) = [line for line in text.splitlines() if " lookup   p50" in line]
    assert "p50   111.00 ms   max   112.00 ms" in exists_row
    assert "p50   222.00 ms   max   223.00 ms" in lookup_row


def test_p99_is_printed_only_from_enough_samples(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--no-baseline")
    assert code == 0
    assert "p99" not in out.replace("p99 from 100 requests on", "")
    assert "latencies: p50 and max of one call per request (p99 from 100 requests on)" in out


def test_the_plot_labels_say_what_the_text_says(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: (figures.append(figure), real_close(figure)))
    code, out, _ = run_bench(capsys, *SMALL, "--no-baseline", "--plot", str(tmp_path / "bench.png"))
    assert code == 0
    throughput = figures[0].axes[0]
    _, labels = throughput.get_legend_handles_labels()
    assert labels == ["offload (put + flush)", "reload (acquire)"]
    assert "(put + flush)" in out


def test_the_plot_draws_the_baselines_over_whole_request_numbers(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: (figures.append(figure), real_close(figure)))
    code, _, _ = run_bench(capsys, *SMALL, "--plot", str(tmp_path / "bench.png"))
    assert code == 0
    throughput = figures[0].axes[0]
    _, labels = throughput.get_legend_handles_labels()
    assert labels == ["offload (put + flush)", "reload (acquire)", "MOCK floor offload", "MOCK floor reload", "memcpy"]
    ticks = [tick for tick in throughput.get_xticks() if throughput.get_xlim()[0] <= tick <= throughput.get_xlim()[1]]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks


def test_the_text_says_when_write_behind_did_not_engage_and_why(capsys, tmp_path):
    # 8 MiB per request, write-behind holds at most 1 MiB: every put waits,
    # as on the README's 70B example (312.5 MiB per request, 256 MiB held).
    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://wb", write_behind_max_bytes="1MiB")
    code, out, _ = run_bench(capsys, *SMALL, "--config", path, "--no-baseline")
    assert code == 0
    assert "write-behind NOT ENGAGED: 0/12 put blocks (put_mode write_behind)" in out
    assert "one request puts 8.0MiB, more than write-behind holds (1.0MiB" in out
    assert "3 puts waited for EIC" in out
    code, out, _ = run_bench(capsys, *SMALL, "--config", path, "--no-baseline", "--json")
    wb = json.loads(out)["write_behind"]
    assert wb == {**wb, "engaged": False, "blocks": 0, "of_blocks": 12, "waits": 3, "limit_bytes": 1024**2}


def test_the_text_says_when_write_behind_took_every_put(capsys):
    code, out, _ = run_bench(capsys, *SMALL, "--no-baseline")
    assert code == 0
    assert "write-behind 12/12 put blocks (put_mode write_behind)" in out


def test_shared_dir_removes_the_store_it_created(capsys, shared_dir):
    new = os.path.join(shared_dir, "new")
    code, out, _ = run_bench(capsys, *SMALL, "--shared-dir", new)
    assert code == 0
    assert f"removed {os.path.join(new, EMBEDDED_STORE)} (" in out
    assert not os.path.exists(new), "the directory the bench created is still there"


def test_shared_dir_that_existed_keeps_everything_but_the_store(capsys, shared_dir):
    with open(os.path.join(shared_dir, "mine.txt"), "w") as f:
        f.write("not the bench's")
    code, _, _ = run_bench(capsys, *SMALL, "--shared-dir", shared_dir)
    assert code == 0
    assert os.listdir(shared_dir) == ["mine.txt"]


def test_shared_dir_with_keep_keeps_the_store(capsys, shared_dir):
    new = os.path.join(shared_dir, "new")
    code, out, _ = run_bench(capsys, *SMALL, "--shared-dir", new, "--keep")
    assert code == 0
    store = os.path.join(new, EMBEDDED_STORE)
    assert f"kept {store} (--keep)" in out
    assert os.path.isfile(os.path.join(store, "data.mdb"))


# ------------------------------------------ one computation behind every rate


def _request(index: int, warmup: bool, nbytes_tokens: int, offload_s: float, acquire_s: float):
    from aibrix_eic.cli.driver import RequestResult

    return RequestResult(
        index=index,
        warmup=warmup,
        tokens=nbytes_tokens,
        offloaded_tokens=nbytes_tokens,
        reloaded_tokens=nbytes_tokens,
        looked_up_tokens=nbytes_tokens,
        seconds={"put": offload_s * 0.75, "flush": offload_s * 0.25, "acquire": acquire_s},
    )


def test_printed_rates_and_the_verdict_agree_by_construction_on_skewed_rounds():
    """A busy host: most of our rounds as fast as the floor's, one burst
    that takes 20x. The headline rate, the baseline rate and the verdict's
    ratio are one computation, so the printed rates divide to the printed
    ratio (within their rounding), and the noise line quotes the same rate.
    Before, the verdict was a median of per-round ratios (1.0x here) beside
    rates whose quotient was 0.21x."""
    from aibrix_eic.cli.report import add_baselines, summarize

    shape = SHAPES["llama3-8b"]
    tokens = 512  # 64 MiB a request
    ours_s = [0.02, 0.02, 0.4, 0.02, 0.02]  # the burst hits our third request
    floor_s = [0.02, 0.021, 0.02, 0.019, 0.02]
    ours = [_request(0, True, tokens, 0.05, 0.05)] + [
        _request(i + 1, False, tokens, s, s * 1.5) for i, s in enumerate(ours_s)
    ]
    floor = [_request(0, True, tokens, 0.05, 0.05)] + [
        _request(i + 1, False, tokens, s, s) for i, s in enumerate(floor_s)
    ]
    backend = {
        "remote_url": "local://",
        "manager": "M",
        "connector": "C",
        "store_mode": "in-process",
        "store_dir": None,
    }
    summary = summarize(shape, ours, backend, None, 1.0, 0)
    add_baselines(summary, floor, [0.01] * len(ours_s))
    text = render_text(summary)

    bytes_moved = len(ours_s) * tokens * shape.bytes_per_token
    assert summary["offload"]["gb_per_s"] == pytest.approx(bytes_moved / sum(ours_s) / 1e9)
    number = r"(\d+\.\d\d)"
    for direction in ("offload", "reload"):
        headline = float(re.search(rf"^{direction}\s+{number} GB/s", text, re.M).group(1))
        baseline = float(re.search(rf"AIBrix MOCK backend .*{direction} {number} GB/s", text).group(1))
        line = re.search(rf"^verdict   {direction} {number} / {number} GB/s = {number}x", text, re.M)
        assert line, text
        assert (float(line.group(1)), float(line.group(2))) == (headline, baseline)
        ratio = float(line.group(3))
        # what a reader gets dividing the printed (rounded) rates
        low, high = (headline - 0.005) / (baseline + 0.005), (headline + 0.005) / (baseline - 0.005)
        assert low - 0.005 <= ratio <= high + 0.005, (headline, baseline, ratio)
        assert summary["verdict"][direction]["grade"] == grade(summary["verdict"][direction]["vs_mock"])
    assert summary["verdict"]["offload"]["vs_mock"] == pytest.approx(sum(floor_s) / sum(ours_s))
    assert summary["verdict"]["offload"]["grade"] == "slow"  # 0.21x: the burst counts
    rounds = summary["verdict"]["offload"]["rounds"]
    assert rounds["min"] <= summary["verdict"]["offload"]["vs_mock"] <= rounds["max"]
    noise_line = next(line for line in text.splitlines() if line.startswith("noise"))
    assert f"the run's {summary['offload']['gb_per_s']:.2f}" in noise_line
