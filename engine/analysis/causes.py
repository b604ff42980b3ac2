"""Who caused a pause: cross-runtime causality (docs/results.md, "Causes").

A JVM pause whose requesting OS thread (`requester_os_thread_id`: the caller of the VM
operation, from JFR's jdk.ExecuteVMOperation) is a Python thread of the session is *caused
by Python*. Linux thread ids are unique on a host while the thread lives; the thread counts
as alive at the pause when its recorded GIL intervals span the pause's start. Works on the
(small) pauses table and the GIL intervals; no join core needed.

For such a pause: the Python thread, the Python code it was in (the GIL interval that
contains the request; a thread holding the GIL then has none, so the code of its next
release is given), the Java frames of its System.gc() call, and whether it held the GIL
through the pause (then every other Python thread that wanted the GIL waited on it:
amplification with its cause).

JPype's GC link (jpype native/common/jp_gc.cpp): after a Python collection that grew the
process past a high-water mark, JPype calls java.lang.System.gc() from the thread that ran
Python's GC, through plain JNI, with the GIL held. That thread is whichever ran the
collection: a Python thread allocating (no Java frame under System.gc()), the main thread
while JPype's native code builds class wrappers at start-up, or JPype's reference-queue
thread, a Java thread, when a Java collection woke it to collect Python's garbage (then
JPype's native methods, `org.jpype.manager.TypeFactoryNative.newWrapper` or
`org.jpype.ref.JPypeReferenceNative.wake`, sit under System.gc()). JPype's Java code never
calls System.gc() (no class of its jar refers to it), so a JPype frame right under it is
JPype's native code. Its shape here: a pause caused by Python, whose thread held the GIL
throughout, whose collection's cause is "System.gc()", and whose System.gc() call has no
caller frame, or a JPype one (when jdk.SystemGC was recorded). A Python thread calling
System.gc() through a JPype method call releases the GIL around the call (JPype does for
every Java call): caused by Python, not the link; a Java method that calls System.gc()
shows as its caller frame.

When JFR names no requester of a System.gc() pause (JDK 17 names no thread attached through
JNI: its jdk.SystemGC event has no thread, the VM operation no caller) and the JVM runs inside a Python process
(JPype: the pause's jvm_pid is a Python pid of the session), the requester is *inferred*
(`cause_inferred`): the one Python thread of that process alive through the pause that held
the GIL through it. A thread that calls System.gc() through JNI stays in the call for the
whole collection; a thread running Python code in the same process runs on through a
collection too, so the inference can name a bystander when a Java thread asked; with two or
more such threads, or none, nothing is inferred; nor when a thread of the process released
the GIL just before the stop began (within CALL_WINDOW_NS) and was still out through the pause,
the shape of a System.gc() call made through a JPype method (then the one holder may be a
bystander, as CI found on the demo). An inferred cause is called JPype's GC link
only when jdk.SystemGC's frames were recorded (JDK 17 records the call, with its frames, but
not the thread attached through JNI) and show no caller outside JPype: without them a Java
thread's own System.gc() cannot be told from the link.

The summary counts stops of the world (engine/correlate/stops.py): the safepoint, GC pause
and collection of one System.gc() are one stop, asked for once.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

CAUSE_COLUMNS = ("caused_by_python", "cause_pid", "cause_tid", "cause_thread", "cause_state", "cause_function",
                 "cause_file", "cause_line", "cause_java_frames", "cause_held_gil", "cause_inferred", "jpype_gc_link")
SYSTEM_GC = "System.gc()"
# How far from an inference candidate a streamed analysis keeps its process's GIL rows: an
# inferred requester's next release (its code) and the rows that show it alive then.
INFERENCE_WINDOW_NS = 10_000_000_000
# A Python thread calling System.gc() through a JPype method releases the GIL for the call and
# the stop of the world begins tens of microseconds to a millisecond later (measured on the
# demo: 31 us - 0.92 ms); JDK 17 names no requester for that call either. A release this
# close before a candidate's stop, lasting through the pause, makes the inference stand down.
CALL_WINDOW_NS = 20_000_000
# The frames of System.gc() itself (JDK 17+: System.gc calls Runtime.gc): the first other
# frame in a call's system_gc_frames is its Java caller.
SYSTEM_GC_OWN_FRAMES = ("java.lang.Runtime.gc", "java.lang.System.gc")
# A caller in this package is one of JPype's native methods (see the module's docstring).
JPYPE_PACKAGE = "org.jpype."
JPYPE_GC_LINK_ADVICE = ("JPype's GC link: after a Python garbage collection that grew the process by its high-water mark "
                        "(+20 MiB), JPype called System.gc() holding the GIL; every Python thread waited for the Java "
                        "collection. Make Python garbage less often (reuse buffers, fewer large temporaries) or give the "
                        "JVM a heap that needs no full collection; JPype has no switch for the link.")


def _empty(n: int) -> dict:
    # (from arrays, not from lists of NA: 0.3 s less on 200 k pauses)
    def ints():
        return pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool))

    def text():
        return pd.array(np.full(n, None, object), dtype="string")

    return {
        "caused_by_python": np.zeros(n, bool),
        "cause_pid": ints(),
        "cause_tid": ints(),
        "cause_thread": text(),
        "cause_state": text(),
        "cause_function": text(),
        "cause_file": text(),
        "cause_line": ints(),
        "cause_java_frames": text(),
        "cause_held_gil": pd.arrays.BooleanArray(np.zeros(n, bool), np.ones(n, bool)),
        "cause_inferred": np.zeros(n, bool),
        "jpype_gc_link": np.zeros(n, bool),
    }


def requester_tids(pauses: pd.DataFrame) -> pd.Series:
    """Per pause, the OS thread that asked for it (Int64): the VM operation's caller, else the
    thread of the System.gc() call the pause lies in."""
    missing = pd.Series(pd.array([pd.NA] * len(pauses), dtype="Int64"), index=pauses.index)
    requester = pauses["requester_os_thread_id"].astype("Int64") if "requester_os_thread_id" in pauses.columns else missing
    if "system_gc_os_thread_id" in pauses.columns:
        requester = requester.fillna(pauses["system_gc_os_thread_id"].astype("Int64"))
    return requester


def system_gc_caller(frames: str) -> str | None:
    """The method that called System.gc() in a call's frames ("method[:line]; ..."), or None
    (called through JNI from native code with no Java frame under it)."""
    for frame in frames.split("; "):
        method = frame.split(":", 1)[0]
        if method not in SYSTEM_GC_OWN_FRAMES:
            return method
    return None


def _caller_outside_jpype(frames: pd.Series) -> np.ndarray:
    """Per System.gc() call's frames (string or null): its caller is Java code other than JPype's."""
    def outside(text) -> bool:
        caller = system_gc_caller(str(text))
        return caller is not None and not caller.startswith(JPYPE_PACKAGE)

    return np.array([False if pd.isna(f) else outside(f) for f in frames], bool)


def _system_gc_pauses(pauses: pd.DataFrame) -> np.ndarray:
    """Per pause: it lies in a System.gc() call, or its own cause, or a collection of the same
    JVM overlapping it, is System.gc()."""
    starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    in_call = (pauses["system_gc_os_thread_id"].notna().to_numpy(bool) if "system_gc_os_thread_id" in pauses.columns
               else np.zeros(len(pauses), bool))
    if "cause" not in pauses.columns:
        return in_call
    is_system = (pauses["cause"].astype("string") == SYSTEM_GC).fillna(False).to_numpy(bool)
    out = is_system | in_call
    jvm = pauses["jvm_pid"].astype("Int64").fillna(-1).to_numpy(np.int64) if "jvm_pid" in pauses.columns else np.zeros(len(pauses), np.int64)
    for i in np.flatnonzero(is_system):
        out |= (starts < ends[i]) & (ends > starts[i]) & (jvm == jvm[i])
    return out


def inference_candidates(pauses: pd.DataFrame, stop: np.ndarray) -> np.ndarray:
    """Per pause: a System.gc() pause JFR names no requester for, of a JVM with a known pid (its
    requester may be inferred: see the module's docstring). `stop`: stops.stop_ids(pauses)."""
    if not len(pauses) or "jvm_pid" not in pauses.columns:
        return np.zeros(len(pauses), bool)
    # (a GC pause or collection whose stop's safepoint JFR names a requester for is that one's)
    named = requester_tids(pauses).notna().to_numpy(bool)
    named_stop = np.isin(stop, stop[named])
    return _system_gc_pauses(pauses) & ~named_stop & pauses["jvm_pid"].notna().to_numpy(bool)


def inferred_requesters(pauses: pd.DataFrame, stop: np.ndarray, lifetimes: pd.DataFrame, overlaps: pd.DataFrame,
                        gil: pd.DataFrame | None = None) -> pd.Series:
    """Per pause (Int64, NA when none): the one Python thread of the JVM's own process alive
    through the pause (`lifetimes`: pid, tid, start_ns, end_ns) with no exact overlap with it
    (it held the GIL throughout), for the inference_candidates, unless a thread of that process
    was in a Java call through the pause that began just before its stop of the world (`gil`:
    at least the rows of those processes near the candidates; see CALL_WINDOW_NS). `overlaps`:
    at least those of the candidates. `stop`: stops.stop_ids(pauses)."""
    out = pd.Series(pd.array([pd.NA] * len(pauses), dtype="Int64"), index=pauses.index)
    candidates = np.flatnonzero(inference_candidates(pauses, stop))
    if not candidates.size or not len(lifetimes):
        return out
    exact = overlaps[~overlaps["near_miss"].astype(bool) & (overlaps["overlap_ns"] > 0)] if len(overlaps) else overlaps
    busy = exact.groupby("pause_id")["tid"].agg(set).to_dict() if len(exact) else {}
    l_pid, l_tid = lifetimes["pid"].to_numpy(np.int64), lifetimes["tid"].to_numpy(np.int64)
    l_start, l_end = lifetimes["start_ns"].to_numpy(np.int64), lifetimes["end_ns"].to_numpy(np.int64)
    starts = pauses["start_ns"].to_numpy(np.int64)
    stop_start = pd.Series(starts).groupby(stop).transform("min").to_numpy(np.int64)
    released = gil[gil["state"].astype("string") == "released"] if gil is not None and len(gil) else None
    if released is not None:
        r_pid, r_start, r_end = (released[c].to_numpy(np.int64) for c in ("pid", "start_ns", "end_ns"))
    for i in candidates.tolist():
        pause = pauses.iloc[i]
        pid, end = int(pause["jvm_pid"]), int(pause["end_ns"])
        alive = (l_pid == pid) & (l_start <= int(pause["start_ns"])) & (l_end >= end)
        holders = set(l_tid[alive].tolist()) - busy.get(int(pause["pause_id"]), set())
        if len(holders) != 1:
            continue
        if released is not None and ((r_pid == pid) & (r_start <= stop_start[i]) & (r_start >= stop_start[i] - CALL_WINDOW_NS)
                                     & (r_end >= end)).any():
            continue  # (a caller through JPype may have asked: the holder may be a bystander)
        out.iloc[i] = holders.pop()
    return out


def pause_causes(pauses: pd.DataFrame, gil: pd.DataFrame, inferred: pd.Series | None = None) -> pd.DataFrame:
    """CAUSE_COLUMNS per pause (pauses table order). `inferred`: inferred_requesters, for the
    pauses JFR names no requester for (`gil` then holds rows of those threads too)."""
    n = len(pauses)
    out = _empty(n)
    requester = requester_tids(pauses)
    if inferred is not None:
        out["cause_inferred"] = requester.isna().to_numpy(bool) & inferred.notna().to_numpy(bool)
        requester = requester.fillna(inferred)
    if n == 0 or not requester.notna().any() or len(gil) == 0:
        return pd.DataFrame(out)
    starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    system_gc = _system_gc_pauses(pauses)
    frames = pauses["system_gc_frames"].astype("string") if "system_gc_frames" in pauses.columns else None
    by_tid = {tid: rows.sort_values("start_ns", kind="stable") for tid, rows in gil.groupby("tid", sort=False)}
    caused, held = out["caused_by_python"], np.zeros(n, bool)
    for i in np.flatnonzero(requester.notna().to_numpy(bool)):
        rows = by_tid.get(int(requester.iloc[i]))
        if rows is None:
            continue
        g_start, g_end = rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)
        if not (g_start[0] <= starts[i] <= g_end[-1]):
            continue  # the tid is not this thread's at the time (before its first interval, after its last)
        caused[i] = True
        inside = np.flatnonzero((g_start <= starts[i]) & (g_end > starts[i]))
        overlapping = (g_start < ends[i]) & (g_end > starts[i])
        held[i] = not overlapping.any()
        if len(inside):
            row, state = rows.iloc[inside[0]], str(rows["state"].iloc[inside[0]])
        else:
            after = np.flatnonzero(g_start >= starts[i])
            row, state = (rows.iloc[after[0]], "holding") if len(after) else (None, "holding")
        out["cause_pid"][i] = int(rows["pid"].iloc[0])
        out["cause_tid"][i] = int(requester.iloc[i])
        if "thread_name" in rows.columns and pd.notna(rows["thread_name"].iloc[0]):
            out["cause_thread"][i] = str(rows["thread_name"].iloc[0])
        out["cause_state"][i] = state
        if row is not None:
            for column in ("function", "file", "line"):
                if column in rows.columns and pd.notna(row[column]):
                    out[f"cause_{column}"][i] = row[column]
        if frames is not None and pd.notna(frames.iloc[i]):
            out["cause_java_frames"][i] = frames.iloc[i]
        out["cause_held_gil"][i] = bool(held[i])
    outside_jpype = _caller_outside_jpype(frames) if frames is not None else np.zeros(n, bool)
    out["cause_inferred"] &= caused
    frames_known = frames.notna().to_numpy(bool) if frames is not None else np.zeros(n, bool)
    out["jpype_gc_link"] = caused & held & system_gc & ~outside_jpype & (~out["cause_inferred"] | frames_known)
    return pd.DataFrame(out)


