"""The flight recorder over a long run of the demo service (`tandem record --max-size --max-age`):
the session's disk use and the history it keeps, sampled every second, against the bounds;
bytes per hour of history kept, GIL events and JFR apart, packed against raw and against
plain zstd -3 of the same bytes (the anchor), and the keeper's CPU; `tandem dump` of the
running session (analyzable, and the service's work rate during the dumps against the rest).

    python -m bench.bench_flight_recorder [--minutes 30] [--max-size 200M] [--max-age 10m]

`make bench` runs it for MINUTES (env TANDEM_BENCH_FLIGHT_MINUTES, default 2; the issue's bar
is sampled over 30 minutes: run it alone for that). The service's work rate is its GIL releases
per second (each request of the demo releases the GIL): what the session itself recorded,
1-second bins overlapping a dump against the others; beside it the floor: the same during a
process at the dump's priority (nice 19) burning as much CPU as the dump used, NULL_AFTER_S
after each dump."""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import Row

DUMPS = 3
NULL_AFTER_S = 8.0
# The floor's process: the dump's priority (nice 19), burning ARGV[1] s of CPU.
NULL_PROCESS = ("import os, sys, time\nos.setpriority(os.PRIO_PROCESS, 0, 19)\nend = time.process_time() + float(sys.argv[1])\n"
                "while time.process_time() < end:\n    pass\n")
DEMO_RELEASES_S = 3800  # the demo service's GIL releases a second on an idle machine (the rate)


def _history_s(session: Path) -> float:
    """Seconds between the oldest and the newest event of the packed GIL segments kept now."""
    from engine.ingest.segments import packed_span
    from engine.session import GIL_EVENTS, PYTHON_DIRS, gil_segments

    spans = []
    for directory in session.glob(PYTHON_DIRS):
        for segment in gil_segments(directory / GIL_EVENTS):
            if segment.packed:
                try:
                    spans.append(packed_span(segment.path))
                except OSError:
                    pass
    spans = [s for s in spans if s[1]]
    return (max(s[1] for s in spans) - min(s[0] for s in spans)) / 1e9 if spans else 0.0


def _kept_sizes(session: Path) -> dict:
    """What the session keeps at the end, per side: bytes packed, raw (decoded) and as plain
    zstd -3 of the raw bytes, and the hours of history they span; GIL records and releases."""
    import zstandard

    from engine.clock.packed import packed_chunk_span
    from engine.ingest.jfr_input import readable_recordings
    from engine.ingest.segments import packed_span, unpack
    from engine.session import GIL_EVENTS, PACKED_CHUNKS, PACKED_DICTIONARY, PYTHON_DIRS, gil_segments, packed_chunks

    anchor = zstandard.ZstdCompressor(level=3)
    gil = {"packed": 0, "raw": 0, "zstd3": 0, "records": 0, "releases": 0, "spans": []}
    for directory in session.glob(PYTHON_DIRS):
        for segment in gil_segments(directory / GIL_EVENTS):
            if segment.packed:
                head, rows = unpack(segment.path)
                raw = head + rows.tobytes()
                gil["packed"] += segment.path.stat().st_size
                gil["raw"] += len(raw)
                gil["zstd3"] += len(anchor.compress(raw))
                gil["records"] += int((rows["seq"] != 0).sum())
                gil["releases"] += int((rows["kind"] == 1).sum())
                gil["spans"].append(packed_span(segment.path))
    jfr = {"packed": 0, "raw": 0, "zstd3": 0, "spans": []}
    for directory in session.glob("jvm-*"):
        dictionary = directory / PACKED_CHUNKS / PACKED_DICTIONARY
        jfr["packed"] += dictionary.stat().st_size if dictionary.exists() else 0  # (kept for the JVM's life)
        for chunk in packed_chunks(directory):
            with readable_recordings([chunk]) as (readable, _named):
                raw = readable[0].read_bytes()
            jfr["packed"] += chunk.stat().st_size
            jfr["raw"] += len(raw)
            jfr["zstd3"] += len(anchor.compress(raw))
            jfr["spans"].append(packed_chunk_span(chunk))
    for side in (gil, jfr):
        spans = [span for span in side.pop("spans") if span and span[1]]
        side["hours"] = (max(e for _, e in spans) - min(b for b, _ in spans)) / 1e9 / 3600 if spans else 0.0
    return {"gil": gil, "jfr": jfr}


