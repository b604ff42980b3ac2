"""numba kernels of the correlation core (engine/correlate/core.py says what calls them when).

Everything per GIL row runs here, in one pass over rows sorted by start: duplicate rows,
the gil_free sweep, and each pause's columns of pause_impact from its overlap pairs.
Threads and processes are small dense indexes (a few hundred at most); their state lives in
arrays the core keeps between calls. DenseNumbers (a hash table kept across calls) gives those
indexes, and numbers the code values of a GIL file for the reader (engine/ingest/gil.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

NONE = -(1 << 62)  # "no time": no run, no free segment
END = 1 << 62


@njit(cache=True, nogil=True)
def merge_rows(o_start, o_end, o_tidx, o_state, o_carried, o_came, start, end, tidx, state, carried, came):
    """The retained GIL rows (o_*) and a batch of new ones, both sorted by start, merged into
    one run sorted by start (old rows first on ties, as a stable sort of old then new), with
    is_new per row; `came` is the new rows' push number. One pass over both, each row's source
    picked by a select rather than a branch (the two runs interleave at random: a branch per
    row was mispredicted every other row)."""
    n_old, n_new = o_start.size, start.size
    n = n_old + n_new
    r_start, r_end, r_tidx = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    r_state, r_carried, r_came = np.empty(n, np.int8), np.empty(n, np.int64), np.empty(n, np.int64)
    is_new = np.empty(n, np.bool_)
    i = j = k = 0
    while i < n_old and j < n_new:
        old = o_start[i] <= start[j]
        r_start[k] = o_start[i] if old else start[j]
        r_end[k] = o_end[i] if old else end[j]
        r_tidx[k] = o_tidx[i] if old else tidx[j]
        r_state[k] = o_state[i] if old else state[j]
        r_carried[k] = o_carried[i] if old else carried[j]
        r_came[k] = o_came[i] if old else came
        is_new[k] = not old
        i += old
        j += 1 - old
        k += 1
    for i in range(i, n_old):
        r_start[k], r_end[k], r_tidx[k], r_state[k] = o_start[i], o_end[i], o_tidx[i], o_state[i]
        r_carried[k], r_came[k], is_new[k] = o_carried[i], o_came[i], False
        k += 1
    for j in range(j, n_new):
        r_start[k], r_end[k], r_tidx[k], r_state[k] = start[j], end[j], tidx[j], state[j]
        r_carried[k], r_came[k], is_new[k] = carried[j], came, True
        k += 1
    return r_start, r_end, r_tidx, r_state, r_carried, r_came, is_new


@njit(cache=True, nogil=True)
def merge_runs(bounds, start, pid, tid, state, end, key, o_start, o_pid, o_tid, o_state, o_end, o_key) -> None:
    """Sorted runs merged into one run sorted by (start, pid, tid), into the o_ arrays' first
    start.size rows: the arrays hold the runs one after the other, run r at bounds[r]:bounds[r + 1],
    each sorted so; rows equal in all three keep the runs' order (a stable sort, in O(n log runs)).
    A heap of each run's next row, its top replaced by that run's next row at each step; each row
    is written where it goes at once (no order array, no gather after)."""
    heap_start, run = np.empty(bounds.size, np.int64), np.empty(bounds.size, np.int64)  # (next start, run)
    at = bounds[:-1].copy()
    n = 0
    for r in range(bounds.size - 1):
        if at[r] < bounds[r + 1]:
            heap_start[n], run[n] = start[at[r]], r
            n += 1
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(heap_start, run, n, i, pid, tid, at)
    for out in range(start.size):
        r = run[0]
        i = at[r]
        o_start[out], o_pid[out], o_tid[out], o_state[out], o_end[out], o_key[out] = (
            start[i], pid[i], tid[i], state[i], end[i], key[i])
        at[r] += 1
        if at[r] < bounds[r + 1]:
            heap_start[0] = start[at[r]]
        else:
            n -= 1
            heap_start[0], run[0] = heap_start[n], run[n]
        _sift_down(heap_start, run, n, 0, pid, tid, at)


@njit(cache=True, nogil=True, inline="always")
def _tie_before(r1, r2, pid, tid, at) -> bool:
    """Of two runs whose next rows start together, whether R1's comes first (by pid, tid, run)."""
    a, b = at[r1], at[r2]
    if pid[a] != pid[b]:
        return pid[a] < pid[b]
    if tid[a] != tid[b]:
        return tid[a] < tid[b]
    return r1 < r2


