"""Fixtures of the real-vLLM suite: the model, the prompts, the baseline
server's outputs, and servers that are always stopped.

Run with `make e2e` (it builds .venv-e2e). Each server's log and probe files
stay under build/e2e/runs/<time>/<server>/ for inspection after a failure.
"""

import atexit
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(E2E_DIR))

import model  # noqa: E402
from server import ENGINE_BLOCK, Completion, Server  # noqa: E402

REPO = E2E_DIR.parent.parent
MODELS_ROOT = REPO / "build" / "e2e" / "models"

# fp32 tiny model: a reload is bit-identical to a computed prefill here
# (measured difference 0.0); the tolerance only absorbs summation-order noise.
LOGPROB_TOL = 1e-4
PROMPT_LEN = 1000
# Type1 sends whole cache blocks of the prompt minus its last token.
FULL_REUSE = (PROMPT_LEN - 1) // ENGINE_BLOCK * ENGINE_BLOCK


def _prompt(seed: int, length: int = PROMPT_LEN) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, model.VOCAB_SIZE) for _ in range(length)]


PROMPTS: dict[str, list[int]] = {f"p{i}": _prompt(100 + i) for i in range(6)}
# shares its first 600 tokens with p0
PROMPTS["p0-fork"] = PROMPTS["p0"][:600] + _prompt(999, PROMPT_LEN - 600)

_live: list[Server] = []
_started: list[Server] = []  # every server of the run, for its timeline
_T0 = time.monotonic()


def _stop_all() -> None:
    stop_server(*_live)


atexit.register(_stop_all)


def pytest_sessionfinish(session, exitstatus):
    _stop_all()
    if _started:
        _write_timeline(_started[0].workdir.parent / "timeline.txt")


def _write_timeline(path: Path) -> None:
    """When each server started, was ready, warm, told to stop and gone, in
    seconds from the session's start: where the suite's time went."""
    columns = ("start", "ready", "warm", "stop", "exited")
    lines = [f"{'server':<22}" + "".join(f"{c:>9}" for c in columns)]
    for server in sorted(_started, key=lambda s: s.events[0][1] if s.events else 0.0):
        events = dict(server.events)
        cells = (f"{events[c] - _T0:9.1f}" if c in events else f"{'-':>9}" for c in columns)
        lines.append(f"{server.name:<22}" + "".join(cells))
    path.write_text("\n".join(lines) + "\n")


def ready(server: Server) -> Server:
    """Wait for /health and take the slow first request; a server that
    fails either is stopped."""
    try:
        server.wait_ready()
        server.warm_up()
    except BaseException:
        stop_server(server)
        raise
    return server


def start_server(*args, wait: bool = True, **kwargs) -> Server:
    server = Server(*args, **kwargs)
    _live.append(server)
    _started.append(server)
    server.start()
    return ready(server) if wait else server


def start_servers(*specs: dict) -> list[Server]:
    """Start servers side by side (each spec: start_server's arguments as
    keywords), then wait for all; the machine runs at most two at once."""
    assert len(specs) <= 2, "more than two vLLM servers at once do not fit this machine"
    servers = [start_server(wait=False, **spec) for spec in specs]
    try:
        for server in servers:
            ready(server)
    except BaseException:
        stop_server(*servers)
        raise
    return servers


def stop_server(*servers: Server) -> None:
    """Stop servers side by side: all are told first, then each is waited for."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()
        if server in _live:
            _live.remove(server)


# Servers of modules that need one server each, in the order the modules
# run. A server start is mostly one core importing vLLM, three processes in
# turn, so each of these starts while the tests before it run: the baseline
# starts the first, and each claim starts the next (at most one ahead).
ServerSpec = Callable[[Path, Path], dict]  # (model_dir, workdir) -> start_server's keywords
_queue: list[tuple[str, str, ServerSpec]] = []  # (module file, server name, spec), import order
_ahead: dict[str, Server] = {}


def queue_server(module_file: str, name: str, spec: ServerSpec) -> None:
    """At a module's import: its server may start before the module runs."""
    _queue.append((Path(module_file).name, name, spec))


def pytest_collection_modifyitems(session, config, items):
    """Start ahead only the servers of modules that will run, in their order."""
    order = {}
    for item in items:
        order.setdefault(item.path.name, len(order))
    _queue[:] = sorted((q for q in _queue if q[0] in order), key=lambda q: order[q[0]])


def _start_next_ahead(model_dir: Path, workdir: Path) -> None:
    if _queue:
        _, name, spec = _queue.pop(0)
        _ahead[name] = start_server(wait=False, **spec(model_dir, workdir))


def claim_server(name: str, model_dir: Path, workdir: Path) -> Server:
    """The queued server `name`, ready and warmed up; started now if it was
    not started ahead. Starts the next queued server ahead."""
    server = _ahead.pop(name, None)
    if server is None:
        (spec,) = [spec for _, queued, spec in _queue if queued == name]
        _queue[:] = [q for q in _queue if q[1] != name]
        server = start_server(wait=False, **spec(model_dir, workdir))
    _start_next_ahead(model_dir, workdir)
    return ready(server)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return model.build("tiny", MODELS_ROOT)


@pytest.fixture(scope="session")
def alt_model_dir() -> Path:
    """Another model with the same KV shapes: only the identity tells them apart."""
    return model.build("tiny-alt", MODELS_ROOT)


@pytest.fixture(scope="session")
def second_mount(model_dir, workdir) -> Path:
    """The model's directory under a second path, as another replica might
    mount it: vLLM reports the path it was given, not the link's target."""
    path = workdir / "mounts" / model_dir.name
    path.parent.mkdir(exist_ok=True)
    path.symlink_to(model_dir, target_is_directory=True)
    return path