def run(console, minutes: float, max_size: str, max_age: str) -> list[Row]:
    from engine.ingest.gil import read_gil
    from engine.record.keeper import disk_use, parse_duration, parse_size
    from engine.session import read_json

    seconds = minutes * 60
    limit_bytes, limit_age = parse_size(max_size), parse_duration(max_age)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-flight-") as tmp:
        session = Path(tmp) / "s"
        service = subprocess.Popen([sys.executable, "-m", "engine", "record", "--max-size", max_size, "--max-age", max_age,
                                    "-o", str(session), "--", sys.executable, "-m", "engine.demo.workload",
                                    "--seconds", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        began = time.monotonic()
        sizes, histories, dumps = [], [], []

        def sample() -> None:  # every second, whatever the dumps are doing
            while service.poll() is None:
                time.sleep(1)
                if session.is_dir():
                    sizes.append(disk_use(session))
                    histories.append(_history_s(session))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # dumps in the last part of the run, inside the history kept at the end; NULL_AFTER_S after
        # each, a process at the dump's priority burning as much CPU as that dump used (the floor:
        # what any such process costs the service on this machine)
        due = sorted([(seconds - min(limit_age, seconds) * (0.8 - 0.2 * k), "dump") for k in range(DUMPS)]
                     + [(seconds - min(limit_age, seconds) * (0.8 - 0.2 * k) + NULL_AFTER_S, "null") for k in range(DUMPS)])
        nulls, dump_cpu = [], []
        while service.poll() is None:
            time.sleep(0.2)
            elapsed = time.monotonic() - began
            if due and elapsed >= due[0][0] and service.poll() is None:
                _, what = due.pop(0)
                start_ns, before = time.monotonic_ns(), _children_cpu_s()
                if what == "dump":
                    snapshot = Path(tmp) / f"dump{len(dumps)}"
                    dumped = subprocess.run([sys.executable, "-m", "engine", "dump", str(session), "-o", str(snapshot),
                                             "--last", "30s"], capture_output=True, text=True)
                    dumps.append((start_ns, time.monotonic_ns(), dumped.returncode, snapshot))
                    dump_cpu.append(_children_cpu_s() - before)
                elif dump_cpu:
                    subprocess.run([sys.executable, "-c", NULL_PROCESS, str(dump_cpu[-1])], check=True)
                    nulls.append((start_ns, time.monotonic_ns()))
        _, err = service.communicate()
        sampler.join()
        if service.returncode != 0:
            raise RuntimeError(f"tandem record failed: {err[-2000:]}")
        kept = read_json(session / "session.json").get("flight_recorder", {})
        console.print(f"{minutes:g} min, bounds {max_size} / {max_age}: disk use max {max(sizes) / 2**20:.1f} MiB over "
                      f"{len(sizes)} samples, history kept max {max(histories):.1f} s; keeper: {kept}")
        rows.append(Row("flight", f"session disk use, max of {len(sizes)} samples (1/s) over {minutes:g} min vs --max-size {max_size}",
                        max(sizes) / 2**20, limit_bytes / 2**20, "MiB", "never above", max(sizes) <= limit_bytes))
        rows.append(Row("flight", f"GIL history kept, max of {len(histories)} samples vs --max-age {max_age}",
                        max(histories), limit_age, "s", "never above", max(histories) <= limit_age))
        # bytes per hour of the history kept at the end: packed vs raw vs zstd -3 of the raw bytes
        kept_sizes = _kept_sizes(session)
        per_hour = {side: {k: v / max(sizes["hours"], 1e-9) / 1e6 for k, v in sizes.items() if k in ("packed", "raw", "zstd3")}
                    for side, sizes in kept_sizes.items()}
        gil_kept = kept_sizes["gil"]
        releases_s = gil_kept["releases"] / max(gil_kept["hours"] * 3600, 1e-9)
        for side, name in (("gil", "GIL events"), ("jfr", "JFR chunks")):
            mb = per_hour[side]
            console.print(f"{name}: {kept_sizes[side]['hours'] * 60:.1f} min of history kept: raw {mb['raw']:.1f} MB/h, "
                          f"zstd -3 {mb['zstd3']:.1f} MB/h, packed {mb['packed']:.1f} MB/h "
                          f"({mb['raw'] / max(mb['packed'], 1e-9):.1f}x raw, {mb['zstd3'] / max(mb['packed'], 1e-9):.2f}x zstd -3)")
            rows.append(Row("flight", f"{name} per hour of history kept: packed vs plain zstd -3 of the same bytes (anchor)",
                            mb["packed"], mb["zstd3"], "MB/h", "< anchor", mb["packed"] < mb["zstd3"]))
            rows.append(Row("flight", f"{name} per hour of history kept: packed vs raw", mb["packed"], mb["raw"], "MB/h",
                            "(ratio)", None))
        bytes_per_record = gil_kept["packed"] / max(gil_kept["records"], 1)
        console.print(f"GIL: {releases_s:.0f} releases/s here, {gil_kept['records'] / max(gil_kept['releases'], 1):.2f} records "
                      f"per release, {bytes_per_record:.2f} bytes per record packed")
        total = per_hour["gil"]["packed"] + per_hour["jfr"]["packed"]
        rows.append(Row("flight", f"disk per hour of history kept: packed GIL + JFR at {releases_s:.0f} releases/s vs 100 MB/h",
                        total, 100.0, "MB/h", "<= 100 MB/h", total <= 100))
        # the rate (the demo alone on its machine): GIL scaled by releases, JFR as measured
        at_demo = per_hour["gil"]["packed"] * DEMO_RELEASES_S / max(releases_s, 1e-9) + per_hour["jfr"]["packed"]
        rows.append(Row("flight", f"the same at the demo's {DEMO_RELEASES_S} releases/s (GIL scaled by releases) vs 100 MB/h",
                        at_demo, 100.0, "MB/h", "<= 100 MB/h", at_demo <= 100))
        cpu_share = kept.get("cpu_s", 0.0) / seconds
        console.print(f"keeper CPU: {kept.get('cpu_s', 0.0):.2f} s over {seconds:.0f} s ({100 * cpu_share:.2f}% of a core)")
        rows.append(Row("flight", "the keeper's CPU (packing both sides, bounds) per second of recording", 100 * cpu_share, 1.0,
                        "% of a core", "(tandem's process, not the service's)", None))
        # dumps: analyzable, and the work rate during them
        gil = read_gil(session)
        drops = gil[gil["state"] == "released"]["start_ns"].to_numpy(np.int64)
        if len(drops) and dumps:
            first = int(drops.min())
            bins = np.bincount((drops - first) // 1_000_000_000)
            whole = np.ones(len(bins), bool)
            whole[[0, -1]] = False  # the kept window's edges are part-seconds

            def covered(spans) -> np.ndarray:
                marked = np.zeros(len(bins), bool)
                for start_ns, end_ns in spans:
                    lo, hi = max((start_ns - first) // 1_000_000_000, 0), min((end_ns - first) // 1_000_000_000, len(bins) - 1)
                    if hi >= 0 and lo < len(bins):
                        marked[lo:hi + 1] = True
                return marked

            during, during_null = covered([d[:2] for d in dumps]), covered(nulls)
            rest = ~during & ~during_null & whole
            if (during & whole).any() and rest.any():
                rate_dump = statistics.median(bins[during & whole].tolist())
                rate_rest = statistics.median(bins[rest].tolist())
                rate_null = statistics.median(bins[during_null & whole].tolist()) if (during_null & whole).any() else float("nan")
                console.print(f"GIL releases/s: {rate_dump:.0f} during dumps (median of {int((during & whole).sum())} s, "
                              f"dump CPU {', '.join(f'{c:.2f}' for c in dump_cpu)} s), {rate_null:.0f} during a nice 19 process "
                              f"burning as much CPU (the floor), {rate_rest:.0f} otherwise")
                rows.append(Row("flight", "service work rate (GIL releases/s) during tandem dump vs otherwise (anchor)",
                                rate_dump, rate_rest, "releases/s", ">= 0.95x", rate_dump >= 0.95 * rate_rest))
                rows.append(Row("flight", "the floor: the same during a nice 19 process burning the dump's CPU vs otherwise",
                                rate_null, rate_rest, "releases/s", "report", None))
        for k, (start_ns, end_ns, code, snapshot) in enumerate(dumps):
            analyzed = subprocess.run([sys.executable, "-m", "engine", "analyze", str(snapshot), "-o", str(snapshot / "out")],
                                      capture_output=True, text=True)
            rows.append(Row("flight", f"tandem dump {k + 1} of the running session: wall time, then analyzed",
                            (end_ns - start_ns) / 1e9, 1.0, "s", "exit 0 and analyzable", code == 0 and analyzed.returncode == 0))
    return rows


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(console) -> list[Row]:
    return run(console, float(os.environ.get("TANDEM_BENCH_FLIGHT_MINUTES", "2")), "200M", "10m")


if __name__ == "__main__":
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--max-size", default="200M")
    parser.add_argument("--max-age", default="10m")
    args = parser.parse_args()
    console = Console()
    for row in run(console, args.minutes, args.max_size, args.max_age):
        verdict = "" if row.ratio_ok is None else " ok" if row.ratio_ok else " NOT MET"
        console.print(f"{row.what}: {row.ours:.3g} {row.unit} vs {row.anchor:.3g} ({row.goal}){verdict}")
