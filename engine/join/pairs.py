"""Array-level interval overlap join: which GIL intervals overlap (or nearly meet) which pauses.

Semantics (docs/join.md): intervals are half-open [start, end) in int64 ns; a pair overlaps
when a.start < b.end and b.start < a.end, so touching and zero-length intervals never
overlap. With slack_ns > 0 a pair that does not overlap but whose gap
max(a.start - b.end, b.start - a.end) is at most slack_ns is a near miss. Zero-length and
negative intervals take part in nothing, near misses included. Rows are rows: duplicated
intervals give duplicated pairs (as in SQL); deduplication is the caller's decision.

Inputs may come in any order; they are checked in one pass and sorted stably only if needed.
Returned row numbers always refer to the caller's original order.
"""
from __future__ import annotations

import numpy as np

from engine.join import kernels


def _as_i8(values) -> np.ndarray:
    """Contiguous int64 read-only view (no copy when already int64 and contiguous).

    Kernels only read their inputs; giving them read-only arrays always (pandas hands out
    read-only ones, numpy writable ones) means one compiled variant per kernel, not four.
    """
    array = np.ascontiguousarray(values, dtype=np.int64).view()
    array.flags.writeable = False
    return array


def _sort_by_start(start: np.ndarray, end: np.ndarray, rows: np.ndarray | None):
    """Return (start, end, rows) sorted stably by start; rows=None means 0..n-1 in order."""
    if kernels.is_sorted(start):
        return start, end, rows
    order = np.argsort(start, kind="stable")
    return _as_i8(start[order]), _as_i8(end[order]), (order if rows is None else rows[order])


def _pauses_that_can_match(p_start: np.ndarray, p_end: np.ndarray):
    """Non-empty pauses as (start, end, original row numbers), sorted by start."""
    rows = np.flatnonzero(p_end > p_start)
    if rows.size == p_start.size:
        return _sort_by_start(p_start, p_end, None)
    return _sort_by_start(_as_i8(p_start[rows]), _as_i8(p_end[rows]), rows)


def overlap_pairs(p_start, p_end, g_start, g_end, *, slack_ns: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """All (pause row, GIL row) pairs that overlap, or are near misses when slack_ns > 0.

    Two passes over the data: the first counts the pairs, the second fills arrays of exactly
    that size. Pairs are ordered by pause start, then by GIL interval start.
    """
    if slack_ns < 0:
        raise ValueError(f"slack_ns must be >= 0, got {slack_ns}")
    p_start, p_end, g_start, g_end = map(_as_i8, (p_start, p_end, g_start, g_end))
    p_start_s, p_end_s, p_rows = _pauses_that_can_match(p_start, p_end)
    if slack_ns:
        # Widen each pause to [start - slack - 1, end + slack + 1) so that the half-open test of
        # the sweep becomes the inclusive "gap <= slack" test (docs/join.md, "Slack").
        lo, hi = _as_i8(p_start_s - (slack_ns + 1)), _as_i8(p_end_s + (slack_ns + 1))
    else:
        lo, hi = p_start_s, p_end_s
    # The GIL side is large: its order is checked by the counting pass itself, for free.
    g_start_s, g_end_s, g_rows = g_start, g_end, None
    joined_at = np.empty(g_start.size, np.int64)  # pages are only touched as far as used
    joined_end = np.empty(lo.size, np.int64)
    forward_from = np.empty(lo.size, np.int64)
    forward_to = np.empty(lo.size, np.int64)
    forward_has_empty = np.zeros(1, np.bool_)
    record = (joined_at, joined_end, forward_from, forward_to, forward_has_empty)
    n = kernels.count_pairs(lo, hi, g_start_s, g_end_s, *record)
    if n < 0:
        g_rows = np.argsort(g_start, kind="stable")
        g_start_s, g_end_s = _as_i8(g_start[g_rows]), _as_i8(g_end[g_rows])
        forward_has_empty[0] = False
        n = kernels.count_pairs(lo, hi, g_start_s, g_end_s, *record)
    pause_pos = np.empty(n, np.int64)
    gil_pos = np.empty(n, np.int64)
    kernels.fill_pairs(lo, g_start_s, g_end_s, *record, pause_pos, gil_pos)
    pause_rows = pause_pos if p_rows is None else p_rows[pause_pos]
    gil_rows = gil_pos if g_rows is None else g_rows[gil_pos]
    return pause_rows, gil_rows


def overlap_totals(p_start, p_end, g_start, g_end) -> tuple[np.ndarray, np.ndarray]:
    """Per pause (caller's order): number of overlapping GIL intervals and their summed overlap in ns.

    The aggregates-only pass: no pairs are materialized, so it runs at memory speed and is
    the way to summarize inputs whose pairs would not fit in memory.
    """
    p_start, p_end, g_start, g_end = map(_as_i8, (p_start, p_end, g_start, g_end))
    counts = np.zeros(p_start.size, np.int64)
    totals = np.zeros(p_start.size, np.int64)
    p_start_s, p_end_s, p_rows = _pauses_that_can_match(p_start, p_end)
    sorted_counts = counts if p_rows is None else np.zeros(p_rows.size, np.int64)
    sorted_totals = totals if p_rows is None else np.zeros(p_rows.size, np.int64)
    if not kernels.overlap_totals(p_start_s, p_end_s, g_start, g_end, sorted_counts, sorted_totals):
        order = np.argsort(g_start, kind="stable")
        sorted_counts[:] = 0
        sorted_totals[:] = 0
        kernels.overlap_totals(p_start_s, p_end_s, _as_i8(g_start[order]), _as_i8(g_end[order]), sorted_counts, sorted_totals)
    if p_rows is None:
        return counts, totals
    counts[p_rows] = sorted_counts
    totals[p_rows] = sorted_totals
    return counts, totals
