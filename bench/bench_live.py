"""`tandem live -- python -m engine.demo.workload`: how late a JVM pause reaches tandem live's
rows, and what tandem live costs.

One run with the agent's pause ring (`tandem live` passes live=true) and one without (the
JFR repository re-read, as before), same workload, same machine, back to back.

- Latency: per pause of the kinds the ring carries (safepoint, gc_pause, gc), the part row's
  `arrived_ns` (CLOCK_MONOTONIC when tandem live had the row) minus the pause's end. Pauses
  the ring never had (JFR start-up, before the agent's stream) come in late from the
  repository by design and are counted apart, not in the percentiles.
- Anchor: the ring's own commit-to-reader latency in the same run, measured by a tailer in
  this process polling pauses.ring every 20 ms (JFR delivers at its flushes: about 1 s).
- Cost: tandem live's own peak RSS (VmHWM) at 1/3, 2/3 and the end of the run; its CPU
  seconds (user + system); both from /proc every 0.1 s (the last sample before exit).

TANDEM_BENCH_LIVE_SECONDS (default 60) sets the workload's length.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import Row

SECONDS = float(os.environ.get("TANDEM_BENCH_LIVE_SECONDS", "60"))
BAR_P99_S = 1.3
RING_KINDS = ("safepoint", "gc_pause", "gc")


def _hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tail_ring(session: Path, stop: threading.Event, lat_ns: list[int]) -> None:
    """The anchor: the pause ring read every 20 ms; arrival minus pause end per record."""
    from engine.ring import RingTailer

    tailer = None
    while not stop.is_set():
        if tailer is None:
            rings = list(session.glob("jvm-*/pauses.ring"))
            if rings:
                try:
                    tailer = RingTailer(rings[0])
                except Exception:
                    tailer = None
        if tailer is not None:
            records = tailer.poll()
            now = time.monotonic_ns()
            keep = np.isin(records["kind"], (1, 2, 3))
            lat_ns.extend((now - records["end_ns"][keep].astype(np.int64)).tolist())
            if tailer.closed_by_producer:
                break
        stop.wait(0.02)


def run_once(ring: bool, seconds: float, workdir: Path) -> dict:
    import pandas as pd

    session = workdir / ("ring" if ring else "repository")
    argv = [sys.executable, "-c", "from engine.commands import main; main()", "live", "--session", str(session),
            "--pause-ring" if ring else "--no-pause-ring", "--",
            sys.executable, "-m", "engine.demo.workload", "--seconds", f"{seconds:g}"]
    stop, anchor = threading.Event(), []
    tail = threading.Thread(target=_tail_ring, args=(session, stop, anchor), daemon=True)
    tail.start()
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # tandem live's own figures (not its children's: the workload and the JVM), sampled
    # every 0.1 s from /proc until it exits; the last sample stands for the end.
    rss, marks, last = [], [seconds / 3, 2 * seconds / 3], (None, 0.0)
    err_chunks = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        hwm, cpu = _hwm_kib(proc.pid), _cpu_s(proc.pid)
        if hwm is not None:
            last = (hwm, cpu if cpu is not None else last[1])
        if marks and time.monotonic() - began >= marks[0]:
            marks.pop(0)
            rss.append(last[0])
        time.sleep(0.1)
    rss += [None] * (2 - len(rss)) + [last[0]]
    reader.join(5)
    err = "".join(err_chunks)
    stop.set()
    tail.join(5)
    if proc.returncode != 0:
        raise RuntimeError(f"tandem live exited {proc.returncode}: {err[-2000:]}")
    parts = sorted((session / "live").glob("part-*/pauses*.parquet"))
    pauses = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    pauses = pauses[pauses["kind"].astype(str).isin(RING_KINDS)]
    lat = (pauses["arrived_ns"].astype("int64") - pauses["end_ns"].astype("int64")).to_numpy() / 1e9
    # With the ring: rows the ring never had (start-up) come from the repository, late; they
    # are the ones carrying the repository's clock_offset_ns.
    start_up = np.zeros(len(lat), dtype=bool)
    if ring and "clock_offset_ns" in pauses.columns:
        start_up = pauses["clock_offset_ns"].notna().to_numpy()
    return {
        "lat": lat[~start_up], "late_start_up": int(start_up.sum()), "anchor": np.array(anchor) / 1e9,
        "rss_mib": [None if r is None else r / 1024 for r in rss], "cpu_s": last[1],
        "wall_s": time.monotonic() - began, "pauses": len(pauses),
    }


def main(console) -> list[Row]:
    seconds = SECONDS
    with tempfile.TemporaryDirectory(prefix="tandem-bench-live-") as tmp:
        before = run_once(False, seconds, Path(tmp))
        after = run_once(True, seconds, Path(tmp))
    rows = []
    p = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
    for label, r in (("before: JFR repository", before), ("after: pause ring", after)):
        console.print(f"{label}: {r['pauses']} pauses ({r['late_start_up']} start-up ones joined late), "
                      f"latency p50 {p(r['lat'], 50):.3f} s p99 {p(r['lat'], 99):.3f} s max {p(r['lat'], 100):.3f} s; "
                      f"ring commit-to-reader p50 {p(r['anchor'], 50):.3f} s p99 {p(r['anchor'], 99):.3f} s; "
                      f"max RSS MiB at 1/3, 2/3, end {r['rss_mib']}; CPU {r['cpu_s']:.2f} s over {r['wall_s']:.1f} s")
    a = after
    anchor99 = p(a["anchor"], 99) if len(a["anchor"]) else 1.0
    rows.append(Row("live", f"pause end -> live row p99, pause ring ({seconds:g} s run) vs ring commit p99",
                    p(a["lat"], 99), anchor99, "s", f"<= {BAR_P99_S} s", p(a["lat"], 99) <= BAR_P99_S))
    rows.append(Row("live", "pause end -> live row p50, pause ring vs ring commit p50",
                    p(a["lat"], 50), p(a["anchor"], 50), "s", "report", True))
    rows.append(Row("live", "pause end -> live row p99, before (repository) vs JFR flush floor 1 s",
                    p(before["lat"], 99), 1.0, "s", f"<= {BAR_P99_S} s", p(before["lat"], 99) <= BAR_P99_S))
    rss = [r for r in a["rss_mib"] if r is not None]
    rows.append(Row("live", "tandem live max RSS end vs at 1/3 (flat?)", rss[-1], rss[0], "MiB", "<= 1.2x",
                    rss[-1] <= 1.2 * rss[0]))
    rows.append(Row("live", "tandem live CPU seconds, pause ring vs repository", a["cpu_s"], before["cpu_s"], "s", "report", True))
    return rows
