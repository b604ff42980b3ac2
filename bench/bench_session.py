"""A synthetic hour of a busy service in tandem's own formats, analyzed end to end.

Three Python processes of 16 threads each write GIL events files exactly as the probe's
drain does (docs/ring.md: header page, lane table, each pass appending every lane's new
records in turn, one lane per thread), about 14,000 intervals a second together (>= 50 M
in the hour: 70% of releases are followed by a wait for the GIL); a pauses table of about
20,000 JVM pauses (0.1-50 ms). `tandem analyze --pauses P.parquet --gil SESSION` runs on a
10-minute and a 60-minute session of the same rate, and DuckDB computes only the overlap
pairs of the same 60 minutes from a Parquet copy of the intervals, in the same run; peak RSS
is the kernel's count for each process; each figure is the best of three runs, the commands
alternating, after the files written are synced. The hour runs twice: as users run it (OUT gets
gil.parquet, 50 M rows written) and with --reference-gil (OUT names the events files). The same hour from MANY_PROCESSES
processes at the same total rate runs once more beside it (best of two), and so does the same hour
from short-lived worker processes (WORKERS an hour, WORKERS_ALIVE at a time, high thread ids: a
Spark executor's Python workers). The engine of ANCHOR_COMMIT (the synthetic hour's bar is "no
slower than it") is built from this repository's history into the bench's directory and runs the
hour in the same run (best of three, alternating with tandem's): this machine's speed varies from
run to run by a fifth, a rate against a fixed number cannot tell that from the code. It wrote no
gil.parquet (its results named the GIL files), so `--reference-gil` is its like. TANDEM_BENCH_SESSION_MINUTES=6 shrinks the long
session (the short one is a sixth of it) for quick checks.

The real shape beside it: the demo service (engine/demo/workload.py: JPype with its GC link,
code attribution on) recorded with `tandem record` for DEMO_SECONDS, then its pauses table and
GIL intervals repeated in time (`repeat_recording`: each copy shifted by the recording's length;
pids, tids, code, thread names, jvm_pid, requester columns and System.gc() causes as they are;
pause, safepoint and GC ids renumbered per copy) to 10 minutes, 1 hour and (with
TANDEM_BENCH_SESSION_8H=1) 8 hours, written as `--pauses P --gil G` Parquet inputs; DuckDB
computes only the overlaps of the hour, and the hour runs again given as two Parquet gil tables
(`split_by_thread`), as DEALT_TABLES tables each holding a share of the whole hour (`dealt`), and
with its 10 minutes as one table grouped by thread (`grouped_by_thread`).
TANDEM_BENCH_SESSION_MINUTES shrinks the hour here too;
TANDEM_BENCH_DEMO_SESSION=DIR takes an existing recording of the demo instead of making one.
The 8 hours and their 10 minutes run once more with no requester named for a System.gc() stop
(as JDK 17 records JPype's GC link; a recording may name them or not): the requesters inferred;
and again so with SLEEPING_THREADS idle Python threads added to the JPype process (`sleeping_rows`),
each alive through every pause whose requester is inferred.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench import Row
from bench.bench_join import DUCKDB_OVERLAPS, io_floor, run_measured

PROCESSES = 3
MANY_PROCESSES = 12
# Python workers that come and go (a Spark executor's): WORKERS an hour, WORKERS_ALIVE at a time,
# WORKER_THREADS threads each, their ids high (a host up for long, pid_max 2^22).
WORKERS = 2400
WORKERS_ALIVE = 60
WORKER_THREADS = 4
DEMO_SECONDS = 30
SLEEPING_THREADS = 48     # idle Python threads added to the demo's JPype process (8 h only)
DEALT_TABLES, DEALT_RUN_ROWS = 12, 1_000  # the real hour as tables of processes side by side (`dealt`)
THREADS = 16
INTERVALS_PER_S = 14_000  # all processes together: 50.4 M intervals an hour
PAUSES_PER_HOUR = 20_000
DRAIN_NS = 20_000_000     # the probe's drain period: one pass of every lane
# The engine the synthetic hour's bar was set against ("no slower than it"), run beside tandem's.
ANCHOR_COMMIT = "18af951"


def thread_events(rng, t0: int, span_ns: int, releases: int):
    """One thread's (mono_ns, kind) in order: hold, DROP, released, then (70%) TAKE_REQUEST and
    a wait, TAKE_ACQUIRED; and the intervals they make (start, end, state 0/1)."""
    from engine.ring.layout import GIL_DROP, GIL_TAKE_ACQUIRED, GIL_TAKE_REQUEST

    hold = rng.integers(2_000, 2 * span_ns // releases - 60_000, releases)
    released = rng.integers(1_000, 40_000, releases)
    waits = rng.random(releases) < 0.7
    waited = np.where(waits, rng.integers(1_000, 20_000, releases), 0)
    drop = t0 + np.cumsum(hold + np.r_[0, (released + waited)[:-1]])
    per = 2 + waits  # events per release: DROP, [TAKE_REQUEST], TAKE_ACQUIRED
    n = int(per.sum())
    first = np.r_[0, np.cumsum(per)[:-1]]
    mono = np.empty(n, np.int64)
    kind = np.empty(n, np.uint16)
    mono[first], kind[first] = drop, GIL_DROP
    request = first[waits] + 1
    mono[request], kind[request] = drop[waits] + released[waits], GIL_TAKE_REQUEST
    take = first + per - 1
    mono[take], kind[take] = drop + released + waited, GIL_TAKE_ACQUIRED
    wait_start = drop[waits] + released[waits]
    start = np.concatenate([drop, wait_start])
    end = np.concatenate([drop + released, wait_start + waited[waits]])
    state = np.repeat(np.array([0, 1], np.int8), [releases, int(waits.sum())])
    return mono, kind, (start, end, state)


def write_events_file(path: Path, pid: int, lanes: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
    """An events file as the drain writes it (closed cleanly): lane i+1 holds thread i's records;
    each drain pass appends, lane by lane, what was stamped since the previous pass."""
    from engine.ring import layout as L

    lane_count = 1 << (len(lanes)).bit_length()  # lane 0 is the shared one
    header = np.zeros(1, L.HEADER_DTYPE)
    boot = (L.current_boot_id() or "").encode()
    header["magic"], header["version"], header["header_size"] = L.MAGIC, L.VERSION, L.HEADER_SIZE
    header["file_kind"], header["record_type"], header["record_size"] = L.FILE_KIND_EVENTS, L.RECORD_TYPE_GIL, 32
    header["lane_capacity"], header["producer_pid"], header["clock_id"] = 1 << 16, pid, L.CLOCK_MONOTONIC
    header["boot_id"] = boot + b"\0" * (40 - len(boot))
    header["runtime_version"] = b"3.11.7".ljust(32, b"\0")
    header["backend"] = b"precise".ljust(32, b"\0")
    header["lane_count"], header["lane_stride"] = lane_count, L.LANE_STRIDE
    header["records_offset"], header["state"] = L.records_offset_for(lane_count), L.STATE_CLOSED
    table = np.zeros(lane_count, L.LANE_DTYPE)
    parts = []
    for lane, (tid, mono, kind) in enumerate(lanes, start=1):
        records = np.zeros(mono.size, L.GIL_RECORD_DTYPE)
        records["seq"] = np.arange(1, mono.size + 1)
        records["mono_ns"], records["tid"], records["kind"], records["lane"] = mono, tid, kind, lane
        table["head"][lane] = table["tail"][lane] = mono.size
        parts.append(records)
    records = np.concatenate(parts)
    # Drain order: by pass, then lane, each lane's records in their order (a stable sort).
    records = records[np.argsort((records["mono_ns"] // DRAIN_NS) * lane_count + records["lane"], kind="stable")]
    with open(path, "wb") as f:
        page = bytearray(int(header["records_offset"][0]))
        page[:L.HEADER_SIZE] = header.tobytes()
        page[L.HEADER_SIZE:L.HEADER_SIZE + table.nbytes] = table.tobytes()
        f.write(page)
        records.tofile(f)


def write_session(directory: Path, minutes: float, seed: int = 7, parquet_copy: bool = False,
                  processes: int = PROCESSES) -> tuple[Path, Path, int]:
    """SESSION/py-<pid>/gil.events for each process and P.parquet; returns (session, pauses, intervals)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    span = int(minutes * 60e9)
    t0 = 10**12
    session = directory / f"session-{minutes:g}min" if processes == PROCESSES else directory / f"session-{minutes:g}min-{processes}p"
    total = 0
    copy = None
    for p in range(processes):
        pid = 100_000 + p
        lanes, intervals = [], []
        for t in range(THREADS):
            releases = int(INTERVALS_PER_S * minutes * 60 / processes / THREADS / 1.7)
            mono, kind, made = thread_events(rng, t0 + int(rng.integers(0, 10**8)), span, releases)
            lanes.append((pid + 1 + t, mono, kind))
            intervals.append((pid + 1 + t, *made))
            total += made[0].size
        (session / f"py-{pid}").mkdir(parents=True)
        write_events_file(session / f"py-{pid}" / "gil.events", pid, lanes)
        del lanes
        if parquet_copy:  # DuckDB's input: the same intervals as a Parquet table
            from engine.correlate.schema import state_strings

            tid = np.concatenate([np.full(s.size, t, np.int64) for t, s, _, _ in intervals])
            start, end, state = (np.concatenate([i[k] for i in intervals]) for k in (1, 2, 3))
            order = np.argsort(start, kind="stable")
            table = pa.table({"pid": np.full(tid.size, pid, np.int64), "tid": tid[order], "state": state_strings(state[order]),
                              "start_ns": start[order], "end_ns": end[order]})
            if copy is None:
                copy = pq.ParquetWriter(directory / "G.parquet", table.schema)
            copy.write_table(table)
        del intervals
    if copy is not None:
        copy.close()
    n_pauses = int(PAUSES_PER_HOUR * minutes / 60)
    start = np.sort(rng.integers(t0, t0 + span, n_pauses))
    kinds = np.array(["gc_pause", "safepoint", "vm_operation"])[rng.integers(0, 3, n_pauses)]
    pauses = pa.table({"pause_id": np.arange(n_pauses, dtype=np.int64), "kind": kinds, "name": np.char.add(kinds, "-name"),
                       "start_ns": start, "end_ns": start + rng.integers(100_000, 50_000_000, n_pauses)})
    pq.write_table(pauses, directory / f"P-{minutes:g}min.parquet")
    return session, directory / f"P-{minutes:g}min.parquet", total


