"""How `aibrix-eic check` runs its steps and reports them: one line per step
(or one JSON document), a verdict, the exit status. Imports nothing heavy:
`check --config-only` runs with PyYAML alone (check_config.py)."""

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ..config import EICConfig

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"

# One problem of a config as `--json` gives it.
ProblemRecord = dict[str, Any]


class StepFailed(Exception):
    """A step's finding: what went wrong and what to do about it; problems,
    when the step found several, one record each."""

    def __init__(self, detail: str, fix: str = "", problems: list[ProblemRecord] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix
        self.problems = problems or []


@dataclass
class StepResult:
    name: str
    verdict: str  # PASS, FAIL, WARN or SKIP
    seconds: float
    detail: str
    fix: str = ""
    problems: list[ProblemRecord] = field(default_factory=list)


class LoggedWarnings(logging.Handler):
    """The warnings aibrix_eic logs while a step runs: the step shows them and
    says WARN (without -v the library's logs are otherwise not shown)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.seen:  # the same warning from a later step adds nothing
            self.seen.add(message)
            self.messages.append(message)

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        library = logging.getLogger("aibrix_eic")
        level = library.level
        if library.getEffectiveLevel() > logging.WARNING:
            library.setLevel(logging.WARNING)
        library.addHandler(self)
        try:
            yield
        finally:
            library.removeHandler(self)
            library.setLevel(level)


# The columns of a step line: verdict, name, time, detail.
_INDENT = "  " + " " * 4 + "  " + " " * 20 + " " + " " * 12 + "  "


class StepRunner:
    """Runs steps in order (after a failure the rest are skipped), prints
    each, and ends with the verdict."""

    config: "EICConfig | None"

    def __init__(self, out: TextIO, as_json: bool, config_only: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.config_only = config_only
        self.warnings = LoggedWarnings()
        self.results: list[StepResult] = []
        self.config = None

    def run(self) -> int:
        with self.warnings.installed():
            return self.run_steps()

    def run_steps(self) -> int:
        raise NotImplementedError

    def step(self, name: str, action: Callable[[], tuple[str, str]]) -> None:
        if any(result.verdict == FAIL for result in self.results):
            self.record(StepResult(name, SKIP, 0.0, "skipped after the failure above"))
            return
        started = time.perf_counter()
        self.warnings.take()
        problems: list[ProblemRecord] = []
        try:
            verdict, detail = action()
            fix = ""
            problems = self.take_notes()
        except StepFailed as e:
            verdict, detail, fix, problems = FAIL, e.detail, e.fix, e.problems
        except Exception as e:  # a bug in this command, not in the setup
            verdict, detail = FAIL, f"internal error: {e!r}"
            fix = "this is a bug in aibrix-eic; rerun with -v and report the output"
        logged = self.warnings.take()
        if logged:
            detail = "; ".join([detail, *(f"warning: {message}" for message in logged)])
            verdict = WARN if verdict == PASS else verdict
        self.record(StepResult(name, verdict, time.perf_counter() - started, detail, fix, problems))

    def take_notes(self) -> list[ProblemRecord]:
        """Problem records a step that passed (with warnings) left behind."""
        return []

    def record(self, result: StepResult) -> None:
        self.results.append(result)
        if self.as_json:
            return  # one document at the end, from verdict()
        timing = f"{result.seconds * 1000:9.1f} ms" if result.verdict != SKIP else " " * 12
        detail = result.detail.replace("\n", "\n" + _INDENT)  # a config error lists one problem a line
        print(f"  {result.verdict}  {result.name:<20} {timing}  {detail}", file=self.out)
        if result.fix:
            print(f"{_INDENT}fix: {result.fix}", file=self.out)
        self.out.flush()

    def verdict(self) -> int:
        total_ms = sum(result.seconds for result in self.results) * 1000
        failed = [result for result in self.results if result.verdict == FAIL]
        if self.as_json:
            return self.json_verdict(failed, total_ms)
        if failed:
            first = failed[0]
            if len(first.problems) > 1:  # each is on the step's lines above: not twice
                print(f"verdict: FAIL at {first.name}: {len(first.problems)} problems, listed above", file=self.out)
                return 1
            print(f"verdict: FAIL at {first.name}: {first.detail}", file=self.out)
            if first.fix:
                print(f"         fix: {first.fix}", file=self.out)
            return 1
        where = self.config.remote_url if self.config else "?"
        warnings = sum(1 for result in self.results if result.verdict == WARN)
        note = f", {warnings} warning(s)" if warnings else ""
        if self.config_only:
            print(f"verdict: PASS: the config is valid for {where} (not connected{note})", file=self.out)
            return 0
        print(
            f"verdict: PASS: the EIC connector works against {where} "
            f"({len(self.results)} steps in {total_ms:.1f} ms{note})",
            file=self.out,
        )
        return 0

    def json_verdict(self, failed: list[StepResult], total_ms: float) -> int:
        """`check --json`: one object, the verdict and a list of steps; a
        step's config problems are records (file, line, key, problem, fix)."""
        document = {
            "verdict": FAIL if failed else PASS,
            "failed_step": failed[0].name if failed else None,
            "remote_url": self.config.remote_url if self.config else None,
            "total_ms": round(total_ms, 3),
            "steps": [
                {
                    "name": result.name,
                    "verdict": result.verdict,
                    "ms": round(result.seconds * 1000, 3),
                    "detail": _json_detail(result),
                    "fix": result.fix or None,
                    "problems": result.problems,
                }
                for result in self.results
            ],
        }
        print(json.dumps(document, indent=2), file=self.out)
        return 1 if failed else 0


def _json_detail(result: StepResult) -> str:
    """A failed step's detail, less the problems its records hold: each is
    in the document once."""
    if result.verdict != FAIL or not result.problems:
        return result.detail
    files = sorted({str(record["file"] or record["variable"]) for record in result.problems})
    return f"{len(result.problems)} problem(s) in {', '.join(files)}, one record each in problems"
