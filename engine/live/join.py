"""The live join: `WindowedJoin` (the offline join code) plus a lane for late rows, and the
rolling summary.

Each pair (pause, GIL interval) is emitted once, in the push that delivers its second
member. Rows starting at or after the join's watermark go through `WindowedJoin`. A row
starting before it ("late": typically a GIL interval that stayed open across pushes, e.g. a
thread blocked in a JPype call or sleeping) cannot enter the WindowedJoin; it is joined by
the late lane instead, with the same `overlap_frame`:

    late pause  x (every GIL interval arrived so far, this push's included)
    late GIL    x (every pause arrived before, and this push's on-time pauses)
    on-time pauses of this push x late GIL rows of earlier pushes
    on-time GIL rows of this push x late pauses of earlier pushes

which covers every pair with a late member exactly once (docs/live.md). "Every pause
arrived so far" is an archive kept back to the oldest open GIL interval; "every GIL
interval arrived so far" is an archive kept `gil_archive_ns` behind the watermark: a late
pause older than that may miss pairs and is counted in `late_pauses_beyond_archive`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.analysis.gil_state import merge_intervals
from engine.analysis.summary import summary_table
from engine.join import OVERLAP_COLUMNS, WindowedJoin, check_gil, check_pauses, overlap_frame

GIL_ARCHIVE_NS = 10_000_000_000
OVERLAP_DTYPES = {"pause_id": "int64", "pid": "int64", "tid": "int64", "state": "string", "start_ns": "int64",
                  "end_ns": "int64", "overlap_ns": "int64", "slack_ns": "int64", "near_miss": "bool"}


def empty_overlaps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=OVERLAP_DTYPES[c]) for c in OVERLAP_COLUMNS})


def _cat(frames: list[pd.DataFrame], like: pd.DataFrame | None) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return like.iloc[:0] if like is not None else pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


class LiveJoin:
    def __init__(self, *, slack_ns: int = 0, gil_archive_ns: int = GIL_ARCHIVE_NS):
        self.slack_ns = int(slack_ns)
        self.gil_archive_ns = int(gil_archive_ns)
        self.windowed = WindowedJoin(slack_ns=slack_ns, pauses_source="live pauses", gil_source="live GIL intervals")
        self._pause_archive: pd.DataFrame | None = None
        self._gil_archive: pd.DataFrame | None = None
        self._late_pauses: pd.DataFrame | None = None
        self._late_gil: pd.DataFrame | None = None
        self.late_gil_rows = 0
        self.late_pause_rows = 0
        self.late_pauses_beyond_archive = 0
        # Rolling state for the summary (pauses and overlaps are small next to the GIL side).
        self.pauses: pd.DataFrame | None = None
        self.overlaps = empty_overlaps()
        self.gil_intervals = 0
        self.span = [None, None]

    def push(self, pauses: pd.DataFrame, gil: pd.DataFrame, watermark_ns: int, keep_pauses_from_ns: int | None = None) -> pd.DataFrame:
        """Add both batches; return the overlaps rows that became known.

        keep_pauses_from_ns: the oldest start of a GIL interval still open (it will arrive
        late): pauses ending after it minus slack are archived for it."""
        pauses = check_pauses(pauses, "live pauses")
        gil, _ = check_gil(gil, "live GIL intervals")
        w0 = self.windowed.watermark_ns
        if w0 is None:
            on_p, late_p, on_g, late_g = pauses, pauses.iloc[:0], gil, gil.iloc[:0]
        else:
            p_late = pauses["start_ns"].to_numpy() < w0
            g_late = gil["start_ns"].to_numpy() < w0
            on_p, late_p = pauses[~p_late], pauses[p_late]
            on_g, late_g = gil[~g_late], gil[g_late]
        watermark_ns = max(int(watermark_ns), w0 if w0 is not None else int(watermark_ns))
        s = self.slack_ns
        parts = [self.windowed.push(on_p.reset_index(drop=True), on_g.reset_index(drop=True), watermark_ns)]
        if len(late_p):
            self.late_pause_rows += len(late_p)
            horizon = (w0 or 0) - s - self.gil_archive_ns
            self.late_pauses_beyond_archive += int((late_p["start_ns"] < horizon).sum())
            parts.append(overlap_frame(late_p, _cat([self._gil_archive, gil], gil), slack_ns=s))
        if len(late_g):
            self.late_gil_rows += len(late_g)
            parts.append(overlap_frame(_cat([self._pause_archive, on_p], pauses), late_g, slack_ns=s))
        if len(on_p) and self._late_gil is not None and len(self._late_gil):
            parts.append(overlap_frame(on_p, self._late_gil, slack_ns=s))
        if len(on_g) and self._late_pauses is not None and len(self._late_pauses):
            parts.append(overlap_frame(self._late_pauses, on_g, slack_ns=s))
        emitted = _cat(parts, parts[0])

        keep = watermark_ns - s
        oldest = keep if keep_pauses_from_ns is None else min(keep, int(keep_pauses_from_ns) - s)
        archive = _cat([self._pause_archive, pauses], pauses)
        self._pause_archive = archive[archive["end_ns"].to_numpy() >= oldest].reset_index(drop=True)
        archive = _cat([self._gil_archive, gil], gil)
        self._gil_archive = archive[archive["end_ns"].to_numpy() >= keep - self.gil_archive_ns].reset_index(drop=True)
        late = _cat([self._late_pauses, late_p], pauses)
        self._late_pauses = late[late["end_ns"].to_numpy() >= keep].reset_index(drop=True)
        late = _cat([self._late_gil, late_g], gil)
        self._late_gil = late[late["end_ns"].to_numpy() >= keep].reset_index(drop=True)

        self._account(pauses, gil, emitted)
        return emitted

    # ---- rolling summary -----------------------------------------------------------------

    def _account(self, pauses: pd.DataFrame, gil: pd.DataFrame, emitted: pd.DataFrame) -> None:
        if len(pauses):
            cols = ["pause_id", "kind", "name", "start_ns", "end_ns", "duration_ns"]
            self.pauses = _cat([self.pauses, pauses[cols]], pauses[cols])
        if len(emitted):
            self.overlaps = _cat([self.overlaps, emitted], emitted)
        self.gil_intervals += len(gil)
        for frame in (pauses, gil):
            if len(frame):
                lo, hi = int(frame["start_ns"].min()), int(frame["end_ns"].max())
                self.span[0] = lo if self.span[0] is None else min(self.span[0], lo)
                self.span[1] = hi if self.span[1] is None else max(self.span[1], hi)

    def pause_overlap_ns(self, pause_ids=None) -> pd.Series:
        """Per pause_id: time of the pause during which at least one Python thread was released
        or waiting, from the overlaps known so far (pause_impact.overlap_ns)."""
        exact = self.overlaps[~self.overlaps["near_miss"].astype(bool)]
        if pause_ids is not None:
            exact = exact[exact["pause_id"].isin(pause_ids)]
        if exact.empty:
            return pd.Series(dtype=np.int64)
        union = merge_intervals(exact, ["pause_id"])
        return (union["end_ns"] - union["start_ns"]).groupby(union["pause_id"]).sum()

    def impact(self) -> pd.DataFrame:
        """A light pause_impact: overlap columns only (no holding, gil_free or amplification live)."""
        pauses = self.pauses if self.pauses is not None else pd.DataFrame(
            {"pause_id": pd.Series([], dtype="int64"), "kind": pd.Series([], dtype="string"),
             "name": pd.Series([], dtype="string"), "start_ns": pd.Series([], dtype="int64"),
             "end_ns": pd.Series([], dtype="int64"), "duration_ns": pd.Series([], dtype="int64")})
        out = pauses.reset_index(drop=True).copy()
        ids = out["pause_id"].to_numpy()
        out["overlap_ns"] = self.pause_overlap_ns().reindex(ids, fill_value=0).to_numpy(np.int64)
        out["hit_python"] = out["overlap_ns"] > 0
        near = self.overlaps[self.overlaps["near_miss"].astype(bool)].groupby("pause_id").size()
        out["near_misses"] = near.reindex(ids, fill_value=0).to_numpy(np.int64)
        out["amplified"] = False
        return out

    def summary(self) -> pd.DataFrame:
        span = (self.span[1] - self.span[0]) if self.span[0] is not None else 0
        return summary_table(self.impact(), self.overlaps, span)