class CodeHits:
    """The summary's code hit most: exact overlaps rows per (function, file, line), total
    overlap_ns ("sum") and rows ("size"), in order of first appearance. Fed the rows as the core
    makes them (`Correlator.overlaps_codes`: added up by carried code, not by text). leaders:
    the pause_ids leading a stop of the world (engine/correlate/stops.py): only their rows
    count, so a stop's safepoint, GC pause and collection hit a release once."""

    def __init__(self, leaders: np.ndarray | None):
        self.leaders = None if leaders is None else np.asarray(leaders, np.int64)
        self.sums = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)  # the first row (over every part) of each code; -1: none
        self.rows = 0

    @classmethod
    def fed_by(cls, core, pauses: pd.DataFrame, stop: np.ndarray) -> "CodeHits":
        """The hits of the pauses leading a stop (STOP: stop_ids of PAUSES), fed by CORE (a
        Correlator) as it makes overlaps rows."""
        pause_id = pauses["pause_id"].to_numpy(np.int64)
        hits = cls(pause_id[stop == pause_id])
        core.overlaps_codes = hits.add
        return hits

    def add(self, pause_id: np.ndarray, overlap_ns: np.ndarray, near_miss: np.ndarray, code: np.ndarray) -> None:
        from engine.correlate.kernels import code_totals

        keep = ~near_miss
        if self.leaders is not None:
            keep &= np.isin(pause_id, self.leaders)
        if code.size and int(code.max()) >= self.sums.size:
            grow = max(int(code.max()) + 1, 2 * self.sums.size) - self.sums.size
            self.sums = np.concatenate([self.sums, np.zeros(grow, np.int64)])
            self.counts = np.concatenate([self.counts, np.zeros(grow, np.int64)])
            self.first = np.concatenate([self.first, np.full(grow, -1, np.int64)])
        code_totals(keep, code.astype(np.int64, copy=False), overlap_ns.astype(np.int64, copy=False), self.rows,
                    self.sums, self.counts, self.first)
        self.rows += code.size

    def table(self, carried: pa.Table | None) -> pa.Table | None:
        """The hits (function, file, line, sum, size), or None if no row carried a function."""
        if carried is None or "function" not in carried.column_names or not self.rows:
            return None
        seen = np.flatnonzero(self.counts)
        seen = seen[np.argsort(self.first[seen], kind="stable")]  # in order of first appearance
        keyed = (_code_keys(carried.take(pa.array(seen, pa.int64())))
                 .append_column("sum", pa.array(self.sums[seen])).append_column("size", pa.array(self.counts[seen])))
        return add_code_hits([keyed])  # (codes whose text is alike add up)


