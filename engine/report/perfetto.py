"""Both runtimes on one timeline for ui.perfetto.dev: the results of `tandem analyze` (or the
parts of `tandem live`) as Perfetto's native protobuf trace (default) or Chrome trace-event
JSON (`--format json`, the legacy format). docs/perfetto.md has the layout and the sizes.

Layout, all on CLOCK_MONOTONIC:
- one process per JVM, with a track per pause family: safepoints (each with its
  time-to-safepoint and its VM operation inside), GC pauses, whole GC collections, VM
  operations without a safepoint, JIT compilation, deoptimization. Slices that overlap
  without nesting (concurrent collections) are spread over extra lanes of that family;
- one process per Python interpreter, with a track per thread showing `released` and
  `waiting` slices named by the Python code the thread gave the GIL up in
  (`released: fetch (db.py:88)`), `held` in between; where a JVM pause overlaps a released or
  waiting interval, a slice `JVM pause: <name>` sits inside it, linked by a flow arrow from
  the pause; a stop of the world a Python thread asked for (pause_impact's causes) has a flow
  arrow from that thread's slice at the request to the stop's pause;
- under each process memory.parquet has (docs/results.md), its memory series as counter
  tracks in bytes (engine.memory.series: RSS, its split into buckets, each runtime's figures).
- with spans (OUT/spans.parquet of `tandem analyze --spans`, or the parts' of `tandem live
  --otlp-receiver`): a span is a slice on a track just above its thread's (spans nest there
  as they nest in time; one crossing another goes to a second track), a span whose thread is
  not a Python thread of the trace on a spans track of its process.

Streaming: the pauses are read whole (tens of bytes a pause); GIL intervals and overlaps are
read batch by batch and spilled to one file per Python thread next to the output, then drawn
one thread at a time, so memory is bounded by the busiest thread's rows, not the session's.
Both formats are written from the same tracks and slices (`_Slices`); each track's slices come
in time order, parents before their children.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from engine.correlate.schema import GIL_CARRIED_COLUMNS
from engine.correlate.stops import caused_stops
from engine.errors import TandemError
from engine.memory import MEMORY_TABLE
from engine.memory.series import process_series
from engine.results import Results, worst_window


# Pause families in the order their tracks appear under a JVM process.
JVM_TRACKS = {
    "safepoint": "safepoints",
    "gc_pause": "GC pauses",
    "gc": "GC collections",
    "vm_operation": "VM operations (no safepoint)",
    "compilation": "JIT compilation",
    "deoptimization": "deoptimization",
}
FORMATS = ("proto", "json")
WORST = "worst"  # export_perfetto's window: the worst pause with its surroundings
_LANE_STRIDE = 100  # JSON tids of a JVM's tracks: family index * stride + lane + 1
_UNKNOWN_JVM_PID = 0  # pauses brought from elsewhere without jvm_pid
_MEMORY_RANK = -1000  # counter tracks' sibling_order_rank: above a process's pause and thread tracks
STATES = ("released", "waiting", "held")  # codes 0, 1, 2 in the spill files
CODE_COLUMNS = GIL_CARRIED_COLUMNS  # the Python code of a GIL interval (docs/results.md)
_STATE_COLOR = {"released": "grey", "waiting": "bad", "held": "good"}
_PAUSE_ARGS = ("pause_id", "kind", "duration_ns", "cause", "gc_id", "safepoint_id", "unmatched", "os_thread_id")
_SPAN_ARGS = ("trace_id", "span_id", "endpoint", "duration_ns", "pause_ns", "gil_wait_ns", "lost_ns", "clock_error_ns")
_ARG_NAMES = (*_PAUSE_ARGS, "pause_ids", "state", *(a for a in _SPAN_ARGS if a not in _PAUSE_ARGS))
# JSON tids of spans tracks: above any OS thread id (pid_max is at most 2^22), a thread's plus this per lane.
_SPAN_TID_BASE = 1 << 23
_ARG_IID = {name: iid for iid, name in enumerate(_ARG_NAMES, 1)}


@dataclass
class _Track:
    uuid: int
    pid: int
    tid: int  # JSON tid: the OS thread id for Python, a synthetic one per JVM track
    name: str
    thread: bool  # a Python thread (Perfetto thread track), else a named track of a JVM
    rank: int = 0


@dataclass
class _Slices:
    """One track's slices, columnar, in drawing order (start, longer first, parents first)."""
    start: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    name: np.ndarray  # index into names
    names: list[str]
    cat: str | list[str]  # one category for all, or per name
    color: dict[str, str] = field(default_factory=dict)  # per name
    args: dict[int, dict] = field(default_factory=dict)  # slice index -> debug arguments
    flows_out: dict[int, list[int]] = field(default_factory=dict)  # slice index -> flow ids starting there
    flows_in: dict[int, list[tuple[int, _Track, int, int]]] = field(default_factory=dict)  # -> (flow id, from track, at ns, pause id)
    gil_rows: int = 0  # released and waiting slices among them (progress)

    def category(self, name_index: int) -> str:
        return self.cat if isinstance(self.cat, str) else self.cat[name_index]


# ---- input -------------------------------------------------------------------------------------


def _code_label(function, file, line) -> str | None:
    """`function (file.py:line)`: how a GIL slice names the Python code it gave the GIL up in."""
    if function is None or function is pd.NA or (isinstance(function, float) and np.isnan(function)):
        return None
    if file is None or file is pd.NA or (isinstance(file, float) and np.isnan(file)) or not str(file):
        return str(function)
    where = os.path.basename(str(file))
    if line is not None and line is not pd.NA and not (isinstance(line, float) and np.isnan(line)):
        where += f":{int(line)}"
    return f"{function} ({where})"


def _ints(batch, name: str) -> np.ndarray:
    return batch.column(name).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _state_codes(batch) -> np.ndarray:
    import pyarrow.compute as pc

    states = batch.column("state").cast("string")
    return pc.equal(states, "waiting").to_numpy(zero_copy_only=False).astype(np.int64)


