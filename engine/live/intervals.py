"""GIL events arriving in batches -> released/waiting intervals, exactly as offline.

`engine.ingest.gil.events_to_intervals` pairs each thread's consecutive events. Here the
events of one process come batch by batch (each thread's in production order, docs/ring.md),
so the last event of every thread is carried over and put in front of that thread's next
batch: the pairs are then the same as over the whole stream at once. An interval whose
closing event has not arrived yet (a thread that dropped the GIL and is still released) is
*pending*: `pending_starts()` says where such intervals will start, so that the caller can
keep what they may still pair with.

Sampling-backend records (SAMPLE_HELD/SAMPLE_FREE) are ordered across threads, not per
thread; they are not supported live (the batch is refused with a TandemError).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.errors import TandemError
from engine.ingest.gil import events_to_intervals
from engine.ring.layout import GIL_DROP, GIL_SAMPLE_FREE, GIL_SAMPLE_HELD, GIL_TAKE_REQUEST


class IncrementalIntervals:
    """Per process: feed `push(mono_ns, tid, kind)` batches, get the intervals they close."""

    def __init__(self, pid: int, thread_names: dict[int, str] | None = None):
        self.pid = int(pid)
        self.thread_names = thread_names if thread_names is not None else {}
        # tid -> (mono_ns, kind) of the thread's last event so far.
        self._last: dict[int, tuple[int, int]] = {}

    def push(self, mono_ns: np.ndarray, tid: np.ndarray, kind: np.ndarray) -> pd.DataFrame:
        mono_ns = np.asarray(mono_ns, dtype=np.int64)
        tid = np.asarray(tid, dtype=np.int64)
        kind = np.asarray(kind, dtype=np.int64)
        if np.isin(kind, (GIL_SAMPLE_HELD, GIL_SAMPLE_FREE)).any():
            raise TandemError(f"pid {self.pid}: sampling-backend GIL records are not supported by `tandem live` "
                              "(use `tandem record` + `tandem analyze`)")
        if self._last:
            carried = np.array(list(self._last.keys()), dtype=np.int64)
            carry_t = np.array([v[0] for v in self._last.values()], dtype=np.int64)
            carry_k = np.array([v[1] for v in self._last.values()], dtype=np.int64)
            # Carried events first: events_to_intervals sorts stably by thread.
            mono_ns = np.concatenate([carry_t, mono_ns])
            tid = np.concatenate([carried, tid])
            kind = np.concatenate([carry_k, kind])
        if len(tid) == 0:
            return events_to_intervals(mono_ns, tid, kind, pid=self.pid)
        out = events_to_intervals(mono_ns, tid, kind, pid=self.pid)
        # Remember each thread's last event (last occurrence in production order).
        order = np.argsort(tid, kind="stable")
        t_sorted, th_sorted, k_sorted = mono_ns[order], tid[order], kind[order]
        last_of_thread = np.r_[th_sorted[1:] != th_sorted[:-1], True]
        for t, th, k in zip(t_sorted[last_of_thread].tolist(), th_sorted[last_of_thread].tolist(),
                            k_sorted[last_of_thread].tolist()):
            self._last[th] = (t, k)
        if len(out) and self.thread_names:
            out["thread_name"] = out["tid"].map(self.thread_names).astype("string")
        return out

    def forget(self) -> None:
        """Drop every thread's carried event (after a gap in the stream): the next events
        start new pairs, as at the start of a stream."""
        self._last.clear()

    def pending_starts(self) -> dict[int, int]:
        """tid -> start of the interval that thread has open (last event DROP or TAKE_REQUEST)."""
        return {tid: t for tid, (t, k) in self._last.items() if k in (GIL_DROP, GIL_TAKE_REQUEST)}

    def open_intervals(self) -> list[tuple[int, int, str, int]]:
        """(pid, tid, state, start_ns) of each interval open now (its closing event not read yet)."""
        return [(self.pid, tid, "released" if k == GIL_DROP else "waiting", t)
                for tid, (t, k) in self._last.items() if k in (GIL_DROP, GIL_TAKE_REQUEST)]

    def oldest_pending_start(self) -> int | None:
        starts = self.pending_starts()
        return min(starts.values()) if starts else None
