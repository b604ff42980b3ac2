"""Memory capture's cost (issue: "the demo's throughput with memory capture on within 1% of
off; peak RSS of tandem's own capture under 10 MiB"), side by side in one run.

1. The demo (`python -m engine.demo.workload`: Python request threads calling an embedded JVM
   with JPype) under `tandem record` with memory capture on (the default) and with
   `--no-memory` (no recorder sampler, no sampler thread in CPython, no JFR memory events),
   PAIRS pairs of DEMO_S seconds, the order rotating within each pair; each pair also runs
   capture off a second time, whose ratio to the first off run is the machine's noise floor for
   the ratio (shown beside the bar: the bar resolves only where that is under 1%). Throughput: the
   demo's own request count over its run; the figure is the median of the pairs' on/off
   ratios (this shared machine's speed drifts between runs: a pair's two runs are adjacent),
   with their spread: where it is far wider than 1%, the median does not resolve the bar.
   So also, per run with capture on: the capture's CPU (the recorder's sampler thread, written
   to session.json's memory_capture, and each CPython sampler thread's, the last cpu_ns of its
   memory.jsonl; JFR's periodic memory events are not counted) over the service's CPU
   (/proc/PID/stat): a CPU-bound service loses at most that share of its throughput.
2. The capture's peak RSS: in tandem's recorder, the most `tandem record`'s own process held
   while the command ran (VmRSS, polled every 0.1 s), on less off (median over the runs);
   inside each CPython, the process's RSS before and after the probe's sampler took its
   first sample (ctypes, its thread, its readers). Their sum is the capture's.
3. No bar, a breakdown the demo cannot resolve: the in-process sampler's CPU per unit of a
   Python workload holding 150 MB of small objects (so pymalloc's statistics have pools to
   walk), at 100 samples a second, 100x its real rate, divided back to one a second (paired
   rounds in one process, as bench_probe does).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import Row

PAIRS = int(os.environ.get("TANDEM_BENCH_MEMORY_PAIRS", "5"))
DEMO_S = float(os.environ.get("TANDEM_BENCH_MEMORY_DEMO_SECONDS", "10"))
ROUNDS = 21
ROUND_S = 0.4
AMPLIFY = 100  # samples a second in the measured rounds / the real rate (one a second)


def _rss_kib() -> int:
    return _status_kib(os.getpid(), "VmRSS")


def _work(stop_at: float) -> tuple[int, float]:
    """Units of dict and str work until STOP_AT (process CPU time), and the CPU time they took."""
    began, units = time.process_time(), 0
    while time.process_time() < stop_at:
        table = {i: str(i) * 3 for i in range(500)}
        units += len("".join(table.values())) > 0
    return units, time.process_time() - began


def _in_process(console) -> tuple[float, int]:
    """(CPU excess per unit of work at one sample a second, RSS of the in-process capture in KiB)."""
    from engine.probe import _json
    from engine.probe.memory import _Readers

    kept = ["%0415d" % i for i in range(300_000)]  # noqa: F841  (150 MB of small objects, as a service holds)
    before = _rss_kib()
    readers = _Readers()
    sink = os.open(os.devnull, os.O_WRONLY)
    os.write(sink, (_json(readers.sample()) + "\n").encode())
    capture_kib = _rss_kib() - before
    sampling = threading.Event()

    def sampler() -> None:
        while True:
            sampling.wait()
            os.write(sink, (_json(readers.sample()) + "\n").encode())
            time.sleep(1 / AMPLIFY)

    threading.Thread(target=sampler, daemon=True).start()
    ratios = []
    for round_ in range(ROUNDS):
        costs = {}
        for on in ((False, True) if round_ % 2 else (True, False)):
            sampling.set() if on else sampling.clear()
            time.sleep(0.02)
            units, cpu = _work(time.process_time() + ROUND_S)
            costs[on] = cpu / units
        sampling.clear()
        ratios.append(costs[True] / costs[False])
    excess = statistics.median(ratios) - 1
    console.print(f"in-process sampler at {AMPLIFY}/s: {excess:+.2%} CPU per unit of work; at 1/s: {excess / AMPLIFY:+.4%}; "
                  f"its RSS {capture_kib} KiB")
    return excess / AMPLIFY, capture_kib


def _demo(memory: bool) -> tuple[float, int, tuple[float, float], float]:
    """One run of the demo under `tandem record`: (requests a second, peak VmRSS of tandem's own
    process in KiB while the command ran, CPU seconds of the memory capture (the recorder's
    sampler, CPython's: as they report it), CPU seconds of the service)."""
    with tempfile.TemporaryDirectory(prefix="tandem-bench-memory-") as tmp:
        session = Path(tmp) / "session"
        argv = [sys.executable, "-m", "engine", "record", "-o", str(session), *([] if memory else ["--no-memory"]), "--",
                sys.executable, "-m", "engine.demo.workload", "--seconds", f"{DEMO_S:g}"]
        recorder = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        peak, service_cpu = 0, 0.0
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.append(recorder.stdout.read()), daemon=True)
        reader.start()
        while recorder.poll() is None:
            service = list(session.glob("py-*"))
            rss = _status_kib(recorder.pid, "VmRSS")
            if service and rss is not None and "end_monotonic_ns" not in _session_json(session):
                peak = max(peak, rss)
                service_cpu = max(service_cpu, _cpu_s(int(service[0].name[3:])) or 0.0)  # (its last reading before it exits)
            time.sleep(0.1)
        reader.join()
        found = re.search(r"demo workload: (\d+) requests", "".join(output))
        if recorder.returncode or not found:
            raise RuntimeError(f"{argv}: exit {recorder.returncode}: {''.join(output)[-2000:]}")
        recorder_cpu = _session_json(session).get("memory_capture", {}).get("cpu_s", 0.0)
        python_cpu = 0.0
        for samples in session.glob("py-*/memory.jsonl"):
            lines = samples.read_text().splitlines()
            python_cpu += json.loads(lines[-1]).get("cpu_ns", 0) / 1e9 if lines else 0.0
        return int(found.group(1)) / DEMO_S, peak, (recorder_cpu, python_cpu), service_cpu


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _session_json(session: Path) -> dict:
    try:
        return json.loads((session / "session.json").read_text())
    except (OSError, ValueError):
        return {}


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), None)
    except OSError:
        return None


