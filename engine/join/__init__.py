"""Interval overlap join of JVM pauses with GIL intervals (semantics and algorithm: docs/join.md).

Layers, lowest first:
* `kernels`: numba sweeps over sorted int64 arrays (count pass, fill pass, aggregates pass);
* `pairs`: array API on any input order (`overlap_pairs`, `overlap_totals`).
The input tables' contracts (`check_pauses`, `check_gil`) and the result tables are the
correlation core's (engine/correlate), which calls this join.
"""
from engine.join.pairs import overlap_pairs, overlap_totals


__all__ = ["overlap_pairs", "overlap_totals"]
