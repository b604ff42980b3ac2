"""Witnesses for GIL events, written plainly (a Python loop per event) and apart from the
engine's numba pairing, so that a test compares two independent readings of the same events."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.ingest.codes import NO_FRAME
from engine.ring.layout import GIL_DROP, GIL_TAKE_ACQUIRED, GIL_TAKE_REQUEST


def model_intervals(mono_ns, tid, kind, aux=None) -> list[tuple[int, int, int, int, int]]:
    """(tid, state 0 released / 1 waiting, start, end, code) of every interval, sorted: per
    thread, in the order it stamped them, DROP -> TAKE_* released, TAKE_REQUEST -> a later
    TAKE_ACQUIRED waiting; the code is the aux of the thread's last DROP (docs/probe.md)."""
    last: dict[int, tuple[int, int]] = {}
    last_drop: dict[int, int] = {}
    rows = []
    aux = np.zeros(len(kind), np.uint64) if aux is None else aux
    for t, th, k, a in zip(np.asarray(mono_ns).tolist(), np.asarray(tid).tolist(), np.asarray(kind).tolist(),
                           np.asarray(aux).tolist()):
        if th in last:
            t0, k0 = last[th]
            code = last_drop.get(th, NO_FRAME)
            if k0 == GIL_DROP and k in (GIL_TAKE_REQUEST, GIL_TAKE_ACQUIRED):
                rows.append((th, 0, t0, t, code))
            elif k0 == GIL_TAKE_REQUEST and k == GIL_TAKE_ACQUIRED and t > t0:
                rows.append((th, 1, t0, t, code))
        if k == GIL_DROP:
            last_drop[th] = a
        last[th] = (t, k)
    return sorted(rows)


def model_open(mono_ns, tid, kind) -> dict[int, tuple[int, int]]:
    """tid -> (state, start) of each thread whose last event is a DROP or a TAKE_REQUEST."""
    last = {th: (t, k) for t, th, k in zip(np.asarray(mono_ns).tolist(), np.asarray(tid).tolist(), np.asarray(kind).tolist())}
    return {th: (int(k == GIL_TAKE_REQUEST), t) for th, (t, k) in last.items() if k in (GIL_DROP, GIL_TAKE_REQUEST)}


def gil_holds(mono_ns: np.ndarray, tid: np.ndarray, kind: np.ndarray) -> pd.DataFrame:
    """Per-thread holding intervals: TAKE_ACQUIRED -> next DROP of the same thread
    (columns tid, start_ns, end_ns), by start."""
    from engine.ingest.gil import sampling_to_events
    from engine.ring.layout import GIL_SAMPLE_FREE, GIL_SAMPLE_HELD

    mono_ns, tid, kind = np.asarray(mono_ns), np.asarray(tid), np.asarray(kind)
    sampled = np.isin(kind, (GIL_SAMPLE_HELD, GIL_SAMPLE_FREE))
    if sampled.any():
        mono_ns, tid, kind = sampling_to_events(mono_ns[sampled], tid[sampled], kind[sampled])
    order = np.argsort(tid, kind="stable")
    t, th, k = mono_ns[order].astype(np.int64), tid[order].astype(np.int64), kind[order].astype(np.int64)
    pair = (th[1:] == th[:-1]) & (k[:-1] == GIL_TAKE_ACQUIRED) & (k[1:] == GIL_DROP)
    holds = pd.DataFrame({"tid": th[:-1][pair], "start_ns": t[:-1][pair], "end_ns": t[1:][pair]})
    return holds.sort_values("start_ns", kind="stable").reset_index(drop=True)


def gil_free_gaps(mono_ns: np.ndarray, tid: np.ndarray, kind: np.ndarray) -> pd.DataFrame:
    """Gaps when no thread holds the GIL (start_ns, end_ns), between the first and the last
    event: the complement of the union of every thread's holds."""
    holds = gil_holds(mono_ns, tid, kind)
    gaps, at = [], int(np.min(mono_ns)) if len(mono_ns) else 0
    for start, end in zip(holds["start_ns"].tolist(), holds["end_ns"].tolist()):
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if len(mono_ns) and int(np.max(mono_ns)) > at:
        gaps.append((at, int(np.max(mono_ns))))
    return pd.DataFrame(gaps or np.zeros((0, 2), np.int64), columns=["start_ns", "end_ns"]).astype(np.int64)
