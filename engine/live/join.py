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

from engine.errors import TandemError
from engine.join import OVERLAP_COLUMNS, overlap_frame
from engine.join.tables import GIL_COLUMNS, PAUSE_COLUMNS
from engine.live.impact import LiveImpact, empty_gil_free

# How far behind the watermark GIL intervals stay for late pauses. Repository-only pauses
# (start-up, compilation, deoptimization: not in the agent's ring) arrive a re-read (5 s)
# plus a flush (1 s) late, more on a loaded machine: a 5-minute soak at load 3 saw one
# older than a 10 s archive. 30 s of a busy producer's intervals is ~100k rows.
GIL_ARCHIVE_NS = 30_000_000_000
OVERLAP_DTYPES = {"pause_id": "int64", "pid": "int64", "tid": "int64", "state": "string", "start_ns": "int64",
                  "end_ns": "int64", "overlap_ns": "int64", "slack_ns": "int64", "near_miss": "bool"}


def empty_overlaps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=OVERLAP_DTYPES[c]) for c in OVERLAP_COLUMNS})


def _cat(frames: list[pd.DataFrame], like: pd.DataFrame | None) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return like.iloc[:0] if like is not None else pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _normalized(df: pd.DataFrame, ints, strings) -> pd.DataFrame:
    """A copy with int64 and string columns, converting only what is not so already (the
    sources' own frames are; check_pauses/check_gil on every push cost more than the join)."""
    out = df.copy() if len(df.columns) else df
    for column in ints:
        if out[column].dtype != np.int64:
            if out[column].isna().any():
                raise TandemError(f"live join: column {column!r} has missing values")
            out[column] = out[column].astype(np.int64)
    for column in strings:
        if not isinstance(out[column].dtype, pd.StringDtype):
            out[column] = out[column].astype("string")
    if (out["end_ns"].to_numpy() < out["start_ns"].to_numpy()).any():
        raise TandemError("live join: an interval ends before it starts")
    return out


def _pauses(df: pd.DataFrame) -> pd.DataFrame:
    _require(df, PAUSE_COLUMNS)
    out = _normalized(df, ("pause_id", "start_ns", "end_ns"), ("kind", "name"))
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    return out


def _gil(df: pd.DataFrame) -> pd.DataFrame:
    _require(df, GIL_COLUMNS)
    return _normalized(df, ("pid", "tid", "start_ns", "end_ns"), ("state",))


def _require(df: pd.DataFrame, columns) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TandemError(f"live join: missing column {missing[0]!r}")


class _Window:
    """WindowedJoin's windowing (engine/join/frames.py) on frames the live sources already
    checked: rows retained while something arriving later could pair with them
    (end_ns >= watermark - slack); each pair emitted in the push bringing its second member,
    by `overlap_frame`, the offline join code."""

    def __init__(self, slack_ns: int):
        self.slack_ns = int(slack_ns)
        self.watermark_ns: int | None = None
        self._pauses: pd.DataFrame | None = None
        self._gil: pd.DataFrame | None = None

    def push(self, pauses: pd.DataFrame, gil: pd.DataFrame, watermark_ns: int) -> pd.DataFrame:
        if self._pauses is None:
            self._pauses, self._gil = pauses.iloc[:0], gil.iloc[:0]
        s = self.slack_ns
        all_gil = _cat([self._gil, gil], gil)
        parts = []
        if len(pauses) and len(all_gil):
            parts.append(overlap_frame(pauses, all_gil, slack_ns=s))
        if len(self._pauses) and len(gil):
            parts.append(overlap_frame(self._pauses, gil, slack_ns=s))
        emitted = _cat(parts, None) if parts else empty_overlaps()
        keep_from = int(watermark_ns) - s
        all_pauses = _cat([self._pauses, pauses], pauses)
        self._pauses = all_pauses[all_pauses["end_ns"].to_numpy() >= keep_from].reset_index(drop=True)
        self._gil = all_gil[all_gil["end_ns"].to_numpy() >= keep_from].reset_index(drop=True)
        self.watermark_ns = int(watermark_ns)
        return emitted


