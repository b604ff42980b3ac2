"""tandem fleet: Ray's scaling over workers, its overhead per task, and DuckDB's summary over sessions.

(a) 12 sessions (3 recorded runs of the demo workload, each copied under 4 hosts x 3 days as
    the tests do) analyzed by `run_fleet` on a local Ray cluster of 1 CPU, then of 2: bar
    1 worker / 2 workers >= 1.7, on warm workers (each has run the 12 sessions once, so its
    imports and its JVM are up: the state of a fleet run after its first sessions). The cold
    run (worker start, imports, JVM start inside the time) is reported beside it. Rounds
    alternate 1 and 2 workers; each round pairs the two under about the same load from the
    rest of the machine, and the round with the median ratio counts.
(b) Ray's own overhead per task: wall time of the 1-worker run minus the time spent inside
    its tasks, per task; and the round trip of an empty task on a warm worker.
(c) `fleet_summary` over 100 and over 1 000 synthetic sessions (the 12 real sessions' files
    copied under new session ids, hosts and days): bar 1 000 / 100 <= 12.
(d) For docs/fleet.md's estimate: one longer session (30 s) analyzed into a dataset in this
    process (JVM warm) beside a short one: CPU seconds and dataset bytes per recorded second.
TANDEM_BENCH_FLEET_ROUNDS (default 3) sets the rounds of (a).
"""
from __future__ import annotations

import calendar
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import Row

HOSTS = ("web-1", "web-2", "db-1", "db-2")
DATES = ("2026-11-28", "2026-11-29", "2026-11-30")


def record_sessions(work: Path, console) -> list[Path]:
    originals = []
    for i in range(3):
        session = work / "recorded" / f"s{i}"
        console.print(f"recording session {i + 1}/3 (demo workload, 6 s)")
        subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(session), "--", sys.executable, "-m",
                        "engine.demo.workload", "--seconds", "6", "--gc-period", "0.3"],
                       check=True, capture_output=True, timeout=300)
        originals.append(session)
    sessions = []
    for h, host in enumerate(HOSTS):
        for d, date in enumerate(DATES):
            original = originals[(h + d) % len(originals)]
            target = work / "fleet" / f"{host}-{date}"
            shutil.copytree(original, target, copy_function=os.link)
            description = json.loads((original / "session.json").read_text())
            description["hostname"] = host
            day_ns = 86_400 * 10**9
            description["start_wall_ns"] = calendar.timegm(time.strptime(date, "%Y-%m-%d")) * 10**9 + (
                description["start_wall_ns"] % day_ns)
            (target / "session.json").unlink()
            (target / "session.json").write_text(json.dumps(description))
            sessions.append(target)
    return sessions


def fleet_once(sessions: list[Path], root: Path, workers: int):
    import logging

    import ray

    from engine.fleet.run import run_fleet

    shutil.rmtree(root, ignore_errors=True)
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        time.sleep(2.0)  # let the cluster's own start-up settle before the clock starts
        cold = run_fleet([str(s) for s in sessions], root.with_name(root.name + "-cold"), progress=False)
        run = run_fleet([str(s) for s in sessions], root, progress=False)
        empty = ray.remote(num_cpus=1)(_empty)
        ray.get([empty.remote() for _ in range(20)])  # warm
        t0 = time.perf_counter()
        ray.get([empty.remote() for _ in range(200)])
        empty_task = (time.perf_counter() - t0) / 200
    finally:
        ray.shutdown()
    if run.failed or cold.failed:
        raise RuntimeError(f"fleet run failed: {run.failed + cold.failed}")
    return cold, run, empty_task


def _empty():
    return None


