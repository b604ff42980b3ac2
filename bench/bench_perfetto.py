"""Perfetto export of an hour-long session: size and peak memory, protobuf vs JSON, same session.

A synthetic session at the demo's rate (`tandem demo`, 22 s measured: ~1,820 GIL intervals/s
over 4 Python threads, ~17 pauses/s, ~140 overlaps/s) is written minute by minute as the
result tables of `tandem analyze` (pauses and GIL intervals drawn at random, overlaps by the
real correlation code on each minute; nothing crosses a minute's edge). Each export runs in a
child process (peak RSS = its ru_maxrss); both formats in one run. A slice of one minute
gives bytes per GIL interval and per pause (each table exported alone).

TANDEM_BENCH_PERFETTO_MINUTES (default 60) sets the session's length.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench import Row, run_child

MINUTES = float(os.environ.get("TANDEM_BENCH_PERFETTO_MINUTES", "60"))
GIL_PER_S = 1820
PAUSES_PER_S = 17
THREADS = (1001, 1002, 1003, 1004)
PID, JVM_PID = 4000, 4000  # JPype: the JVM in the Python process, as in the demo
S = 1_000_000_000
KINDS = [("safepoint", "G1CollectForAllocation"), ("gc_pause", "Pause Young (Normal) (G1 Evacuation Pause)"),
         ("gc", "G1New"), ("vm_operation", "HandshakeAllThreads")]


def _minute(rng: np.random.Generator, index: int, first_pause_id: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    t0 = 10_000 * S + index * 60 * S
    rows = []
    per_thread = GIL_PER_S * 60 // len(THREADS)
    for tid in THREADS:
        lengths = rng.integers(20_000, 2_000_000, per_thread)  # 20 us - 2 ms
        gaps = rng.integers(0, 400_000, per_thread)
        starts = t0 + np.cumsum(np.r_[0, (lengths + gaps)[:-1]])
        keep = starts + lengths < t0 + 60 * S
        frame = pd.DataFrame({"pid": PID, "tid": tid, "thread_name": f"request-{tid}",
                              "state": np.where(rng.random(per_thread) < 0.7, "released", "waiting"),
                              "start_ns": starts, "end_ns": starts + lengths})[keep]
        rows.append(frame)
    gil = pd.concat(rows, ignore_index=True).sort_values("start_ns", kind="stable", ignore_index=True)
    n = PAUSES_PER_S * 60
    starts = np.sort(rng.integers(t0, t0 + 59 * S, n))
    kinds = rng.integers(0, len(KINDS), n)
    pauses = pd.DataFrame({
        "pause_id": np.arange(first_pause_id, first_pause_id + n, dtype=np.int64),
        "kind": [KINDS[k][0] for k in kinds], "name": [KINDS[k][1] for k in kinds],
        "start_ns": starts, "end_ns": starts + rng.integers(100_000, 30_000_000, n),
        "time_to_safepoint_ns": pd.array(np.where(kinds == 0, 40_000, 0), dtype="Int64"),
        "operation": [KINDS[0][1] if k == 0 else None for k in kinds], "jvm_pid": JVM_PID,
    })
    return pauses, gil


def write_session(out: Path, minutes: float, seed: int = 3) -> dict:
    """The result tables of a synthetic session, written minute by minute (bounded memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.analysis import correlate

    rng = np.random.default_rng(seed)
    writers: dict[str, pq.ParquetWriter] = {}
    counts = {"pauses": 0, "gil": 0, "overlaps": 0}
    out.mkdir(parents=True, exist_ok=True)
    for index in range(int(np.ceil(minutes))):
        pauses, gil = _minute(rng, index, counts["pauses"])
        analysis = correlate(pauses, gil)
        for name, table in (("pauses", analysis.pauses), ("gil", analysis.gil), ("overlaps", analysis.overlaps)):
            arrow = pa.Table.from_pandas(table, preserve_index=False)
            if name not in writers:
                writers[name] = pq.ParquetWriter(out / f"{name}.parquet", arrow.schema)
            writers[name].write_table(arrow.cast(writers[name].schema))
            counts[name] += len(table)
    for writer in writers.values():
        writer.close()
    return counts


def export_in_child(results: Path, output: Path, fmt: str) -> dict:
    """Export in a child process: seconds, peak RSS (ru_maxrss), bytes written."""
    code = "import sys; from engine.report.perfetto import export_perfetto; export_perfetto(sys.argv[1], sys.argv[2], sys.argv[3])"
    seconds, peak_gib = run_child([sys.executable, "-c", code, str(results), str(output), fmt])
    return {"s": seconds, "rss_mib": peak_gib * 1024, "bytes": output.stat().st_size}


def _per_row_bytes(work: Path) -> dict:
    """Bytes per GIL interval and per pause: one minute, each table exported with the other empty."""
    minute = work / "minute"
    counts = write_session(minute, 1, seed=5)
    out = {}
    for only in ("gil", "pauses"):
        directory = work / f"only-{only}"
        directory.mkdir()
        for name in ("pauses", "gil", "overlaps"):
            table = pd.read_parquet(minute / f"{name}.parquet")
            (table if name == only else table.iloc[:0]).to_parquet(directory / f"{name}.parquet")
        for fmt in ("proto", "json"):
            size = export_in_child(directory, work / f"only-{only}.{fmt}", fmt)["bytes"]
            out[(only, fmt)] = size / counts[only]
    whole = {fmt: export_in_child(minute, work / f"minute.{fmt}", fmt)["bytes"] for fmt in ("proto", "json")}
    marks = {fmt: (whole[fmt] - out[("gil", fmt)] * counts["gil"] - out[("pauses", fmt)] * counts["pauses"]) / counts["overlaps"]
             for fmt in ("proto", "json")}
    return {**out, **{("overlaps", fmt): v for fmt, v in marks.items()}}


def main(console) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-perfetto-") as tmp:
        work = Path(tmp)
        began = time.monotonic()
        counts = write_session(work / "results", MINUTES)
        console.print(f"synthetic session: {MINUTES:g} min, {counts['gil']:,} GIL intervals, {counts['pauses']:,} pauses, "
                      f"{counts['overlaps']:,} overlaps rows ({time.monotonic() - began:.0f} s to write)")
        runs = {fmt: export_in_child(work / "results", work / f"trace.{fmt}", fmt) for fmt in ("proto", "json")}
        for fmt, r in runs.items():
            console.print(f"{fmt}: {r['bytes'] / 1e6:,.1f} MB in {r['s']:.0f} s, peak RSS {r['rss_mib']:.0f} MiB")
        per_row = _per_row_bytes(work)
        for (table, fmt), size in sorted(per_row.items()):
            console.print(f"bytes per {table} row, {fmt}: {size:.1f}")
    proto, js = runs["proto"], runs["json"]
    rows.append(Row("perfetto", f"export size, {MINUTES:g} min session: protobuf vs JSON", proto["bytes"] / 1e6, js["bytes"] / 1e6,
                    "MB", "<= 0.2x (5x smaller)", proto["bytes"] * 5 <= js["bytes"]))
    rows.append(Row("perfetto", f"export peak RSS, {MINUTES:g} min session: protobuf vs 1 GiB", proto["rss_mib"], 1024, "MiB",
                    "<= 1x", proto["rss_mib"] <= 1024))
    rows.append(Row("perfetto", "export peak RSS: JSON (streamed too) vs 1 GiB", js["rss_mib"], 1024, "MiB", "-", None))
    rows.append(Row("perfetto", "export seconds: protobuf vs JSON", proto["s"], js["s"], "s", "-", None))
    for table in ("gil", "pauses", "overlaps"):
        rows.append(Row("perfetto", f"bytes per {table} row: protobuf vs JSON", per_row[(table, "proto")], per_row[(table, "json")],
                        "bytes", "-", None))
    return rows
