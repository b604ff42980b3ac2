"""Memory capture's cost inside the service (issue: "throughput with memory capture on within 1%
of off; peak RSS of tandem's own capture under 10 MiB").

Paired rounds in one process, as bench_probe does (this shared machine's speed drifts between
processes): a Python workload holding 150 MB of small objects (so pymalloc's statistics have
pools to walk) runs rounds with and without the probe's memory sampler beside it, their order
alternating; each figure is the median over the rounds of the process's CPU time per unit of
work (the sampler's own CPU and its GIL holds included). The sampler runs at 100 samples a
second, 100x its real rate, so that its cost stands out of the noise; the overhead at one
sample a second is that excess divided by 100. The capture's RSS is the process's before and
after the sampler's first samples (ctypes, its thread, its readers).
"""
from __future__ import annotations

import os
import statistics
import threading
import time

from bench import Row

ROUNDS = 21
ROUND_S = 0.4
AMPLIFY = 100  # samples a second in the measured rounds / the real rate (one a second)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def _work(stop_at: float) -> tuple[int, float]:
    """Units of dict and str work until STOP_AT (process CPU time), and the CPU time they took."""
    began, units = time.process_time(), 0
    while time.process_time() < stop_at:
        table = {i: str(i) * 3 for i in range(500)}
        units += len("".join(table.values())) > 0
    return units, time.process_time() - began


def main(console) -> list[Row]:
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
    per_second = 1 + excess / AMPLIFY
    console.print(f"memory sampler at {AMPLIFY}/s: {excess:+.2%} CPU per unit of work; at 1/s: {excess / AMPLIFY:+.4%}; "
                  f"capture RSS {capture_kib} KiB")
    return [
        Row("memory", "workload CPU per unit, memory sampler on (1/s) vs off", per_second, 1.0, "x", "<= 1.01x",
            per_second <= 1.01),
        Row("memory", "RSS of the in-process capture (ctypes, thread, readers)", capture_kib / 1024, 10.0, "MiB",
            "< 10 MiB", capture_kib / 1024 < 10),
    ]


if __name__ == "__main__":
    from rich.console import Console

    for row in main(Console()):
        print(row)
