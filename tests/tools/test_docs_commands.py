"""Every command in the user pages (the quickstart, troubleshooting, the FAQ)
is run here or checked to parse, as test_docs_citations.py checks their
references. A page gaining a command no rule below knows fails the test,
so a new kind of command comes with its check.

- every ```bash block passes `bash -n`;
- `aibrix-eic ...` parses with our own argument parser, and runs: `check`
  (with the quickstart's config in place of the file named), `status`
  (against a local server answering the documented URL's /metrics path
  with a vLLM page that has our series), `--version`;
- `python3 -c ...` runs, and what it writes is what the next `curl` sends;
- `curl` targets a documented endpoint of vLLM's OpenAI server, sends JSON
  that parses, and a `| grep -E` after it matches lines of a real page;
- `grep -E PATTERN LOG`: each alternative matches a line of LOG_LINES, lines
  as vLLM, AIBrix and our connector print them (each checked to come from
  its source where that source is installed here);
- `vllm serve`: its `--kv-transfer-config` is JSON naming a connector
  class that exists in the installed aibrix-kvcache, and every flag is one
  vLLM's argument parser defines (read from its source, where vLLM is
  installed: the e2e venv);
- `pip install`: the requirement files it names exist;
- `cat > FILE <<EOF`, `export`, `rm`, `mkdir`, `sleep`: bash -n only; the
  quickstart's heredoc is the config `check` runs with.
"""

import glob
import http.server
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from aibrix_eic.cli import build_parser, main
from aibrix_eic.observability.metrics import ConnectorMetrics

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/quickstart.md", "docs/troubleshooting.md", "docs/faq.md"]
CONFIG_PATHS = ("/tmp/eic.yaml", "/etc/aibrix/eic.yaml")
# vLLM's OpenAI server, as the pages use it (the decoder of the PD example on 8200)
ENDPOINTS = {"/metrics", "/v1/completions"}
PORTS = {"8000", "8200"}
# Log lines the pages grep for, as printed (from e2e server logs).
LOG_LINES = [
    "(Worker pid=123) INFO 12-06 15:03:19 [lifecycle.py:176] EIC connector open: remote_url=local://quickstart "
    "ns='quickstart' conn_id=aibrix_h0_1_l0_23_lcnd16roc io_threads=6 connected=True",
    "(Worker pid=123) INFO 12-06 15:03:19 [identity.py:141] EIC keys carry model identity MFg9YcPyrtg from vLLM: x",
    "(Worker pid=123) WARNING 12-06 15:03:19 [identity.py:150] EIC keys carry NO MODEL IDENTITY: x",
    "(Worker pid=123) INFO 12-06 15:03:19 [probe.py:80] EIC warm-up: 64 probe keys in one mexist, 0.4 ms (ok)",
    "(Worker pid=123) WARNING 12-06 15:03:19 [link.py:213] EIC circuit OPEN for local://faults (open: init returned -1)",
    "(Worker pid=123) WARNING 12-06 15:03:29 [link.py:221] EIC circuit CLOSED for local://faults: EIC answers again",
    "(Worker pid=123) INFO 12-06 15:03:29 [reuse.py:57] EIC reuse, last 60 s: 3 get requests loaded 31 of 31 blocks "
    "(100.0%), 3.9MiB",
    "(Worker pid=123) INFO 12-06 15:03:29 [aibrix_offloading_connector_type1.py:900] Request[id=cmpl-1, "
    "prompt_len=1000, context_len=0] reused 992 tokens",
    "(APIServer pid=18879) INFO 12-06 15:03:29 [loggers.py:335] Engine 000: Avg prompt throughput: 102.4 tokens/s, "
    "Running: 0 reqs, CPU KV cache usage: 0.0%, External prefix cache hit rate: 84.5%",
    "ValueError: EIC config /etc/aibrix/eic.yaml:2: eic_kv_nss: unknown key; did you mean 'eic_kv_ns'?",
    "ModuleNotFoundError: No module named 'eic'",
    "aibrix_eic.config.errors: remote_url eic://10.0.0.1:12500 needs the EIC Python SDK (pip install ...)",
    "(Worker pid=123) WARNING 12-06 15:03:29 [loads.py:60] EIC PD: request cmpl-1 loaded 0 of 1000 prompt tokens "
    "from EIC; vLLM recomputes the other 1000 (32 blocks)",
    "(EngineCore pid=12) WARNING 12-06 15:03:29 [scheduler.py:1] Recovered from KV load failure: 1 request(s) "
    "rescheduled (1000 tokens affected).",
]
# Where each grepped text is printed, to check LOG_LINES against: (text, where).
LOG_SOURCES = [
    ("EIC connector open: remote_url=", "aibrix_eic/lifecycle.py"),
    ("EIC keys carry model identity", "aibrix_eic/keys/identity.py"),
    ("EIC warm-up: ", "aibrix_eic/link/probe.py"),
    ("EIC circuit OPEN for", "aibrix_eic/link/link.py"),
    ("EIC circuit CLOSED for", "aibrix_eic/link/link.py"),
    ("EIC reuse, last", "aibrix_eic/observability/reuse.py"),
    ("needs the EIC Python SDK", "aibrix_eic"),
    ("EIC PD: request", "aibrix_eic/pd"),
    ("External prefix cache hit rate", "vllm:v1/metrics/loggers.py"),
    ("Recovered from KV load failure", "vllm:v1/core/sched/scheduler.py"),
    ("] reused %d tokens", "aibrix_kvcache:integration/vllm/kv_connector/aibrix_offloading_connector_type1.py"),
    ("EIC keys carry NO MODEL IDENTITY", "aibrix_eic/keys/identity.py"),
]