@njit(cache=True, nogil=True, inline="always")
def _sift_down(key, run, n, i, pid, tid, at) -> None:
    k, r = key[i], run[i]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and (key[child + 1] < key[child] or (
                key[child + 1] == key[child] and _tie_before(run[child + 1], run[child], pid, tid, at))):
            child += 1
        if key[child] < k or (key[child] == k and _tie_before(run[child], r, pid, tid, at)):
            key[i], run[i] = key[child], run[child]
            i = child
        else:
            break
    key[i], run[i] = k, r


@njit(cache=True, nogil=True)
def keep_before(keep, start, end, tidx, state, carried, came) -> int:
    """Moves the rows i < keep.size where KEEP is true, in order, up against row keep.size;
    returns the first row kept (the rows from there on are the ones to keep)."""
    j = keep.size
    for i in range(keep.size - 1, -1, -1):
        if keep[i]:
            j -= 1
            start[j], end[j], tidx[j], state[j], carried[j], came[j] = start[i], end[i], tidx[i], state[i], carried[i], came[i]
    return j


@njit(cache=True, nogil=True)
def a_row_per_key(keys) -> np.ndarray:
    """Per number 0..max(KEYS): the first row with that key (0 for a number no row has)."""
    n_keys = 0
    for k in keys:
        n_keys = max(n_keys, k + 1)
    rows = np.full(n_keys, -1, np.int64)
    for i in range(keys.size):
        if rows[keys[i]] < 0:
            rows[keys[i]] = i
    return np.maximum(rows, 0)


@njit(cache=True, nogil=True)
def duplicate_rows(start, end, tidx, state, is_new) -> np.ndarray:
    """True for each new row equal (thread, state, start, end) to an earlier row; rows sorted by start."""
    n = start.size
    dup = np.zeros(n, np.bool_)
    run = 0
    for i in range(1, n):
        if start[i] != start[run]:
            run = i
            continue
        if not is_new[i]:
            continue
        for j in range(run, i):
            if not dup[j] and end[j] == end[i] and tidx[j] == tidx[i] and state[j] == state[i]:
                dup[i] = True
                break
    return dup


