"""Table-level join: the `overlaps` table (docs/results.md) in one shot or window by window."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.correlate.schema import GIL_CARRIED_COLUMNS
from engine.errors import TandemError
from engine.join.pairs import overlap_pairs
from engine.join.tables import GIL_IDENTITY, check_gil, check_pauses

OVERLAP_COLUMNS = ("pause_id", "pid", "tid", "state", "start_ns", "end_ns", "overlap_ns", "slack_ns", "near_miss")


def overlap_frame(pauses: pd.DataFrame, gil: pd.DataFrame, *, slack_ns: int = 0) -> pd.DataFrame:
    """One row per (pause, GIL interval) that overlap, or nearly meet when slack_ns > 0.

    Inputs follow the checked input contract (engine.join.tables). For an overlap,
    start_ns/end_ns bound the overlap and slack_ns is 0; for a near miss they bound the gap
    between the two intervals, overlap_ns is 0 and slack_ns is the gap's length.
    """
    p_start = pauses["start_ns"].to_numpy(np.int64)
    p_end = pauses["end_ns"].to_numpy(np.int64)
    g_start = gil["start_ns"].to_numpy(np.int64)
    g_end = gil["end_ns"].to_numpy(np.int64)
    pause_rows, gil_rows = overlap_pairs(p_start, p_end, g_start, g_end, slack_ns=slack_ns)
    later_start = np.maximum(p_start[pause_rows], g_start[gil_rows])
    earlier_end = np.minimum(p_end[pause_rows], g_end[gil_rows])
    overlapping = later_start < earlier_end
    return pd.DataFrame(
        {
            "pause_id": pauses["pause_id"].to_numpy(np.int64)[pause_rows],
            "pid": gil["pid"].to_numpy(np.int64)[gil_rows],
            "tid": gil["tid"].to_numpy(np.int64)[gil_rows],
            "state": gil["state"].astype("string").array.take(gil_rows),
            "start_ns": np.where(overlapping, later_start, earlier_end),
            "end_ns": np.where(overlapping, earlier_end, later_start),
            "overlap_ns": np.where(overlapping, earlier_end - later_start, 0),
            "slack_ns": np.where(overlapping, 0, later_start - earlier_end),
            "near_miss": ~overlapping,
            # the Python code of the GIL interval (docs/results.md), where the GIL table has it
            **{c: gil[c].array.take(gil_rows) for c in GIL_CARRIED_COLUMNS if c in gil.columns},
        }
    )


class WindowedJoin:
    """The overlaps of a stream fed batch by batch; together they equal one `overlap_frame` run.

    Each `push(pauses, gil, watermark_ns)` is a promise: no interval pushed later starts
    before watermark_ns. An interval is retained while something arriving later could still
    pair with it (end_ns >= watermark - slack_ns), and each pair is emitted in the batch in
    which its second member arrives, so nothing is emitted twice or lost. Intervals straddling
    a window edge simply stay retained. Late data is fine as long as it starts at or after the
    previous watermark; data starting before it is refused (its pairs may already be lost).
    Exact duplicate GIL rows (and repeated identical pauses) are dropped as in `correlate`.
    """

    def __init__(self, *, slack_ns: int = 0, pauses_source: str = "pauses batch", gil_source: str = "gil batch"):
        if slack_ns < 0:
            raise ValueError(f"slack_ns must be >= 0, got {slack_ns}")
        self.slack_ns = int(slack_ns)
        self.watermark_ns: int | None = None
        self._pauses_source = pauses_source
        self._gil_source = gil_source
        self._pauses: pd.DataFrame | None = None
        self._gil: pd.DataFrame | None = None

    def _refuse_late(self, batch: pd.DataFrame, source: str) -> None:
        if self.watermark_ns is not None and len(batch) and batch["start_ns"].min() < self.watermark_ns:
            raise TandemError(
                f"{source}: an interval starts at {int(batch['start_ns'].min())} ns, before the watermark "
                f"{self.watermark_ns} ns already passed"
            )

    def push(self, pauses: pd.DataFrame, gil: pd.DataFrame, watermark_ns: int) -> pd.DataFrame:
        """Add a batch of both sides; return the overlaps rows that became known with it."""
        if self.watermark_ns is not None and watermark_ns < self.watermark_ns:
            raise ValueError(f"watermark went backwards: {watermark_ns} < {self.watermark_ns}")
        new_pauses = check_pauses(pauses, self._pauses_source)
        new_gil, _ = check_gil(gil, self._gil_source)
        self._refuse_late(new_pauses, self._pauses_source)
        self._refuse_late(new_gil, self._gil_source)
        if self._pauses is None:
            self._pauses, self._gil = new_pauses.iloc[:0], new_gil.iloc[:0]
        new_pauses = self._without_pauses_seen(new_pauses)
        new_gil = self._without_gil_seen(new_gil)

        all_gil = pd.concat([self._gil, new_gil], ignore_index=True)
        emitted = pd.concat(
            [
                overlap_frame(new_pauses, all_gil, slack_ns=self.slack_ns),
                overlap_frame(self._pauses, new_gil, slack_ns=self.slack_ns),
            ],
            ignore_index=True,
        )
        # Anything ending before watermark - slack is farther than slack from all future intervals.
        keep_from = watermark_ns - self.slack_ns
        all_pauses = pd.concat([self._pauses, new_pauses], ignore_index=True)
        self._pauses = all_pauses[all_pauses["end_ns"] >= keep_from].reset_index(drop=True)
        self._gil = all_gil[all_gil["end_ns"] >= keep_from].reset_index(drop=True)
        self.watermark_ns = int(watermark_ns)
        return emitted

    def _without_pauses_seen(self, new: pd.DataFrame) -> pd.DataFrame:
        both = pd.concat([self._pauses, new], ignore_index=True)
        repeated_id = both["pause_id"].duplicated()
        identical = both.duplicated(subset=[c for c in both.columns if c != "duration_ns"])
        if (repeated_id & ~identical).any():
            pause_id = int(both["pause_id"][repeated_id & ~identical].iloc[0])
            raise TandemError(f"{self._pauses_source}: pause_id {pause_id} names two different pauses")
        return new[~identical.to_numpy()[len(self._pauses):]].reset_index(drop=True)

    def _without_gil_seen(self, new: pd.DataFrame) -> pd.DataFrame:
        both = pd.concat([self._gil, new], ignore_index=True)
        seen = both.duplicated(subset=list(GIL_IDENTITY)).to_numpy()[len(self._gil):]
        return new[~seen].reset_index(drop=True)