def _code_keys(table: pa.Table) -> pa.Table:
    """TABLE's (function, file, line) as the hits group them, nulls filled."""
    def column(name, kind):  # (a gil table may carry some of the three only)
        if name in table.column_names:
            return table.column(name).cast(kind)
        return pa.nulls(table.num_rows, kind)

    return pa.table({"function": pc.fill_null(column("function", pa.string()), "<not recorded>"),
                     "file": pc.fill_null(column("file", pa.string()), ""),
                     "line": pc.fill_null(column("line", pa.int64()), -1)})


def add_code_hits(parts: list[pa.Table]) -> pa.Table:
    both = pa.concat_tables(parts)
    total = both.group_by(["function", "file", "line"], use_threads=False).aggregate([("sum", "sum"), ("size", "sum")])
    return total.rename_columns([{"sum_sum": "sum", "size_sum": "size"}.get(c, c) for c in total.column_names])


def caused_stops(impact: pd.DataFrame) -> pd.DataFrame:
    """The pauses caused by Python, one row per stop of the world (`stop_id`): the stop's own
    (leading) row when it is caused, else its first caused row. The safepoint, GC pause and
    collection of one System.gc() are one request."""
    caused = impact[impact["caused_by_python"].fillna(False).astype(bool)]
    stop = caused["stop_id"] if "stop_id" in caused.columns else caused["pause_id"]
    leading = (caused["pause_id"] == stop).to_numpy(bool)
    order = np.lexsort((np.arange(len(caused)), ~leading, stop.to_numpy(np.int64)))
    return caused.iloc[order].loc[lambda d: ~stop.iloc[order].duplicated().to_numpy()]