def main(console) -> list[Row]:
    ratios, floors, peaks, cpu_shares = [], [], {True: [], False: []}, []
    for pair in range(PAIRS):
        # Each pair also runs capture off twice: the second off over the first is this machine's
        # noise floor for the ratio (the same program twice), shown beside the bar.
        order = [(True, 0), (False, 0), (False, 1)]
        order = order[pair % 3:] + order[:pair % 3]
        runs = {}
        for memory, again in order:
            runs[(memory, again)] = _demo(memory)
            peaks[memory].append(runs[(memory, again)][1])
        on, off, off_again = runs[(True, 0)], runs[(False, 0)], runs[(False, 1)]
        ratios.append(on[0] / off[0])
        floors.append(off_again[0] / off[0])
        cpu_shares.append(sum(on[2]) / on[3])
        console.print(f"pair {pair + 1}/{PAIRS}: {on[0]:.0f} requests/s with memory capture, "
                      f"{off[0]:.0f} and {off_again[0]:.0f} without ({ratios[-1]:.3f}x; off/off {floors[-1]:.3f}x); "
                      f"recorder peak RSS {on[1] / 1024:.1f} vs {off[1] / 1024:.1f} MiB; capture CPU {on[2][0]:.3f} s in the "
                      f"recorder + {on[2][1]:.3f} s in CPython, of the service's {on[3]:.1f} s")
    throughput = statistics.median(ratios)
    # How far apart the pairs are: on a loaded machine far wider than the 1% bar, which the
    # median then does not resolve (the in-process row below does, for the sampler's part).
    spread = max(ratios) / min(ratios)
    floor = statistics.median(abs(1 - f) for f in floors)
    recorder_kib = statistics.median(peaks[True]) - statistics.median(peaks[False])
    cpu_share = statistics.median(cpu_shares)
    cpu_excess, in_process_kib = _in_process(console)
    capture_mib = (recorder_kib + in_process_kib) / 1024
    console.print(f"capture CPU / service CPU: median {cpu_share:.3%} ({', '.join(f'{c:.3%}' for c in cpu_shares)})")
    console.print(f"demo throughput, capture on / off: median {throughput:.4f}x over {PAIRS} pairs "
                  f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)}); off/off: {', '.join(f'{r:.3f}' for r in floors)}; capture's peak RSS {capture_mib:.2f} MiB "
                  f"(recorder {recorder_kib / 1024:+.2f} MiB, in each CPython {in_process_kib / 1024:.2f} MiB)")
    return [
        Row("memory", f"demo throughput, memory capture on vs off (median of {PAIRS} pairs)", throughput, 1.0, "x",
            ">= 0.99x", throughput >= 0.99),
        Row("memory", "spread of the pairs' throughput ratios (largest / smallest)", spread, 1.0, "x", "-", None),
        Row("memory", "noise floor: capture off twice, median |1 - off/off| (the bar resolves when this is under 1%)",
            1 + floor, 1.0, "x", "report", None),
        # What the throughput cannot resolve here: the capture's CPU (the recorder's sampler and
        # CPython's, as they count their own threads' time) against the service's CPU over the
        # same run; a CPU-bound service loses at most that share of its throughput.
        Row("memory", "memory capture's CPU / the service's CPU (median of the on runs)", 1 + cpu_share, 1.0, "x",
            "<= 1.01x", cpu_share <= 0.01),
        Row("memory", "peak RSS of the capture (recorder's on less off + in-process sampler)", capture_mib, 10.0, "MiB",
            "< 10 MiB", capture_mib < 10),
        Row("memory", "in-process sampler CPU per unit of Python work at 1/s (from 100/s)", 1 + cpu_excess, 1.0, "x",
            "-", None),
    ]


if __name__ == "__main__":
    from rich.console import Console

    for row in main(Console()):
        print(row)
