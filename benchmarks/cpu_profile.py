"""Where a vLLM server's CPU goes during one serving-benchmark pass:
py-spy samples the server's process tree (every thread that runs Python
code, not idle ones) and each sample is charged to the component whose code
it is in, looking from the innermost frame outwards, so a torch copy that
our engine makes is the engine's, and one the model makes is the model's.

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
# (component, path fragment) in the order they are tried on each frame; the
# first frame from the innermost out that matches one decides.
COMPONENTS = (
    ("engine store (embedded EIC)", "aibrix_eic/engine/"),
    ("aibrix_eic connector", "aibrix_eic/"),
    ("AIBrix (cache manager, L1, connector)", "aibrix_kvcache/"),
    ("CPU adapter copies (test scaffolding)", "tests/e2e/"),
    ("model forward", "vllm/model_executor/"),
    ("model forward", "vllm/v1/attention/"),
    ("model forward", "torch/nn/"),
    ("vLLM (scheduler, runner, API server)", "vllm/"),
)
OTHER = "other (no component frame)"
_FRAME = re.compile(r"\((?P<path>[^():]+):\d+\)$")


def component(stack: str) -> str:
    """The component a collapsed stack (`outer;...;inner`) is charged to."""
    for frame in reversed(stack.split(";")):
        match = _FRAME.search(frame)
        if match is None:
            continue
        path = match["path"]
        for name, fragment in COMPONENTS:
            if fragment in path:
                return name
    return OTHER


def summarise(raw: str) -> Counter[str]:
    """Samples per component in py-spy's raw (collapsed) output."""
    samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples[component(stack)] += int(count)
    return samples


class Recording:
    """py-spy recording a process and its children until stopped."""

    def __init__(self, pid: int, out: Path, py_spy: str, rate_hz: int = RATE_HZ) -> None:
        self.out, self.rate_hz = out, rate_hz
        argv = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
        argv += ["--rate", str(rate_hz), "--format", "raw", "--output", str(out)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        """CPU seconds per component (samples / rate), and their total."""
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        _, err = self.proc.communicate(timeout=120)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.strip()[-500:]}")
        samples = summarise(self.out.read_text(errors="replace"))
        seconds = {name: n / self.rate_hz for name, n in samples.most_common()}
        return {"cpu_s": seconds, "total_cpu_s": sum(seconds.values()), "raw": str(self.out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--rate", type=int, default=RATE_HZ)
    args = parser.parse_args()
    samples = summarise(Path(args.raw).read_text(errors="replace"))
    total = sum(samples.values())
    for name, n in samples.most_common():
        print(f"{n / args.rate:8.1f} s  {n / total:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