# ------------------------------------------------------------ extraction
def bash_blocks(page: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, a heredoc kept with
    the command that opens it, comments and blank lines dropped."""
    out: list[str] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        heredoc = re.search(r"<<'?(\w+)'?", line)
        if heredoc:
            body = []
            while i < len(lines) and lines[i] != heredoc.group(1):
                body.append(lines[i])
                i += 1
            i += 1
            line += "\n" + "\n".join(body) + "\n" + heredoc.group(1)
        out.append(line)
    return out


def page_commands(page: str) -> list[str]:
    return [c for block in bash_blocks(page) for c in commands(block)]


ALL = [(page, command) for page in PAGES for command in page_commands(page)]


def test_the_pages_have_commands():
    assert {page for page, _ in ALL} == set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_bash_blocks_parse(page):
    for block in bash_blocks(page):
        run = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, f"{page}: bash -n: {run.stderr}\n{block}"


# --------------------------------------------------------------- helpers
def quickstart_config() -> str:
    (heredoc,) = [c for c in page_commands("docs/quickstart.md") if c.startswith("cat > /tmp/eic.yaml")]
    return "\n".join(heredoc.splitlines()[1:-1]) + "\n"


def metrics_page() -> str:
    """A vLLM /metrics page with a worker's series: ours as ConnectorMetrics
    writes them, vLLM's external prefix cache counters as vLLM 0.32 names them."""
    namespace = f"docs-{uuid.uuid4().hex[:8]}"
    metrics = ConnectorMetrics(namespace, "", "h0_1_l0_23")
    metrics.opened("MFg9YcPyrtg")
    metrics.counted({"get_blocks": 8, "get_hits": 4})
    metrics.count_requests("get", "hit", 1)
    metrics.exists_seconds(0.001)
    metrics.record_request("get", "hit", [], (), 0.002)
    ours = "\n".join(  # this test's series only: other tests' share the registry
        line
        for line in generate_latest(REGISTRY).decode().splitlines()
        if line.startswith("#") or f'eic_namespace="{namespace}"' in line
    )
    vllm = (
        "# TYPE vllm:external_prefix_cache_queries counter\n"
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 4000.0\n'
        "# TYPE vllm:external_prefix_cache_hits counter\n"
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 1984.0\n'
    )
    return vllm + ours + "\n"


@pytest.fixture(scope="module")
def metrics_server():
    body = metrics_page().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def documented_url(url: str) -> str:
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/\S*)", url)
    assert match and match[1] in PORTS and match[2] in ENDPOINTS, f"{url}: not a documented endpoint"
    return match[2]


