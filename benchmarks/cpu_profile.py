"""Where a vLLM server's CPU goes during one serving-benchmark pass:
py-spy samples the server's process tree (every thread that runs Python
code, not idle ones) and each sample is charged to the component whose code
it is in, the innermost frame that names one deciding (so a torch copy that
our engine makes is the engine's, and a model layer that AIBrix's wrapped
`execute_model` runs is the model's).

benchmarks/serve.py --profile uses it around pass 2 (the reload); run alone
it summarises a raw py-spy file:

    python benchmarks/cpu_profile.py RAW_FILE [--rate 50]
"""

import argparse
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE_HZ = 50  # samples per second per thread: cheap for py-spy, fine enough for shares
# Tried on each frame from the innermost out; the first frame that matches
# decides. So the engine's copy inside our connector inside AIBrix is the
# engine's, and a model layer inside AIBrix's wrapped execute_model is the
# model's (its innermost frames, vLLM's custom ops and torch, match nothing).
COMPONENTS = (
    ("engine store (embedded EIC)", "aibrix_eic/engine/"),
    ("aibrix_eic connector", "aibrix_eic/"),
    ("AIBrix (cache manager, L1, connector)", "aibrix_kvcache/"),
    # the e2e adapters (tests/e2e is on the server's path, so py-spy names them bare)
    ("CPU adapter copies (test scaffolding)", "tests/e2e/"),
    ("CPU adapter copies (test scaffolding)", "kv_layout"),
    ("CPU adapter copies (test scaffolding)", "cpu_adapt.py"),
    ("CPU adapter copies (test scaffolding)", "cpu_tiering.py"),
    # vLLM's own tiered offloading: its fs tier, and the rest (lookups, jobs, CPU primary)
    ("vLLM fs tier", "vllm/v1/kv_offload/tiering/fs/"),
    ("vLLM KV offloading (tiering, CPU primary)", "vllm/v1/kv_offload/"),
    ("model forward", "vllm/model_executor/"),
    ("model forward", "vllm/v1/attention/"),
    # vLLM's processes spin on their shared-memory queues while they wait
    # for work (sched_yield in a loop): CPU, but no work
    ("vLLM waiting for work (shm queue spin)", "shm_broadcast.py"),
)
VLLM = ("vLLM (scheduler, runner, API server)", "vllm/")  # when no frame matched the above
OTHER = "other (no component frame)"
_FRAME = re.compile(r"\((?P<path>[^():]+):\d+\)$")


def component(stack: str) -> str:
    """The component a collapsed stack (`outer;...;inner`) is charged to."""
    paths = [m["path"] for frame in stack.split(";") if (m := _FRAME.search(frame))]
    for path in reversed(paths):
        for name, fragment in COMPONENTS:
            if fragment in path:
                return name
    return VLLM[0] if any(VLLM[1] in path for path in paths) else OTHER


STEP_FRAME = "execute_model ("  # the model runner's step, on the worker's main thread


def summarise(raw: str, within: str | None = None) -> Counter[str]:
    """Samples per component in py-spy's raw (collapsed) output; with
    `within`, only of stacks that have a frame containing it."""
    samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and (within is None or within in stack):
            samples[component(stack)] += int(count)
    return samples


class Recording:
    """py-spy recording a process and its children until stopped. mode
    "cpu": threads while they run; "step": the worker's model step
    (`execute_model`) whether it runs or waits, i.e. where the time of the
    steps every request waits on goes."""

    def __init__(self, pid: int, out: Path, py_spy: str, mode: str = "cpu", rate_hz: int = RATE_HZ) -> None:
        self.out, self.rate_hz, self.mode = out, rate_hz, mode
        argv = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
        argv += ["--rate", str(rate_hz), "--format", "raw", "--output", str(out)]
        if mode == "step":
            argv.append("--idle")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        """CPU seconds per component (samples / rate), and their total."""
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        _, err = self.proc.communicate(timeout=120)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.strip()[-500:]}")
        within = STEP_FRAME if self.mode == "step" else None
        samples = summarise(self.out.read_text(errors="replace"), within)
        seconds = {name: n / self.rate_hz for name, n in samples.most_common()}
        return {"mode": self.mode, "seconds": seconds, "total_s": sum(seconds.values()), "raw": str(self.out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--rate", type=int, default=RATE_HZ)
    parser.add_argument("--step", action="store_true", help="only the model step's stacks (a --idle recording)")
    args = parser.parse_args()
    samples = summarise(Path(args.raw).read_text(errors="replace"), STEP_FRAME if args.step else None)
    total = sum(samples.values())
    for name, n in samples.most_common():
        print(f"{n / args.rate:8.1f} s  {n / total:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
