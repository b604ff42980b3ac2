"""Per span: its time inside JVM stops of the world, and how its thread spent it (docs/spans.md).

Inputs: the spans on CLOCK_MONOTONIC (engine.spans.clock: `start_ns`, `end_ns`, `pid`,
`thread_id`), the pauses table, pause_impact (its `stop_id` and cause columns, optional) and
the GIL intervals (pid, tid, state, start_ns, end_ns). All interval arithmetic is on sorted
disjoint interval sets (`IntervalSet`): the time a set covers inside [a, b) is a difference
of its running total at b and at a, found by searchsorted, so a block of spans costs a few
array passes per thread, whatever its length. Spans may come in blocks (any order), each with
the GIL rows of its threads and processes over its time range (any superset): the figures of
a span depend only on its own time range.

The stops of the world are the pauses that stop the whole VM (kind `safepoint` or `gc_pause`,
or `at_safepoint` true), grouped into stops as pause_impact's `stop_id` (engine/correlate/stops.py).
Which JVM's stops count for a span: the JVM running inside the span's own process (a JVM
whose `jvm_pid` is the span's `process.pid`: JPype, Jep's host); for a span of a process
without a JVM of its own, or of an unknown process, the stops of every JVM of the session
(the host's): `pause_scope` says which.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.correlate.schema import WHOLE_VM_KINDS
from engine.correlate.stops import at_safepoint_of, jvm_of, stop_ids

FIGURE_COLUMNS = ("pause_ns", "pause_scope", "stop_ids", "stop_causes", "figures_of", "gil_wait_ns",
                  "stop_released_ns", "stop_waiting_ns", "stop_holding_ns", "lost_ns")


@dataclass
class IntervalSet:
    """Sorted disjoint half-open intervals, with the running total of their lengths."""

    starts: np.ndarray
    ends: np.ndarray

    def __post_init__(self):
        self.before = np.r_[0, np.cumsum(self.ends - self.starts)].astype(np.int64)

    @classmethod
    def union(cls, starts, ends) -> "IntervalSet":
        """The union of any intervals [starts, ends) (empty ones dropped)."""
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        if not len(starts):
            return cls(starts, ends)
        reach = np.maximum.accumulate(ends)
        first = np.r_[True, starts[1:] > reach[:-1]]  # a new interval starts past everything before it
        group_end = np.maximum.reduceat(ends, np.flatnonzero(first))
        return cls(starts[first], group_end)

    def covered_before(self, t: np.ndarray) -> np.ndarray:
        """Per time: how much of the set lies before it."""
        t = np.asarray(t, np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        inside = i >= 0
        j = np.where(inside, i, 0)
        partial = np.clip(t - self.starts[j] if len(self.starts) else 0, 0, (self.ends - self.starts)[j] if len(self.starts) else 0)
        return np.where(inside, self.before[np.maximum(i, 0)] + partial, 0)

    def covered(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per [a, b): how much of it the set covers."""
        if not len(self.starts):
            return np.zeros(np.shape(a), np.int64)
        return self.covered_before(b) - self.covered_before(a)

    def intersect(self, other: "IntervalSet") -> "IntervalSet":
        if not len(self.starts) or not len(other.starts):
            return IntervalSet(np.zeros(0, np.int64), np.zeros(0, np.int64))
        lo = np.searchsorted(other.ends, self.starts, side="right")
        hi = np.searchsorted(other.starts, self.ends, side="left")
        count = np.maximum(hi - lo, 0)
        mine = np.repeat(np.arange(len(self.starts)), count)
        theirs = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + np.repeat(lo, count)
        starts = np.maximum(self.starts[mine], other.starts[theirs])
        ends = np.minimum(self.ends[mine], other.ends[theirs])
        keep = ends > starts
        return IntervalSet(starts[keep], ends[keep])


_EMPTY = IntervalSet(np.zeros(0, np.int64), np.zeros(0, np.int64))