def egrep(pattern: str) -> re.Pattern[str]:
    """An ERE as grep -E reads the pages' patterns (Python's syntax agrees on them)."""
    return re.compile(pattern)


def vllm_source() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    found = sorted(glob.glob(str(ROOT / ".venv-e2e/lib/python3*/site-packages/vllm")))
    return Path(found[0]) if found else None


def aibrix_source() -> Path:
    spec = importlib.util.find_spec("aibrix_kvcache")
    assert spec is not None and spec.origin
    return Path(spec.origin).parent


def source_text(where: str) -> str | None:
    """The text of a source file or folder named in LOG_SOURCES; None when
    that project is not installed here."""
    project, _, path = where.rpartition(":")
    base = {"": ROOT, "vllm": vllm_source(), "aibrix_kvcache": aibrix_source()}[project]
    if base is None:
        return None
    target = base / path
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    return "".join(f.read_text(errors="replace") for f in files)


# ------------------------------------------------------------- the rules
def check_aibrix_eic(argv: list[str], tmp_path: Path, capsys, metrics_server: str, monkeypatch) -> None:
    parser = build_parser()
    if argv == ["--version"]:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 0
        return
    args = parser.parse_args(argv)
    config = tmp_path / "eic.yaml"
    config.write_text(quickstart_config().replace("local://quickstart", f"local://docs-{uuid.uuid4().hex[:8]}"))
    argv = [str(config) if a in CONFIG_PATHS else a for a in argv]
    monkeypatch.delenv("AIBRIX_KV_CACHE_OL_EIC_CONFIG", raising=False)
    monkeypatch.delenv("AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE", raising=False)
    if args.command == "status":
        if args.url:
            documented_url(args.url)
        argv = [re.sub(r"^http://127\.0\.0\.1:\d+", "http://" + metrics_server, a) for a in argv]
        if "--interval" not in argv and "--watch" not in argv:
            argv += ["--interval", "0.1"]
        code = main(argv)
        out = capsys.readouterr().out
        assert code == 0, out
        assert "verdict: healthy: 1 rank" in out or json.loads(out)["verdict_code"] == "healthy", out
        return
    assert args.command == "check", argv
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0 and "verdict: PASS" in out, out


def check_vllm_serve(argv: list[str]) -> None:
    assert argv[:2] == ["vllm", "serve"] and not argv[2].startswith("-"), argv
    flags = [a.split("=", 1)[0] for a in argv[3:] if a.startswith("--")]
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    module = aibrix_source().parent / (kv["kv_connector_module_path"].replace(".", "/") + ".py")
    assert module.is_file(), module
    assert re.search(rf"^class {kv['kv_connector']}\b", module.read_text(), re.M), kv
    assert kv["kv_role"] in ("kv_both", "kv_producer", "kv_consumer")
    source = vllm_source()
    if source is not None:  # vLLM's flags, as its EngineArgs and serve parser define them
        defined = "".join(p.read_text(errors="replace") for p in (source / "engine").rglob("*.py"))
        defined += "".join(p.read_text(errors="replace") for p in (source / "entrypoints").rglob("*.py"))
        for flag in flags:
            name = flag[2:].replace("-", "_")
            base = name[3:] if name.startswith("no_") else name
            assert re.search(rf"\b{base}\b", defined), f"vllm serve {flag}: not a vLLM argument"


def check_curl(command: str, cwd: Path) -> None:
    curl, _, grep = command.partition(" | ")
    argv = shlex.split(curl)
    urls = [a for a in argv if a.startswith("http")]
    assert len(urls) == 1, command
    path = documented_url(urls[0])
    if "-d" in argv:
        data = argv[argv.index("-d") + 1]
        body = (cwd / data[1:]).read_text() if data.startswith("@") else data
        request = json.loads(body)
        assert path == "/v1/completions" and request["model"] and request["prompt"], request
    if grep:
        pattern = shlex.split(grep)
        assert pattern[:2] == ["grep", "-E"], grep
        lines = metrics_page().splitlines()
        check_alternatives(pattern[2], lines, command)