@njit(cache=True, nogil=True)
def sweep_gil_free(t_pidx, r_tidx, r_start, r_end, i0, i1, frontier, pid_threads_ptr, pid_threads,
                   t_run, t_reach, t_reach_closed, t_open_row, t_seen_end, t_dead, t_alive,
                   p_holding, p_alive, p_in_span, p_span_end, free_since, close_start, close_end,
                   out_pid, out_start, out_end, holders_gone, released_gone, gone_at) -> int:
    """Advance the per-process holder count over rows i0..i1 (sorted by start, all before frontier;
    row i's thread r_tidx[i], its process t_pidx[r_tidx[i]]),
    then over every run end before frontier; write the gil_free segments that became final.

    Per thread: t_run/t_reach (its current run of merged intervals and where it ends; END while an
    open row is in it), t_alive (within its inferred lifetime), t_dead (its lifetime ends with its
    last interval seen). Per process: p_holding (living threads holding the GIL), p_alive,
    p_in_span, p_span_end (the process's span ends there once no thread is alive), free_since
    (start of the free segment now, or NONE) and the last closed segment (close_start/close_end),
    held back because a segment closing and reopening at one instant is one segment. Returns the
    number of segments written. A process's running threads are kept in a min-heap on their
    runs' ends (in the process's slots of pid_threads), built anew each call from t_run.

    First, threads found gone at GONE_AT (a live driver learns it late, from /proc):
    HOLDERS_GONE were counted as holding the GIL since their run ended, RELEASED_GONE were in a
    run held open by an interval that will never close; both stop being alive then. Then one
    loop: the rows, then one step per process at the frontier; each step first applies, in time
    order, the ends of the process's runs before it.

    The helpers are closures over the arrays, not functions they are passed to: numba counts
    references of every array passed at each call, even inlined (two atomic operations an
    array, several calls a row: half of this kernel's time).
    """
    n_pids = p_holding.size
    heap = np.empty(pid_threads.size, np.int64)
    heap_size = np.zeros(n_pids, np.int64)
    pos = np.full(t_run.size, -1, np.int64)

    def emit_closed(p, n_out):  # p's closed free segment, if it has one, out and forgotten
        if close_end[p] != NONE:
            out_pid[n_out] = p
            out_start[n_out] = close_start[p]
            out_end[n_out] = close_end[p]
            n_out += 1
            close_end[p] = NONE
        return n_out

    def open_free(p, t, n_out):  # p becomes free at t: rejoin a segment closed at t, else start anew
        if close_end[p] == t:
            free_since[p] = close_start[p]
            close_end[p] = NONE
        else:
            n_out = emit_closed(p, n_out)
            free_since[p] = t
        return n_out

    def close_free(p, t, n_out):  # p stops being free at t: held back until it cannot rejoin
        if free_since[p] != NONE:
            if free_since[p] < t:
                n_out = emit_closed(p, n_out)
                close_start[p] = free_since[p]
                close_end[p] = t
            free_since[p] = NONE
        return n_out

    def sift_up(base, i):
        th = heap[base + i]
        while i > 0:
            parent = (i - 1) >> 1
            up = heap[base + parent]
            if t_reach[up] <= t_reach[th]:
                break
            heap[base + i] = up
            pos[up] = base + i
            i = parent
        heap[base + i] = th
        pos[th] = base + i

    def sift_down(base, size, i):
        th = heap[base + i]
        while True:
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and t_reach[heap[base + child + 1]] < t_reach[heap[base + child]]:
                child += 1
            down = heap[base + child]
            if t_reach[th] <= t_reach[down]:
                break
            heap[base + i] = down
            pos[down] = base + i
            i = child
        heap[base + i] = th
        pos[th] = base + i

    n_out = 0
    for k in range(holders_gone.size + released_gone.size):
        th = holders_gone[k] if k < holders_gone.size else released_gone[k - holders_gone.size]
        p = t_pidx[th]
        if k < holders_gone.size:
            if not t_alive[th] or t_run[th]:
                continue
            p_holding[p] -= 1
            if p_holding[p] == 0 and p_in_span[p]:
                n_out = open_free(p, gone_at, n_out)
        else:
            if not (t_run[th] and t_open_row[th]):
                continue
            t_run[th] = False
            t_open_row[th] = False
        t_alive[th] = False
        p_alive[p] -= 1
        if p_alive[p] == 0 and gone_at >= p_span_end[p] and p_in_span[p]:
            n_out = close_free(p, gone_at, n_out)
            p_in_span[p] = False

    for p in range(n_pids):
        base = pid_threads_ptr[p]
        for k in range(base, pid_threads_ptr[p + 1]):
            th = pid_threads[k]
            if t_run[th]:
                heap[base + heap_size[p]] = th
                heap_size[p] += 1
                sift_up(base, heap_size[p] - 1)
    for i in range(i0, i1 + n_pids):
        if i < i1:
            s = r_start[i]
            e = r_end[i]
            if e <= s:
                continue
            th = r_tidx[i]
            p = t_pidx[th]
        else:  # the frontier, for each process
            p = i - i1
            s = frontier
            th = -1
            e = s
        base = pid_threads_ptr[p]
        while heap_size[p] > 0 and t_reach[heap[base]] < s:  # the ends of p's runs before s
            best = heap[base]
            best_t = t_reach[best]
            heap_size[p] -= 1
            pos[best] = -1
            if heap_size[p] > 0:
                heap[base] = heap[base + heap_size[p]]
                sift_down(base, heap_size[p], 0)
            t_run[best] = False
            if t_seen_end[best] == best_t and t_dead[best]:
                # Its last interval ended: the thread's inferred lifetime ends here (it did not hold).
                t_alive[best] = False
                p_alive[p] -= 1
                if p_alive[p] == 0 and best_t >= p_span_end[p]:
                    n_out = close_free(p, best_t, n_out)
                    p_in_span[p] = False
            else:
                p_holding[p] += 1
                if p_holding[p] == 1:
                    n_out = close_free(p, best_t, n_out)
        if th < 0:
            n_out = emit_closed(p, n_out)
            continue
        is_open = e >= END
        if t_run[th]:  # touching or overlapping its current run: the run goes on
            if is_open:
                t_open_row[th] = True
            elif e > t_reach_closed[th]:
                t_reach_closed[th] = e
            t_reach[th] = END if t_open_row[th] else t_reach_closed[th]
            sift_down(base, heap_size[p], pos[th] - base)  # its end only moves later
            continue
        t_run[th] = True
        t_open_row[th] = is_open
        t_reach_closed[th] = s if is_open else e
        t_reach[th] = END if is_open else e
        heap[base + heap_size[p]] = th
        heap_size[p] += 1
        sift_up(base, heap_size[p] - 1)
        if not t_alive[th]:
            t_alive[th] = True
            p_alive[p] += 1
            if not p_in_span[p]:
                p_in_span[p] = True
                if p_holding[p] == 0:
                    n_out = open_free(p, s, n_out)
        else:
            p_holding[p] -= 1
            if p_holding[p] == 0:
                n_out = open_free(p, s, n_out)
    return n_out


