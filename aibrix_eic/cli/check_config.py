"""The config step of `aibrix-eic check`, and `check --config-only`, which
runs it alone. Nothing here imports torch, aibrix_kvcache or
prometheus_client: a CI job can check a ConfigMap with PyYAML and this
package only (tests/tools/test_check_light.py proves it in such a venv)."""

import dataclasses
from typing import TextIO

from ..config import ConfigError, EICConfig, Problem, config_path_from_env, node_problems, warn_about_env
from ..util.vendor_sdk import SDK_WHEEL_URL, sdk_installed
from .check_report import PASS, WARN, ProblemRecord, StepFailed, StepRunner


def problem_record(source: str, problem: Problem) -> ProblemRecord:
    """One config problem as `check --json` gives it: where (the file and
    line, or the AIBRIX_EIC_<KEY> variable), the key, what is wrong, the fix."""
    return {
        "file": None if problem.variable else source,
        "line": problem.line,
        "variable": problem.variable,
        "key": problem.key,
        "problem": problem.problem,
        "fix": problem.fix,
    }


class ConfigStep:
    """The config step; the runner keeps the config it loaded."""

    config: EICConfig | None
    config_only: bool
    notes: list[ProblemRecord]

    def check_config(self) -> tuple[str, str]:
        """Validate the config; with config_only, what it needs from its node
        (a flag file, the vendor SDK) is a note, since it may be checked
        elsewhere."""
        path = config_path_from_env()
        warn_about_env()  # a warning here makes the step WARN (check_report.py)
        try:
            self.config = EICConfig.from_env(node_checks=not self.config_only)
        except ConfigError as e:
            records = [problem_record(e.source, p) for p in e.problems]
            if len(e.problems) == 1:  # the fix on its own line
                raise StepFailed(
                    f"EIC config {dataclasses.replace(e.problems[0], fix='').text(e.source)}", e.fix, records
                ) from None
            raise StepFailed(str(e), "correct each line named above", records) from None
        config = self.config
        source = path or "no config file: the embedded engine with default settings"
        detail = (
            f"{source} (remote_url {config.remote_url}, eic_kv_ns {config.eic_kv_ns!r}, eic_kv_ttl {config.eic_kv_ttl})"
        )
        if config.overridden_by:
            detail += f"; overridden by {', '.join(config.overridden_by)}"
        if self.config_only and config.scheme == "eic" and not sdk_installed():
            detail += (
                "; note: this host has no vendor EIC SDK (`import eic` fails); the node that runs this config "
                f"needs it (pip install {SDK_WHEEL_URL})"
            )
        missing = node_problems(config) if self.config_only else []
        if missing:
            self.notes = [problem_record(config.source, p) for p in missing]
            notes = "; ".join(f"not on this host, needed where it runs: {p.text(config.source)}" for p in missing)
            return WARN, f"{detail}; {notes}"
        return PASS, detail


class ConfigOnlyCheck(ConfigStep, StepRunner):
    """`check --config-only`: the config step alone; nothing is connected."""

    def __init__(self, out: TextIO, as_json: bool) -> None:
        super().__init__(out, as_json, config_only=True)
        self.notes = []

    def take_notes(self) -> list[ProblemRecord]:
        notes, self.notes = self.notes, []
        return notes

    def run_steps(self) -> int:
        self.step("config", self.check_config)
        return self.verdict()