def _stops_table(pauses: pd.DataFrame, impact: pd.DataFrame | None) -> pd.DataFrame:
    """One row per stop of the world: stop_id, jvm, start_ns, end_ns (its whole-VM rows' hull), cause text."""
    if not len(pauses):
        return pd.DataFrame({"stop_id": [], "jvm": [], "start_ns": [], "end_ns": [], "cause": []})
    whole = np.isin(pauses["kind"].astype(str).to_numpy(), WHOLE_VM_KINDS) | at_safepoint_of(pauses)
    stop = impact["stop_id"].to_numpy(np.int64) if impact is not None and "stop_id" in impact else stop_ids(pauses)
    rows = pd.DataFrame({"stop_id": stop, "jvm": jvm_of(pauses), "start_ns": pauses["start_ns"].to_numpy(np.int64),
                         "end_ns": pauses["end_ns"].to_numpy(np.int64), "whole": whole,
                         "label": pauses["kind"].astype(str) + ": " + pauses["name"].astype(str),
                         "gc_cause": pauses["cause"].astype("string") if "cause" in pauses else pd.NA,
                         "python": _python_cause(impact, len(pauses))})
    leaders = rows[rows["stop_id"].to_numpy() == pauses["pause_id"].to_numpy(np.int64)].set_index("stop_id")["label"]
    whole_rows = rows[rows["whole"]]
    stops = whole_rows.groupby("stop_id", sort=False).agg(jvm=("jvm", "first"), start_ns=("start_ns", "min"),
                                                         end_ns=("end_ns", "max"),
                                                         gc_cause=("gc_cause", "first"), python=("python", "first"))
    # GC causes and Python requesters may sit on rows of the stop that do not stop the VM (jdk.GarbageCollection).
    extra = rows.groupby("stop_id", sort=False).agg(gc_cause=("gc_cause", "first"), python=("python", "first"))
    stops = stops.reset_index()
    stops["gc_cause"] = stops["gc_cause"].fillna(stops["stop_id"].map(extra["gc_cause"]))
    stops["python"] = stops["python"].fillna(stops["stop_id"].map(extra["python"]))
    label = stops["stop_id"].map(leaders).fillna("stop of the world").astype(str)
    gc_cause = stops["gc_cause"].astype("string")
    label = label.where(gc_cause.isna(), label + " (" + gc_cause.fillna("") + ")")
    python = stops["python"].astype("string")
    stops["cause"] = label.where(python.isna(), label + "; " + python.fillna(""))
    return stops[["stop_id", "jvm", "start_ns", "end_ns", "cause"]].sort_values("start_ns", ignore_index=True)


def _python_cause(impact: pd.DataFrame | None, n: int) -> pd.Series:
    """Per pause: 'caused by Python thread T (name) at function (file:line)[, JPype's GC link]', or NA."""
    if impact is None or "caused_by_python" not in impact or not impact["caused_by_python"].astype("boolean").fillna(False).any():
        return pd.Series(pd.NA, index=range(n), dtype="string")
    caused = impact["caused_by_python"].astype("boolean").fillna(False).to_numpy(bool)
    thread = impact["cause_thread"].astype("string").fillna("")
    function = impact["cause_function"].astype("string")
    where = function + " (" + impact["cause_file"].astype("string").fillna("?") + ":" \
        + impact["cause_line"].astype("string").fillna("?") + ")"
    where = where.where(function.notna(), "<site unknown>")  # (a holder whose next release came long after)
    text = "caused by Python thread " + impact["cause_tid"].astype("string").fillna("?") + " " + thread + " at " + where
    link = impact["jpype_gc_link"].astype("boolean").fillna(False).to_numpy(bool) if "jpype_gc_link" in impact else np.zeros(n, bool)
    text = text.where(~link, text + ", JPype's GC link")
    return text.where(caused, pd.NA).reset_index(drop=True)


_TID_BITS = 23  # Linux pid_max is at most 2^22
_TID_MASK = (1 << _TID_BITS) - 1


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """(pid, tid) as one int64 sorting by pid, then tid; tid -1 (unknown) sorts last of its pid."""
    return (np.asarray(pid, np.int64) << _TID_BITS) | (np.asarray(tid, np.int64) & _TID_MASK)


def _by_thread(key: np.ndarray) -> np.ndarray:
    """A stable order of KEY (thread keys of GIL rows): a radix sort of the rank of each row's
    thread among the few distinct ones (3x a comparison sort of 5 M rows)."""
    codes, distinct = pd.factorize(key)
    if len(distinct) >= 1 << 15:
        return np.argsort(key, kind="stable")
    rank = np.empty(len(distinct), np.int16)
    rank[np.argsort(distinct)] = np.arange(len(distinct), dtype=np.int16)
    return np.argsort(rank[codes], kind="stable")