def shared_store_url(workdir: Path, name: str) -> str:
    """A remote_url of the engine's shared mode: every server given it opens
    one store, kept under the run's directory (made here, so the URL needs
    no `create=1`, as a deployment's pre-made volume would not)."""
    directory = workdir / ("store-" + name)
    directory.mkdir(parents=True, exist_ok=True)
    return f"local://{name}?dir={directory}&capacity=512MiB"


@pytest.fixture(scope="session")
def workdir() -> Path:
    path = REPO / "build" / "e2e" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config(workdir: Path, name: str, text: str) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(text)
    return path


TYPO_CONFIG = "remote_url: local://typo\neic_kv_nss: prod\n"


@pytest.fixture(scope="session")
def typo_server(model_dir, workdir) -> Server:
    """A server whose config has a typo, started early: it fails by itself
    while the baseline starts (test_startup checks how)."""
    config = write_config(workdir, "typo", TYPO_CONFIG)
    server = start_server("typo", model_dir, workdir, env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config)}, wait=False)
    server.config_path = config
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def baseline(model_dir, workdir, typo_server) -> dict[str, Completion]:
    """Every prompt's outputs from a server without the connector. The first
    queued module server starts beside it."""
    server = start_server("baseline", model_dir, workdir, connector=False, wait=False)
    _start_next_ahead(model_dir, workdir)
    try:
        ready(server)
        return {name: server.complete(prompt) for name, prompt in PROMPTS.items()}
    finally:
        stop_server(server)


def assert_same_output(got: Completion, want: Completion, what: str = "", tol: float = LOGPROB_TOL) -> None:
    assert got.token_ids == want.token_ids, f"{what}: token ids {got.token_ids} != baseline {want.token_ids}"
    worst = max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs))
    assert worst <= tol, f"{what}: logprobs differ by {worst} > {tol}"


def first_send(server: Server, name: str, baseline: dict[str, Completion]) -> Completion:
    """Send prompt `name` the first time: computed with the baseline's
    outputs, nothing reused, its whole blocks (but the last token) offloaded."""
    first = server.complete(PROMPTS[name])
    assert server.sent(first) == FULL_REUSE
    assert server.reuse(first) == 0
    assert_same_output(first, baseline[name], f"{server.name}: first send of {name}")
    return first


def assert_fork_reuses_shared_blocks(server: Server, baseline: dict[str, Completion]) -> None:
    """p0 stored: p0-fork, which shares its first 600 tokens with p0, reuses
    whole blocks of them at most and gives the baseline's outputs."""
    fork = server.complete(PROMPTS["p0-fork"])
    reused = server.reuse(fork)
    assert 0 < reused <= 600 // ENGINE_BLOCK * ENGINE_BLOCK and reused % ENGINE_BLOCK == 0, reused
    assert_same_output(fork, baseline["p0-fork"], "fork")


def store_stats(server: Server, store: str) -> dict:
    """The probe's latest stats of engine store `store` in a one-worker server."""
    (snapshot,) = server.fresh_stats().values()
    return snapshot["stores"][store]


def assert_replicas_reuse_each_other(server: Server, peer: Server, baseline: dict[str, Completion], store: str) -> None:
    """Two replicas on one shared `store`, p0 stored by `server`: the peer
    reloads p0 whole, and what the peer computes (p1) the server reloads
    whole from the store, each with the baseline's outputs."""
    reload = peer.complete(PROMPTS["p0"])
    assert peer.reuse(reload) == FULL_REUSE
    assert_same_output(reload, baseline["p0"], f"{peer.name}'s reload of {server.name}'s p0")
    first_send(peer, "p1", baseline)
    peer.flushed_stats()
    hits_before = store_stats(server, store)["hits"]
    again = server.complete(PROMPTS["p1"])
    assert server.reuse(again) == FULL_REUSE
    assert_same_output(again, baseline["p1"], f"{server.name}'s reload of {peer.name}'s p1")
    assert store_stats(server, store)["hits"] - hits_before == FULL_REUSE // ENGINE_BLOCK


def assert_poisoned_reload_differs(server: Server, baseline: dict[str, Completion], store: str) -> None:
    """Overwrite every block of `store` through the engine (p0 stored): the
    next full reload of p0 must give other outputs, so equal outputs before
    were computed from the KV our L2 returned, not recomputed."""
    (result,) = server.probe("corrupt", {"corrupt": True})
    assert "corrupted" in result[store]
    poisoned = server.complete(PROMPTS["p0"])
    assert server.reuse(poisoned) == FULL_REUSE
    assert (
        poisoned.token_ids != baseline["p0"].token_ids
        or max(abs(a - b) for a, b in zip(poisoned.logprobs, baseline["p0"].logprobs)) > 1.0
    )


# connector-open line as vLLM formats a worker's record:
# "(Worker pid=123) INFO 12-01 08:39:07 [connector.py:184] EIC connector open: ..."
VLLM_PREFIX = (
    r"^\((?P<proc>Worker(?:_TP\d+)?) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+\.py:\d+\] "
)


def open_line(remote_url: str, ns: str = "") -> str:
    return (
        VLLM_PREFIX
        + rf"EIC connector open: remote_url={re.escape(remote_url)} ns='{re.escape(ns)}' conn_id=(?P<conn_id>\S+)"
    )


def identity_token(server: Server, processes: int = 1) -> str:
    """The model identity that the server's connectors put in their keys
    (from their open() line; every rank must agree)."""
    lines = server.wait_log(
        VLLM_PREFIX + r"EIC keys carry model identity (?P<token>\S+) from (?P<how>.*)$", count=processes
    )
    tokens = {m["token"] for m in lines}
    assert len(tokens) == 1, f"{server.name}: ranks disagree on the model identity: {[m[0] for m in lines]}"
    return tokens.pop()
