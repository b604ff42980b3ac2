"""Both runtimes on one timeline: the results of `tandem analyze` as a Chrome trace-event JSON
that ui.perfetto.dev (and chrome://tracing) opens.

Layout, all on CLOCK_MONOTONIC (trace `ts` is microseconds with nanosecond fractions):
- one process per JVM, with a track per pause family: safepoints (each with its
  time-to-safepoint and its VM operation inside), GC pauses, whole GC collections,
  VM operations without a safepoint, JIT compilation, deoptimization. Slices that overlap
  without nesting (concurrent collections) are spread over extra lanes of that family;
- one process per Python interpreter, with a track per thread showing `held`, `released`
  and `waiting`; where a JVM pause overlaps a released or waiting interval, a red slice
  `JVM pause: <name>` sits inside it, linked by a flow arrow from the pause.

Every event is a complete event (`ph: X`), so begin/end are balanced by construction;
events are written in timestamp order, parents before their children.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

# Pause families in the order their tracks appear under a JVM process.
JVM_TRACKS = {
    "safepoint": "safepoints",
    "gc_pause": "GC pauses",
    "gc": "GC collections",
    "vm_operation": "VM operations (no safepoint)",
    "compilation": "JIT compilation",
    "deoptimization": "deoptimization",
}
_LANE_STRIDE = 100  # synthetic tids of a JVM: family index * stride + lane
_UNKNOWN_JVM_PID = 0  # pauses brought from elsewhere without jvm_pid


def _us(ns) -> float:
    return round(int(ns) / 1000.0, 3)


def _slice(name: str, pid: int, tid: int, start_ns: int, end_ns: int, cat: str, args: dict | None = None, color: str | None = None) -> dict:
    event = {"name": name, "cat": cat, "ph": "X", "pid": int(pid), "tid": int(tid), "ts": _us(start_ns), "dur": _us(end_ns - start_ns)}
    if args:
        event["args"] = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in args.items() if v is not None and v is not pd.NA}
    if color:
        event["cname"] = color
    return event


def _meta(kind: str, pid: int, tid: int | None, value) -> dict:
    key = "sort_index" if kind.endswith("sort_index") else "name"
    event = {"name": kind, "ph": "M", "pid": int(pid), "args": {key: value}}
    if tid is not None:
        event["tid"] = int(tid)
    return event


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


def _jvm_events(pauses: pd.DataFrame) -> tuple[list[dict], dict[int, tuple[int, int]]]:
    """Slices of every pause; also where each pause was drawn (pid, tid), for flow arrows."""
    events: list[dict] = []
    placed: dict[int, tuple[int, int]] = {}
    if pauses.empty:
        return events, placed
    jvm_pid = pauses["jvm_pid"] if "jvm_pid" in pauses else pd.Series(_UNKNOWN_JVM_PID, index=pauses.index)
    pauses = pauses.assign(_pid=jvm_pid.fillna(_UNKNOWN_JVM_PID).astype(np.int64))
    for pid, of_jvm in pauses.groupby("_pid", sort=True):
        events.append(_meta("process_name", pid, None, f"JVM {pid}" if pid != _UNKNOWN_JVM_PID else "JVM"))
        events.append(_meta("process_sort_index", pid, None, 0))
        kinds = list(JVM_TRACKS) + sorted(set(of_jvm["kind"].astype(str)) - set(JVM_TRACKS))
        for family, kind in enumerate(kinds):
            rows = of_jvm[of_jvm["kind"].astype(str) == kind].sort_values(["start_ns", "end_ns"], kind="stable")
            if rows.empty:
                continue
            lanes = _lanes(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
            label = JVM_TRACKS.get(kind, kind)
            for lane in range(int(lanes.max()) + 1):
                tid = family * _LANE_STRIDE + lane + 1
                events.append(_meta("thread_name", pid, tid, label if lane == 0 else f"{label} ({lane + 1})"))
                events.append(_meta("thread_sort_index", pid, tid, tid))
            for row, lane in zip(rows.itertuples(index=False), lanes.tolist()):
                tid = family * _LANE_STRIDE + lane + 1
                placed[int(row.pause_id)] = (int(pid), tid)
                events.extend(_pause_slices(row, pid, tid))
    return events, placed


def _pause_slices(row, pid: int, tid: int) -> list[dict]:
    get = row._asdict().get
    name = str(row.name)
    operation = get("operation")
    title = f"{name}: {operation}" if row.kind == "safepoint" and isinstance(operation, str) and operation != name else name
    args = {"pause_id": row.pause_id, "kind": row.kind, "duration_ns": int(row.end_ns - row.start_ns),
            "cause": get("cause"), "gc_id": get("gc_id"), "safepoint_id": get("safepoint_id"),
            "unmatched": get("unmatched"), "os_thread_id": get("os_thread_id")}
    out = [_slice(title, pid, tid, row.start_ns, row.end_ns, "jvm", args, color="terrible" if row.kind in ("safepoint", "gc_pause") else None)]
    ttsp = get("time_to_safepoint_ns")
    if row.kind == "safepoint" and ttsp is not None and ttsp is not pd.NA and 0 < int(ttsp) <= row.end_ns - row.start_ns:
        # Reaching the safepoint (jdk.SafepointBegin), then the operation with the world stopped.
        sync_end = row.start_ns + int(ttsp)
        out.append(_slice("synchronize (time to safepoint)", pid, tid, row.start_ns, sync_end, "jvm"))
        if sync_end < row.end_ns:
            out.append(_slice(operation if isinstance(operation, str) else "operation", pid, tid, sync_end, row.end_ns, "jvm"))
    return out


def _held_intervals(threads: pd.DataFrame) -> pd.DataFrame:
    """Complement of a thread's released/waiting intervals within its inferred lifetime."""
    from engine.analysis.gil_state import merge_intervals, thread_lifetimes

    not_holding = merge_intervals(threads, ["pid", "tid"])
    held = []
    for (pid, tid), life in thread_lifetimes(threads).set_index(["pid", "tid"]).iterrows():
        gaps = not_holding[(not_holding.pid == pid) & (not_holding.tid == tid)]
        edges = np.concatenate([[life.start_ns], gaps.end_ns.to_numpy()]), np.concatenate([gaps.start_ns.to_numpy(), [life.end_ns]])
        for start, end in zip(*edges):
            if end > start:
                held.append((pid, tid, "held", start, end))
    return pd.DataFrame(held, columns=["pid", "tid", "state", "start_ns", "end_ns"])


