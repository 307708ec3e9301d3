"""tests/e2e/server.py's cleanup after a stopped server: the shared memory a
killed vLLM leaves in /dev/shm is unlinked, unless a live process (another
server) still maps it or holds it open."""

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

HOLD = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    view = mmap.mmap(fd, 4096)
    os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def server():
    spec = importlib.util.spec_from_file_location("e2e_server_under_test", REPO / "tests" / "e2e" / "server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hold(path: Path, how: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path), how], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_only_new_unused_leftovers_are_removed(server, tmp_path):
    (tmp_path / "psm_old").write_bytes(b"\0" * 4096)
    before = server.shm_names(tmp_path)
    assert before == {"psm_old"}
    for name in ("psm_free", "vllm_offload_e1.mmap", "psm_open", "vllm_offload_e2.mmap", "not_vllm"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    holders = [_hold(tmp_path / "psm_open", "open"), _hold(tmp_path / "vllm_offload_e2.mmap", "map")]
    try:
        removed = server.remove_shm_leftovers(before, tmp_path)
    finally:
        for child in holders:
            child.kill()
            child.wait()
    assert removed == ["psm_free", "vllm_offload_e1.mmap"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_vllm", "psm_old", "psm_open", "vllm_offload_e2.mmap"]
    # once their holders are gone, a later stop removes them too
    assert server.remove_shm_leftovers(before, tmp_path) == ["psm_open", "vllm_offload_e2.mmap"]


def test_a_missing_directory_is_nothing_to_remove(server, tmp_path):
    assert server.shm_names(tmp_path / "absent") == set()
    assert server.remove_shm_leftovers(set(), tmp_path / "absent") == []


def test_a_group_is_alive_until_its_last_process_has_exited(server):
    """stop() waits on this before it cleans up: a worker still exiting maps
    its files, and they would be skipped for good."""
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time; subprocess.Popen(['sleep', '60']); print('ready', flush=True); time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert leader.stdout.readline().strip() == "ready"  # its child started
        assert server.group_alive(leader.pid)
        leader.kill()
        leader.wait()
        assert server.group_alive(leader.pid)  # its child, orphaned, lives on
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    wait_until(lambda: not server.group_alive(leader.pid), timeout=10, what="the killed group to exit")