def _in_window(start: np.ndarray, end: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """Rows reaching into [window start, window end] (a slice crossing an edge is drawn whole)."""
    return (end >= window[0]) & (start <= window[1])


def _window(results: Results, window) -> tuple[int, int] | None:
    """WINDOW on CLOCK_MONOTONIC: WORST (the worst pause with its surroundings:
    engine.results.worst_window), or (FROM, TO) offsets in ns from the start of the results'
    span (a negative one from its end; None: that edge of the span); None: everything."""
    import pyarrow.compute as pc

    if window is None:
        return None
    facts = results.facts()
    span = (facts.span_start_ns, facts.span_end_ns)
    if span[1] <= span[0]:  # (no analysis header: live parts) the span the tables cover
        ends = [(int(pc.min(b.column("start_ns")).as_py()), int(pc.max(b.column("end_ns")).as_py()))
                for table in ("gil", "pauses") for b in results.batches(table, ("start_ns", "end_ns")) if b.num_rows]
        span = (min(lo for lo, _ in ends), max(hi for _, hi in ends)) if ends else span
    if window == WORST:
        return worst_window(results.table("pause_impact"), span)
    edges = [span[i] if offset is None else (span[1] if offset < 0 else span[0]) + offset for i, offset in enumerate(window)]
    length = f"the results span {(span[1] - span[0]) / 1e9:.1f} s"
    if edges[1] <= edges[0] and None not in window:
        raise TandemError(f"--window: it ends before it starts ({length})")
    if edges[0] >= span[1] or edges[1] <= span[0] or edges[1] <= edges[0]:
        raise TandemError(f"--window: outside the results ({length})")
    return edges[0], edges[1]


def gil_rows(results: Results) -> int:
    """The results' GIL intervals: their files' footers, else (results naming the GIL files they
    were analyzed from) the header's count."""
    return results.rows("gil") or results.facts().gil_intervals


def _read_pauses(results: Results) -> pd.DataFrame:
    return results.table("pauses")


def _read_memory(results: Results) -> pd.DataFrame:
    """memory.parquet (`tandem analyze`) or its live parts; empty when there is none (no memory capture)."""
    memory = results.table(MEMORY_TABLE.removesuffix(".parquet"))
    return memory if len(memory) else pd.DataFrame({"t_ns": pd.Series([], dtype="int64"), "pid": pd.Series([], dtype="int64")})


def _read_spans(results: Results) -> pd.DataFrame:
    """The spans drawn (spans.parquet, docs/spans.md): none when RESULTS has none."""
    spans = results.table("spans")
    return spans if len(spans) else pd.DataFrame({"pid": [], "thread_id": [], "start_ns": [], "end_ns": []})


class _ThreadSpill:
    """GIL intervals and overlaps of each Python thread, one pass over each table, in files of
    int64 records per thread (a thread's rows never all sit in memory with another's)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.threads: dict[tuple[int, int], int] = {}
        self.names: dict[tuple[int, int], str] = {}
        self.rows = 0
        self.last_start: dict[tuple[int, int], int] = {}
        self.unsorted: set[tuple[int, int]] = set()  # threads whose GIL rows did not come in start order
        self.codes: dict[str, int] = {}  # the label of each Python code a GIL row names -> its code in the spill

    def _file(self, kind: str, key: tuple[int, int]) -> Path:
        index = self.threads.setdefault(key, len(self.threads))
        return self.dir / f"{kind}-{index}.bin"

    def _append(self, kind: str, pid: np.ndarray, tid: np.ndarray, records: np.ndarray) -> None:
        if not len(pid):
            return
        order = np.lexsort((tid, pid))
        pid, tid, records = pid[order], tid[order], records[order]
        cuts = np.flatnonzero((pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(pid)]):
            key = (int(pid[lo]), int(tid[lo]))
            with open(self._file(kind, key), "ab") as out:
                records[lo:hi].tofile(out)  # (lexsort is stable: a thread's rows keep their order)
            if kind == "gil":
                starts = records[lo:hi, 0]
                if starts[0] < self.last_start.get(key, starts[0]) or (np.diff(starts) < 0).any():
                    self.unsorted.add(key)
                self.last_start[key] = max(self.last_start.get(key, starts[0]), int(starts.max()))

    def add_gil(self, results: Results, progress: Callable[[int], None], window: tuple[int, int] | None = None) -> None:
        """The GIL rows (of WINDOW only: those reaching into [start, end])."""
        for batch in results.batches("gil", ("pid", "tid", "state", "start_ns", "end_ns", "thread_name", *CODE_COLUMNS)):
            progress(batch.num_rows)
            if window is not None:
                batch = batch.filter(_in_window(_ints(batch, "start_ns"), _ints(batch, "end_ns"), window))
                if not batch.num_rows:
                    continue
            pid, tid = _ints(batch, "pid"), _ints(batch, "tid")
            if "thread_name" in batch.schema.names:
                self._learn_names(pid, tid, batch.column("thread_name"))
            records = np.column_stack([_ints(batch, "start_ns"), _ints(batch, "end_ns"), _state_codes(batch),
                                       self._code_of_rows(batch)])
            self._append("gil", pid, tid, records)
            self.rows += len(pid)

    def _code_of_rows(self, batch) -> np.ndarray:
        """Per GIL row, the code of its Python code's label (`_code_label`), -1 when not recorded.
        Each distinct (function, file, line) of the batch is labelled once."""
        import pyarrow as pa
        import pyarrow.compute as pc

        present = [c for c in CODE_COLUMNS if c in batch.schema.names]
        if "function" not in present or not batch.num_rows:
            return np.full(batch.num_rows, -1, np.int64)
        key = np.zeros(batch.num_rows, np.int64)
        values = []
        for name in present:
            column = batch.column(name)
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            encoded = pc.dictionary_encode(column, null_encoding="encode")
            indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            key = key * (len(encoded.dictionary) + 1) + indices
            values.append((encoded.dictionary.to_pylist(), indices))
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        codes = np.empty(first.size, np.int64)
        for k, row in enumerate(first.tolist()):
            fields = {name: dictionary[indices[row]] for name, (dictionary, indices) in zip(present, values)}
            label = _code_label(fields.get("function"), fields.get("file"), fields.get("line"))
            codes[k] = -1 if label is None else self.codes.setdefault(label, len(self.codes))
        return codes[inverse.reshape(-1)]

    def _learn_names(self, pid: np.ndarray, tid: np.ndarray, names) -> None:
        import pyarrow.compute as pc

        valid = pc.is_valid(names).to_numpy(zero_copy_only=False)
        if not valid.any():
            return
        keys = pid[valid] << 32 | tid[valid]
        rows = np.flatnonzero(valid)[~pd.Series(keys).duplicated().to_numpy()]  # (each thread's first named row: a hash, not a sort)
        for key, row in zip((pid[rows] << 32 | tid[rows]).tolist(), rows.tolist()):
            self.names.setdefault((key >> 32, key & 0xFFFFFFFF), str(names[row]))

    def add_overlaps(self, results: Results, window: tuple[int, int] | None = None) -> None:
        for batch in results.batches("overlaps", ("pause_id", "pid", "tid", "state", "start_ns", "end_ns", "near_miss")):
            start, end = _ints(batch, "start_ns"), _ints(batch, "end_ns")
            hit = end > start
            if window is not None:
                hit &= _in_window(start, end, window)
            if "near_miss" in batch.schema.names:
                hit &= ~batch.column("near_miss").to_numpy(zero_copy_only=False).astype(bool)
            records = np.column_stack([start, end, _state_codes(batch), _ints(batch, "pause_id")])[hit]
            self._append("overlaps", _ints(batch, "pid")[hit], _ints(batch, "tid")[hit], records)

    def gil_chunks(self, key: tuple[int, int]) -> Iterator[np.ndarray]:
        """A thread's GIL rows in start order, _CHUNK_ROWS at a time: read a chunk at a time when
        they came in start order (`tandem analyze` and `tandem live` write them so), else
        loaded whole and sorted."""
        path = self.dir / f"gil-{self.threads[key]}.bin"
        if not path.exists():
            return
        if key in self.unsorted:
            rows = self.load("gil", key, 4)
            rows = rows[np.lexsort((-rows[:, 1], rows[:, 0]))]
            for at in range(0, len(rows), _CHUNK_ROWS):
                yield rows[at:at + _CHUNK_ROWS]
            return
        with open(path, "rb") as spilled:
            while (rows := np.fromfile(spilled, np.int64, count=4 * _CHUNK_ROWS)).size:
                yield rows.reshape(-1, 4)

    def load(self, kind: str, key: tuple[int, int], width: int) -> np.ndarray:
        path = self.dir / f"{kind}-{self.threads[key]}.bin"
        return np.fromfile(path, np.int64).reshape(-1, width) if path.exists() else np.zeros((0, width), np.int64)


# ---- what is drawn -----------------------------------------------------------------------------


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane per interval (sorted by start) so that no two intervals of a lane overlap."""
    lane_ends: list[int] = []
    lanes = np.zeros(len(starts), np.int64)
    for i, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        for lane, lane_end in enumerate(lane_ends):
            if lane_end <= start:
                lane_ends[lane] = end
                lanes[i] = lane
                break
        else:
            lanes[i] = len(lane_ends)
            lane_ends.append(end)
    return lanes


def _plain(value):
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def _jvm_tracks(pauses: pd.DataFrame, next_uuid: Callable[[], int]) -> list[tuple[_Track, pd.DataFrame]]:
    """A track per (JVM, pause family, lane) with the pauses drawn on it, sorted by start."""
    out = []
    if pauses.empty:
        return out
    jvm_pid = pauses["jvm_pid"] if "jvm_pid" in pauses else pd.Series(_UNKNOWN_JVM_PID, index=pauses.index)
    pauses = pauses.assign(_pid=jvm_pid.fillna(_UNKNOWN_JVM_PID).astype(np.int64), kind=pauses["kind"].astype(str))
    for pid, of_jvm in pauses.groupby("_pid", sort=True):
        kinds = list(JVM_TRACKS) + sorted(set(of_jvm["kind"]) - set(JVM_TRACKS))
        for family, kind in enumerate(kinds):
            rows = of_jvm[of_jvm["kind"] == kind].sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
            if rows.empty:
                continue
            lanes = _lanes(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
            label = JVM_TRACKS.get(kind, kind)
            for lane in range(int(lanes.max()) + 1):
                tid = family * _LANE_STRIDE + lane + 1
                track = _Track(next_uuid(), int(pid), tid, label if lane == 0 else f"{label} ({lane + 1})", thread=False, rank=tid)
                out.append((track, rows[lanes == lane]))
    return out


def _pause_slices(rows: pd.DataFrame, flows: tuple[np.ndarray, np.ndarray],
                  causes: dict[int, list[tuple[int, _Track, int, int]]]) -> _Slices:
    """A lane's pauses; a safepoint gets its time to safepoint and its operation inside.
    causes: per pause_id, the flows from the Python slice that asked for it."""
    starts, ends, depths, names = [], [], [], []
    index: dict[str, int] = {}
    args, flows_out, flows_in = {}, {}, {}
    for row in rows.to_dict("records"):
        name, operation, kind = str(row["name"]), _plain(row.get("operation")), row["kind"]
        title = f"{name}: {operation}" if kind == "safepoint" and isinstance(operation, str) and operation != name else name
        start, end = int(row["start_ns"]), int(row["end_ns"])
        at = len(starts)
        starts.append(start), ends.append(end), depths.append(0), names.append(index.setdefault(title, len(index)))
        args[at] = {k: v for k in _PAUSE_ARGS if (v := _plain(row.get(k, end - start if k == "duration_ns" else None))) is not None}
        args[at]["duration_ns"] = end - start
        lo, hi = np.searchsorted(flows[0], int(row["pause_id"]), "left"), np.searchsorted(flows[0], int(row["pause_id"]), "right")
        if hi > lo:
            flows_out[at] = flows[1][lo:hi].tolist()
        if int(row["pause_id"]) in causes:
            flows_in[at] = causes[int(row["pause_id"])]
        ttsp = _plain(row.get("time_to_safepoint_ns"))
        if kind == "safepoint" and ttsp is not None and 0 < int(ttsp) <= end - start:
            # Reaching the safepoint (jdk.SafepointBegin), then the operation with the world stopped.
            sync_end = start + int(ttsp)
            for a, b, label in ((start, sync_end, "synchronize (time to safepoint)"),
                                (sync_end, end, operation if isinstance(operation, str) else "operation")):
                if b > a or label.startswith("synchronize"):
                    starts.append(a), ends.append(b), depths.append(1), names.append(index.setdefault(label, len(index)))
    color = {title: "terrible" for title in index} if rows["kind"].iloc[0] in ("safepoint", "gc_pause") else {}
    return _Slices(np.array(starts, np.int64), np.array(ends, np.int64), np.array(depths, np.int8), np.array(names, np.int32),
                   list(index), "jvm", color, args, flows_out, flows_in)


def _span_nesting(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, lane, depth) of spans: ORDER sorts them by start, longer first; in that order,
    each goes to the first lane where it nests in (or follows) what is open there, at the depth it
    nests at: a lane's slices nest properly."""
    order = np.lexsort((-end, start))
    lane = np.zeros(len(start), np.int64)
    depth = np.zeros(len(start), np.int64)
    stacks: list[list[int]] = []  # per lane: the ends of the spans open there
    for at, (a, b) in enumerate(zip(start[order].tolist(), end[order].tolist())):
        for k, stack in enumerate([*stacks, None]):
            if stack is None:
                stacks.append(stack := [])
            while stack and stack[-1] <= a:
                stack.pop()
            if not stack or b <= stack[-1]:
                lane[at], depth[at] = k, len(stack)
                stack.append(b)
                break
    return order, lane, depth


def _span_tracks(spans: pd.DataFrame, owners: dict[tuple[int, int], "_Track"], next_uuid: Callable[[], int]
                 ) -> list[tuple[_Track, _Slices]]:
    """A track per (thread, lane) of the spans of a Python thread in OWNERS (its track), and per
    (process, lane) of the others, with their slices."""
    if not len(spans):
        return []
    pid = spans["pid"].astype("Int64").fillna(_UNKNOWN_JVM_PID).to_numpy(np.int64)
    tid = spans["thread_id"].astype("Int64").fillna(-1).to_numpy(np.int64)
    on_thread = np.array([(p, t) in owners for p, t in zip(pid.tolist(), tid.tolist())], bool)
    tid = np.where(on_thread, tid, 0)  # 0: the process's spans track
    out = []
    for (p, t), index in pd.DataFrame({"pid": pid, "tid": tid}).groupby(["pid", "tid"], sort=True).indices.items():
        rows = spans.iloc[index]
        start, end = rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)
        order, lane, depth = _span_nesting(start, end)
        owner = owners.get((int(p), int(t)))
        label = f"spans: {owner.name}" if owner is not None else "spans (no Python thread)"
        records = rows.iloc[order].to_dict("records")
        for k in range(int(lane.max()) + 1):
            mine = np.flatnonzero(lane == k)
            track = _Track(next_uuid(), int(p), _SPAN_TID_BASE * (k + 1) + int(t), label if k == 0 else f"{label} ({k + 1})",
                           thread=False, rank=owner.rank - 1 if owner is not None else k)
            names: dict[str, int] = {}
            name = [names.setdefault(str(records[i]["name"]), len(names)) for i in mine.tolist()]
            args = {n: {a: v for a in _SPAN_ARGS if (v := _plain(records[i].get(a))) is not None} for n, i in enumerate(mine.tolist())}
            out.append((track, _Slices(start[order][mine], end[order][mine], depth[mine].astype(np.int8),
                                       np.array(name, np.int32), list(names), "span", {}, args)))
    return out


@dataclass
class _Marks:
    """A thread's overlaps (rows: start, end, state, pause_id) merged where they overlap each
    other, one mark per merged stretch of one state; marks sorted by start.

    Pauses nest and overlap (a GC pause inside its safepoint, inside its collection), so
    their overlaps with one GIL interval would cross each other on the thread's track;
    one mark per merged stretch keeps the track properly nested. Touching stretches stay
    apart: a released interval ends exactly where the thread's waiting interval starts.
    A row's flow id is flow_base + its index here (0: its pause is not drawn)."""
    rows: np.ndarray
    flow: np.ndarray
    first: np.ndarray  # per mark: its rows are rows[first[k]:last[k]]
    last: np.ndarray
    start: np.ndarray
    end: np.ndarray
    state: np.ndarray


def _overlap_marks(overlaps: np.ndarray, placed_ids: np.ndarray, flow_base: int) -> _Marks:
    rows = overlaps[np.lexsort((overlaps[:, 0], overlaps[:, 2]))]
    starts, ends, states = rows[:, 0], rows[:, 1], rows[:, 2]
    new = np.zeros(len(rows), bool)
    for state in np.unique(states).tolist():  # each state's rows are contiguous, sorted by start
        at = np.flatnonzero(states == state)
        reach = np.maximum.accumulate(ends[at])
        new[at[0]] = True
        new[at[1:]] = starts[at[1:]] >= reach[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(rows)]
    mark_end = np.maximum.reduceat(ends, first) if len(first) else ends[:0]
    placed = np.isin(rows[:, 3], placed_ids)
    flow = np.where(placed, flow_base + np.arange(len(rows)), 0)
    order = np.argsort(starts[first], kind="stable")
    return _Marks(rows, flow, first[order], last[order], starts[first][order], mark_end[order], states[first][order])


def _held(intervals: np.ndarray) -> np.ndarray:
    """Gaps between a thread's (sorted, non-overlapping) released/waiting intervals."""
    if not len(intervals):
        return np.zeros((0, 2), np.int64)
    gap = intervals[1:, 0] > intervals[:-1, 1]
    return np.column_stack([intervals[:-1, 1][gap], intervals[1:, 0][gap]])


_CHUNK_ROWS = 1 << 17  # a thread's slices are drawn this many states at a time


def _states(chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """(start, end, state code, Python code) rows of a thread in start order, chunk by chunk:
    empty ones dropped, a state starting inside an earlier one (bad input) cut so the track
    nests, and the gaps between states (state 2, held; Python code -1)."""
    reach = None  # the end of the last state so far
    for gil in chunks:
        gil = gil[gil[:, 1] > gil[:, 0]]
        if not len(gil):
            continue
        gil = gil[np.lexsort((-gil[:, 1], gil[:, 0]))]
        ends = np.maximum.accumulate(gil[:, 1])
        gil[:, 0] = np.maximum(gil[:, 0], np.r_[gil[0, 0] if reach is None else reach, ends[:-1]])
        gil = gil[gil[:, 1] > gil[:, 0]]
        if not len(gil):
            continue
        rows = gil[:, :4]
        gaps = _held(rows)
        if reach is not None and rows[0, 0] > reach:
            gaps = np.r_[[[reach, rows[0, 0]]], gaps]
        gaps = gaps.reshape(-1, 2)
        rows = np.concatenate([rows, np.column_stack([gaps, np.full(len(gaps), 2, np.int64), np.full(len(gaps), -1, np.int64)])])
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        reach = int(gil[-1, 1])
        yield rows


def _thread_chunks(chunks: Iterator[np.ndarray], marks: _Marks, pause_names: dict[int, str], placed: dict[int, _Track],
                   labels: list[str], causes: tuple[np.ndarray, np.ndarray]) -> Iterator[_Slices]:
    """A thread's states (and held gaps), with its overlap marks inside, a chunk at a time. A
    mark lies inside a state, so it belongs to the chunk up to the next chunk's first start.
    causes: (times, flow ids) of the stops this thread asked for, sorted by time."""
    pending, k0 = np.zeros((0, 4), np.int64), 0
    for rows in _states(chunks):
        if len(pending):
            k1 = int(np.searchsorted(marks.start, rows[0, 0], "left"))
            yield _chunk_slices(pending, marks, range(k0, k1), pause_names, placed, labels, causes)
            k0 = k1
        pending = rows
    if len(pending) or k0 < len(marks.start):
        yield _chunk_slices(pending, marks, range(k0, len(marks.start)), pause_names, placed, labels, causes)


def _containing(states: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per time, the index of the state row (sorted, non-overlapping) holding it, else -1."""
    at = np.searchsorted(states[:, 0], times, "right") - 1
    ok = at >= 0
    ok[ok] = states[at[ok], 1] > times[ok]
    return np.where(ok, at, -1)


def _state_names(states: np.ndarray, labels: list[str]) -> tuple[np.ndarray, list[str]]:
    """Per state row its name index, and the names: `held`, or the state and the Python code it
    gave the GIL up in (`released: fetch (db.py:88)`), or the state alone when not recorded."""
    keys = states[:, 3] * len(STATES) + states[:, 2]  # (code, state) pairs; code -1 gives negative keys
    inverse, unique = pd.factorize(keys, sort=True)
    names = []
    for key in unique.tolist():
        code, state = divmod(key, len(STATES))
        name = STATES[state]
        names.append(f"{name}: {labels[code]}" if code >= 0 and state != 2 else name)
    return inverse.astype(np.int64), names


def _chunk_slices(states: np.ndarray, marks: _Marks, chosen: range, pause_names: dict[int, str],
                  placed: dict[int, _Track], labels: list[str], causes: tuple[np.ndarray, np.ndarray]) -> _Slices:
    state_name, names = _state_names(states, labels)
    colors = {name: _STATE_COLOR[name.split(":", 1)[0]] for name in names}
    index = {name: i for i, name in enumerate(names)}
    first_mark = len(names)
    flows_out: dict = {}
    if len(causes[0]) and len(states):
        host = _containing(states, causes[0])
        for row, flow in zip(host.tolist(), causes[1].tolist()):
            if row >= 0:
                flows_out.setdefault(row, []).append(flow)
    states = np.column_stack([states[:, 0], states[:, 1], state_name])
    mark_rows = np.zeros((len(chosen), 3), np.int64)
    flows_in: dict = {}
    args: dict = {}
    for i, k in enumerate(chosen):
        rows = marks.rows[marks.first[k]:marks.last[k]]
        ids = rows[:, 3].tolist()
        title = "JVM pause: " + " + ".join(dict.fromkeys(pause_names.get(p, "pause") for p in ids))
        if title not in index:
            index[title] = len(names)
            names.append(title)
        mark_rows[i] = (marks.start[k], marks.end[k], index[title])
        flows = marks.flow[marks.first[k]:marks.last[k]].tolist()
        flows_in[i] = [(f, placed[p], at, p) for f, p, at in zip(flows, ids, rows[:, 0].tolist()) if f]
        args[i] = {"pause_ids": ids, "state": STATES[int(marks.state[k])]}
    rows = np.concatenate([states, mark_rows])
    depth = np.r_[np.zeros(len(states), np.int8), np.ones(len(mark_rows), np.int8)]
    order = np.lexsort((depth, -rows[:, 1], rows[:, 0]))
    # Mark arguments and flows are keyed by their position in the drawing order.
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    flows_in = {int(position[len(states) + i]): v for i, v in flows_in.items()}
    args = {int(position[len(states) + i]): v for i, v in args.items()}
    flows_out = {int(position[i]): v for i, v in flows_out.items()}
    cats = ["gil"] * first_mark + ["overlap"] * (len(names) - first_mark)
    color = {**colors, **{n: "terrible" for n in names[first_mark:]}}
    gil_rows = int(np.isin(state_name, [i for i, n in enumerate(names[:first_mark]) if n != "held"]).sum())
    return _Slices(rows[order, 0], rows[order, 1], depth[order], rows[order, 2].astype(np.int32), names, cats, color, args,
                   flows_out=flows_out, flows_in=flows_in, gil_rows=gil_rows)


# ---- writers -----------------------------------------------------------------------------------


def _us(ns) -> str:
    return f"{int(ns) / 1000.0:.3f}"


class _JsonWriter:
    """Chrome trace-event JSON: complete events (`ph: X`), so begin/end balance by construction."""

    def __init__(self, out, metadata: dict):
        self.out = out
        self.metadata = metadata
        self.first = True
        out.write('{"displayTimeUnit":"ns","traceEvents":[')

    def _event(self, event: dict | str) -> None:
        self.out.write(("" if self.first else ",\n") + (event if isinstance(event, str) else json.dumps(event, separators=(",", ":"), default=str)))
        self.first = False

    def process(self, uuid: int, pid: int, name: str, rank: int) -> None:
        self._event({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        self._event({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": rank}})

    def track(self, track: _Track, parent: int) -> None:
        self._event({"name": "thread_name", "ph": "M", "pid": track.pid, "tid": track.tid, "args": {"name": track.name}})
        if not track.thread:
            self._event({"name": "thread_sort_index", "ph": "M", "pid": track.pid, "tid": track.tid, "args": {"sort_index": track.rank}})

    def slices(self, track: _Track, s: _Slices) -> None:
        prefix = f'"ph":"X","pid":{track.pid},"tid":{track.tid}'
        plain = [json.dumps(n) for n in s.names]
        cats = [json.dumps(s.category(i)) for i in range(len(s.names))]
        colors = [f',"cname":"{s.color[n]}"' if n in s.color else "" for n in s.names]
        for i, (start, end, name) in enumerate(zip(s.start.tolist(), s.end.tolist(), s.name.tolist())):
            extra = f',"args":{json.dumps(s.args[i], separators=(",", ":"), default=str)}' if i in s.args else ""
            self._event(f'{{"name":{plain[name]},"cat":{cats[name]},{prefix},"ts":{_us(start)},"dur":{_us(end - start)}{colors[name]}{extra}}}')
            for flow_id, source, at, _ in s.flows_in.get(i, ()):
                what = "Python asks for this pause" if source.thread else "pause hits Python"
                flow = f'"name":"{what}","cat":"overlap","id":{flow_id},"ts":{_us(at)}'
                self._event(f'{{{flow},"ph":"s","pid":{source.pid},"tid":{source.tid}}}')
                self._event(f'{{{flow},"ph":"f","bp":"e","pid":{track.pid},"tid":{track.tid}}}')

    def counter(self, track: _Track, parent: int, t_ns: np.ndarray, values: np.ndarray) -> None:
        """A counter of the process (Chrome JSON counters belong to a process: `ph: C`)."""
        name = json.dumps(track.name)
        for at, value in zip(t_ns.tolist(), np.rint(values).astype(np.int64).tolist()):
            self._event(f'{{"name":{name},"ph":"C","pid":{track.pid},"ts":{_us(at)},"args":{{"bytes":{value}}}}}')

    def close(self) -> None:
        self.out.write('],"otherData":' + json.dumps({"clock": "CLOCK_MONOTONIC", "producer": "tandem", **self.metadata}, default=str) + "}\n")


def _event_order(s: _Slices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Begin and end events of a track's slices in an order that nests: (times, is_end, slice).

    At one instant: ends before begins (touching slices), deeper ends first, shallower begins
    first; an empty slice ends right after it begins."""
    n = len(s.start)
    empty = s.end == s.start
    times = np.r_[s.start, s.end]
    is_end = np.r_[np.zeros(n, bool), np.ones(n, bool)]
    phase = np.r_[np.ones(n, np.int8), np.where(empty, 2, 0).astype(np.int8)]
    depth = np.r_[s.depth, -s.depth].astype(np.int64)
    which = np.r_[np.arange(n), np.arange(n)]
    tiebreak = np.r_[np.arange(n), -np.arange(n)]  # a parent begins before, and ends after, a child drawn after it
    order = np.lexsort((tiebreak, depth, phase, times))
    return times[order], is_end[order], which[order]


class _ProtoWriter:
    """Perfetto's TrackEvent protobuf, through the `perfetto` package's protos.

    Each track is a packet sequence of its own: its descriptor, interned names, a clock
    snapshot defining an incremental clock (so a timestamp is the few bytes of its delta) and
    the track as the sequence's default (so events carry no track uuid)."""

    _INCREMENTAL_CLOCK = 64  # sequence-scoped clock ids are 64-127
    _MONOTONIC = 3  # ClockSnapshot.Clock.BuiltinClocks.MONOTONIC

    def __init__(self, out, metadata: dict):
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        self.pb = pb
        self.out = out
        self.sequences = 1
        trace = pb.Trace()
        packet = trace.packet.add(trusted_packet_sequence_id=1)
        packet.clock_snapshot.primary_trace_clock = self._MONOTONIC
        packet.clock_snapshot.clocks.add(clock_id=self._MONOTONIC, timestamp=0)
        packet.clock_snapshot.clocks.add(clock_id=6, timestamp=0)  # BOOTTIME: only to have a pair
        out.write(trace.SerializeToString())

    def process(self, uuid: int, pid: int, name: str, rank: int) -> None:
        trace = self.pb.Trace()
        packet = trace.packet.add(trusted_packet_sequence_id=1)
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.process.pid = pid
        packet.track_descriptor.process.process_name = name
        packet.track_descriptor.child_ordering = self.pb.TrackDescriptor.ChildTracksOrdering.EXPLICIT
        self.out.write(trace.SerializeToString())

    def track(self, track: _Track, parent: int) -> None:
        pb = self.pb
        self.sequences += 1
        self.seq, self.iids, self.last_ts = self.sequences, {}, None
        trace = pb.Trace()
        head = trace.packet.add(trusted_packet_sequence_id=self.seq, sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        head.incremental_state_cleared = True
        d = head.track_descriptor
        d.uuid, d.parent_uuid = track.uuid, parent
        d.sibling_order_rank = track.rank
        if track.thread:
            d.thread.pid, d.thread.tid, d.thread.thread_name = track.pid, track.tid, track.name
        else:
            d.name = track.name
        head.trace_packet_defaults.timestamp_clock_id = self._INCREMENTAL_CLOCK
        head.trace_packet_defaults.track_event_defaults.track_uuid = track.uuid
        for iid, name in enumerate(_ARG_NAMES, 1):
            head.interned_data.debug_annotation_names.add(iid=iid, name=name)
        self.out.write(trace.SerializeToString())

    def slices(self, track: _Track, s: _Slices) -> None:
        """The next slices of the current track (after those already written). A plain event
        (a begin with only its name, an end: nearly all of them) is encoded by `plain_packets`;
        one with flows, arguments or names interned with it by the protos."""
        pb, seq = self.pb, self.seq
        times, is_end, which = _event_order(s)
        if not len(times):
            return
        if self.last_ts is None:
            self.last_ts = int(times[0])
            trace = pb.Trace()
            clock = trace.packet.add(trusted_packet_sequence_id=seq, timestamp=self.last_ts, timestamp_clock_id=self._MONOTONIC)
            clock.clock_snapshot.clocks.add(clock_id=self._INCREMENTAL_CLOCK, timestamp=self.last_ts, is_incremental=True)
            clock.clock_snapshot.clocks.add(clock_id=self._MONOTONIC, timestamp=self.last_ts)
            self.out.write(trace.SerializeToString())
        deltas = np.diff(np.r_[self.last_ts, times])
        self.last_ts = int(times[-1])
        iid = []
        new_names = []
        for name in s.names:
            if name not in self.iids:
                self.iids[name] = len(self.iids) + 1
                new_names.append(name)
            iid.append(self.iids[name])
        name_iid = np.asarray(iid, np.int64)[s.name[which]]
        begins = np.flatnonzero(~is_end)
        with_more = set(s.flows_out) | set(s.flows_in) | set(s.args)
        special = [int(k) for k in begins[np.isin(which[begins], list(with_more))]] if with_more else []
        if new_names and len(begins):  # (names first used in this batch, interned with its first begin)
            special = sorted({int(begins[0]), *special})
        special = np.array(special, np.int64)
        for lo in range(0, len(times), _PLAIN_BATCH):  # (the encoder's byte matrices, a batch of events at a time)
            hi = min(lo + _PLAIN_BATCH, len(times))
            data, offsets = plain_packets(deltas[lo:hi], is_end[lo:hi], name_iid[lo:hi], seq)
            written = 0
            for k in special[np.searchsorted(special, lo):np.searchsorted(special, hi)].tolist():
                i = int(which[k])
                trace = pb.Trace()
                packet = trace.packet.add(timestamp=int(deltas[k]), trusted_packet_sequence_id=seq)
                if new_names:
                    for name in new_names:
                        packet.interned_data.event_names.add(iid=self.iids[name], name=name)
                    new_names = []
                event = packet.track_event
                event.type = pb.TrackEvent.TYPE_SLICE_BEGIN
                event.name_iid = int(name_iid[k])
                if i in s.flows_out:
                    event.flow_ids.extend(s.flows_out[i])
                if i in s.flows_in:
                    event.terminating_flow_ids.extend(link[0] for link in s.flows_in[i])
                if i in s.args:
                    for key, value in s.args[i].items():
                        _annotate(event.debug_annotations.add(name_iid=_ARG_IID[key]), value)
                self.out.write(data[offsets[written]:offsets[k - lo]])
                self.out.write(trace.SerializeToString())
                written = k - lo + 1
            self.out.write(data[offsets[written]:offsets[-1]])

    def counter(self, track: _Track, parent: int, t_ns: np.ndarray, values: np.ndarray) -> None:
        """A counter track of its own sequence: descriptor (bytes), then one TYPE_COUNTER event a
        sample, its timestamp the delta on the sequence's incremental clock."""
        pb = self.pb
        self.sequences += 1
        seq = self.sequences
        trace = pb.Trace()
        head = trace.packet.add(trusted_packet_sequence_id=seq, sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        head.incremental_state_cleared = True
        d = head.track_descriptor
        d.uuid, d.parent_uuid, d.name, d.sibling_order_rank = track.uuid, parent, track.name, track.rank
        d.counter.unit = pb.CounterDescriptor.Unit.UNIT_SIZE_BYTES
        head.trace_packet_defaults.timestamp_clock_id = self._INCREMENTAL_CLOCK
        head.trace_packet_defaults.track_event_defaults.track_uuid = track.uuid
        if len(t_ns):
            first = int(t_ns[0])
            clock = trace.packet.add(trusted_packet_sequence_id=seq, timestamp=first, timestamp_clock_id=self._MONOTONIC)
            clock.clock_snapshot.clocks.add(clock_id=self._INCREMENTAL_CLOCK, timestamp=first, is_incremental=True)
            clock.clock_snapshot.clocks.add(clock_id=self._MONOTONIC, timestamp=first)
            COUNTER = pb.TrackEvent.TYPE_COUNTER
            deltas = np.diff(np.r_[first, t_ns.astype(np.int64)]).tolist()
            for delta, value in zip(deltas, np.rint(values).astype(np.int64).tolist()):
                event = trace.packet.add(timestamp=delta, trusted_packet_sequence_id=seq).track_event
                event.type, event.counter_value = COUNTER, value
        self.out.write(trace.SerializeToString())

    def close(self) -> None:
        pass


# Protobuf wire bytes of the plain TrackEvent packets (field numbers: perfetto's trace.proto;
# tests/test_perfetto.py holds the bytes equal to the protos' own serialization).
_PLAIN_BATCH = 1 << 15  # events encoded at once (their byte matrices: ~100 bytes an event)
_PACKET = 0x0A          # Trace.packet (1), length-delimited
_TIMESTAMP = 0x40       # TracePacket.timestamp (8), varint
_SEQUENCE = 0x50        # TracePacket.trusted_packet_sequence_id (10), varint
_TRACK_EVENT = 0x5A     # TracePacket.track_event (11), length-delimited
_TYPE = 0x48            # TrackEvent.type (9), varint: 1 slice begin, 2 slice end
_NAME_IID = 0x50        # TrackEvent.name_iid (10), varint


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's varint bytes, as a (values, bytes of the largest) matrix and the mask of its bytes."""
    v = np.asarray(values).astype(np.uint64)
    width = max(1, -(-int(v.max()).bit_length() // 7)) if v.size else 1  # (bytes of the largest: 10 at most)
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    rest = v[:, None] >> shifts  # (v >> 7k: what byte k and those after it hold)
    more = np.zeros_like(rest, dtype=bool)
    more[:, :-1] = rest[:, 1:] != 0
    used = more.copy()
    used[:, 0] = True
    used[:, 1:] |= more[:, :-1]
    return ((rest & np.uint64(0x7F)) | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8), used


def plain_packets(deltas: np.ndarray, is_end: np.ndarray, name_iid: np.ndarray, sequence: int) -> tuple[bytes, np.ndarray]:
    """The wire bytes of one plain packet per event, in order: a slice begin (type 1, its
    name_iid) or end (type 2) at DELTAS on the sequence's incremental clock; and each
    packet's offset in them (offsets[k]: where packet k begins; offsets[-1]: the end)."""
    n = len(deltas)
    delta, delta_used = _varints(deltas)
    iid, iid_used = _varints(np.where(is_end, 0, name_iid))
    iid_used &= ~is_end[:, None]
    seq, seq_used = _varints(np.array([sequence]))
    seq, seq_used = np.repeat(seq[:, seq_used[0]], n, 0), np.ones((n, int(seq_used.sum())), bool)
    event_len = 2 + np.where(is_end, 0, 1 + iid_used.sum(1))  # type, then name_iid
    body_len = 1 + delta_used.sum(1) + 1 + seq.shape[1] + 2 + event_len  # (< 128: one length byte)
    column = lambda value: np.full((n, 1), value, np.uint8)  # noqa: E731
    parts = [column(_PACKET), body_len.astype(np.uint8)[:, None], column(_TIMESTAMP), delta, column(_SEQUENCE), seq,
             column(_TRACK_EVENT), event_len.astype(np.uint8)[:, None], column(_TYPE),
             np.where(is_end, 2, 1).astype(np.uint8)[:, None], column(_NAME_IID), iid]
    ones = np.ones((n, 1), bool)
    used = [ones, ones, ones, delta_used, ones, seq_used, ones, ones, ones, ones, ~is_end[:, None], iid_used]
    mask = np.concatenate(used, axis=1)
    data = np.concatenate(parts, axis=1)[mask].tobytes()
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(2 + body_len, out=offsets[1:])
    return data, offsets


def _annotate(annotation, value) -> None:
    if isinstance(value, bool):
        annotation.bool_value = value
    elif isinstance(value, int):
        annotation.int_value = value
    elif isinstance(value, float):
        annotation.double_value = value
    elif isinstance(value, (list, tuple)):
        for item in value:
            _annotate(annotation.array_values.add(), item)
    else:
        annotation.string_value = str(value)


# ---- export ------------------------------------------------------------------------------------


def export_perfetto(results_dir: str | os.PathLike, output: str | os.PathLike, fmt: str | None = None,
                    progress: Callable[[int, int], None] | None = None, window=None) -> Path:
    """Write the trace of the results in RESULTS_DIR (`tandem analyze -o`, or `tandem live`'s
    parts) to OUTPUT, atomically. fmt: "proto" or "json"; default by OUTPUT's suffix (.json:
    JSON, else protobuf). progress(done, total): GIL rows read and drawn so far. window: only
    what reaches into it (`_window`: WORST, or offsets (FROM, TO) into the results' span)."""
    output = Path(output)
    fmt = fmt or ("json" if output.suffix.lower() == ".json" else "proto")
    if fmt not in FORMATS:
        raise TandemError(f"--format {fmt}: not one of {', '.join(FORMATS)}")
    results = Results(results_dir)
    for name in ("pauses", "gil", "overlaps"):
        results.require(name)
    facts = results.facts()
    window = _window(results, window)
    read = gil_rows(results)
    total, done = 2 * read, 0  # (rows read, then rows drawn: those of the window once known)

    def advance(rows: int) -> None:
        nonlocal done
        done += rows
        if progress is not None:
            progress(done, total)

    pauses = _read_pauses(results)
    memory, spans = _read_memory(results), _read_spans(results)
    if window is not None:
        pauses = pauses[_in_window(pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64), window)]
        memory = memory[memory["t_ns"].between(*window)]
        if len(spans):
            spans = spans[_in_window(spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64), window)]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    # (named before it is made: a signal at any moment, even inside mkdir, leaves nothing behind)
    spill_dir = output.with_name(f".{output.name}.spill")
    claimed = -1  # (TMP's descriptor, locked: TMP and the spill directory are this export's)
    try:
        # (signals wait while TMP is made, locked and known here as ours: one handled in between
        # would leave a file nobody knows is there)
        with _signals_held():
            claimed = _claim(tmp, output)
        shutil.rmtree(spill_dir, ignore_errors=True)  # (a killed export's)
        spill_dir.mkdir(mode=0o700)
        # (the lock is held until TMP has become OUTPUT: the descriptor is closed last)
        with open(claimed, "wb" if fmt == "proto" else "w", closefd=False) as out:
            spill = _ThreadSpill(spill_dir)
            spill.add_gil(results, advance, window)
            total = read + spill.rows
            spill.add_overlaps(results, window)
            metadata = {"results": str(results.path),
                        "clock_errors": {side: clock.as_metadata() for side, clock in facts.clock.items()} or None,
                        **({"window_ns": list(window)} if window is not None else {})}
            writer = _ProtoWriter(out, metadata) if fmt == "proto" else _JsonWriter(out, metadata)
            _draw(writer, pauses, spill, _read_causes(results), memory, advance=advance, spans=spans)
            writer.close()
        os.replace(tmp, output)
    except BaseException:  # (a full disk, an interrupt: no half trace left beside the output)
        if claimed >= 0:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        if claimed >= 0:
            shutil.rmtree(spill_dir, ignore_errors=True)
            os.close(claimed)
    return output


def _claim(tmp: Path, output: Path) -> int:
    """TMP opened empty and locked (flock), as the sign that the scratch files beside OUTPUT (TMP,
    its spill directory) are this export's: those an export killed earlier left are taken over;
    an export writing OUTPUT now is not disturbed, and this one is refused in one line."""
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TandemError(f"{output}: another tandem export is writing it now (its scratch file {tmp.name} is "
                          "locked); try again when it is done") from None
    try:
        os.ftruncate(fd, 0)
    except BaseException:
        tmp.unlink(missing_ok=True)
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM held back in the block; one that came meanwhile is raised at its end.
    Their handlers wait, not the signals: the kernel gives a signal to any thread not blocking
    it (Arrow's, the progress bar's), and Python runs its handler in the main thread at once."""
    if threading.current_thread() is not threading.main_thread():  # (only the main thread runs handlers)
        yield
        return
    came, kept = [], {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            kept[signum] = signal.signal(signum, lambda number, _frame: came.append(number))
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
        if came:
            signal.raise_signal(came[0])


def _read_causes(results: Results) -> pd.DataFrame:
    """The stops a Python thread asked for (pause_impact's cause columns, one row per stop:
    engine.correlate.stops.caused_stops): pause_id, start_ns, cause_pid, cause_tid."""
    columns = ["pause_id", "start_ns", "cause_pid", "cause_tid"]
    impact = results.table("pause_impact")
    if not len(impact) or not {"caused_by_python", *columns} <= set(impact.columns):
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in columns})
    caused = caused_stops(impact)
    caused = caused[caused["cause_pid"].notna() & caused["cause_tid"].notna()]
    return caused[columns].astype(np.int64).sort_values("start_ns", ignore_index=True)


def _cause_flows(spill: _ThreadSpill, causes: pd.DataFrame, first_flow: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per Python thread: (times, flow ids, pause ids) of the stops it asked for that land in one
    of its slices (every time of a thread's lifetime does: released, waiting or held)."""
    out = {}
    flow = first_flow
    for (pid, tid), rows in causes.groupby(["cause_pid", "cause_tid"], sort=True):
        key = (int(pid), int(tid))
        if key not in spill.threads:
            continue
        times = rows["start_ns"].to_numpy(np.int64)
        found = np.zeros(len(times), bool)
        for states in _states(spill.gil_chunks(key)):
            found |= _containing(states, times) >= 0
        ids = np.arange(flow, flow + len(times), dtype=np.int64)
        flow += len(times)
        out[key] = (times[found], ids[found], rows["pause_id"].to_numpy(np.int64)[found])
    return out


def _draw(writer, pauses: pd.DataFrame, spill: _ThreadSpill, causes: pd.DataFrame, memory: pd.DataFrame,
          advance: Callable[[int], None], spans: pd.DataFrame) -> None:
    uuids = iter(range(1, 1 << 62))
    jvm = _jvm_tracks(pauses, lambda: next(uuids))
    placed = {int(pid): track for track, rows in jvm for pid in rows["pause_id"].tolist()}
    pause_names = dict(zip(pauses["pause_id"].astype(np.int64).tolist(), pauses["name"].astype(str).tolist())) if len(pauses) else {}
    threads = sorted(spill.threads)
    placed_ids = np.array(sorted(placed), np.int64)
    # Flow ids first (a pause's begin names the flows that leave it): an overlaps row's flow
    # id is its thread's base + its index among the thread's sorted rows (_Marks).
    flow_base: dict[tuple[int, int], int] = {}
    pause_of_flow, flow_ids = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    next_flow = 1
    for key in threads:
        flow_base[key] = next_flow
        marks = _overlap_marks(spill.load("overlaps", key, 4), placed_ids, next_flow)
        drawn = marks.flow > 0
        pause_of_flow.append(marks.rows[drawn, 3])
        flow_ids.append(marks.flow[drawn])
        next_flow += len(marks.rows)
    pause_of_flow, flow_ids = np.concatenate(pause_of_flow), np.concatenate(flow_ids)
    order = np.lexsort((flow_ids, pause_of_flow))
    flows = (pause_of_flow[order], flow_ids[order])
    # Python thread tracks first (a cause flow's start is on one), then the cause flows.
    thread_tracks = {}
    for key in threads:
        label = spill.names.get(key)
        thread_tracks[key] = _Track(next(uuids), key[0], key[1], f"{label} ({key[1]})" if label else f"thread {key[1]}",
                                    thread=True, rank=2 * key[1] + 1)  # (its spans track's rank: the one before)
    cause_flows = _cause_flows(spill, causes[causes["pause_id"].isin(placed_ids)], next_flow)
    into_pause: dict[int, list] = {}
    for key, (times, ids, pause_ids) in cause_flows.items():
        for at, flow, pause_id in zip(times.tolist(), ids.tolist(), pause_ids.tolist()):
            into_pause.setdefault(pause_id, []).append((flow, thread_tracks[key], at, pause_id))
    # Processes: a JVM embedded in Python (JPype) or Python in a JVM (Jep) shares its pid, so
    # both sides' tracks sit under one process named for both.
    span_tracks = _span_tracks(spans, thread_tracks, lambda: next(uuids))
    jvm_pids = sorted({t.pid for t, _ in jvm})
    python_pids = sorted({pid for pid, _ in threads})
    memory_of = {pid: (comm, series) for pid, comm, series in process_series(memory)}
    process_uuid = {}
    span_pids = {t.pid for t, _ in span_tracks}
    for pid in sorted(set(jvm_pids) | set(python_pids) | set(memory_of) | span_pids):
        process_uuid[pid] = next(uuids)
        both = pid in jvm_pids and pid in python_pids
        if pid in jvm_pids:
            name = f"JVM + Python {pid}" if both else f"JVM {pid}" if pid != _UNKNOWN_JVM_PID else "JVM"
        elif pid in python_pids:
            name = f"Python {pid}"
        elif pid in memory_of:  # a process only the memory sampler saw (a shell, a helper the command ran)
            name = f"{memory_of[pid][0] or 'process'} {pid}"
        else:
            name = f"spans of process {pid}" if pid != _UNKNOWN_JVM_PID else "spans"
        writer.process(process_uuid[pid], pid, name, 0 if pid in jvm_pids else 1 if pid in python_pids else 2)
    for pid, (_, series) in memory_of.items():  # counter tracks first under their process
        for rank, (_, label, t_ns, values) in enumerate(series, _MEMORY_RANK):
            writer.counter(_Track(next(uuids), pid, 0, f"memory: {label}", thread=False, rank=rank),
                           process_uuid[pid], t_ns, values)
    for track, slices in span_tracks:
        writer.track(track, process_uuid[track.pid])
        writer.slices(track, slices)
    for track, rows in jvm:
        writer.track(track, process_uuid[track.pid])
        writer.slices(track, _pause_slices(rows, flows, into_pause))
    labels = list(spill.codes)
    no_causes = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for key in threads:
        track = thread_tracks[key]
        marks = _overlap_marks(spill.load("overlaps", key, 4), placed_ids, flow_base[key])
        writer.track(track, process_uuid[key[0]])
        causes_here = cause_flows[key][:2] if key in cause_flows else no_causes
        for slices in _thread_chunks(spill.gil_chunks(key), marks, pause_names, placed, labels, causes_here):
            writer.slices(track, slices)
            advance(slices.gil_rows)