_STATE_COLOR = {"held": "good", "released": "grey", "waiting": "bad"}


def _python_events(gil: pd.DataFrame, overlaps: pd.DataFrame, pauses: pd.DataFrame, placed: dict, flow_start: int) -> list[dict]:
    events: list[dict] = []
    if gil.empty:
        return events
    names = {}
    if "thread_name" in gil:
        named = gil.dropna(subset=["thread_name"]).drop_duplicates(["pid", "tid"])
        names = {(int(p), int(t)): str(n) for p, t, n in zip(named.pid, named.tid, named.thread_name)}
    for pid in sorted(set(gil["pid"].astype(np.int64).tolist())):
        events.append(_meta("process_name", pid, None, f"Python {pid}"))
        events.append(_meta("process_sort_index", pid, None, 1))
    for (pid, tid) in sorted(set(zip(gil["pid"].astype(np.int64).tolist(), gil["tid"].astype(np.int64).tolist()))):
        label = names.get((pid, tid))
        events.append(_meta("thread_name", pid, tid, f"{label} ({tid})" if label else f"thread {tid}"))
    states = pd.concat([gil[["pid", "tid", "state", "start_ns", "end_ns"]], _held_intervals(gil)], ignore_index=True)
    for row in states.itertuples(index=False):
        if row.end_ns > row.start_ns:
            events.append(_slice(str(row.state), row.pid, row.tid, row.start_ns, row.end_ns, "gil", color=_STATE_COLOR.get(str(row.state))))
    hits = overlaps[~overlaps["near_miss"]] if "near_miss" in overlaps else overlaps
    hits = hits[hits["end_ns"] > hits["start_ns"]]
    pause_names = dict(zip(pauses["pause_id"].astype(np.int64).tolist(), pauses["name"].astype(str).tolist())) if not pauses.empty else {}
    flow_id = flow_start
    for mark in _overlap_marks(hits):
        ids = mark["pause_ids"]
        title = " + ".join(dict.fromkeys(pause_names.get(i, "pause") for i in ids))
        events.append(_slice(f"JVM pause: {title}", mark["pid"], mark["tid"], mark["start_ns"], mark["end_ns"], "overlap",
                             {"pause_ids": ids, "state": mark["state"]}, color="terrible"))
        for pause_id, start_ns in zip(ids, mark["starts"]):
            if pause_id in placed:
                jpid, jtid = placed[pause_id]
                flow = {"name": "pause hits Python", "cat": "overlap", "id": flow_id, "ts": _us(start_ns)}
                events.append({**flow, "ph": "s", "pid": jpid, "tid": jtid})
                events.append({**flow, "ph": "f", "bp": "e", "pid": int(mark["pid"]), "tid": int(mark["tid"])})
                flow_id += 1
    return events


