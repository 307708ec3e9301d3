"""The one way tests wait for another thread or process to get somewhere.

Poll the state itself rather than sleep and hope: `wait_until` returns as soon
as the predicate holds and, if it never does, fails naming what was awaited and
the last value seen. The default timeout is generous on purpose: a stalled CI
host must not fail a test whose state would have arrived. Pass a shorter
timeout only when the bound itself is what the test asserts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
POLL_S = 0.005


def wait_until(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    show: Callable[[], object] | None = None,
) -> T:
    """Return the predicate's first truthy value; fail after `timeout` seconds.

    `show`, if given, is called on failure and its value printed beside the
    predicate's last one (a lambda's `False` alone says little).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"{value!r}" if show is None else f"{value!r}; {show()!r}"
            pytest.fail(f"waited {timeout:g} s for {what}; last seen: {seen}")
        time.sleep(POLL_S)