def pids_from_threads(spans: pd.DataFrame, gil: pd.DataFrame) -> pd.DataFrame:
    """SPANS with `pid` filled where the span has none (a resource without process.pid, as the
    SDK's default) but a thread_id that the GIL rows know in exactly one process: an OS thread
    id names one thread of the host while it lives."""
    pid = spans["pid"].astype("Int64")
    missing = pid.isna().to_numpy() & spans["thread_id"].notna().to_numpy()
    if not missing.any() or not len(gil):
        return spans
    threads = pd.DataFrame({"pid": gil["pid"].to_numpy(np.int64), "tid": gil["tid"].to_numpy(np.int64)}).drop_duplicates()
    unique = threads[~threads["tid"].duplicated(keep=False)].set_index("tid")["pid"]
    found = spans["thread_id"].astype("Int64").map(unique).astype("Int64")
    spans = spans.copy()
    spans["pid"] = pid.where(~missing, found)
    return spans


class SpanFigures:
    """Prepared once from the pauses (few); called on blocks of spans with their GIL rows."""

    def __init__(self, pauses: pd.DataFrame, impact: pd.DataFrame | None = None):
        self.stops = _stops_table(pauses, impact)
        jvm = self.stops["jvm"].to_numpy(np.int64)
        start, end = self.stops["start_ns"].to_numpy(np.int64), self.stops["end_ns"].to_numpy(np.int64)
        self.jvms = set(int(j) for j in np.unique(jvm) if j >= 0)
        self._scope_sets = {j: IntervalSet.union(start[jvm == j], end[jvm == j]) for j in self.jvms}
        self._scope_sets[-1] = IntervalSet.union(start, end)  # the host's: every JVM's stops
        self._longest = int((end - start).max()) if len(start) else 0

    def scope_of(self, pid: np.ndarray) -> np.ndarray:
        """Per span: the jvm_pid whose stops count (its own process's JVM), or -1 (every JVM's)."""
        return np.where(np.isin(pid, list(self.jvms)), pid, -1) if self.jvms else np.full(len(pid), -1, np.int64)

    def __call__(self, spans: pd.DataFrame, gil: pd.DataFrame) -> pd.DataFrame:
        """FIGURE_COLUMNS for SPANS (same index and order), from GIL (at least the rows of the
        spans' processes over their time range)."""
        n = len(spans)
        a, b = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
        pid = spans["pid"].astype("Int64").fillna(-1).to_numpy(np.int64)
        tid = spans["thread_id"].astype("Int64").fillna(-1).to_numpy(np.int64)
        scope = self.scope_of(pid)
        out = {
            "pause_ns": np.zeros(n, np.int64),
            "gil_wait_ns": np.zeros(n, np.int64), "stop_released_ns": np.zeros(n, np.int64),
            "stop_waiting_ns": np.zeros(n, np.int64), "stop_holding_ns": np.zeros(n, np.int64),
        }
        known = {"gil_wait_ns": np.zeros(n, bool), "thread": np.zeros(n, bool)}
        for j in np.unique(scope):
            mine = scope == j
            out["pause_ns"][mine] = self._scope_sets[int(j)].covered(a[mine], b[mine])
        stop_lists = self._stop_lists(a, b, scope)

        # The GIL rows sorted by thread: a thread's rows, and a process's, are one slice.
        gil_key = _thread_key(gil["pid"].to_numpy(np.int64), gil["tid"].to_numpy(np.int64))
        order = _by_thread(gil_key)
        gil_key = gil_key[order]
        waiting = (gil["state"] == "waiting").to_numpy(bool)[order]
        released = (gil["state"] == "released").to_numpy(bool)[order]
        g_start, g_end = gil["start_ns"].to_numpy(np.int64)[order], gil["end_ns"].to_numpy(np.int64)[order]
        span_key = _thread_key(pid, tid)
        by_thread = (tid >= 0) & np.isin(span_key, gil_key)
        by_process = ~by_thread & (pid >= 0) & np.isin(pid, gil_key >> _TID_BITS)
        known["gil_wait_ns"] = by_thread | by_process
        known["thread"] = by_thread

        # One pass per thread (spans of a thread) and per process (spans without a known thread).
        keys = np.where(by_thread, span_key, _thread_key(pid, np.full(n, -1)))
        groups = pd.DataFrame({"key": keys, "scope": scope})[by_thread | by_process]
        for (key, j), index in groups.groupby(["key", "scope"], sort=False).indices.items():
            rows = groups.index.to_numpy()[index]
            stops = self._scope_sets[int(j)]
            whole_process = (key & _TID_MASK) == _TID_MASK
            first, last = (np.searchsorted(gil_key, (key >> _TID_BITS) << _TID_BITS), np.searchsorted(gil_key, key, "right")) \
                if whole_process else (np.searchsorted(gil_key, key), np.searchsorted(gil_key, key, "right"))
            mine = slice(first, last)
            waits = IntervalSet.union(g_start[mine][waiting[mine]], g_end[mine][waiting[mine]])
            out["gil_wait_ns"][rows] = waits.covered(a[rows], b[rows])
            out["stop_waiting_ns"][rows] = waits.intersect(stops).covered(a[rows], b[rows])
            if not whole_process:
                releases = IntervalSet.union(g_start[mine][released[mine]], g_end[mine][released[mine]])
                out["stop_released_ns"][rows] = releases.intersect(stops).covered(a[rows], b[rows])
        out["stop_holding_ns"] = out["pause_ns"] - out["stop_released_ns"] - out["stop_waiting_ns"]
        lost = out["pause_ns"] + out["gil_wait_ns"] - out["stop_waiting_ns"]
        frame = pd.DataFrame(index=spans.index)
        frame["pause_ns"] = out["pause_ns"]
        frame["pause_scope"] = pd.Categorical.from_codes((scope < 0).astype(np.int8), ["process", "host"])
        frame["stop_ids"] = pd.Series(stop_lists[0], index=spans.index)
        frame["stop_causes"] = pd.Series(stop_lists[1], index=spans.index)
        frame["figures_of"] = pd.Categorical.from_codes(np.where(by_thread, 0, np.where(by_process, 1, 2)).astype(np.int8),
                                                        ["thread", "process", "none"])
        for column, mask in (("gil_wait_ns", known["gil_wait_ns"]), ("stop_waiting_ns", known["gil_wait_ns"]),
                             ("stop_released_ns", known["thread"]), ("stop_holding_ns", known["thread"])):
            frame[column] = pd.Series(out[column], index=spans.index, dtype="Int64").where(mask)
        frame["lost_ns"] = lost
        return frame[list(FIGURE_COLUMNS)]

    def stop_overlaps(self, spans: pd.DataFrame) -> pd.DataFrame:
        """One row per (span, stop of the world overlapping it, in scope): span (its row number
        in SPANS), stop_id, cause, overlap_ns."""
        a, b = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
        scope = self.scope_of(spans["pid"].astype("Int64").fillna(-1).to_numpy(np.int64))
        span, stop = self._pairs(a, b, scope)
        overlap = np.minimum(b[span], self.stops["end_ns"].to_numpy(np.int64)[stop]) \
            - np.maximum(a[span], self.stops["start_ns"].to_numpy(np.int64)[stop])
        return pd.DataFrame({"span": span, "stop_id": self.stops["stop_id"].to_numpy(np.int64)[stop],
                             "cause": self.stops["cause"].to_numpy(object)[stop], "overlap_ns": overlap})

    def _pairs(self, a: np.ndarray, b: np.ndarray, scope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(span row, stop row) of every stop in scope overlapping a span, by span, then stop start."""
        stop_start = self.stops["start_ns"].to_numpy(np.int64)
        stop_end = self.stops["end_ns"].to_numpy(np.int64)
        stop_jvm = self.stops["jvm"].to_numpy(np.int64)
        lo = np.searchsorted(stop_start, a - self._longest, side="left")
        hi = np.searchsorted(stop_start, b, side="left")
        count = np.maximum(hi - lo, 0)
        span = np.repeat(np.arange(len(a)), count)
        candidate = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + np.repeat(lo, count)
        hit = (stop_end[candidate] > a[span]) & (stop_start[candidate] < b[span])
        hit &= (scope[span] < 0) | (stop_jvm[candidate] == scope[span])
        return span[hit], candidate[hit]

    def _stop_lists(self, a: np.ndarray, b: np.ndarray, scope: np.ndarray) -> tuple[list, list]:
        """Per span: the stop ids overlapping it (in scope) and their cause texts, as lists."""
        n = len(a)
        ids, causes = self.stops["stop_id"].to_numpy(np.int64), self.stops["cause"].astype(str).to_numpy(object)
        span, candidate = self._pairs(a, b, scope)
        offsets = np.r_[0, np.cumsum(np.bincount(span, minlength=n))].astype(np.int32)
        id_lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[candidate], pa.int64()))
        cause_lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(causes[candidate], pa.string()))
        return pd.arrays.ArrowExtensionArray(id_lists), pd.arrays.ArrowExtensionArray(cause_lists)
