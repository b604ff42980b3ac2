"""Who holds the GIL, derived from the gil table: thread lifetimes, unions of intervals, gil_free.

Definitions (docs/results.md, "gil_free"):
* A thread's lifetime is inferred as [start of its first recorded interval, end of its last).
  Before and after, it is taken not to exist (the table records no thread starts or exits).
* Within its lifetime a thread holds the GIL except while it is `released` or `waiting`.
* gil_free of a process: the times within the process's span (first to last recorded
  instant of any of its threads) at which none of its living threads holds the GIL.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from numba import njit


@njit(cache=True, nogil=True)
def _run_starts(same_group: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For intervals sorted by (group, start): True where a new union run begins."""
    new_run = np.empty(starts.size, np.bool_)
    reach = 0
    for i in range(starts.size):
        if same_group[i] and starts[i] <= reach:
            new_run[i] = False
            reach = max(reach, ends[i])
        else:
            new_run[i] = True
            reach = ends[i]
    return new_run


def merge_intervals(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Union of the non-empty [start_ns, end_ns) intervals of each key group (touching ones join).

    Returns keys + start_ns, end_ns, sorted by keys then start.
    """
    nonempty = frame[frame["end_ns"] > frame["start_ns"]]
    key_values = [nonempty[key].to_numpy(np.int64) for key in keys]
    starts = nonempty["start_ns"].to_numpy(np.int64)
    order = np.lexsort((starts, *reversed(key_values)))
    key_values = [values[order] for values in key_values]
    starts, ends = starts[order], nonempty["end_ns"].to_numpy(np.int64)[order]
    same_group = np.ones(starts.size, bool)
    if starts.size:
        same_group[0] = False
    for values in key_values:
        same_group[1:] &= values[1:] == values[:-1]
    firsts = np.flatnonzero(_run_starts(same_group, starts, ends))
    merged = pd.DataFrame({key: values[firsts] for key, values in zip(keys, key_values)})
    merged["start_ns"] = starts[firsts]
    merged["end_ns"] = np.maximum.reduceat(ends, firsts) if firsts.size else ends[:0]
    return merged


def thread_lifetimes(gil: pd.DataFrame) -> pd.DataFrame:
    """pid, tid, start_ns, end_ns: each thread's inferred lifetime (first start to last end)."""
    return gil.groupby(["pid", "tid"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))


def gil_free_intervals(gil: pd.DataFrame) -> pd.DataFrame:
    """pid, start_ns, end_ns, duration_ns: the intervals at which no thread of the process holds the GIL.

    A count of holders per process is swept over time: +1 when a thread's lifetime starts
    or one of its (merged) released/waiting intervals ends, -1 at the opposite ends.
    """
    not_holding = merge_intervals(gil, ["pid", "tid"])
    lifetimes = thread_lifetimes(gil[gil["end_ns"] > gil["start_ns"]])
    pids = np.concatenate([lifetimes.pid, lifetimes.pid, not_holding.pid, not_holding.pid]).astype(np.int64)
    times = np.concatenate([lifetimes.start_ns, lifetimes.end_ns, not_holding.start_ns, not_holding.end_ns]).astype(np.int64)
    deltas = np.repeat([1, -1, -1, 1], [len(lifetimes), len(lifetimes), len(not_holding), len(not_holding)])
    order = np.lexsort((times, pids))
    pids, times, deltas = pids[order], times[order], deltas[order]
    # One change point per distinct (pid, time). Each process's deltas sum to zero, so one
    # running sum over all processes restarts at zero at every process boundary.
    firsts = np.flatnonzero(np.r_[True, (pids[1:] != pids[:-1]) | (times[1:] != times[:-1])]) if pids.size else order[:0]
    pids, times = pids[firsts], times[firsts]
    holders = np.cumsum(np.add.reduceat(deltas, firsts)) if firsts.size else deltas[:0]
    # Segment i is [times[i], times[i+1]) of one process, with holders[i] threads holding the GIL.
    free = np.zeros(pids.size, bool)
    if pids.size > 1:
        free[:-1] = (holders[:-1] == 0) & (pids[:-1] == pids[1:])
    segments = pd.DataFrame({"pid": pids[free], "start_ns": times[free], "end_ns": times[np.flatnonzero(free) + 1]})
    merged = merge_intervals(segments, ["pid"])
    merged["duration_ns"] = merged["end_ns"] - merged["start_ns"]
    return merged.astype({"pid": np.int64, "start_ns": np.int64, "end_ns": np.int64, "duration_ns": np.int64})
