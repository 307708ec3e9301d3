"""Tests wait through `waiting.wait_until`, not through loops of their own.

Hand-written deadline loops (`while ... monotonic() ...: sleep(...)`) and
bounded polls (`for _ in range(N): if ...: break; sleep(...)`) each chose
their own timeout and message, and several were too tight for a stalled CI
host. A loop that samples for a fixed time on purpose (an observation
window, not a wait) says so with the comment WINDOW on its `while` line.
"""

import ast
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
HELPER = TESTS / "support" / "waiting.py"
WINDOW = "# a window, not a wait"


def _calls_sleep(node: ast.AST) -> bool:
    """A sleep, or a timed Event().wait(t), anywhere inside node."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if name == "sleep" or (name == "wait" and call.args and "Event()" in ast.unparse(call.func)):
                return True
    return False


def _mentions_a_clock(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "monotonic" in text or "deadline" in text or "time.time" in text or "perf_counter" in text


def hand_written_waits(source: str) -> list[int]:
    """Line numbers of the hand-written waiting loops in source."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.While):
            waits = _calls_sleep(node) and _mentions_a_clock(node)
            if waits and WINDOW not in lines[node.lineno - 1]:
                found.append(node.lineno)
        elif isinstance(node, ast.For):
            breaks = any(isinstance(inner, ast.Break) for inner in ast.walk(node))
            if breaks and _calls_sleep(node):
                found.append(node.lineno)
    return sorted(found)


def test_no_test_waits_in_a_loop_of_its_own():
    offenders = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != HELPER and "e2e" not in path.relative_to(TESTS).parts
        for line in hand_written_waits(path.read_text())
    ]
    assert offenders == [], f"use waiting.wait_until instead of these loops: {offenders}"


@pytest.mark.parametrize(
    "source",
    [
        "deadline = time.monotonic() + 5\nwhile x and time.monotonic() < deadline:\n    time.sleep(0.01)\n",
        "while not ready():\n    assert time.monotonic() < deadline\n    time.sleep(0.01)\n",
        "async def f():\n    while time.monotonic() < end:\n        await asyncio.sleep(0.01)\n",
        "for _ in range(100):\n    if done():\n        break\n    threading.Event().wait(0.05)\n",
    ],
)
def test_the_check_finds_each_form_of_a_hand_written_wait(source):
    assert hand_written_waits(source) != []


@pytest.mark.parametrize(
    "source",
    [
        f"while time.monotonic() - started < 2.5:  {WINDOW}\n    time.sleep(0.001)\n",
        "while streaming.is_set():\n    time.sleep(0.005)\n",
        "for i in range(3):\n    time.sleep(0.01)\n",
        "while not delete.done():\n    reads.append(read())\n",
    ],
)
def test_the_check_leaves_windows_and_pacing_alone(source):
    assert hand_written_waits(source) == []
