"""`make bench`: every benchmark runs side by side with its anchor in one run, reported as ratios.

Each `bench/bench_*.py` module defines `main(console) -> list[Row]`; `python -m bench`
runs them all (or those named on the command line) and prints one table.
"""
from dataclasses import dataclass


@dataclass
class Row:
    area: str        # "ingest", "probe", "join", ...
    what: str        # what was measured, e.g. "tandem ingest vs EventStream.openFile"
    ours: float      # seconds (or ns/event, see unit)
    anchor: float    # same unit, the anchor's figure
    unit: str        # "s", "ns/event", "events/s"
    goal: str        # the bar from the issue, e.g. "<= 1.5x"
    ratio_ok: bool | None  # whether the bar is met; None: a row without a bar (a floor, a breakdown)

    @property
    def ratio(self) -> float:
        return self.ours / self.anchor if self.anchor else float("inf")


# Runs a command and reports its wall time and exit status, and the command's own peak RSS
# from wait4. It runs from this small launcher, not from the benchmark's process: Linux
# carries the forking process's RSS high-water mark into a child through exec, so a child
# of a benchmark holding its data would report the benchmark's peak, not its own.
_LAUNCHER = """
import os, subprocess, sys, time
began = time.perf_counter()
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{time.perf_counter() - began} {os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def run_child(argv: list[str], env: dict | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (GiB) of one command; raises with its stderr if it fails."""
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("r", prefix="tandem-bench-child-") as result:
        launcher = subprocess.run([sys.executable, "-c", _LAUNCHER, result.name, *argv], env=env,
                                  stderr=subprocess.PIPE, text=True)
        fields = result.read().split()
    if launcher.returncode or not fields or int(fields[1]) != 0:
        raise RuntimeError(f"{argv[:3]} failed: {launcher.stderr[-2000:]}")
    return float(fields[0]), int(fields[2]) / 2**20
