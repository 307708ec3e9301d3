"""CHANGELOG.md's table of changed defaults states the defaults the code
has, and names the commits that changed them."""

import dataclasses
import os
import re
import subprocess

import pytest

from aibrix_eic.config import EICConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows() -> list[list[str]]:
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Changed defaults", 1)[1].split("\n### ", 1)[0]
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]


def _yaml_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_the_changed_config_defaults_are_the_defaults_the_code_has():
    defaults = {f.name: f.default for f in dataclasses.fields(EICConfig)}
    config_rows = [row for row in _rows() if row[0].strip("`") in defaults]
    named = {row[0].strip("`") for row in config_rows}
    assert {"put_mode", "put_registered"} <= named
    for what, _was, now, *_ in config_rows:
        key = what.strip("`")
        assert re.fullmatch(r"`[^`]+`", now), f"{key}: the 'now' cell is one value in backticks"
        assert now.strip("`") == _yaml_text(defaults[key]), f"CHANGELOG.md says {key} defaults to {now}"


def test_the_commits_named_exist():
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    commits = {c for row in _rows() for c in re.findall(r"\b([0-9a-f]{7})\b", row[3])}
    assert commits
    for commit in commits:
        done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
        assert done.returncode == 0, f"CHANGELOG.md names commit {commit}, which this repository does not have"
