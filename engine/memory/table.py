"""memory.parquet: one row per process per sample, every memory series a column, on CLOCK_MONOTONIC.

The grid is the process sampler's (SESSION/memory/<pid>.jsonl, engine/record/memory.py);
a process it never saw (a session of `tandem attach`) gets the times of its runtime's own
samples. A series sampled once a second is interpolated to the row's time (null farther than
STALE_NS from a sample of it); the heap and metaspace summaries, written at each GC, count
from that GC until the next. The buckets (docs/results.md, "memory.parquet") split the RSS into
what each runtime accounts for, and `unexplained`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from engine.memory.jvm import AT_GC_FIELDS, read_jvm_memory
from engine.session import PROCESS_MEMORY_DIR, PYTHON_MEMORY, Session

STALE_NS = 3_000_000_000
SCHEMA = "tandem.memory"
SCHEMA_VERSION = 1
BUCKETS = ("jvm_heap", "jvm_native", "python", "native_other", "unexplained")
_AT_GC_COLUMNS = {column for fields in AT_GC_FIELDS.values() for column in fields}


def read_jsonl(path: Path) -> pd.DataFrame:
    """A samples file (a process killed mid-line leaves half a last line: skipped)."""
    rows = []
    with open(path, "rb") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return pd.DataFrame(rows)


def memory_table(session: Session | Path) -> tuple[pd.DataFrame, dict]:
    """The memory table of a session and its facts (per JVM: clock, recordings left out)."""
    session = session if isinstance(session, Session) else Session.open(session)
    outside = {int(p.stem): read_jsonl(p) for p in sorted((session.path / PROCESS_MEMORY_DIR).glob("*.jsonl"))}
    python = {p.pid: read_jsonl(p.directory / PYTHON_MEMORY) for p in session.pythons
              if p.pid and (p.directory / PYTHON_MEMORY).is_file()}
    jvms, facts = {}, {"jvms": {}}
    if not outside and not python:  # recorded without memory capture: the JVMs' recordings are not read again
        return pd.DataFrame({"t_ns": pd.Series(dtype="int64"), "pid": pd.Series(dtype="int64")}), facts
    for source in session.jvms:
        if source.pid:
            jvms[source.pid], facts["jvms"][str(source.pid)] = read_jvm_memory(
                source.recordings, java_version=source.description.get("java_version"))
    parts = []
    for pid in sorted(set(outside) | set(python) | set(jvms)):
        part = process_rows(pid, outside.get(pid), python.get(pid), jvms.get(pid))
        if part is not None and len(part):
            parts.append(part)
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"t_ns": [], "pid": []})
    table = with_buckets(table)
    facts.update(schema=SCHEMA, schema_version=SCHEMA_VERSION, clock_domain="monotonic")
    return table, facts


def process_rows(pid: int, outside: pd.DataFrame | None, python: pd.DataFrame | None,
                 jvm: pd.DataFrame | None) -> pd.DataFrame | None:
    """One process's rows from its three sources (each may be missing): the recorder's samples
    (their times are the rows'), CPython's (interpolated) and its JVM's long table (read_jvm_memory)."""
    if outside is not None and len(outside):
        rows = outside.rename(columns={"t": "t_ns"}).drop(columns=["pid"], errors="ignore")
    elif python is not None and len(python):
        rows = python[["t"]].rename(columns={"t": "t_ns"})
    elif jvm is not None and len(jvm):
        rows = pd.DataFrame({"t_ns": np.unique(jvm["t_ns"].to_numpy())})
    else:
        return None
    rows = rows.sort_values("t_ns", ignore_index=True)
    rows["t_ns"] = rows["t_ns"].astype("int64")
    at = rows["t_ns"].to_numpy(np.int64)
    # Every series is computed as an array and the columns set at once: a live run rebuilds
    # this table every few seconds, and per-column DataFrame copies and merges cost far more
    # than the arithmetic.
    columns: dict[str, np.ndarray] = {}
    if python is not None and len(python):
        series = python.rename(columns={"t": "t_ns", "blocks": "py_blocks", "arenas": "py_arenas",
                                        "arena_bytes": "py_arena_bytes", "pymalloc_bytes": "py_pymalloc_bytes",
                                        "tracemalloc": "py_tracemalloc", "tracemalloc_numpy": "py_tracemalloc_numpy"})
        series = series.sort_values("t_ns").astype({"t_ns": "int64"}).drop(columns=["cpu_ns"], errors="ignore")
        t = series["t_ns"].to_numpy(np.int64)
        for column in series.columns.drop("t_ns"):
            values = pd.to_numeric(series[column], errors="coerce").to_numpy(np.float64)
            present = ~np.isnan(values)
            if present.any():
                columns[column] = _interpolated(at, t[present], values[present])
    if jvm is not None and len(jvm):
        columns.update(_jvm_columns(at, jvm))
        if "large_mappings" in rows and "jvm_heap_start" in columns:
            columns["jvm_heap_resident"] = np.array([
                _resident_within(mappings, start, end) for mappings, start, end
                in zip(rows["large_mappings"], columns["jvm_heap_start"], columns["jvm_heap_end"])], dtype=np.float64)
    for column in [c for c in columns if c in rows]:
        rows[column] = columns.pop(column)
    if columns:
        rows = pd.concat([rows, pd.DataFrame(columns, index=rows.index)], axis=1)
    rows = rows.drop(columns=["large_mappings", "jvm_heap_start", "jvm_heap_end"], errors="ignore")
    rows.insert(1, "pid", np.int64(pid))
    return rows


def _resident_within(mappings, start: float, end: float) -> float:
    """The resident bytes of the sampled mappings inside [START, END) (a JVM's heap), pro rata."""
    if not isinstance(mappings, list) or np.isnan(start) or np.isnan(end):
        return np.nan
    total = 0.0
    for low, high, resident in mappings:
        overlap = min(high, end) - max(low, start)
        if overlap > 0:
            total += resident * overlap / (high - low)
    return total


def _as_of(at: np.ndarray, t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The value of the latest sample at or before each of AT (T sorted), null before the first."""
    latest = np.searchsorted(t, at, side="right") - 1
    return np.where(latest >= 0, values[np.maximum(latest, 0)], np.nan)


def _interpolated(at: np.ndarray, t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A periodic series at the rows' times AT, linear between its samples (T sorted; JFR's
    periodic thread runs late on a busy JVM: taking the latest value would lag by a varying
    amount, and a lag that varies bends a trend); null farther than STALE_NS from any sample."""
    interpolated = np.interp(at.astype(np.float64), t.astype(np.float64), values)
    after = np.clip(np.searchsorted(t, at), 0, len(t) - 1)
    before = np.clip(after - 1, 0, len(t) - 1)
    nearest = np.minimum(np.abs(t[after] - at), np.abs(at - t[before]))
    return np.where(nearest <= STALE_NS, interpolated, np.nan)


def _last_per_time(t: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One sample per time, sorted: the last non-null value given for it (null if none is)."""
    if not len(t):
        return t, values
    order = np.argsort(t, kind="stable")
    t, values = t[order], values[order]
    group = np.r_[0, np.cumsum(t[1:] != t[:-1])]
    position = np.arange(len(t))
    last = np.full(group[-1] + 1, -1)
    np.maximum.at(last, group, position)  # the last sample of each time...
    known = ~np.isnan(values)
    last_known = np.full(len(last), -1)
    np.maximum.at(last_known, group[known], position[known])  # ...or its last non-null one
    pick = np.where(last_known >= 0, last_known, last)
    return t[pick], values[pick]


def _jvm_columns(at: np.ndarray, jvm: pd.DataFrame) -> dict[str, np.ndarray]:
    """The JVM's series at the rows' times AT; the code heaps (one event each) summed into jvm_code_cache,
    the heap after the latest GC kept apart (jvm_heap_after_gc: the live set and what leaks;
    jvm_heap_after_gc_ns: when that GC ended), G1's unused copy buffers summed since the start
    (jvm_heap_gc_waste: in the heap's used bytes, not in its live set),
    and the most the heap held so far (jvm_heap_peak: before a GC, eden full), which its pages
    were touched for."""
    names, columns_named = pd.factorize(jvm["column"].to_numpy(object))  # (numbers compared, not text)
    t_all = jvm["t_ns"].to_numpy(np.int64)
    values_all = jvm["value"].to_numpy(np.float64)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for number, column in enumerate(map(str, columns_named)):
        mine = names == number
        t, values = t_all[mine], values_all[mine]
        if column == "jvm_heap_gc_waste":
            values = np.nancumsum(values) + np.where(np.isnan(values), np.nan, 0.0)
        series[column] = (t, values)
        if column == "jvm_heap_used":
            after = jvm["after_gc"].to_numpy(bool)[mine]
            series["jvm_heap_after_gc"] = (t[after], values[after])
            series["jvm_heap_after_gc_ns"] = (t[after], t[after].astype(np.float64))
            series["jvm_heap_peak"] = (t, pd.Series(values).cummax().to_numpy(np.float64))
    columns: dict[str, np.ndarray] = {}
    code_cache = []
    for column in sorted(series):
        t, values = _last_per_time(*series[column])
        if not len(t):  # (no collection ended yet: no heap after GC)
            continue
        at_gc = column in _AT_GC_COLUMNS or column in ("jvm_heap_after_gc", "jvm_heap_after_gc_ns", "jvm_heap_peak",
                                                       "jvm_heap_gc_waste", "jvm_gc_side_tables")
        columns[column] = _as_of(at, t, values) if at_gc else _interpolated(at, t, values)
        if column.startswith("jvm_code_cache:"):
            code_cache.append(column)
    if code_cache:
        stacked = np.column_stack([columns.pop(c) for c in code_cache])
        columns["jvm_code_cache"] = np.where(np.isnan(stacked).all(axis=1), np.nan, np.nansum(stacked, axis=1))
    return columns


def with_buckets(table: pd.DataFrame) -> pd.DataFrame:
    """The RSS split (bytes; docs/results.md): jvm_heap, jvm_native, python, native_other, unexplained."""
    def column(name: str) -> pd.Series:
        return table[name].astype("float64").fillna(0.0) if name in table else pd.Series(0.0, index=table.index)

    table = table.copy()
    direct = column("jvm_direct_buffers")
    # The heap's part of the RSS: its resident pages where the recorder measured them, else the
    # most it held so far within its committed size (a lower bound: the pages a heap touched run
    # ahead of what it calls used; G1 takes eden from fresh regions of its committed memory).
    peak = column("jvm_heap_peak" if "jvm_heap_peak" in table else "jvm_heap_used")
    bound = np.fmin(peak, table["jvm_heap_committed"].astype("float64")) if "jvm_heap_committed" in table else peak
    table["jvm_heap"] = table["jvm_heap_resident"].astype("float64").fillna(bound) if "jvm_heap_resident" in table else bound
    table["jvm_native"] = column("jvm_metaspace_committed") + column("jvm_code_cache") + direct + column("jvm_gc_side_tables")
    python_malloc = (column("py_tracemalloc") - column("py_pymalloc_bytes")).clip(lower=0)  # 0 unless tracing
    table["python"] = (column("py_arena_bytes") + python_malloc).where(_sampled(table, "py_arena_bytes"))
    # malloc in use, less what the runtimes say is theirs in it: the JVM's direct buffers
    # (malloc'd by Unsafe) and Python's large objects (known when tracemalloc traces).
    table["native_other"] = (column("malloc_in_use") - direct - python_malloc).clip(lower=0).where(
        _sampled(table, "malloc_in_use"))
    known = sum(table[bucket].fillna(0.0) for bucket in BUCKETS if bucket != "unexplained")
    table["unexplained"] = column("rss") - known if "rss" in table else np.nan
    return table


def _sampled(table: pd.DataFrame, name: str) -> pd.Series:
    """Rows where NAME has a value: a bucket made from it is null elsewhere (its sampler had not
    run for 3 s: a service holding the GIL), not 0, so no trend dips to it (unexplained counts it 0)."""
    return table[name].notna() if name in table else pd.Series(False, index=table.index)
