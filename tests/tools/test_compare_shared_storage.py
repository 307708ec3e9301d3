"""benchmarks/compare_shared_storage.py runs and times the product's store:
its first put once failed (a StatusCode compared with 0), and it timed only
bare candidates, never local://NAME?dir=DIR."""

import importlib.util
import os

import pytest

import aibrix_eic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))


@pytest.fixture
def compare(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "compare_shared_storage", os.path.join(REPO_ROOT, "benchmarks", "compare_shared_storage.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "CASES", (("put", 4096, 4), ("get", 4096, 4), ("exists", 4096, 4)))
    return module


def test_it_times_the_in_process_and_the_products_shared_store(compare, shared_dir):
    for candidate in (compare.InProcess, compare.Shared):
        times = compare.measure(candidate(shared_dir), reps=2)
        assert sorted(times) == ["exists 4 x 4 KiB", "get 4 x 4 KiB", "put 4 x 4 KiB"]
        assert all(seconds > 0 for seconds in times.values())
    assert compare.Shared.endpoint(shared_dir).startswith("compare?dir=")
