"""Who caused each pause, live: the offline stage (engine/analysis/causes.py) run on the
pauses as they become due, so that live pause_impact rows carry the cause columns (and
stop_id) `tandem analyze` gives them.

A pause whose stop a Python thread asked for, or whose requester may be inferred, is due once
the GIL intervals are read SITE_WINDOW_NS past its end (a thread that held the GIL at the pause
is placed at its next release within that window; a release still open has its DROP's code):
the intervals' watermark, without the hold a young open release puts on the core's
(engine/live/watermark.py), which the row has already waited for to be final. Any other pause
(nearly all) reads no GIL row and is due as soon as the core made it final. Its pause_impact
row waits until then.
Kept for it, as the core keeps rows for late pauses: the pauses, GIL rows and System.gc() calls
of the last `retain_ns`. Each due batch is one `Causes` over the kept pauses (a stop's rows
count together: the requester of its safepoint, its collection's cause), fed the kept GIL rows
as one block with the intervals open now. What the pause ring does not carry is filled in as
the recording's reader does (docs/ring.md, "Java writer"): a GC pause's cause from its
collection, the System.gc() call a pause lies in.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from engine.analysis.causes import (CALL_WINDOW_NS, SITE_WINDOW_NS, SYSTEM_GC, Causes, PauseCauses, PauseRows,
                                    inference_candidates, requester_tids, with_causes)
from engine.correlate import GilRows
from engine.correlate.inputs import gil_rows_from_frame
from engine.correlate.schema import END, GIL_STATES
from engine.correlate.stops import stop_ids
from engine.ingest.gil_stream import ThreadHulls

# Due rows are taken at most this often (a batch costs ~5-50 ms of the loop's CPU, mostly
# fixed: more often costs CPU, less often adds up to this much to a pause_impact row's latency).
DUE_EVERY_S = 0.1
# Kinds a System.gc() call's thread and frames are never given to (the recording's reader skips them).
NOT_IN_CALLS = ("compilation", "deoptimization")


class LiveCauses:
    def __init__(self, retain_ns: int, code_names, alive):
        self.retain_ns = retain_ns
        self.code_names = code_names  # (pid, codes) -> function, file, line per code, or None
        self.alive = alive            # (pid, tid) -> the thread is alive now (/proc)
        self.pause_frames: list[pd.DataFrame] = []  # (concatenated when a batch is due)
        self.calls: list[pd.DataFrame] = []
        self.gil: list[dict[str, np.ndarray]] = []  # GIL rows as arrays (GIL_ARRAYS), a poll each
        self.thread_names: dict[tuple[int, int], str] = {}
        self.python_tids: set[int] = set()  # every thread seen in the GIL rows
        self.named_tids: set[int] = set()
        self.waiting: list[pd.DataFrame] = []  # pause_impact rows whose causes are not due yet
        self.last_due = 0.0
        self.added = False     # rows came since the last batch
        self.recheck_ns = END  # the watermark at which a row waiting for its site window is due

    def add(self, pauses: pd.DataFrame | None, gil: pd.DataFrame | None, calls: pd.DataFrame | None,
            impact: pd.DataFrame | None) -> None:
        if pauses is not None and len(pauses):
            self.pause_frames.append(pauses[[c for c in PAUSE_FACTS if c in pauses.columns]])
        if gil is not None and len(gil):
            self.gil.append(_gil_arrays(gil))
            tids = np.unique(self.gil[-1]["tid"]).tolist()
            if "thread_name" in gil.columns and not set(tids) <= self.named_tids:  # (a thread's name, once)
                named = gil[["pid", "tid", "thread_name"]].dropna().drop_duplicates(["pid", "tid"], keep="last")
                self.thread_names.update(zip(zip(named["pid"].tolist(), named["tid"].tolist()), named["thread_name"].tolist()))
                self.named_tids.update(named["tid"].tolist())
            self.python_tids.update(tids)
        for kept, frame in ((self.calls, calls), (self.waiting, impact)):
            if frame is not None and len(frame):
                kept.append(frame)
        self.added |= impact is not None and len(impact) > 0

    def due(self, watermark_ns: int, open_rows) -> pd.DataFrame | None:
        """The waiting pause_impact rows whose causes are due at WATERMARK_NS (END: all; the
        intervals' watermark: every GIL interval starting before it read, closed or open), with
        stop_id and the cause columns; None when none is. OPEN_ROWS(): the GIL intervals open
        now (GilRows) and their codes, asked for only when a batch is due."""
        if not self.waiting:
            return None
        final = watermark_ns >= END
        if not final and (time.monotonic() - self.last_due < DUE_EVERY_S
                          or (not self.added and watermark_ns < self.recheck_ns)):
            return None
        self.added = False
        impact = pd.concat(self.waiting, ignore_index=True) if len(self.waiting) > 1 else self.waiting[0]
        ends, wanted = impact["end_ns"].to_numpy(np.int64), impact["pause_id"].to_numpy(np.int64)
        pauses, stop, reads_gil = self._pauses_of(impact)
        ready = (ends + SITE_WINDOW_NS <= watermark_ns) | final
        ids = pauses["pause_id"].to_numpy(np.int64)
        if not ready.all():  # (the rows of pauses that read no GIL row are due now)
            ready |= ~np.isin(wanted, ids[reads_gil]) & (ends <= watermark_ns)
        # (the rows left wait for the site window: nothing changes for them before it)
        self.recheck_ns = int((ends[~ready]).min()) + SITE_WINDOW_NS if not ready.all() else END
        if not ready.any():
            self.waiting = [impact]
            return None
        self.last_due = time.monotonic()
        reads_gil &= np.isin(ids, wanted[ready])
        causes = (self._causes(pauses, stop, reads_gil, watermark_ns, open_rows) if reads_gil.any()
                  else PauseCauses.none(len(pauses)))
        out = with_causes(impact[ready], PauseRows(pauses), stop, causes)
        self.waiting = [impact[~ready]] if not ready.all() else []
        self._trim(watermark_ns)
        return out

    def next_due_ns(self) -> int | None:
        """The watermark at which the first row left waiting for its site window is due (its
        pause reads GIL rows up to SITE_WINDOW_NS past its end): the loop pushes once real time
        minus the watermark's lag passes it."""
        return self.recheck_ns if self.waiting and self.recheck_ns < END else None

    def _pauses_of(self, impact: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
        """The kept pauses overlapping the span of IMPACT's (their stops' rows and collections),
        with what the recording's reader fills in, their stop ids, and per pause whether its
        causes read GIL rows: its stop was asked for by a Python thread, or its requester may
        be inferred."""
        kept = self._pauses()
        starts, ends = kept["start_ns"].to_numpy(np.int64), kept["end_ns"].to_numpy(np.int64)
        lo, hi = int(impact["start_ns"].min()), int(impact["end_ns"].max())
        pauses = kept[(ends >= lo) & (starts <= hi)].reset_index(drop=True)
        pauses = with_system_gc_calls(with_collection_causes(pauses), self._calls(lo, hi))
        stop = stop_ids(pauses)
        named = requester_tids(pauses).to_numpy(np.int64, na_value=-1)
        asks = np.isin(named, np.fromiter(self.python_tids, np.int64, len(self.python_tids)))
        reads_gil = np.isin(stop, stop[asks]) | inference_candidates(pauses, stop)
        return pauses, stop, reads_gil

    def _causes(self, pauses: pd.DataFrame, stop: np.ndarray, reads_gil: np.ndarray, watermark_ns: int, open_rows):
        """Causes over PAUSES, fed the GIL rows from just before those that read them on, and
        each thread's last row before that (its name, and that the thread was there)."""
        gil = self._gil(int(pauses["start_ns"].to_numpy(np.int64)[reads_gil].min()) - CALL_WINDOW_NS, watermark_ns,
                        open_rows())
        causes = Causes(pauses, stop, self._lifetimes(gil, watermark_ns))
        causes.push(gil_rows_from_frame(gil), min(int(watermark_ns), END), lambda mask: self._named(gil[mask]))
        return causes.table()

    def _lifetimes(self, gil: pd.DataFrame, watermark_ns: int) -> pd.DataFrame:
        """pid, tid, start_ns, end_ns: each thread's hull of rows; a thread alive now (/proc)
        lives on to the watermark."""
        keys, start, end = ThreadHulls().add(*(gil[c].to_numpy(np.int64) for c in ("pid", "tid", "start_ns", "end_ns"))).arrays()
        lifetimes = pd.DataFrame({"pid": keys >> 32, "tid": keys & 0xFFFFFFFF, "start_ns": start, "end_ns": end})
        alive = np.array([self.alive(p, t) for p, t in zip(lifetimes["pid"].tolist(), lifetimes["tid"].tolist())], bool)
        lifetimes.loc[alive, "end_ns"] = np.maximum(end[alive], min(int(watermark_ns), END))
        return lifetimes[lifetimes["end_ns"] > lifetimes["start_ns"]]

    def _pauses(self) -> pd.DataFrame:
        if len(self.pause_frames) > 1:
            self.pause_frames = [pd.concat(self.pause_frames, ignore_index=True)]
        return self.pause_frames[0]

    def _calls(self, lo: int, hi: int) -> pd.DataFrame | None:
        """The System.gc() calls overlapping [LO, HI]."""
        if len(self.calls) > 1:
            self.calls = [pd.concat(self.calls, ignore_index=True)]
        calls = self.calls[0] if self.calls else None
        if calls is None:
            return None
        calls = calls[(calls["end_ns"].to_numpy(np.int64) >= lo) & (calls["start_ns"].to_numpy(np.int64) <= hi)]
        return calls if len(calls) else None

    def _kept_since(self, since_ns: int) -> dict[str, np.ndarray]:
        """The kept GIL rows (GIL_ARRAYS) ending at or after SINCE_NS, and each thread's last row before it."""
        kept = {name: np.concatenate([chunk[name] for chunk in self.gil]) if self.gil else np.zeros(0, dtype)
                for name, dtype in GIL_ARRAYS}
        recent = kept["end_ns"] >= since_ns
        older = np.flatnonzero(~recent)
        if older.size:  # (per thread, its latest row: sorted by thread, then end)
            order = older[np.lexsort((kept["end_ns"][older], kept["tid"][older], kept["pid"][older]))]
            key = (kept["pid"][order] << 32) | kept["tid"][order]
            recent[order[np.r_[key[1:] != key[:-1], True]]] = True
        return {name: values[recent] for name, values in kept.items()}

    def _gil(self, since_ns: int, watermark_ns: int, open_now: tuple[GilRows, np.ndarray]) -> pd.DataFrame:
        """_kept_since(SINCE_NS) as a gil-table frame with thread names, and the intervals open now
        (ending at the watermark, with their DROP's code: a holder's next release names its site
        before it closes)."""
        rows = self._kept_since(since_ns)
        open_rows, open_codes = open_now
        if len(open_rows):
            rows = {"pid": np.r_[rows["pid"], open_rows.pid], "tid": np.r_[rows["tid"], open_rows.tid],
                    "state": np.r_[rows["state"], np.asarray(open_rows.state, np.int8)],
                    "start_ns": np.r_[rows["start_ns"], open_rows.start_ns],
                    "end_ns": np.r_[rows["end_ns"], np.full(len(open_rows), min(int(watermark_ns), END), np.int64)],
                    "code": np.r_[rows["code"], open_codes]}
        return pd.DataFrame({
            **{name: rows[name] for name in ("pid", "tid", "start_ns", "end_ns", "code")},
            "state": pd.Categorical.from_codes(rows["state"], categories=list(GIL_STATES)),
            "thread_name": pd.array([self.thread_names.get(k) for k in zip(rows["pid"].tolist(), rows["tid"].tolist())],
                                    dtype="string"),
        })

    def _named(self, rows: pd.DataFrame) -> pd.DataFrame:
        """ROWS with the function, file and line of their release's code."""
        names = []
        for pid, group in rows.groupby("pid", sort=False):
            named = self.code_names(int(pid), group["code"].to_numpy(np.uint64))
            if named is not None:
                names.append(named.set_index(group.index))
        return rows.join(pd.concat(names)) if names else rows

    def _trim(self, watermark_ns: int) -> None:
        """Forget what is older than retain_ns behind the watermark and no waiting row needs
        (of the GIL rows, each thread's last is kept)."""
        if watermark_ns >= END:
            return
        horizon = watermark_ns - self.retain_ns
        waiting = np.concatenate([f["pause_id"].to_numpy(np.int64) for f in self.waiting]) if self.waiting else np.zeros(0, np.int64)
        if self.pause_frames:
            pauses = self._pauses()
            old = (pauses["end_ns"].to_numpy(np.int64) < horizon) & ~np.isin(pauses["pause_id"].to_numpy(np.int64), waiting)
            if old.any():
                self.pause_frames = [pauses[~old].reset_index(drop=True)]
        # (the oldest chunk first: once it ends before the horizon, the chunks are made one again)
        if self.gil and self.gil[0]["end_ns"].size and int(self.gil[0]["end_ns"].max()) < horizon:
            self.gil = [self._kept_since(horizon)]
        if self.calls:
            calls = self._calls(horizon, END)
            self.calls = [calls] if calls is not None else []


# What Causes reads of a pause (engine/analysis/causes.py), and pause_id.
PAUSE_FACTS = ("pause_id", "kind", "start_ns", "end_ns", "jvm_pid", "at_safepoint", "requester_os_thread_id",
               "system_gc_os_thread_id", "system_gc_frames", "cause", "asked_by_tandem", "gc_id")
GIL_ARRAYS = (("pid", np.int64), ("tid", np.int64), ("state", np.int8), ("start_ns", np.int64), ("end_ns", np.int64),
              ("code", np.uint64))


def _gil_arrays(gil: pd.DataFrame) -> dict[str, np.ndarray]:
    """A gil-table frame (live: with each release's `code`) as GIL_ARRAYS."""
    state = gil["state"]
    state = (state.cat.codes.to_numpy(np.int8) if isinstance(state.dtype, pd.CategoricalDtype)
             else pd.Categorical(state.astype(str), categories=list(GIL_STATES)).codes.astype(np.int8))
    code = gil["code"].to_numpy(np.uint64) if "code" in gil.columns else np.zeros(len(gil), np.uint64)
    # (copies: a column's view would keep the frame's whole block, every column, while it is kept)
    columns = {name: gil[name].to_numpy(np.int64, copy=True) for name in ("pid", "tid", "start_ns", "end_ns")}
    return {**columns, "state": state, "code": code}


def with_collection_causes(pauses: pd.DataFrame) -> pd.DataFrame:
    """A gc_pause row without a cause takes its collection's (the gc row of its JVM and gc_id),
    as the recording's reader gives it."""
    if "cause" not in pauses.columns or "gc_id" not in pauses.columns:
        return pauses
    kind = pauses["kind"].to_numpy(object)
    known_id = pauses["gc_id"].notna().to_numpy(bool)
    has_cause = pauses["cause"].notna().to_numpy(bool)
    missing = (kind == "gc_pause") & ~has_cause & known_id
    collections = (kind == "gc") & has_cause & known_id
    if not (missing.any() and collections.any()):
        return pauses
    jvm = pauses["jvm_pid"].astype("Int64").to_numpy(np.int64, na_value=-1) if "jvm_pid" in pauses.columns else 0
    key = (np.asarray(jvm, np.int64) << 32) ^ pauses["gc_id"].astype("Int64").to_numpy(np.int64, na_value=-1)
    ids, first = np.unique(key[collections], return_index=True)
    at = np.searchsorted(ids, key[missing]).clip(0, ids.size - 1)
    found = ids[at] == key[missing]
    causes = pauses["cause"].to_numpy(object, na_value=None)[np.flatnonzero(collections)[first]]
    pauses = pauses.copy()
    rows = np.flatnonzero(missing)[found]
    pauses.iloc[rows, pauses.columns.get_loc("cause")] = pd.array(causes[at[found]], dtype="string")
    return pauses


def with_system_gc_calls(pauses: pd.DataFrame, calls: pd.DataFrame | None) -> pd.DataFrame:
    """Each stop-the-world row lying inside a System.gc() call of its JVM (the last call starting
    at or before it, if that call ends at or after it) takes the call's thread and frames,
    unless it names another requester or its collection another cause: the rule of the
    recording's reader (docs/pauses.md, system_gc_os_thread_id), for the pause ring's calls."""
    if calls is None or not len(calls) or not len(pauses):
        return pauses
    pauses = pauses.copy()
    for column, dtype in (("system_gc_os_thread_id", "Int64"), ("system_gc_frames", "string")):
        if column not in pauses.columns:
            pauses[column] = pd.array([None] * len(pauses), dtype=dtype)
    jvm = pauses["jvm_pid"].astype("Int64").fillna(-1).to_numpy(np.int64)
    starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    open_row = (pauses["system_gc_os_thread_id"].isna().to_numpy(bool)
                & ~pauses["kind"].astype(str).isin(NOT_IN_CALLS).to_numpy(bool))
    requester = pauses["requester_os_thread_id"].astype("Int64") if "requester_os_thread_id" in pauses else None
    cause = pauses["cause"].astype("string") if "cause" in pauses else None
    for j, mine in calls.groupby("jvm_pid"):
        mine = mine.sort_values("start_ns", kind="stable")
        c_start, c_end = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
        rows = np.flatnonzero(open_row & (jvm == int(j)))
        at = np.searchsorted(c_start, starts[rows], "right") - 1
        inside = at >= 0
        inside[inside] = c_end[at[inside]] >= ends[rows[inside]]
        rows, at = rows[inside], at[inside]
        thread = mine["os_thread_id"].astype("Int64").to_numpy(np.int64, na_value=-1)[at]
        ok = np.ones(rows.size, bool)
        if requester is not None:
            named = requester.to_numpy(np.int64, na_value=-1)[rows]
            ok &= (named < 0) | (named == thread)
        if cause is not None:
            known = cause.to_numpy(object, na_value=None)[rows]
            ok &= np.array([c is None or c == SYSTEM_GC for c in known], bool)
        rows, at, thread = rows[ok], at[ok], thread[ok]
        position = pauses.columns.get_loc("system_gc_os_thread_id")
        pauses.iloc[rows, position] = pd.arrays.IntegerArray(thread, thread < 0)
        pauses.iloc[rows, pauses.columns.get_loc("system_gc_frames")] = pd.array(
            mine["frames"].to_numpy(object, na_value=None)[at], dtype="string")
    return pauses