def write_workers_session(directory: Path, minutes: float, seed: int = 10) -> tuple[Path, int, int]:
    """SESSION/py-<pid>/gil.events of short-lived worker processes (WORKERS an hour, WORKERS_ALIVE
    at a time, starting at even steps) at the synthetic hour's total rate; returns (session,
    intervals, workers)."""
    rng = np.random.default_rng(seed)
    span, t0 = int(minutes * 60e9), 10**12
    workers = max(WORKERS_ALIVE, round(WORKERS * minutes / 60))
    life = span * WORKERS_ALIVE // workers
    releases = int(INTERVALS_PER_S * minutes * 60 / workers / WORKER_THREADS / 1.7)
    session, total = directory / f"session-{minutes:g}min-workers", 0
    for w in range(workers):
        pid = 3_000_000 + 8 * w
        begin = t0 + (span - life) * w // max(workers - 1, 1)
        lanes = []
        for t in range(WORKER_THREADS):
            mono, kind, made = thread_events(rng, begin + int(rng.integers(0, 10**7)), life, releases)
            lanes.append((pid + 1 + t, mono, kind))
            total += made[0].size
        (session / f"py-{pid}").mkdir(parents=True)
        write_events_file(session / f"py-{pid}" / "gil.events", pid, lanes)
    return session, total, workers


