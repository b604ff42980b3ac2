"""Interval overlap join of JVM pauses with GIL intervals (semantics and algorithm: docs/join.md).

Layers, lowest first:
* `kernels`: numba sweeps over sorted int64 arrays (count pass, fill pass, aggregates pass);
* `pairs`: array API on any input order (`overlap_pairs`, `overlap_totals`);
* `tables`: the input table contracts (`check_pauses`, `check_gil`).
The result tables are made by the correlation core (engine/correlate).
"""
from engine.join.pairs import overlap_pairs, overlap_totals
from engine.join.tables import check_gil, check_pauses

__all__ = ["check_gil", "check_pauses", "overlap_pairs", "overlap_totals"]