@njit(cache=True, nogil=True)
def free_columns(pidx, start, end, p_pid):
    """gil_free's columns of the sweep's segments (process index, start, end), copied in one
    pass: pid, start_ns, end_ns, duration_ns; and whether they are in (pid, start) order."""
    n = start.size
    pid = np.empty(n, np.int64)
    s = np.empty(n, np.int64)
    e = np.empty(n, np.int64)
    d = np.empty(n, np.int64)
    in_order = True
    for i in range(n):
        pid[i] = p_pid[pidx[i]]
        s[i] = start[i]
        e[i] = end[i]
        d[i] = end[i] - start[i]
        if i > 0 and (pid[i] < pid[i - 1] or (pid[i] == pid[i - 1] and s[i] < s[i - 1])):
            in_order = False
    return pid, s, e, d, in_order


@njit(cache=True, nogil=True)
def pause_columns(p_start, p_end, p_own_tid, p_whole_vm, pair_b, pair_a, r_tidx, r_state, r_start, r_end,
                  t_tid, t_first, t_life_end, t_jvm, out):
    """pause_impact's per-pause columns from the pairs of each pause (ordered by pause, then GIL start).

    out[b] = threads_released, released_ns, threads_waiting, waiting_ns, overlap_ns, near_misses,
    threads_holding, amplifying_tid (-1: none). A thread holds the GIL during the part of the pause
    inside its lifetime [t_first, t_life_end) not covered by its released/waiting intervals.
    """
    n_threads = t_tid.size
    seen_state = np.full((2, n_threads), -1, np.int64)  # pause index that last counted the thread
    cov_mark = np.full(n_threads, -1, np.int64)
    cov_reach = np.zeros(n_threads, np.int64)
    cov_total = np.zeros(n_threads, np.int64)
    k = 0
    n_pairs = pair_b.size
    for b in range(p_start.size):
        ps = p_start[b]
        pe = p_end[b]
        threads = np.zeros(2, np.int64)
        sums = np.zeros(2, np.int64)
        union = 0
        reach = NONE
        near = 0
        while k < n_pairs and pair_b[k] == b:
            a = pair_a[k]
            k += 1
            lo = max(ps, r_start[a])
            hi = min(pe, r_end[a])
            if lo >= hi:
                near += 1
                continue
            th = r_tidx[a]
            st = r_state[a]
            if seen_state[st, th] != b:
                seen_state[st, th] = b
                threads[st] += 1
            sums[st] += hi - lo
            if lo > reach:  # segment starts never decrease: GIL starts are sorted, clipped at ps
                union += hi - lo
                reach = hi
            elif hi > reach:
                union += hi - reach
                reach = hi
            if cov_mark[th] != b:
                cov_mark[th] = b
                cov_total[th] = hi - lo
                cov_reach[th] = hi
            elif lo > cov_reach[th]:
                cov_total[th] += hi - lo
                cov_reach[th] = hi
            elif hi > cov_reach[th]:
                cov_total[th] += hi - cov_reach[th]
                cov_reach[th] = hi
        holding = 0
        amplifying = -1
        for th in range(n_threads):
            alive = min(pe, t_life_end[th]) - max(ps, t_first[th])
            if alive <= 0:
                continue
            covered = cov_total[th] if cov_mark[th] == b else 0
            if alive - covered > 0:
                holding += 1
                tid = t_tid[th]
                if tid == p_own_tid[b] or (p_whole_vm[b] and t_jvm[th]):
                    if amplifying < 0 or tid < amplifying:
                        amplifying = tid
        out[b, 0] = threads[0]
        out[b, 1] = sums[0]
        out[b, 2] = threads[1]
        out[b, 3] = sums[1]
        out[b, 4] = union
        out[b, 5] = near
        out[b, 6] = holding
        out[b, 7] = amplifying


@njit(cache=True, nogil=True)
def group_bounds(codes, start, end, lo, hi) -> None:
    """Per group code: lo = min start, hi = max end over its non-empty intervals (lo/hi pre-filled)."""
    for i in range(codes.size):
        if end[i] > start[i]:
            c = codes[i]
            if start[i] < lo[c]:
                lo[c] = start[i]
            if end[i] > hi[c]:
                hi[c] = end[i]