def record_demo(session: Path, seconds: float = DEMO_SECONDS) -> Path:
    """SESSION: `tandem record` of the demo service for SECONDS."""
    import subprocess

    subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(session), "--",
                    sys.executable, "-m", "engine.demo.workload", "--seconds", str(seconds)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return session


def repeat_recording(session: Path, directory: Path, minutes: float, sleeping_threads: int = 0) -> tuple[Path, Path, dict]:
    """P and G (Parquet) of SESSION's pauses and GIL intervals repeated in time to MINUTES; the
    GIL rows in start order. SLEEPING_THREADS: that many more Python threads in the JVM's
    process (`sleeping_rows`). Returns (P, G, counts)."""
    import pandas as pd
    import pyarrow as pa

    from engine.correlate.stops import stop_ids
    from engine.analysis.causes import inference_candidates
    from engine.ingest.gil_stream import BLOCK_ROWS
    from engine.ingest.inputs import gil_from, pauses_from
    from engine.store import TableWriter, write_table

    pauses, _ = pauses_from(session=session)
    gil, _ = gil_from(session=session)
    first = min(int(pauses["start_ns"].min()), int(gil["start_ns"].min()))
    span = max(int(pauses["end_ns"].max()), int(gil["end_ns"].max())) - first + 1
    if sleeping_threads:
        gil = pd.concat([gil, sleeping_rows(gil, pauses, sleeping_threads, first, first + span)], ignore_index=True)
    gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    copies = max(1, round(minutes * 60e9 / span))
    more = f"-{sleeping_threads}-sleeping" if sleeping_threads else ""
    pauses_out, gil_out = (directory / f"P-real-{minutes:g}min.parquet",
                           directory / f"G-real-{minutes:g}min{more}.parquet")
    ids = {c: int(pauses[c].max()) + 1 for c in ("pause_id", "safepoint_id", "gc_id")
           if c in pauses.columns and pauses[c].notna().any()}
    parts = []
    for k in range(copies):
        part = pauses.copy()
        part["start_ns"] += k * span
        part["end_ns"] += k * span
        for column, step in ids.items():
            part[column] = part[column] + k * step
        parts.append(part)
    repeated = pd.concat(parts, ignore_index=True)
    write_table(repeated, pauses_out, pauses.attrs)
    base = pa.Table.from_pandas(gil, preserve_index=False)
    start, end = base.column("start_ns").to_numpy(), base.column("end_ns").to_numpy()
    # Row groups of BLOCK_ROWS rows (the streamed reader's block), as one pyarrow write makes them.
    writer, pending = TableWriter(gil_out, base.schema), []
    for k in range(copies + 1):
        if k < copies:
            pending.append(base.set_column(base.schema.get_field_index("start_ns"), "start_ns", pa.array(start + k * span))
                           .set_column(base.schema.get_field_index("end_ns"), "end_ns", pa.array(end + k * span)))
        buffered = sum(t.num_rows for t in pending)
        if buffered >= BLOCK_ROWS or (k == copies and buffered):
            rows = pa.concat_tables(pending).combine_chunks()
            whole = rows.num_rows - rows.num_rows % BLOCK_ROWS if k < copies else rows.num_rows
            for at in range(0, whole, BLOCK_ROWS):
                writer.write(rows.slice(at, min(BLOCK_ROWS, whole - at)))
            pending = [rows.slice(whole)]
    writer.close(gil.attrs)
    unnamed = int(inference_candidates(pauses, stop_ids(pauses)).sum())
    return pauses_out, gil_out, {"intervals": copies * len(gil), "pauses": len(repeated),
                                 "system_gc_unnamed": copies * unnamed, "copies": copies}