def check_alternatives(pattern: str, lines: list[str], what: str) -> None:
    """Every top-level alternative of the pattern matches one of the lines."""
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(ch, 0) if (i == 0 or pattern[i - 1] != "\\") else 0
        if ch == "|" and depth == 0 and pattern[i - 1] != "\\":
            parts.append(pattern[start:i])
            start = i + 1
    parts.append(pattern[start:])
    for part in parts:
        assert any(egrep(part).search(line) for line in lines), f"{what}: {part!r} matches nothing it should"


def check_grep(argv: list[str]) -> None:
    assert argv[:2] == ["grep", "-E"] and len(argv) == 4 and argv[3].endswith(".log"), argv
    check_alternatives(argv[2], LOG_LINES, " ".join(argv))


def check_pip(argv: list[str]) -> None:
    assert argv[:2] == ["pip", "install"], argv
    for i, arg in enumerate(argv):
        if arg == "-r":
            assert (ROOT / argv[i + 1]).is_file(), argv[i + 1]


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize(("page", "command"), ALL, ids=[f"{p}:{c[:50]}" for p, c in ALL])
def test_command(page, command, tmp_path, capsys, metrics_server, monkeypatch):
    first = command.split()[0]
    if command.startswith("python3 -c"):
        run = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        # what the next curl sends: check it with the page's curl lines
        for curl in [c for c in page_commands(page) if c.startswith("curl") and "-d @" in c]:
            check_curl(curl, tmp_path)
        return
    if first == "curl":
        if "-d @" in command:
            return  # checked with the command that writes the file, above
        check_curl(command, tmp_path)
        return
    argv = shlex.split(command.split("\n", 1)[0])
    if first == "aibrix-eic":
        check_aibrix_eic(argv[1:], tmp_path, capsys, metrics_server, monkeypatch)
    elif first == "vllm":
        check_vllm_serve(argv[: argv.index("2>&1")] if "2>&1" in argv else argv)
    elif first == "grep":
        check_grep(argv)
    elif first == "pip":
        check_pip(argv)
    elif first == "cat":
        assert command.startswith("cat > /tmp/eic.yaml <<'EOF'"), command  # the config check runs with
    else:
        assert first in ("export", "rm", "sleep"), f"{page}: no rule checks `{command}`: add one"


def test_log_lines_are_what_the_sources_print():
    for text, where in LOG_SOURCES:
        assert any(text.replace("%d", "992") in line for line in LOG_LINES), text
        source = source_text(where)
        if source is not None:
            assert text in source, f"{text!r} is not printed by {where}"


def test_the_quickstart_config_is_valid(tmp_path, capsys, monkeypatch):
    config = tmp_path / "eic.yaml"
    config.write_text(quickstart_config())
    assert main(["check", "--config-only", "--config", str(config)]) == 0, capsys.readouterr().out


def test_the_prompt_is_long_enough_to_reload():
    """Type1 reloads no prompt shorter than 8 engine blocks (128 tokens at
    vLLM's GPU default of 16); the quickstart's is far longer."""
    (builder,) = [c for c in page_commands("docs/quickstart.md") if c.startswith("python3 -c")]
    run = subprocess.run([sys.executable, "-c", shlex.split(builder)[2]], capture_output=True, text=True, timeout=60)
    assert len(json.loads(run.stdout)["prompt"].split()) > 1000


def test_no_command_is_unchecked():
    """Each command's first word has a rule in test_command."""
    known = {"aibrix-eic", "python3", "curl", "vllm", "grep", "pip", "cat", "export", "rm", "sleep"}
    for page, command in ALL:
        assert command.split()[0] in known, f"{page}: {command}"
    assert os.path.isfile(ROOT / "deploy/requirements-image.txt")