def why_facts(impact: pd.DataFrame, hits: pa.Table | None, top: int = 5) -> dict:
    """For the summary: the Python code hit most (HITS, CodeHits.table) and the causes by Python
    (per thread and code: stops of the world asked for, their total duration, how many with
    the GIL held, how many JPype's GC link); each stop counts once (`caused_stops`), and
    `jpype_gc_link_stops` is the sum of the per-cause link counts over every cause."""
    facts: dict = {"functions_hit": [], "caused_by_python": [], "jpype_gc_link_stops": 0}
    if hits is not None and hits.num_rows:
        hit = hits.to_pandas().set_index(["function", "file", "line"])
        for (function, file, line), row in hit.sort_values("sum", ascending=False, kind="stable").head(top).iterrows():
            facts["functions_hit"].append({"function": function, "file": file, "line": int(line) if line >= 0 else None,
                                           "overlap_ns": int(row["sum"]), "overlaps": int(row["size"])})
    if "caused_by_python" in impact.columns and impact["caused_by_python"].any():
        caused = caused_stops(impact).assign(
            thread=lambda d: d["cause_thread"].fillna(d["cause_tid"].astype("string")),
            function=lambda d: d["cause_function"].fillna("?"), file=lambda d: d["cause_file"].fillna(""),
            line=lambda d: d["cause_line"].fillna(-1),
            java_frames=lambda d: (d["cause_java_frames"] if "cause_java_frames" in d.columns
                                   else pd.Series(pd.NA, index=d.index, dtype="string")).fillna(""))
        grouped = caused.groupby(["thread", "function", "file", "line", "java_frames"], sort=False).agg(
            stops=("pause_id", "size"), duration_ns=("duration_ns", "sum"), held_gil=("cause_held_gil", "sum"),
            jpype_gc_link=("jpype_gc_link", "sum"), inferred=("cause_inferred", "sum"))
        for (thread, function, file, line, frames), row in grouped.sort_values("duration_ns", ascending=False).iterrows():
            facts["jpype_gc_link_stops"] += int(row["jpype_gc_link"])
            if len(facts["caused_by_python"]) < top:
                facts["caused_by_python"].append({
                    "thread": thread, "function": function, "file": file, "line": int(line) if line >= 0 else None,
                    "java_frames": frames or None, "stops": int(row["stops"]), "duration_ns": int(row["duration_ns"]),
                    "held_gil": int(row["held_gil"]), "jpype_gc_link": int(row["jpype_gc_link"]),
                    "inferred": int(row["inferred"])})
    return facts