class LiveJoin:
    def __init__(self, *, slack_ns: int = 0, gil_archive_ns: int = GIL_ARCHIVE_NS):
        self.slack_ns = int(slack_ns)
        self.gil_archive_ns = int(gil_archive_ns)
        self.windowed = _Window(slack_ns)
        self._pause_archive: pd.DataFrame | None = None
        self._gil_archive: pd.DataFrame | None = None
        self._late_pauses: pd.DataFrame | None = None
        self._late_gil: pd.DataFrame | None = None
        self.late_gil_rows = 0
        self.late_pause_rows = 0
        self.late_pauses_beyond_archive = 0
        # pause_impact / gil_free / the rolling summary, in bounded memory (engine/live/impact.py).
        self.impact = LiveImpact(slack_ns=slack_ns)
        self.pause_rows = 0
        self.overlap_rows = 0
        self.gil_intervals = 0
        self.span = [None, None]

    def push(self, pauses: pd.DataFrame, gil: pd.DataFrame, watermark_ns: int, keep_pauses_from_ns: int | None = None) -> pd.DataFrame:
        """Add both batches; return the overlaps rows that became known.

        keep_pauses_from_ns: the oldest start of a GIL interval still open (it will arrive
        late): pauses ending after it minus slack are archived for it."""
        pauses = _pauses(pauses)
        gil = _gil(gil)
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

    # ---- pause_impact, gil_free, the rolling summary --------------------------------------

    def _account(self, pauses: pd.DataFrame, gil: pd.DataFrame, emitted: pd.DataFrame) -> None:
        self.impact.add(pauses, gil, emitted)
        self.pause_rows += len(pauses)
        self.overlap_rows += len(emitted)
        self.gil_intervals += len(gil)
        for frame in (pauses, gil):
            if len(frame):
                lo, hi = int(frame["start_ns"].min()), int(frame["end_ns"].max())
                self.span[0] = lo if self.span[0] is None else min(self.span[0], lo)
                self.span[1] = hi if self.span[1] is None else max(self.span[1], hi)

    def finalize(self, open_intervals=(), final: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """pause_impact and gil_free rows that became final (engine/live/impact.py), and the
        overlaps rows of the finalized pauses with the GIL intervals open now."""
        job = self.prepare_final(open_intervals, final)
        if job is None:
            return self.impact._empty_impact(), empty_gil_free(), empty_overlaps()
        impact, free = self.impact.compute(job)
        return impact, free, job.get("virtual_pairs") if job.get("virtual_pairs") is not None else empty_overlaps()

    def prepare_final(self, open_intervals=(), final: bool = False) -> dict | None:
        """`LiveImpact.prepare` + `forget_finalized`: the job for `LiveImpact.compute`."""
        w = self.windowed.watermark_ns
        job = self.impact.prepare(w if w is not None else -(1 << 62), list(open_intervals), final=final)
        if job is not None:
            self.forget_finalized(job)
        return job

    def forget_finalized(self, job: dict) -> None:
        """Finalized pauses leave the late lane's archive: their pairs with every GIL interval
        that can still arrive late (those open now) are the job's `virtual_pairs`, emitted by
        the caller. Without this the archive kept every pause back to the oldest interval
        still open (a main thread blocked for the whole run: every pause of the run)."""
        batch = job.get("batch")
        pairs = job.get("virtual_pairs")
        if pairs is not None and len(pairs):
            self.overlap_rows += len(pairs)
        if batch is None or self._pause_archive is None or not len(self._pause_archive):
            return
        gone = np.isin(self._pause_archive["pause_id"].to_numpy(), batch["pause_id"].to_numpy())
        if gone.any():
            self._pause_archive = self._pause_archive[~gone].reset_index(drop=True)

    def pause_overlap_ns(self, pause_ids=None) -> pd.Series:
        """Per pending pause_id: time of the pause during which at least one Python thread was
        released or waiting, from the overlaps known so far (pause_impact.overlap_ns)."""
        return self.impact.pending_overlap_ns(pause_ids)

    def summary(self) -> pd.DataFrame:
        span = (self.span[1] - self.span[0]) if self.span[0] is not None else 0
        return self.impact.summary(span)
