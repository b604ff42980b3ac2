"""numba kernels of the interval overlap join (docs/join.md has the semantics and the algorithm).

Both inputs arrive sorted by start. The sweep walks the pauses ("B", the probing side) in
start order and keeps two things about the GIL intervals ("A"):

* a pointer `next_a` to the first A interval that starts after the current pause's start;
* `survivors`: the A intervals that started at or before the current pause's start and
  were still running then. Only these can overlap a later pause among those already passed.

For each pause the pairs are the survivors still running (each one visited is a pair or is
dropped for good) plus the A intervals starting inside the pause (each one visited is a pair).
Every A interval is read once by the pointer; everything else read is output. So the work is
O(len(A) + len(B) + pairs) whatever the lengths: a long or nested interval costs only the
pairs it really takes part in (the running-max sweep of join.md pitfall 1 does not have this
property). The fill pass replays what the count pass recorded and never rescans A.

Kernels are compiled with cache=True so that only the first run on a machine pays for it.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(KEYS, kind="stable") of integer keys, sooner: where each key's distance from
    the least, times their number, fits in 63 bits, the keys with their positions packed in are
    sorted as values (numpy's quicksort, SIMD where the CPU has it: a sixth of the stable sort's
    time on a million random times, all distinct, so the order is the stable one) and the
    positions read back; else the stable sort."""
    keys = np.asarray(keys)
    n = keys.size
    if n < 2:
        return np.arange(n)
    lo = int(keys.min())
    if (int(keys.max()) - lo + 1) * n >= 1 << 63:
        return np.argsort(keys, kind="stable")
    packed = keys.astype(np.int64)  # (a copy, worked on in place)
    packed -= lo
    packed *= n
    packed += np.arange(n, dtype=np.int64)
    packed.sort()
    packed %= n
    return packed


@njit(cache=True, nogil=True)
def is_sorted(values: np.ndarray) -> bool:
    """True when values never decrease (one cheap pass, no allocation)."""
    return _sorted_from(values, 0, np.iinfo(np.int64).min)


@njit(cache=True, nogil=True)
def is_sorted_by(major: np.ndarray, minor: np.ndarray) -> bool:
    """True when the pairs (major, minor) never decrease: the order np.lexsort((minor, major)) gives."""
    for i in range(1, major.size):
        if major[i] < major[i - 1] or (major[i] == major[i - 1] and minor[i] < minor[i - 1]):
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _sorted_from(values, first, previous) -> bool:
    """True when values[first:] never decrease and values[first] >= previous."""
    for i in range(first, values.size):
        if values[i] < previous:
            return False
        previous = values[i]
    return True


@njit(cache=True, nogil=True)
def count_pairs(b_lo, b_hi, a_start, a_end, joined_at, joined_end, forward_from, forward_to, forward_has_empty) -> int:
    """First pass: the number of pairs (b, a) with a_start < b_hi and b_lo < a_end, or -1 if a_start is unsorted.

    b_lo/b_hi: probing bounds of the pauses, sorted by b_lo, every b_lo < b_hi.
    a_start/a_end: GIL intervals sorted by a_start; empty ones (a_end <= a_start) never pair.
    It also records what the second pass needs so that it never rescans A: the intervals that
    joined the survivors at each pause (joined_at[joined_end[b-1]:joined_end[b]], at most one
    entry per A interval, so joined_at has len(A) slots), each pause's forward range
    [forward_from[b], forward_to[b]) and whether any of those ranges holds an empty interval
    (forward_has_empty[0]). Every A start is read once, in order: sortedness is checked for free.
    """
    n_a = a_start.size
    # Sized for the worst case (every interval running at once) so the loop never reallocates:
    # a growable buffer made numba's loop about 10x slower. Untouched pages cost no memory.
    survivors = np.empty(n_a, np.int64)
    n_survivors = 0
    n_joined = 0
    next_a = 0
    k = 0
    previous_start = np.iinfo(np.int64).min
    for b in range(b_lo.size):
        lo = b_lo[b]
        hi = b_hi[b]
        # Survivors started at or before an earlier (so also this) pause's start: a pair iff still running.
        kept = 0
        for s in range(n_survivors):
            a = survivors[s]
            if a_end[a] > lo:
                survivors[kept] = a
                kept += 1
        k += kept
        n_survivors = kept
        # Intervals starting at or before this pause's start: a pair (and a survivor) iff still running.
        # (Each value is loaded once into a local: reloading a_start[next_a] cost about 25%.)
        while next_a < n_a:
            start = a_start[next_a]
            if start > lo:
                break
            if start < previous_start:
                return -1
            previous_start = start
            if a_end[next_a] > lo:
                survivors[n_survivors] = next_a
                n_survivors += 1
                joined_at[n_joined] = next_a
                n_joined += 1
                k += 1
            next_a += 1
        joined_end[b] = n_joined
        forward_from[b] = next_a
        # Intervals starting inside the pause: all pairs, unless empty.
        a = next_a
        while a < n_a:
            start = a_start[a]
            if start >= hi:
                break
            if a_end[a] > start:
                k += 1
            else:
                forward_has_empty[0] = True
            a += 1
        forward_to[b] = a
    if not _sorted_from(a_start, next_a, previous_start):
        return -1
    return k