def synthesize(source: Path, root: Path, count: int) -> None:
    """`count` sessions made from the real ones in `source`: their files copied under new ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.fleet.dataset import dataset_tables

    shutil.rmtree(root, ignore_errors=True)
    originals = sorted((source / "sessions").glob("host=*/date=*/*.parquet"))
    parts = [(p.parent.parent.name, p.parent.name, p.stem) for p in originals]
    tables = {name: {} for name in dataset_tables()}
    for host_dir, date_dir, sid in parts:
        for name in tables:
            tables[name][sid] = pq.read_table(source / name / host_dir / date_dir / f"{sid}.parquet")
    hosts = max(1, count // 10)
    for k in range(count):
        _, _, sid = parts[k % len(parts)]
        host, date = f"host-{k % hosts:04d}", f"2026-11-{1 + (k // hosts) % 28:02d}"
        new_id = f"synthetic-{k:06d}"
        for name, by_session in tables.items():
            table = by_session[sid]
            table = table.set_column(0, "session_id", pa.array([new_id] * table.num_rows, pa.string()))
            directory = root / name / f"host={host}" / f"date={date}"
            directory.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, directory / f"{new_id}.parquet")


def summary_time(root: Path, runs: int = 3) -> float:
    from engine.fleet.summary import fleet_summary

    fleet_summary(root)  # warm: DuckDB's first-run costs, the page cache
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fleet_summary(root)
        best = min(best, time.perf_counter() - t0)
    return best


def dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.parquet"))


def longer_session(work: Path, short: Path, console) -> dict:
    """CPU seconds and dataset bytes of a 30 s session and of a short one, analyzed in this process."""
    from engine.fleet.dataset import analyze_into

    long = work / "recorded" / "long"
    console.print("recording one 30 s session")
    subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(long), "--", sys.executable, "-m",
                    "engine.demo.workload", "--seconds", "30", "--gc-period", "0.3"],
                   check=True, capture_output=True, timeout=600)
    analyze_into(short, work / "warm")  # JVM start, imports, numba cache
    figures = {}
    for name, session in (("short", short), ("long", long)):
        cpu, wall = time.process_time(), time.perf_counter()
        analysis, _, files = analyze_into(session, work / f"one-{name}")
        figures[name] = {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                         "bytes": sum(p.stat().st_size for p in files.values()),
                         "bytes_per_table": {t: p.stat().st_size for t, p in files.items()},
                         "span_s": analysis.header["span_ns"] / 1e9, "pauses": analysis.header["pauses"],
                         "gil_intervals": analysis.header["gil_intervals"]}
        console.print(f"{name}: {figures[name]}")
    return figures


def main(console) -> list[Row]:
    import pandas as pd

    rounds = int(os.environ.get("TANDEM_BENCH_FLEET_ROUNDS", "3"))
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-fleet-"))
    try:
        sessions = record_sessions(work, console)
        times = {1: [], 2: []}
        cold_times = {1: [], 2: []}
        runs = {}
        for r in range(rounds):
            for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
                cold, run, empty_task = fleet_once(sessions, work / f"ds{workers}", workers)
                times[workers].append(run.seconds)
                cold_times[workers].append(cold.seconds)
                runs.setdefault(workers, (run, empty_task))
                for label, one_run in (("cold", cold), ("warm", run)):
                    console.print(f"round {r + 1}: {workers} worker(s), {label}: {one_run.seconds:.2f} s for "
                                  f"{len(sessions)} sessions (inside tasks {one_run.tasks_seconds:.2f} s, "
                                  f"CPU {sum(o.cpu_seconds for o in one_run.outcomes):.2f} s)")
        paired = sorted(range(rounds), key=lambda r: times[1][r] / times[2][r])
        median = paired[len(paired) // 2]
        one, two = times[1][median], times[2][median]
        console.print("paired ratios per round: " + ", ".join(f"{times[1][r] / times[2][r]:.2f}x" for r in range(rounds)))
        console.print(f"load average after the Ray rounds (1, 5, 15 min): {os.getloadavg()}: other work on the "
                      "machine takes CPU from both configurations")
        cold_one, cold_two = cold_times[1][median], cold_times[2][median]
        run1, empty1 = runs[1]
        overhead = max(0.0, run1.seconds - run1.tasks_seconds) / len(sessions)
        sessions_df = pd.read_parquet(work / "ds1" / "sessions")
        per_session_bytes = dataset_bytes(work / "ds1") / len(sessions)
        console.print(
            f"per session: {run1.tasks_seconds / len(sessions):.2f} s in task, "
            f"{sum(o.cpu_seconds for o in run1.outcomes) / len(sessions):.2f} CPU s, "
            f"{per_session_bytes / 1e6:.2f} MB of dataset, recorded {sessions_df['span_ns'].mean() / 1e9:.2f} s, "
            f"{sessions_df['pauses'].mean():.0f} pauses, {sessions_df['gil_intervals'].mean():.0f} GIL intervals; "
            f"Ray overhead {overhead * 1e3:.0f} ms/task (1-worker run), empty task {empty1 * 1e3:.2f} ms")

        synthesize(work / "ds1", work / "syn100", 100)
        synthesize(work / "ds1", work / "syn1000", 1000)
        small, large = summary_time(work / "syn100"), summary_time(work / "syn1000")
        longer_session(work, sessions[0], console)
        console.print(f"fleet summary: 100 sessions {small:.3f} s ({dataset_bytes(work / 'syn100') / 1e6:.1f} MB), "
                      f"1000 sessions {large:.3f} s ({dataset_bytes(work / 'syn1000') / 1e6:.1f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [
        Row("fleet", f"{len(sessions)} sessions on Ray, warm workers: 1 worker vs 2 (ratio = speed-up, median round)", one, two, "s",
            ">= 1.7x", one / two >= 1.7),
        Row("fleet", f"{len(sessions)} sessions on Ray, cold workers (start + JVM inside): 1 worker vs 2", cold_one,
            cold_two, "s", "-", None),
        Row("fleet", "Ray overhead per task (1-worker run: wall - time in tasks) vs time in a task", overhead,
            run1.tasks_seconds / len(sessions), "s", "-", None),
        Row("fleet", "Ray empty task round trip vs time in a task", empty1, run1.tasks_seconds / len(sessions), "s", "-",
            None),
        Row("fleet", "fleet summary: 1000 sessions vs 100", large, small, "s", "<= 12x", large / small <= 12),
    ]