def sleeping_rows(gil, pauses, threads: int, start: int, end: int):
    """GIL rows of THREADS more Python threads in the JVM's process (the pauses' most common
    jvm_pid: JPype's), each asleep from START to END in back-to-back 200 ms releases, the GIL
    taken back for 20 us between them (a pool of idle workers): each alive through every pause."""
    import pandas as pd

    step, held = 200_000_000, 20_000
    pid = int(pauses["jvm_pid"].mode().iloc[0])
    tids = int(gil["tid"].max()) + 1 + np.arange(threads)
    at = np.arange(start, end - step, step, dtype=np.int64)
    tid, begin = np.repeat(tids, at.size), np.tile(at, threads) + np.repeat(np.arange(threads) * 1_000, at.size)
    rows = pd.DataFrame({"pid": pid, "tid": tid, "thread_name": [f"sleeper-{t - tids[0]}" for t in tid.tolist()],
                         "state": "released", "start_ns": begin, "end_ns": begin + step - held,
                         "function": "sleep", "file": "worker.py", "line": 7})
    return rows[[c for c in gil.columns if c in rows.columns]].astype(
        {c: t for c, t in gil.dtypes.items() if c in rows.columns})


def split_table(gil: Path, directory: Path, names: list[str], part_of) -> list[Path]:
    """GIL's rows in Parquet tables DIRECTORY/<stem>-<name>.parquet, one per NAMES, each with GIL's
    metadata: PART_OF(rows, first) says which table each row of a row group goes to (FIRST: the
    group's first row's number in GIL)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(gil)
    facts = {k: v for k, v in (source.metadata.metadata or {}).items() if k == b"tandem"}
    paths = [directory / f"{gil.stem}-{name}.parquet" for name in names]
    writers = [pq.ParquetWriter(path, source.schema_arrow) for path in paths]
    first = 0
    for group in range(source.metadata.num_row_groups):
        rows = source.read_row_group(group)
        part = part_of(rows, first)
        first += rows.num_rows
        for k, writer in enumerate(writers):
            writer.write_table(rows.filter(pa.array(part == k)))
    for writer in writers:
        writer.add_key_value_metadata(facts)
        writer.close()
    return paths


def split_by_thread(gil: Path, directory: Path) -> list[Path]:
    """GIL's rows in two Parquet tables, by the parity of their tid (odd ones first)."""
    return split_table(gil, directory, ["odd", "even"], lambda rows, first: 1 - rows.column("tid").to_numpy() % 2)


