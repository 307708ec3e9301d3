"""Why the config checks are hand-written and not pydantic v2 (which
aibrix-kvcache installs): the figures behind docs/config.md's note.

    .venv/bin/python benchmarks/config_pydantic.py

1. Coercion and messages: the same bad values through our checks and
   through a pydantic model declaring the same types and ranges (lax mode,
   its default). Counts what pydantic accepts that we refuse, and how many
   of its messages name the value given, or a fix.
2. Import cost, same run, fresh interpreters: `import aibrix_eic.config`
   against `import pydantic` plus building that model.
"""

import statistics
import subprocess
import sys
import textwrap

MODEL = textwrap.dedent(
    """
    from pydantic import BaseModel, ConfigDict, Field

    class PydanticConfig(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        eic_thread_num: int = Field(6, ge=1, le=1024)
        fail_open: bool = True
        get_timeout_ms: float = Field(2000.0, ge=0.001, le=3_600_000, allow_inf_nan=False)
        eic_kv_ns: str = ""
        model_id: str | None = None
    """
)

# key, value as a YAML file would give it
CASES = [
    ("eic_thread_num", True),
    ("fail_open", 1),
    ("eic_thread_num", "six"),
    ("eic_thread_num", 0),
    ("fail_open", "maybe"),
    ("get_timeout_ms", 10**400),
    ("eic_kv_ns", 7),
    ("model_id", 3.1),
    ("eic_kv_nss", "a"),
]


def compare() -> None:
    from pydantic import ValidationError

    from aibrix_eic.config import ConfigError, EICConfig

    namespace: dict = {}
    exec(MODEL, namespace)
    model = namespace["PydanticConfig"]
    accepted_wrongly = named_value = with_fix = refused = 0
    print(f"{'input':<28} {'ours':<70} pydantic")
    for key, value in CASES:
        try:
            EICConfig.from_mapping({"remote_url": "local://", key: value})
            ours = "accepted"
        except ConfigError as e:
            ours = f"{e.problem} (fix: {e.fix})"
        try:
            theirs = f"accepted as {getattr(model(**{key: value}), key)!r}"
            if ours != "accepted":
                accepted_wrongly += 1
        except ValidationError as e:
            error = e.errors()[0]
            theirs = f"{error['type']}: {error['msg']}"
            refused += 1
            named_value += repr(value) in error["msg"]
            with_fix += "fix" in error["msg"].lower() or "did you mean" in error["msg"].lower()
        shown = f"{key}: {value!r}"[:27]
        print(f"{shown:<28} {ours[:69]:<70} {theirs[:90]}")
    print(
        f"\npydantic accepted {accepted_wrongly} of {len(CASES)} values we refuse; of its {refused} refusals, "
        f"{named_value} name the value given and {with_fix} a fix"
    )


def import_ms(code: str, runs: int) -> float:
    timer = f"import time; t = time.perf_counter(); {code}; print((time.perf_counter() - t) * 1000)"
    times = [float(subprocess.check_output([sys.executable, "-c", timer], text=True)) for _ in range(runs)]
    return statistics.median(times)


def imports(runs: int = 7) -> None:
    ours = import_ms("import aibrix_eic.config", runs)
    theirs = import_ms(f"exec({MODEL!r})", runs)
    print(
        f"\nfresh interpreter, median of {runs}: import aibrix_eic.config {ours:.0f} ms; "
        f"import pydantic + a 5-field model {theirs:.0f} ms ({theirs / ours:.1f}x). "
        "vLLM imports pydantic itself, so inside a vLLM worker this cost is already paid."
    )


if __name__ == "__main__":
    compare()
    imports()
