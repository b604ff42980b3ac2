"""Interval overlap join of JVM pauses with GIL intervals (semantics and algorithm: docs/join.md).

Layers, lowest first:
* `kernels`: numba sweeps over sorted int64 arrays (count pass, fill pass, aggregates pass);
* `pairs`: array API on any input order (`overlap_pairs`, `overlap_totals`);
* `tables`: the input table contracts (`check_pauses`, `check_gil`);
* `frames`: the `overlaps` table in one shot (`overlap_frame`) or window by window (`WindowedJoin`).
"""
from engine.join.frames import OVERLAP_COLUMNS, WindowedJoin, overlap_frame
from engine.join.pairs import overlap_pairs, overlap_totals
from engine.join.tables import check_gil, check_pauses

__all__ = [
    "OVERLAP_COLUMNS",
    "WindowedJoin",
    "check_gil",
    "check_pauses",
    "overlap_frame",
    "overlap_pairs",
    "overlap_totals",
]