def _overlap_marks(hits: pd.DataFrame) -> list[dict]:
    """Overlaps of one thread and state merged where they overlap each other.

    Pauses nest and overlap (a GC pause inside its safepoint, inside its collection), so
    their overlaps with one GIL interval would cross each other on the thread's track;
    one mark per merged stretch keeps the track properly nested. Touching stretches stay
    apart: a released interval ends exactly where the thread's waiting interval starts.
    """
    marks: list[dict] = []
    ordered = hits.sort_values(["pid", "tid", "state", "start_ns"], kind="stable")
    for row in ordered.itertuples(index=False):
        key = (int(row.pid), int(row.tid), str(row.state))
        last = marks[-1] if marks else None
        if last is not None and (last["pid"], last["tid"], last["state"]) == key and row.start_ns < last["end_ns"]:
            last["end_ns"] = max(last["end_ns"], int(row.end_ns))
            last["pause_ids"].append(int(row.pause_id))
            last["starts"].append(int(row.start_ns))
        else:
            marks.append({"pid": key[0], "tid": key[1], "state": key[2], "start_ns": int(row.start_ns), "end_ns": int(row.end_ns),
                          "pause_ids": [int(row.pause_id)], "starts": [int(row.start_ns)]})
    return marks


def _merge_process_metadata(events: list[dict]) -> list[dict]:
    """One name per process: a JVM embedded in Python (JPype) or Python in a JVM (Jep) shares
    its pid, so both sides' tracks sit under one process named for both."""
    names: dict[int, list[str]] = {}
    sorted_pids: set[int] = set()
    out = []
    for event in events:
        if event["ph"] == "M" and event["name"] == "process_name":
            names.setdefault(event["pid"], []).append(event["args"]["name"])
        elif event["ph"] == "M" and event["name"] == "process_sort_index":
            if event["pid"] not in sorted_pids:  # the JVM's (first) order wins
                sorted_pids.add(event["pid"])
                out.append(event)
        else:
            out.append(event)
    for pid, labels in names.items():
        label = labels[0] if len(labels) == 1 else " + ".join(l.split(" ")[0] for l in labels) + f" {pid}"
        out.append(_meta("process_name", pid, None, label))
    return out


def _order(event: dict) -> tuple:
    # Metadata first; then by time; at one instant the longer slice (the parent) first,
    # flow ends after the slice that encloses them.
    if event["ph"] == "M":
        return (0, 0.0, 0.0, 0)
    return (1, event["ts"], -event.get("dur", -1.0), {"X": 0, "s": 1, "f": 2}[event["ph"]])


def perfetto_trace(pauses: pd.DataFrame, gil: pd.DataFrame, overlaps: pd.DataFrame, metadata: dict | None = None) -> dict:
    """The trace as a dict in Chrome trace-event JSON form."""
    jvm, placed = _jvm_events(pauses)
    python = _python_events(gil, overlaps, pauses, placed, flow_start=1)
    events = sorted(_merge_process_metadata(jvm + python), key=_order)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"clock": "CLOCK_MONOTONIC", "producer": "tandem", **(metadata or {})}}


def export_perfetto(results_dir: str | os.PathLike, output: str | os.PathLike) -> Path:
    """Write the trace of the results in RESULTS_DIR (from `tandem analyze`) to OUTPUT, atomically."""
    from engine.errors import TandemError
    from engine.store import read_table

    results = Path(results_dir)
    tables = {}
    for name in ("pauses", "gil", "overlaps"):
        path = results / f"{name}.parquet"
        if not path.exists():
            raise TandemError(f"{path}: missing; RESULTS must be the -o directory of `tandem analyze`")
        tables[name] = read_table(path)
    header = tables["overlaps"].attrs.get("analysis", {})
    trace = perfetto_trace(tables["pauses"], tables["gil"], tables["overlaps"], {"results": str(results), "clock_errors": header.get("clock")})
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(json.dumps(trace, separators=(",", ":"), default=str))
    os.replace(tmp, output)
    return output