@njit(cache=True, nogil=True)
def fill_pairs(b_lo, a_start, a_end, joined_at, joined_end, forward_from, forward_to, forward_has_empty,
               out_b, out_a) -> int:
    """Second pass: write the pairs counted by `count_pairs` into preallocated out_b/out_a.

    Replays count_pairs' record instead of rescanning A, so its work is O(len(B) + pairs);
    forward ranges are written without reading A unless they hold empty intervals.
    Pairs come out ordered by b, then by a; returns how many.
    """
    check_empty = forward_has_empty[0]
    survivors = np.empty(joined_end[-1] if joined_end.size else 0, np.int64)  # all that ever joined
    n_survivors = 0
    k = 0
    joined_from = 0
    for b in range(b_lo.size):
        lo = b_lo[b]
        kept = 0
        for s in range(n_survivors):
            a = survivors[s]
            if a_end[a] > lo:
                survivors[kept] = a
                kept += 1
                out_b[k] = b
                out_a[k] = a
                k += 1
        n_survivors = kept
        for j in range(joined_from, joined_end[b]):
            a = joined_at[j]
            survivors[n_survivors] = a
            n_survivors += 1
            out_b[k] = b
            out_a[k] = a
            k += 1
        joined_from = joined_end[b]
        for a in range(forward_from[b], forward_to[b]):
            if check_empty and a_end[a] <= a_start[a]:
                continue
            out_b[k] = b
            out_a[k] = a
            k += 1
    return k


@njit(cache=True, nogil=True)
def overlap_totals(b_start, b_end, a_start, a_end, counts, totals) -> bool:
    """Per pause b: counts[b] += overlapping A intervals, totals[b] += their overlap in ns.

    Same sweep as `count_pairs` with per-pause sums instead of a count (no slack: real overlaps only).
    Returns False, with counts/totals partly filled, if a_start turns out to be unsorted.
    """
    n_a = a_start.size
    # Sized for the worst case (every interval running at once) so the loop never reallocates:
    # a growable buffer made numba's loop about 10x slower. Untouched pages cost no memory.
    survivors = np.empty(n_a, np.int64)
    n_survivors = 0
    next_a = 0
    previous_start = np.iinfo(np.int64).min
    for b in range(b_start.size):
        lo = b_start[b]
        hi = b_end[b]
        count = 0
        total = 0
        kept = 0
        for s in range(n_survivors):
            a = survivors[s]
            end = a_end[a]
            if end > lo:
                survivors[kept] = a
                kept += 1
                count += 1
                total += min(end, hi) - lo
        n_survivors = kept
        while next_a < n_a:
            start = a_start[next_a]
            if start > lo:
                break
            if start < previous_start:
                return False
            previous_start = start
            end = a_end[next_a]
            if end > lo:
                survivors[n_survivors] = next_a
                n_survivors += 1
                count += 1
                total += min(end, hi) - lo
            next_a += 1
        a = next_a
        while a < n_a:
            start = a_start[a]
            if start >= hi:
                break
            end = a_end[a]
            if end > start:
                count += 1
                total += min(end, hi) - start
            a += 1
        counts[b] += count
        totals[b] += total
    return _sorted_from(a_start, next_a, previous_start)