def dealt(gil: Path, directory: Path, tables: int = DEALT_TABLES, run_rows: int = DEALT_RUN_ROWS) -> list[Path]:
    """GIL's rows dealt into TABLES Parquet tables, RUN_ROWS rows at a time in turn: each table a
    share of the whole span in time order, as the tables of processes running side by side."""
    return split_table(gil, directory, [f"dealt-{k}" for k in range(tables)],
                       lambda rows, first: (np.arange(first, first + rows.num_rows) // run_rows) % tables)


def grouped_by_thread(gil: Path, directory: Path) -> Path:
    """GIL's rows grouped by thread (by pid, tid, start: a tool writing a thread at a time), with GIL's metadata."""
    import pyarrow.parquet as pq

    table = pq.read_table(gil)
    out = directory / f"{gil.stem}-by-thread.parquet"
    pq.write_table(table.sort_by([("pid", "ascending"), ("tid", "ascending"), ("start_ns", "ascending")]), out,
                   row_group_size=1 << 20)
    return out


def without_system_gc_requesters(pauses: Path, out: Path) -> tuple[Path, int]:
    """PAUSES with no requester named for any stop of the world holding a System.gc() pause (as
    JDK 17 records a System.gc() called through JNI by a thread it did not start: JPype's GC
    link), written to OUT; and how many of its pauses are inference candidates then."""
    from engine.analysis.causes import SYSTEM_GC, inference_candidates
    from engine.correlate.stops import stop_ids
    from engine.store import read_table, write_table

    table = read_table(pauses)
    stop = stop_ids(table)
    is_call = (table["cause"].astype("string") == SYSTEM_GC).fillna(False).to_numpy(bool)
    in_call_stop = np.isin(stop, stop[is_call])
    for column in ("requester_os_thread_id", "system_gc_os_thread_id"):
        if column in table.columns:
            table[column] = table[column].mask(in_call_stop)
    write_table(table, out, table.attrs)
    return out, int(inference_candidates(table, stop).sum())


def fastest_and_median_peak(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """(the fastest run's seconds, the median peak RSS) of RUNS of (seconds, peak GiB)."""
    peaks = sorted(gib for _, gib in runs)
    return min(s for s, _ in runs), peaks[len(peaks) // 2]


def real_shape(console, tmp: Path) -> list[Row]:
    """The demo's recording repeated to 10 minutes, 1 hour (and 8 hours), analyzed; DuckDB on the hour."""
    given = os.environ.get("TANDEM_BENCH_DEMO_SESSION")
    if given:
        session = Path(given)
    else:
        console.print(f"recording the demo service for {DEMO_SECONDS} s ...")
        session = record_demo(tmp / "demo-session")
    hour = float(os.environ.get("TANDEM_BENCH_SESSION_MINUTES", "60"))  # (shrinks this one too)
    lengths = [hour / 6, hour, *([480] if os.environ.get("TANDEM_BENCH_SESSION_8H") == "1" else [])]
    inputs = {}
    for minutes in lengths:
        pauses, gil, counts = repeat_recording(session, tmp, minutes)
        inputs[minutes] = (pauses, gil, counts)
        console.print(f"real shape, {minutes:g} min: {counts['intervals'] / 1e6:.1f} M GIL intervals, "
                      f"{counts['pauses']:,} pauses, {counts['system_gc_unnamed']:,} System.gc() pauses with no requester")
    os.sync()

    def tandem(minutes, pauses=None, gil=None):  # (GIL: a list of tables in place of the recording's)
        given_pauses, given_gil, _ = inputs[minutes]
        gils = [a for table in (gil or [given_gil]) for a in ("--gil", str(table))]
        return [sys.executable, "-m", "engine", "analyze", "--pauses", str(pauses or given_pauses), *gils,
                "-o", str(tmp / f"out-real-{minutes:g}min")]

    short_minutes = hour / 6
    hour_pauses, hour_gil, counts = inputs[hour]
    duck = [sys.executable, "-c", "import duckdb; duckdb.connect().execute({!r})".format(
        DUCKDB_OVERLAPS.format(pauses=hour_pauses, gil=hour_gil, out=tmp / "duck-real.parquet"))]
    run_measured(tandem(short_minutes))  # warm-up
    runs = {"short": [], "long": [], "duckdb": []}
    for _ in range(3):
        runs["long"].append(run_measured(tandem(hour)))
        runs["duckdb"].append(run_measured(duck))
        runs["short"].append(run_measured(tandem(short_minutes)))
    # time: the fastest run; peak RSS: the median run's (a run's peak varies by tens of MiB with
    # how far the reading and writing threads get ahead of the core)
    (long_s, long_gib), (short_s, short_gib), (duck_s, duck_gib) = (fastest_and_median_peak(runs[k])
                                                                    for k in ("long", "short", "duckdb"))
    rate = counts["intervals"] / long_s
    console.print(f"real shape, {hour:g} min, {counts['intervals'] / 1e6:.1f} M intervals: tandem {long_s:.1f} s "
                  f"({rate / 1e6:.2f} M intervals/s), peak RSS {long_gib:.2f} GiB; {short_minutes:g} min: {short_s:.1f} s, "
                  f"{short_gib:.2f} GiB; DuckDB overlaps only: {duck_s:.1f} s, {duck_gib:.2f} GiB")
    label = f"real shape, {hour:g} min, {counts['intervals'] / 1e6:.1f} M intervals"
    floor_s = io_floor(hour_pauses, hour_gil, tmp / f"out-real-{hour:g}min" / "overlaps.parquet", tmp / "floor.parquet")
    results_s = io_floor(hour_pauses, hour_gil, tmp / f"out-real-{hour:g}min", tmp / "floor.parquet")
    console.print(f"I/O floor of the hour (interpreter start, read both inputs, write the overlaps rows): {floor_s:.2f} s; "
                  f"result floor (the same, writing every result table tandem wrote): {results_s:.2f} s "
                  f"(the bar asks for {duck_s / 2.5:.2f} s)")
    rows = [
        Row("session", f"tandem analyze --pauses --gil ({label}) vs DuckDB overlaps only", long_s, duck_s, "s",
            "<= 1/2.5x", long_s * 2.5 <= duck_s),
        Row("session", f"I/O floor (interpreter start, read both inputs, write the overlaps rows) vs DuckDB ({label})",
            floor_s, duck_s, "s", "bar under the floor if > 0.4x", None),
        Row("session", f"result floor (interpreter start, read both inputs, write every result table tandem wrote, "
                       f"by its writer) vs DuckDB ({label})", results_s, duck_s, "s", "bar under the floor if > 0.4x", None),
        Row("session", f"intervals/s ({label}; anchor: the bar)", rate, 5e6, "intervals/s", ">= 5 M/s", rate >= 5e6),
        Row("session", f"peak RSS ({label}; anchor: DuckDB's)", long_gib, duck_gib, "GiB", "<= 1.5 GiB", long_gib <= 1.5),
        Row("session", f"peak RSS real shape {hour:g} min vs {short_minutes:g} min", long_gib, short_gib, "GiB", "-", None),
    ]
    # The same hour given as two Parquet gil tables (its threads split by tid parity): streamed side by side
    halves = split_by_thread(hour_gil, tmp)
    split_s, split_gib = fastest_and_median_peak([run_measured(tandem(hour, gil=halves)) for _ in range(3)])
    console.print(f"real shape, {hour:g} min as two gil tables: {split_s:.1f} s, peak RSS {split_gib:.2f} GiB")
    rows += [Row("session", f"tandem analyze, {label} as two Parquet gil tables vs one", split_s, long_s, "s", "-", None),
             Row("session", f"peak RSS, {label} as two Parquet gil tables vs one", split_gib, long_gib, "GiB", "-", None)]
    for path in halves:
        path.unlink()
    # ... and dealt into DEALT_TABLES tables, each a share of the whole hour (processes side by side)
    tables = dealt(hour_gil, tmp)
    dealt_s, dealt_gib = fastest_and_median_peak([run_measured(tandem(hour, gil=tables)) for _ in range(3)])
    console.print(f"real shape, {hour:g} min dealt into {len(tables)} gil tables: {dealt_s:.1f} s, peak RSS {dealt_gib:.2f} GiB")
    rows += [Row("session", f"tandem analyze, {label} dealt into {len(tables)} Parquet gil tables vs one", dealt_s, long_s,
                 "s", "-", None),
             Row("session", f"peak RSS, {label} dealt into {len(tables)} Parquet gil tables vs one", dealt_gib, long_gib,
                 "GiB", "-", None)]
    for path in tables:
        path.unlink()
    # The same hour and its short session as one table grouped by thread: pushed by time, through buckets
    grouped = {m: grouped_by_thread(inputs[m][1], tmp) for m in (short_minutes, hour)}
    (g_short_s, g_short_gib), (g_long_s, g_long_gib) = (
        fastest_and_median_peak([run_measured(tandem(m, gil=[grouped[m]])) for _ in range(3)]) for m in (short_minutes, hour))
    for m in grouped.values():
        m.unlink()
    console.print(f"real shape grouped by thread: {hour:g} min {g_long_s:.1f} s, peak RSS {g_long_gib:.2f} GiB; "
                  f"{short_minutes:g} min {g_short_s:.1f} s, {g_short_gib:.2f} GiB")
    rows += [Row("session", f"tandem analyze, {label} grouped by thread vs in time order", g_long_s, long_s, "s", "-", None),
             Row("session", f"peak RSS, {label} grouped by thread vs in time order", g_long_gib, long_gib, "GiB", "-", None),
             Row("session", f"peak RSS real shape grouped by thread, {hour:g} min vs {short_minutes:g} min", g_long_gib,
                 g_short_gib, "GiB", "<= 1.2x", g_long_gib <= 1.2 * g_short_gib)]
    if 480 in inputs:
        days = [run_measured(tandem(480)) for _ in range(3)]
        day_s, day_gib = fastest_and_median_peak(days)
        console.print(f"real shape, 8 h, {inputs[480][2]['intervals'] / 1e6:.1f} M intervals: {day_s:.1f} s "
                      f"({inputs[480][2]['intervals'] / day_s / 1e6:.2f} M intervals/s), peak RSS {day_gib:.2f} GiB "
                      f"(runs {', '.join(f'{g:.2f}' for _, g in days)}; {short_minutes:g} min: "
                      f"{', '.join(f'{g:.2f}' for _, g in runs['short'])})")
        rows.append(Row("session", f"peak RSS real shape 8 h vs {short_minutes:g} min", day_gib, short_gib, "GiB",
                        "<= 1.2x", day_gib <= 1.2 * short_gib))
        # The same 8 h of GIL intervals with no pause: what of the peak is the GIL side's (bounded
        # by the blocks read ahead and written) and what the pauses' state (per pause, for causes,
        # stops and the end tables)
        import pyarrow.parquet as pq

        no_pauses = tmp / "P-none.parquet"
        pq.write_table(pq.read_table(inputs[480][0]).slice(0, 0), no_pauses)
        bare_s, bare_gib = run_measured(tandem(480, no_pauses))
        console.print(f"real shape, 8 h with no pauses: {bare_s:.1f} s, peak RSS {bare_gib:.2f} GiB "
                      f"({bare_gib / short_gib:.2f}x the {short_minutes:g} min's); the {inputs[480][2]['pauses']:,} pauses "
                      f"add {(day_gib - bare_gib) * 1024:.0f} MiB")
        rows.append(Row("session", f"peak RSS real shape 8 h with no pauses vs {short_minutes:g} min (the GIL side alone)",
                        bare_gib, short_gib, "GiB", "-", None))
        # The same 8 h and 10 minutes with JFR naming no requester of a System.gc() stop (a
        # recording where it did): each such pause's requester is inferred, the causes asking
        # every thread of its JVM alive through it.
        unnamed = {m: without_system_gc_requesters(inputs[m][0], tmp / f"P-unnamed-{m:g}min.parquet")
                   for m in (short_minutes, 480)}
        short_unnamed = [run_measured(tandem(short_minutes, unnamed[short_minutes][0])) for _ in range(3)]
        long_unnamed = [run_measured(tandem(480, unnamed[480][0])) for _ in range(3)]
        (u_short_s, u_short_gib), (u_long_s, u_long_gib) = (fastest_and_median_peak(r) for r in (short_unnamed, long_unnamed))
        console.print(f"real shape with no System.gc() requester named ({unnamed[480][1]:,} inference candidates in 8 h): "
                      f"8 h {u_long_s:.1f} s, peak RSS {u_long_gib:.2f} GiB; {short_minutes:g} min {u_short_s:.1f} s, "
                      f"{u_short_gib:.2f} GiB ({u_long_gib / u_short_gib:.2f}x)")
        rows.append(Row("session", f"peak RSS real shape 8 h vs {short_minutes:g} min, no System.gc() requester named "
                                   "(requesters inferred)", u_long_gib, u_short_gib, "GiB", "<= 1.2x",
                        u_long_gib <= 1.2 * u_short_gib))
        # The same, in a JPype process with a pool of idle Python threads: each is alive through
        # every inference candidate, so the causes ask each of them about each candidate.
        sleeping = {m: repeat_recording(session, tmp, m, sleeping_threads=SLEEPING_THREADS)[1] for m in (short_minutes, 480)}
        s_short, s_long = ([run_measured(tandem(m, unnamed[m][0], [sleeping[m]])) for _ in range(3)]
                           for m in (short_minutes, 480))
        (s_short_s, s_short_gib), (s_long_s, s_long_gib) = (fastest_and_median_peak(r) for r in (s_short, s_long))
        console.print(f"the same with {SLEEPING_THREADS} idle threads more in the JPype process: 8 h {s_long_s:.1f} s, "
                      f"peak RSS {s_long_gib:.2f} GiB; {short_minutes:g} min {s_short_s:.1f} s, {s_short_gib:.2f} GiB "
                      f"({s_long_gib / s_short_gib:.2f}x)")
        rows.append(Row("session", f"peak RSS real shape 8 h vs {short_minutes:g} min, requesters inferred, "
                                   f"{SLEEPING_THREADS} idle Python threads more in the JPype process",
                        s_long_gib, s_short_gib, "GiB", "<= 1.2x", s_long_gib <= 1.2 * s_short_gib))
    return rows


def anchor_engine(directory: Path, console) -> Path | None:
    """ANCHOR_COMMIT's tree, its extensions built in place, in DIRECTORY; None (said) where this
    checkout's history does not hold it or it does not build."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    tree = directory / "anchor"
    tree.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", ANCHOR_COMMIT], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, capture_output=True,
                       check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        console.print(f"the engine of {ANCHOR_COMMIT} is not run beside tandem's: {err}")
        return None
    return tree


def anchor_command(tree: Path, *args: str) -> list[str]:
    """`python -m engine ARGS` of the engine in TREE (anchor_engine's), not this checkout's."""
    run = f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); runpy.run_module('engine', run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", run, *args]


def main(console) -> list[Row]:
    rows = synthetic(console)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-real-") as tmp:
        rows += real_shape(console, Path(tmp))
    return rows


def synthetic(console) -> list[Row]:
    minutes = float(os.environ.get("TANDEM_BENCH_SESSION_MINUTES", "60"))
    with tempfile.TemporaryDirectory(prefix="tandem-bench-session-") as tmp:
        tmp = Path(tmp)
        console.print(f"writing a {minutes:g}-minute and a {minutes / 6:g}-minute session ...")
        long_session, long_pauses, n_long = write_session(tmp, minutes, parquet_copy=True)
        short_session, short_pauses, n_short = write_session(tmp, minutes / 6, seed=8)
        os.sync()  # (the kernel's write-back of the 3 GB just written would run during the first timings)

        def tandem(session, pauses, *more):
            return [sys.executable, "-m", "engine", "analyze", "--pauses", str(pauses), "--gil", str(session),
                    "-o", str(tmp / f"out-{session.name}"), *more]

        duck = [sys.executable, "-c", "import duckdb; duckdb.connect().execute({!r})".format(
            DUCKDB_OVERLAPS.format(pauses=long_pauses, gil=tmp / "G.parquet", out=tmp / "duck.parquet"))]
        anchor = anchor_engine(tmp, console)

        def anchored(session, pauses):  # (ANCHOR_COMMIT's engine, its default: OUT names the GIL files)
            return anchor_command(anchor, "analyze", "--pauses", str(pauses), "--gil", str(session),
                                  "-o", str(tmp / f"anchor-out-{session.name}"))

        run_measured(tandem(short_session, short_pauses))  # warm-up: numba's cache
        if anchor is not None:
            run_measured(anchored(short_session, short_pauses))  # (its kernels compiled into its own cache)
        runs = {"long": [], "short": [], "duckdb": [], "named": [], "anchor": []}
        for _ in range(3):
            runs["long"].append(run_measured(tandem(long_session, long_pauses)))
            runs["duckdb"].append(run_measured(duck))
            runs["short"].append(run_measured(tandem(short_session, short_pauses)))
            # OUT naming the events files instead of holding gil.parquet (50 M rows written)
            runs["named"].append(run_measured(tandem(long_session, long_pauses, "--reference-gil")))
            if anchor is not None:
                runs["anchor"].append(run_measured(anchored(long_session, long_pauses)))
        (long_s, long_gib), (short_s, short_gib), (duck_s, duck_gib), (named_s, named_gib) = (
            fastest_and_median_peak(runs[k]) for k in ("long", "short", "duckdb", "named"))
        anchor_s, anchor_gib = fastest_and_median_peak(runs["anchor"]) if runs["anchor"] else (None, None)
        # The same hour's rate from MANY_PROCESSES processes (a host of many Python workers): the
        # cost of a session should not grow with how many processes share its intervals.
        many_session, _, n_many = write_session(tmp, minutes, seed=9, processes=MANY_PROCESSES)
        os.sync()
        many_s, many_gib = min(run_measured(tandem(many_session, long_pauses)) for _ in range(2))
        shutil.rmtree(many_session)
        workers_session, n_workers, workers = write_workers_session(tmp, minutes)
        os.sync()
        workers_s, workers_gib = min(run_measured(tandem(workers_session, long_pauses)) for _ in range(2))
    rate, named_rate = n_long / long_s, n_long / named_s
    console.print(f"{minutes:g} min, {n_long / 1e6:.1f} M intervals: tandem {long_s:.1f} s ({rate / 1e6:.2f} M intervals/s), "
                  f"peak RSS {long_gib:.2f} GiB; with --reference-gil {named_s:.1f} s ({named_rate / 1e6:.2f} M intervals/s), "
                  f"{named_gib:.2f} GiB; {minutes / 6:g} min: {short_s:.1f} s, {short_gib:.2f} GiB; "
                  f"DuckDB overlaps only: {duck_s:.1f} s, {duck_gib:.2f} GiB")
    label = f"{minutes:g}-min session, {n_long / 1e6:.0f} M intervals"
    anchor_rows = []
    if anchor_s is not None:
        anchor_rate = n_long / anchor_s
        console.print(f"{minutes:g} min, the engine of {ANCHOR_COMMIT} in the same run: {anchor_s:.1f} s "
                      f"({anchor_rate / 1e6:.2f} M intervals/s), peak RSS {anchor_gib:.2f} GiB")
        anchor_rows = [
            Row("session", f"intervals/s, --reference-gil vs the engine of {ANCHOR_COMMIT} (OUT names the GIL files in "
                f"both; {label}, same run)", named_rate, anchor_rate, "intervals/s", ">= 1x", named_rate >= anchor_rate),
            Row("session", f"intervals/s, as users run it (OUT holds gil.parquet) vs the engine of {ANCHOR_COMMIT} "
                f"({label}, same run)", rate, anchor_rate, "intervals/s", "-", None),
            Row("session", f"peak RSS vs the engine of {ANCHOR_COMMIT} ({label}, same run)", long_gib, anchor_gib, "GiB",
                "-", None),
        ]
    many_rate = n_many / many_s
    console.print(f"{minutes:g} min from {MANY_PROCESSES} processes, {n_many / 1e6:.1f} M intervals: {many_s:.1f} s "
                  f"({many_rate / 1e6:.2f} M intervals/s), peak RSS {many_gib:.2f} GiB")
    workers_rate = n_workers / workers_s
    workers = f"{workers} workers, {WORKERS_ALIVE} at a time"
    console.print(f"{minutes:g} min from {workers}, {n_workers / 1e6:.1f} M intervals: {workers_s:.1f} s "
                  f"({workers_rate / 1e6:.2f} M intervals/s), peak RSS {workers_gib:.2f} GiB")
    return [
        Row("session", f"intervals/s, {MANY_PROCESSES} processes vs {PROCESSES} ({label}; anchor: {PROCESSES})", many_rate, rate,
            "intervals/s", "-", None),
        Row("session", f"peak RSS, {MANY_PROCESSES} processes vs {PROCESSES} ({label})", many_gib, long_gib, "GiB", "-", None),
        Row("session", f"intervals/s, {workers} vs {PROCESSES} processes ({label}; anchor: {PROCESSES})", workers_rate, rate,
            "intervals/s", "-", None),
        Row("session", f"peak RSS, {workers} vs {PROCESSES} processes ({label})", workers_gib, long_gib, "GiB", "-", None),
        Row("session", f"tandem analyze SESSION ({label}) vs DuckDB overlaps only", long_s, duck_s, "s", "<= 1/2.5x",
            long_s * 2.5 <= duck_s),
        Row("session", f"intervals/s ({label}; anchor: the bar)", rate, 7e6, "intervals/s", ">= 7 M/s", rate >= 7e6),
        Row("session", f"intervals/s, --reference-gil ({label}; anchor: the bar)", named_rate, 7e6, "intervals/s",
            ">= 7 M/s", named_rate >= 7e6),
        Row("session", f"peak RSS ({label}; anchor: DuckDB's)", long_gib, duck_gib, "GiB", "<= 1.5 GiB", long_gib <= 1.5),
        Row("session", f"peak RSS {minutes:g} min vs {minutes / 6:g} min", long_gib, short_gib, "GiB", "<= 1.2x",
            long_gib <= 1.2 * short_gib),
        *anchor_rows,
    ]
