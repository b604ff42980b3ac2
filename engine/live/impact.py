"""pause_impact, gil_free and the rolling summary, live, in bounded memory (docs/live.md).

A pause is *pending* while GIL intervals that could still pair with it may arrive; it is
*finalized* once the join's watermark W has passed its end by more than the slack: every
later on-time GIL interval starts at or after W, so the only intervals that can still pair
with it are those open now (a thread released or waiting since before its end). An open
interval's pairs with a finalized pause are already known exactly -- it covers everything
from its start to past W -- so it is counted as closed at the finalization frontier
F = W - slack ("virtual" rows; its real overlaps rows are emitted by the join when it
closes, and are the same). Then the offline code (`engine.analysis.impact.pause_impact`,
`engine.analysis.gil_state.gil_free_intervals`) runs on the finalized pauses and on a window
of the GIL intervals, and the pause's row goes to the rolling summary's aggregates: the
pause rows and overlaps rows themselves are not kept.

Thread lifetimes (offline: first interval start to last interval end of the whole run)
are carried across windows with 1 ns anchor intervals: one just before the window for a
thread that began before it, one at F for a thread still alive (`/proc/PID/task/TID`) that
holds the GIL now. gil_free rows are written once final: ending before F (a row touching F
may still grow).

Memory: pending pauses and their overlaps rows (W trails real time by ~2 s), the GIL
intervals of the last RETAIN_NS (late pauses: the repository's start-up pauses arrive a few
seconds late), one entry per thread, and per (kind, name) counters plus the overlap of each
pause that hit Python (8 bytes: the percentiles need every value).
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pandas as pd

from engine.analysis.gil_state import gil_free_intervals, merge_intervals
from engine.analysis.impact import pause_impact
from engine.correlate.schema import END
from engine.correlate.summary import NS_PER_HOUR, NS_PER_MS, SUMMARY_COLUMNS
from engine.join import overlap_frame

RETAIN_NS = 8_000_000_000
# A gil_free interval longer than this (a process idle for minutes) is written in pieces.
MAX_RETAIN_NS = 120_000_000_000

IMPACT_INPUT = ("pause_id", "kind", "name", "start_ns", "end_ns", "duration_ns")
GIL_COLUMNS = ("pid", "tid", "state", "start_ns", "end_ns")


def _gil_frame(pid, tid, state, start, end) -> pd.DataFrame:
    return pd.DataFrame({"pid": np.asarray(pid, np.int64), "tid": np.asarray(tid, np.int64),
                         "state": pd.array(list(state), dtype="string"), "start_ns": np.asarray(start, np.int64),
                         "end_ns": np.asarray(end, np.int64)})


def empty_gil_free() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="int64") for c in ("pid", "start_ns", "end_ns", "duration_ns")})


def thread_alive(pid: int, tid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/task/{tid}")


class _Aggregate:
    __slots__ = ("pauses", "hit_ns", "near_miss", "amplified", "threads")

    def __init__(self):
        self.pauses = 0
        self.hit_ns: list[np.ndarray] = []
        self.near_miss = 0
        self.amplified = 0
        self.threads: set[tuple[int, int]] = set()


class LiveImpact:
    def __init__(self, slack_ns: int = 0, retain_ns: int = RETAIN_NS, alive=thread_alive):
        self.slack_ns = int(slack_ns)
        self.retain_ns = int(retain_ns)
        self.alive = alive
        self.pending: pd.DataFrame | None = None        # pauses not finalized (+ os_thread_id, at_safepoint)
        self.pending_overlaps: list[pd.DataFrame] = []  # overlaps rows emitted for pending pauses
        # The GIL window, in chunks (one per finalization: max end, frame), dropped whole.
        self.gil_chunks: list[tuple[int, pd.DataFrame]] = []
        self.pids: set[int] = set()
        self._new_gil: list[pd.DataFrame] = []           # pushed since the last finalization
        self.window_start = -END                        # every interval ending at or after it is in the window
        self.threads: dict[tuple[int, int], list[int]] = {}  # (pid, tid) -> [first start, last end]
        self.jvm_tids: set[int] = set()
        self.gil_free_done: dict[int, int] = {}          # pid -> end of the last gil_free row written
        self.gil_free_through: dict[int, int] = {}       # pid -> gil_free is final before this
        self.frontier_ns = -END                         # F of the last finalization
        self.aggregates: dict[tuple[str, str], _Aggregate] = {}
        self.finalized = 0
        self.latest_hits: list[dict] = []              # a few recent finalized pauses that hit Python
        self.last_final_overlaps: pd.DataFrame | None = None  # overlaps of the last finalized batch (alerts)
        # compute() may run on a thread of its own: it takes this lock to update what
        # summary() reads and what the next prepare() starts from.
        self._lock = threading.Lock()

    # ---- input ---------------------------------------------------------------------------

    def add(self, pauses: pd.DataFrame, gil: pd.DataFrame, emitted: pd.DataFrame) -> None:
        if len(pauses):
            keep = pauses[list(IMPACT_INPUT)].reset_index(drop=True).copy()
            keep["kind"] = keep["kind"].astype("string")
            keep["name"] = keep["name"].astype("string")
            keep["os_thread_id"] = (pauses["os_thread_id"].astype("Int64").to_numpy() if "os_thread_id" in pauses.columns
                                    else pd.array([pd.NA] * len(pauses), dtype="Int64"))
            keep["at_safepoint"] = (pauses["at_safepoint"].astype("boolean").to_numpy() if "at_safepoint" in pauses.columns
                                    else pd.array([pd.NA] * len(pauses), dtype="boolean"))
            self.jvm_tids.update(int(t) for t in keep["os_thread_id"].dropna().unique())
            self.pending = keep if self.pending is None else pd.concat([self.pending, keep], ignore_index=True)
        if len(gil):
            self._new_gil.append(gil[list(GIL_COLUMNS)])
        if len(emitted) and self.pending is not None and len(self.pending):
            mine = emitted[np.isin(emitted["pause_id"].to_numpy(), self.pending["pause_id"].to_numpy())]
            if len(mine):
                self.pending_overlaps.append(mine)

    # ---- what is known so far (view, alerts) --------------------------------------------

    def pending_overlaps_frame(self) -> pd.DataFrame | None:
        frames = [f for f in self.pending_overlaps if len(f)]
        if not frames:
            return None
        self.pending_overlaps = [pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]]
        return self.pending_overlaps[0]

    def pending_overlap_ns(self, pause_ids=None) -> pd.Series:
        """Per pending pause_id: the union of its exact overlaps emitted so far."""
        rows = self.pending_overlaps_frame()
        if rows is None:
            return pd.Series(dtype=np.int64)
        exact = rows[~rows["near_miss"].astype(bool)]
        if pause_ids is not None:
            exact = exact[exact["pause_id"].isin(pause_ids)]
        if exact.empty:
            return pd.Series(dtype=np.int64)
        union = merge_intervals(exact, ["pause_id"])
        return (union["end_ns"] - union["start_ns"]).groupby(union["pause_id"]).sum()

    # ---- finalization ----------------------------------------------------------------------


    def prepare(self, watermark_ns: int, open_intervals, final: bool = False) -> dict | None:
        """The cheap part, on the thread that adds rows: what became final, with the GIL
        window it needs; None if the frontier has not moved. Only one job at a time may be
        outstanding (`compute` updates what the next `prepare` starts from)."""
        frontier = END if final else int(watermark_ns) - self.slack_ns
        if frontier <= self.frontier_ns and not final:
            return None
        self._take_new_gil()
        self.frontier_ns = frontier
        pending = self.pending
        done = (pending["end_ns"].to_numpy() < frontier) if pending is not None else np.zeros(0, bool)
        # Only the part of the window something still depends on: gil_free not final yet, and
        # the pauses being finalized (a late one may start seconds back).
        starts = [self.gil_free_through.get(p, self.window_start) for p in self.pids]
        if done.any():
            starts.append(int(pending["start_ns"].to_numpy()[done].min()) - 1)
        sub_start = max(self.window_start, min(starts)) if starts else self.window_start
        virtual = self._virtual(open_intervals, frontier) if not final else _gil_frame([], [], [], [], [])
        window = self._window(frontier, open_intervals, final, sub_start, virtual)
        job = {"frontier": frontier, "final": final, "sub_start": sub_start, "window": window, "virtual": virtual,
               "pids": sorted(self.pids), "jvm_tids": set(self.jvm_tids), "t0": self.window_start, "batch": None}
        if done.any():
            batch = pending[done].reset_index(drop=True)
            self.pending = pending[~done].reset_index(drop=True)
            ids = batch["pause_id"].to_numpy()
            rows = self.pending_overlaps_frame()
            mine = np.isin(rows["pause_id"].to_numpy(), ids) if rows is not None else None
            job["batch"] = batch
            job["overlaps"] = rows[mine].reset_index(drop=True) if rows is not None else None
            # Their pairs with the intervals open now: exact already (each open interval
            # covers the pause's end). The caller emits them as overlaps rows and drops these
            # pauses from the join's archive, so the join does not pair them again when the
            # intervals close (engine/live/join.py, `forget_finalized`).
            job["virtual_pairs"] = overlap_frame(batch, virtual, slack_ns=self.slack_ns) if len(virtual) else None
            if rows is not None:
                self.pending_overlaps = [rows[~mine].reset_index(drop=True)]
        self._prune(frontier)
        return job

    def compute(self, job: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The costly part (the offline pause_impact and gil_free code, ~50-300 ms): may run
        on a thread of its own while rows keep being added."""
        window, frontier = job["window"], job["frontier"]
        free = gil_free_intervals(window) if len(window) else empty_gil_free()
        impact = self._empty_impact()
        if job["batch"] is not None:
            impact = self._impact(job, free)
        with self._lock:
            written = self._gil_free_rows(free, frontier, job["final"], job["sub_start"])
            for pid in job["pids"]:
                mine = free[free["pid"].to_numpy() == pid] if len(free) else free
                carried = mine["start_ns"].to_numpy()[mine["end_ns"].to_numpy() >= frontier] if len(mine) else []
                self.gil_free_through[pid] = int(min(carried)) if len(carried) else frontier
        return impact, written

    _EMPTY_IMPACT: pd.DataFrame | None = None

    def _take_new_gil(self) -> None:
        """The GIL intervals pushed since the last finalization: into the window, and each
        thread's first start / last end (its inferred lifetime so far)."""
        if not self._new_gil:
            return
        g = pd.concat(self._new_gil, ignore_index=True) if len(self._new_gil) > 1 else self._new_gil[0].reset_index(drop=True)
        self._new_gil = []
        if len(g):
            self.gil_chunks.append((int(g["end_ns"].max()), g))
            self.pids.update(np.unique(g["pid"].to_numpy()).tolist())
        live = g[g["end_ns"].to_numpy() > g["start_ns"].to_numpy()]
        if len(live):
            pid, tid = live["pid"].to_numpy(np.int64), live["tid"].to_numpy(np.int64)
            lo, hi = live["start_ns"].to_numpy(np.int64), live["end_ns"].to_numpy(np.int64)
            order = np.lexsort((tid, pid))
            pid, tid, lo, hi = pid[order], tid[order], lo[order], hi[order]
            firsts = np.flatnonzero(np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])])
            for p, t, a, b in zip(pid[firsts].tolist(), tid[firsts].tolist(), np.minimum.reduceat(lo, firsts).tolist(),
                                  np.maximum.reduceat(hi, firsts).tolist()):
                known = self.threads.get((p, t))
                if known is None:
                    self.threads[(p, t)] = [a, b]
                else:
                    known[0], known[1] = min(known[0], a), max(known[1], b)

    def _empty_impact(self) -> pd.DataFrame:
        if LiveImpact._EMPTY_IMPACT is None:
            LiveImpact._EMPTY_IMPACT = self._compute_empty_impact()
        return LiveImpact._EMPTY_IMPACT.copy()

    def _compute_empty_impact(self) -> pd.DataFrame:
        empty_p = pd.DataFrame({"pause_id": pd.Series([], dtype="int64"), "kind": pd.Series([], dtype="string"),
                                "name": pd.Series([], dtype="string"), "start_ns": pd.Series([], dtype="int64"),
                                "end_ns": pd.Series([], dtype="int64"), "duration_ns": pd.Series([], dtype="int64")})
        from engine.live.join import empty_overlaps

        return pause_impact(empty_p, _gil_frame([], [], [], [], []), empty_overlaps(), empty_gil_free())

    def _window(self, frontier: int, open_intervals, final: bool, ws: int, virtual: pd.DataFrame) -> pd.DataFrame:
        chunks = [frame for hi, frame in self.gil_chunks if hi >= ws]
        gil = pd.concat(chunks, ignore_index=True) if len(chunks) > 1 else (chunks[0] if chunks else None)
        if gil is not None and len(gil):
            gil = gil[gil["end_ns"].to_numpy() >= ws]
        parts = [gil] if gil is not None and len(gil) else []
        # Threads that began before the window: their lifetime starts earlier (1 ns anchor).
        before = [(p, t) for (p, t), (lo, _hi) in self.threads.items() if lo < ws]
        if before:
            parts.append(_gil_frame([p for p, _ in before], [t for _, t in before], ["released"] * len(before),
                                    [ws - 2] * len(before), [ws - 1] * len(before)))
        if not final:
            if len(virtual):
                parts.append(virtual)
            opened = {(p, t) for p, t, _s, start in open_intervals if start < frontier}
            # A thread alive now that holds the GIL: its lifetime goes on past F (1 ns anchor at F).
            holding = [(p, t) for (p, t), (_lo, hi) in self.threads.items()
                       if hi < frontier and (p, t) not in opened and self.alive(p, t)]
            if holding:
                parts.append(_gil_frame([p for p, _ in holding], [t for _, t in holding], ["released"] * len(holding),
                                        [frontier] * len(holding), [frontier + 1] * len(holding)))
        if not parts:
            return _gil_frame([], [], [], [], [])
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    def _virtual(self, open_intervals, frontier: int) -> pd.DataFrame:
        """Open intervals counted as closed at F (their thread still exists: one that exited
        after a release leaves no interval, as offline)."""
        rows = [(p, t, s, start) for p, t, s, start in open_intervals if start < frontier and self.alive(p, t)]
        if not rows:
            return _gil_frame([], [], [], [], [])
        return _gil_frame([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                          [frontier] * len(rows))

    def _impact(self, job: dict, free: pd.DataFrame) -> pd.DataFrame:
        batch, window = job["batch"], job["window"]
        overlaps = [job["overlaps"]] if job["overlaps"] is not None else []
        if job.get("virtual_pairs") is not None:
            overlaps.append(job["virtual_pairs"])
        from engine.live.join import empty_overlaps

        overlaps = [o for o in overlaps if len(o)]
        overlaps = pd.concat(overlaps, ignore_index=True) if overlaps else empty_overlaps()
        overlaps = overlaps.astype({"near_miss": bool})
        # pause_impact takes the JVM threads it knows from the pauses table: the whole run's
        # os_thread_ids, given here as zero-length pauses far before the window (dropped after).
        known = sorted(job["jvm_tids"] - set(batch["os_thread_id"].dropna().astype(np.int64).tolist()))
        pauses = batch
        if known:
            t0 = min(int(batch["start_ns"].min()), job["t0"]) - 10
            extra = pd.DataFrame({"pause_id": np.arange(-len(known), 0, dtype=np.int64),
                                  "kind": pd.array(["_jvm_thread"] * len(known), dtype="string"),
                                  "name": pd.array([""] * len(known), dtype="string"),
                                  "start_ns": np.full(len(known), t0, np.int64), "end_ns": np.full(len(known), t0, np.int64),
                                  "duration_ns": np.zeros(len(known), np.int64),
                                  "os_thread_id": pd.array(known, dtype="Int64"),
                                  "at_safepoint": pd.array([pd.NA] * len(known), dtype="boolean")})
            pauses = pd.concat([batch, extra], ignore_index=True)
        impact = pause_impact(pauses, window, overlaps, free)
        impact = impact[impact["pause_id"].to_numpy() >= 0].reset_index(drop=True)
        with self._lock:
            self.last_final_overlaps = overlaps
            self._aggregate(impact, overlaps)
            self.finalized += len(impact)
        return impact

    def _aggregate(self, impact: pd.DataFrame, overlaps: pd.DataFrame) -> None:
        exact = overlaps[~overlaps["near_miss"].to_numpy(bool)]
        names = impact.set_index("pause_id")[["kind", "name"]]
        if len(exact):
            tagged = exact[["pause_id", "pid", "tid"]].join(names, on="pause_id")
            for (kind, name), group in tagged.groupby(["kind", "name"], sort=False):
                self.aggregates.setdefault((str(kind), str(name)), _Aggregate()).threads.update(
                    zip(group["pid"].astype(np.int64).tolist(), group["tid"].astype(np.int64).tolist()))
        for (kind, name), group in impact.groupby(["kind", "name"], sort=False):
            agg = self.aggregates.setdefault((str(kind), str(name)), _Aggregate())
            hit = group["hit_python"].to_numpy(bool)
            agg.pauses += len(group)
            agg.hit_ns.append(group["overlap_ns"].to_numpy(np.int64)[hit])
            agg.near_miss += int(((group["near_misses"].to_numpy() > 0) & ~hit).sum())
            agg.amplified += int(group["amplified"].to_numpy(bool).sum())
            if len(agg.hit_ns) > 64:
                agg.hit_ns = [np.concatenate(agg.hit_ns)]
        hits = impact[impact["hit_python"].to_numpy(bool)]
        if len(hits):
            self.latest_hits.extend(hits[["kind", "name", "start_ns", "end_ns", "duration_ns", "overlap_ns"]]
                                    .to_dict("records"))
            self.latest_hits = self.latest_hits[-16:]

    def _gil_free_rows(self, free: pd.DataFrame, frontier: int, final: bool, ws: int) -> pd.DataFrame:
        if not len(free):
            return empty_gil_free()
        start, end = free["start_ns"].to_numpy(), free["end_ns"].to_numpy()
        pids = free["pid"].to_numpy()
        done = np.array([self.gil_free_done.get(int(p), -END) for p in pids], dtype=np.int64)
        ok = (start >= done) & (start >= ws) & ((end < frontier) | final)
        out = free[ok].reset_index(drop=True)
        for pid, hi in out.groupby("pid")["end_ns"].max().items():
            self.gil_free_done[int(pid)] = int(hi)
        return out

    def _prune(self, frontier: int) -> None:
        if frontier >= END:
            return
        keep_from = frontier - self.retain_ns
        if self.pending is not None and len(self.pending):
            keep_from = min(keep_from, int(self.pending["start_ns"].min()) - 1_000_000_000)
        pending_free = [d for d in self.gil_free_through.values() if d > frontier - MAX_RETAIN_NS]
        if pending_free:
            keep_from = min(keep_from, min(pending_free))
        keep_from = max(keep_from, frontier - MAX_RETAIN_NS, self.window_start)
        if keep_from <= self.window_start:
            return
        self.window_start = keep_from
        for key in [k for k, (_lo, hi) in self.threads.items() if hi < keep_from and not self.alive(*k)]:
            del self.threads[key]  # gone before the window: nothing left depends on it
        self.gil_chunks = [(hi, frame) for hi, frame in self.gil_chunks if hi >= keep_from]

    # ---- summary -------------------------------------------------------------------------

    def summary(self, span_ns: int) -> pd.DataFrame:
        """The summary table of docs/results.md over the finalized pauses and, provisionally
        (overlaps known so far, no amplification), the pending ones."""
        hours = span_ns / NS_PER_HOUR if span_ns > 0 else np.nan
        keys: dict[tuple[str, str], dict] = {}
        with self._lock:
            for key, agg in self.aggregates.items():
                keys[key] = {"pauses": agg.pauses, "hit": list(agg.hit_ns), "near": agg.near_miss, "ampl": agg.amplified,
                             "threads": set(agg.threads)}
        if self.pending is not None and len(self.pending):
            pending = self.pending
            overlap = self.pending_overlap_ns().reindex(pending["pause_id"].to_numpy(), fill_value=0).to_numpy(np.int64)
            rows = self.pending_overlaps_frame()
            near_ids = set(rows.loc[rows["near_miss"].astype(bool), "pause_id"].tolist()) if rows is not None else set()
            exact = rows[~rows["near_miss"].astype(bool)].join(pending.set_index("pause_id")[["kind", "name"]], on="pause_id") \
                if rows is not None else None
            for (kind, name), idx in pending.groupby(["kind", "name"], sort=False).indices.items():
                entry = keys.setdefault((str(kind), str(name)), {"pauses": 0, "hit": [], "near": 0, "ampl": 0, "threads": set()})
                ov = overlap[idx]
                entry["pauses"] += len(idx)
                entry["hit"].append(ov[ov > 0])
                ids = pending["pause_id"].to_numpy()[idx]
                entry["near"] += int(sum(1 for i, o in zip(ids.tolist(), ov.tolist()) if o == 0 and i in near_ids))
                if exact is not None and len(exact):
                    mine = exact[(exact["kind"] == kind) & (exact["name"] == name)]
                    entry["threads"].update(zip(mine["pid"].astype(np.int64).tolist(), mine["tid"].astype(np.int64).tolist()))
        out = []
        for (kind, name), e in sorted(keys.items()):
            hit_ms = (np.concatenate(e["hit"]) if e["hit"] else np.zeros(0, np.int64)).astype(np.float64) / NS_PER_MS
            out.append({
                "kind": kind, "name": name, "pauses": e["pauses"], "pauses_hit": int(hit_ms.size),
                "hits_per_hour": hit_ms.size / hours,
                "mean_overlap_ms": hit_ms.mean() if hit_ms.size else np.nan,
                "p50_overlap_ms": np.percentile(hit_ms, 50) if hit_ms.size else np.nan,
                "p99_overlap_ms": np.percentile(hit_ms, 99) if hit_ms.size else np.nan,
                "max_overlap_ms": hit_ms.max() if hit_ms.size else np.nan,
                "total_overlap_ms": hit_ms.sum(), "threads_affected": len(e["threads"]),
                "pauses_near_miss": e["near"], "pauses_amplified": e["ampl"],
            })
        table = pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))
        table = table.astype({"kind": "string", "name": "string", "pauses": np.int64, "pauses_hit": np.int64,
                              "threads_affected": np.int64, "pauses_near_miss": np.int64, "pauses_amplified": np.int64})
        return table.sort_values(["pauses_hit", "total_overlap_ms", "kind", "name"], ascending=[False, False, True, True],
                                 ignore_index=True)