@njit(cache=True, nogil=True)
def _number_keys(high, low, at, table_keys, table_used, table_values, n_known, new_keys, numbers) -> int:
    """DenseNumbers.number's pass: from row at[0] on, each key's number into NUMBERS (the key:
    low, or (high << 32) | low when HIGH has rows); a key not in the table (open addressing, a
    power of two long) gets the next number and is listed in new_keys. Stops with the table half
    full (at[0]: the row to go on from); returns how many keys were new."""
    mask = table_keys.size - 1
    n_new = 0
    for i in range(at[0], low.size):
        if 2 * (n_known + n_new + 1) > table_keys.size:
            at[0] = i
            return n_new
        key = (np.int64(high[i]) << 32) | np.int64(low[i]) if high.size else np.int64(low[i])
        slot = ((key * -7046029254386353131) >> 40) & mask  # Fibonacci hashing (2^64 / golden ratio, signed)
        while table_used[slot] and table_keys[slot] != key:
            slot = (slot + 1) & mask
        if not table_used[slot]:
            table_used[slot] = True
            table_keys[slot] = key
            table_values[slot] = n_known + n_new
            new_keys[n_new] = key
            n_new += 1
        numbers[i] = table_values[slot]
    at[0] = low.size
    return n_new


_NO_ROWS = np.zeros(0, np.int64)


class DenseNumbers:
    """Numbers 0, 1, 2, ... for int64 keys, in the order they are first seen (a hash table kept
    from call to call): threads ((pid << 32) | tid) for the core, code values for a GIL file."""

    def __init__(self):
        self.keys = np.zeros(0, np.int64)  # the key of each number
        self._rehash(1024)

    def __len__(self) -> int:
        return int(self.keys.size)

    def _rehash(self, size: int) -> None:
        self._table_keys = np.zeros(size, np.int64)
        self._table_used = np.zeros(size, np.bool_)
        self._table_values = np.zeros(size, np.int64)
        if self.keys.size:
            _number_keys(_NO_ROWS, self.keys, np.zeros(1, np.int64), self._table_keys, self._table_used,
                         self._table_values, 0, np.empty(self.keys.size, np.int64), np.empty(self.keys.size, np.int64))

    def number(self, keys: np.ndarray, high: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The number of each key (int64; with HIGH, the keys are (high << 32) | keys), and the
        keys numbered for the first time (in number order)."""
        keys = np.asarray(keys)
        high = _NO_ROWS if high is None else np.asarray(high)
        numbers = np.empty(keys.size, np.int64)
        new_keys = np.empty(keys.size, np.int64)
        at = np.zeros(1, np.int64)
        n_before = self.keys.size
        while True:
            n_new = _number_keys(high, keys, at, self._table_keys, self._table_used, self._table_values, self.keys.size,
                                 new_keys, numbers)
            self.keys = np.concatenate([self.keys, new_keys[:n_new]])
            if at[0] == keys.size:
                return numbers, self.keys[n_before:]
            self._rehash(4 * self._table_keys.size)


@njit(cache=True, nogil=True)
def overlap_rows(pair_b, pair_a, p_id, p_start, p_end, r_start, r_end, r_tidx, r_state, t_pid, t_tid,
                 pause_id, pid, tid, state, start, end, overlap, slack, near_miss) -> None:
    """The overlaps table's columns for each pair: the overlap, or the gap of a near miss."""
    for k in range(pair_b.size):
        b = pair_b[k]
        a = pair_a[k]
        later_start = max(p_start[b], r_start[a])
        earlier_end = min(p_end[b], r_end[a])
        th = r_tidx[a]
        pause_id[k] = p_id[b]
        pid[k] = t_pid[th]
        tid[k] = t_tid[th]
        state[k] = r_state[a]
        if later_start < earlier_end:
            start[k] = later_start
            end[k] = earlier_end
            overlap[k] = earlier_end - later_start
            slack[k] = 0
            near_miss[k] = False
        else:
            start[k] = earlier_end
            end[k] = later_start
            overlap[k] = 0
            slack[k] = later_start - earlier_end
            near_miss[k] = True


@njit(cache=True, nogil=True)
def code_totals(keep, code, overlap_ns, first_row, sums, counts, first) -> None:
    """Per carried code, of the rows KEEP selects: the sum of overlap_ns, the rows, and the first
    row's number (FIRST_ROW + position; first[c] < 0 until code c is seen)."""
    for i in range(code.size):
        if keep[i]:
            c = code[i]
            sums[c] += overlap_ns[i]
            counts[c] += 1
            if first[c] < 0:
                first[c] = first_row + i
