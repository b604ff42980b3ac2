"""Who caused a pause: cross-runtime causality (docs/results.md, "Causes").

A JVM pause whose requesting OS thread (`requester_os_thread_id`: the caller of the VM
operation, from JFR's jdk.ExecuteVMOperation) is a Python thread of the session is *caused
by Python*. Linux thread ids are unique on a host while the thread lives; the thread counts
as alive at the pause when its recorded GIL intervals span the pause's start. `Causes` works it
out as the GIL intervals stream past, keeping none of them (and, for the inference below, the
core's overlaps rows).

For such a pause: the Python thread, the Python code it was in (the GIL interval that
contains the request; a thread holding the GIL then has none, so the code of its next
release is given when that came within SITE_WINDOW_NS of the pause's end, else none), the Java frames of its System.gc() call, and whether it held the GIL
through the pause (then every other Python thread that wanted the GIL waited on it:
amplification with its cause).

JPype's GC link (jpype native/common/jp_gc.cpp): after a Python collection that grew the
process past a high-water mark, JPype calls java.lang.System.gc() from the thread that ran
Python's GC, through plain JNI, with the GIL held. That thread is whichever ran the
collection: a Python thread allocating (no Java frame under System.gc()), the main thread
while JPype's native code builds class wrappers at start-up, or JPype's reference-queue
thread, a Java thread, when a Java collection woke it to collect Python's garbage (then
JPype's native methods, `org.jpype.manager.TypeFactoryNative.newWrapper` or
`org.jpype.ref.JPypeReferenceNative.wake`, sit under System.gc()). JPype's Java code never
calls System.gc() (no class of its jar refers to it), so a JPype frame right under it is
JPype's native code. Its shape here: a pause caused by Python, whose thread held the GIL
throughout, whose collection's cause is "System.gc()", and whose System.gc() call has no
caller frame, or a JPype one (when jdk.SystemGC was recorded). A Python thread calling
System.gc() through a JPype method call releases the GIL around the call (JPype does for
every Java call): caused by Python, not the link; a Java method that calls System.gc()
shows as its caller frame.

When JFR names no requester of a System.gc() pause (JDK 17 names no thread attached through
JNI: its jdk.SystemGC event has no thread, the VM operation no caller) and the JVM runs inside a Python process
(JPype: the pause's jvm_pid is a Python pid of the session), the requester is *inferred*
(`cause_inferred`): the one Python thread of that process alive through the pause that held
the GIL through it (tandem's own threads in it, the probe's memory sampler, are never named). A thread that calls System.gc() through JNI stays in the call for the
whole collection; a thread running Python code in the same process runs on through a
collection too, so the inference can name a bystander when a Java thread asked; with two or
more such threads, or none, nothing is inferred; nor when a thread of the process released
the GIL just before the stop began (within CALL_WINDOW_NS) and was still out through the pause,
the shape of a System.gc() call made through a JPype method (then the one holder may be a
bystander, as CI found on the demo). An inferred cause is called JPype's GC link
only when jdk.SystemGC's frames were recorded (JDK 17 records the call, with its frames, but
not the thread attached through JNI) and show no caller outside JPype: without them a Java
thread's own System.gc() cannot be told from the link.

The summary counts stops of the world (engine/correlate/stops.py): the safepoint, GC pause
and collection of one System.gc() are one stop, asked for once.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from engine.correlate.inputs import gil_rows_from_frame
from engine.correlate.kernels import END, code_totals
from engine.correlate.schema import GIL_STATES
from engine.session import PROBE_THREAD_NAMES
from engine.correlate.stops import caused_stops


CAUSE_COLUMNS = ("caused_by_python", "cause_pid", "cause_tid", "cause_thread", "cause_state", "cause_function",
                 "cause_file", "cause_line", "cause_java_frames", "cause_held_gil", "cause_inferred", "jpype_gc_link")
# The pauses table's columns causes and the summary's facts read, when present, beyond the
# core's (engine.correlate.schema.core_columns).
REQUESTER_COLUMNS = ("requester_os_thread_id", "system_gc_os_thread_id")
CAUSE_INPUT_COLUMNS = (*REQUESTER_COLUMNS, "system_gc_frames", "asked_by_tandem", "cause")
SYSTEM_GC = "System.gc()"
STATE_NAMES = np.array(GIL_STATES, object)  # (by a GilRows state code)
# A Python thread calling System.gc() through a JPype method releases the GIL for the call and
# the stop of the world begins tens of microseconds to a millisecond later; JDK 17 names no
# requester for that call either. A release this
# close before a candidate's stop, lasting through the pause, makes the inference stand down.
CALL_WINDOW_NS = 20_000_000
# A thread holding the GIL at a pause's start is placed at the code of its next release when that
# release began at most this long after the pause ended: a holder other threads wait for drops
# the GIL within CPython's switch interval (5 ms) of running again, and a busy machine delays
# that run by tens of milliseconds. Later than that, the thread ran on long enough for the
# release's code not to be where it was: the site is unknown.
SITE_WINDOW_NS = 100_000_000
# The frames of System.gc() itself (JDK 17+: System.gc calls Runtime.gc): the first other
# frame in a call's system_gc_frames is its Java caller.
SYSTEM_GC_OWN_FRAMES = ("java.lang.Runtime.gc", "java.lang.System.gc")
# A caller in this package is one of JPype's native methods (see the module's docstring).
JPYPE_PACKAGE = "org.jpype."
# JPype's reference-queue thread (a Java thread): a Java collection clears the phantom reference
# it keeps to a fresh sentinel object; the thread, woken, runs Python's garbage collection holding
# the GIL (JPypeReferenceQueue.wake -> JPGarbageCollection::triggered -> PyGC_Collect), and JPype's
# callback at that collection's end calls System.gc() when the process grew past its high-water mark.
JPYPE_REFERENCE_WORKER = ("org.jpype.ref.JPypeReferenceNative.wake", "org.jpype.ref.JPypeReferenceQueue.wake",
                          "org.jpype.ref.JPypeReferenceQueue$Worker.run")


def no_causes(n: int) -> dict:
    """CAUSE_COLUMNS of N pauses nobody is known to have asked for."""
    # (from arrays, not from lists of NA: 0.3 s less on 200 k pauses)
    def ints():
        return pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool))

    def text():
        return pd.array(np.full(n, None, object), dtype="string")

    return {
        "caused_by_python": np.zeros(n, bool),
        "cause_pid": ints(),
        "cause_tid": ints(),
        "cause_thread": text(),
        "cause_state": text(),
        "cause_function": text(),
        "cause_file": text(),
        "cause_line": ints(),
        "cause_java_frames": text(),
        "cause_held_gil": pd.arrays.BooleanArray(np.zeros(n, bool), np.ones(n, bool)),
        "cause_inferred": np.zeros(n, bool),
        "jpype_gc_link": np.zeros(n, bool),
    }


def requester_tids(pauses: pd.DataFrame) -> pd.Series:
    """Per pause, the OS thread that asked for it (Int64): the VM operation's caller, else the
    thread of the System.gc() call the pause lies in; none for a pause tandem's agent asked for."""
    missing = pd.Series(pd.array([pd.NA] * len(pauses), dtype="Int64"), index=pauses.index)
    requester = pauses["requester_os_thread_id"].astype("Int64") if "requester_os_thread_id" in pauses.columns else missing
    if "system_gc_os_thread_id" in pauses.columns:
        requester = requester.fillna(pauses["system_gc_os_thread_id"].astype("Int64"))
    if "asked_by_tandem" in pauses.columns:  # (tandem's own start-up is never the service's doing)
        requester = requester.mask(pauses["asked_by_tandem"].fillna(False).astype(bool))
    return requester


def system_gc_caller(frames: str) -> str | None:
    """The method that called System.gc() in a call's frames ("method[:line]; ..."), or None
    (called through JNI from native code with no Java frame under it)."""
    for frame in frames.split("; "):
        method = frame.split(":", 1)[0]
        if method not in SYSTEM_GC_OWN_FRAMES:
            return method
    return None


def _caller_outside_jpype(frames: pd.Series) -> np.ndarray:
    """Per System.gc() call's frames (string or null): its caller is Java code other than JPype's."""
    def outside(text) -> bool:
        caller = system_gc_caller(str(text))
        return caller is not None and not caller.startswith(JPYPE_PACKAGE)

    codes, texts = pd.factorize(frames)  # (a few distinct calls among many pauses)
    answers = np.array([outside(t) for t in texts] + [False], bool)
    return answers[codes]  # (-1, a null: the last, False)


def _system_gc_pauses(pauses: pd.DataFrame) -> np.ndarray:
    """Per pause: it lies in a System.gc() call, or its own cause, or a collection of the same
    JVM overlapping it, is System.gc()."""
    starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    in_call = (pauses["system_gc_os_thread_id"].notna().to_numpy(bool) if "system_gc_os_thread_id" in pauses.columns
               else np.zeros(len(pauses), bool))
    if "cause" not in pauses.columns:
        return in_call
    is_system = (pauses["cause"].astype("string") == SYSTEM_GC).fillna(False).to_numpy(bool)
    out = is_system | in_call
    jvm = pauses["jvm_pid"].astype("Int64").fillna(-1).to_numpy(np.int64) if "jvm_pid" in pauses.columns else np.zeros(len(pauses), np.int64)
    for j in np.unique(jvm[is_system]):  # (a few JVMs): per pause, does a System.gc() one overlap it
        mine = np.flatnonzero(is_system & (jvm == j))
        mine = mine[np.argsort(starts[mine], kind="stable")]
        latest_end = np.maximum.accumulate(ends[mine])  # of the System.gc() pauses starting up to each
        rows = np.flatnonzero(jvm == j)
        before = np.searchsorted(starts[mine], ends[rows], "left")  # those starting before each row ends
        hit = before > 0
        hit[hit] = latest_end[before[hit] - 1] > starts[rows[hit]]
        out[rows[hit]] = True
    return out


def inference_candidates(pauses: pd.DataFrame, stop: np.ndarray, *, requester: pd.Series | None = None,
                         system_gc: np.ndarray | None = None) -> np.ndarray:
    """Per pause: a System.gc() pause JFR names no requester for, of a JVM with a known pid (its
    requester may be inferred: see the module's docstring). `stop`: stops.stop_ids(pauses);
    REQUESTER and SYSTEM_GC: requester_tids(pauses) and _system_gc_pauses(pauses), where the
    caller has them already."""
    if not len(pauses) or "jvm_pid" not in pauses.columns:
        return np.zeros(len(pauses), bool)
    # (a GC pause or collection whose stop's safepoint JFR names a requester for is that one's)
    named = (requester_tids(pauses) if requester is None else requester).notna().to_numpy(bool)
    named_stop = np.isin(stop, stop[named])
    system_gc = _system_gc_pauses(pauses) if system_gc is None else system_gc
    return system_gc & ~named_stop & pauses["jvm_pid"].notna().to_numpy(bool)


@njit(cache=True, nogil=True)
def _dense_in_order(tid, start, threads, lookup):
    """Per row, its thread's index in THREADS (sorted; LOOKUP: those indexes by tid, its last
    entry for any larger tid, or empty where tids are too large for one: then a binary search);
    -1 for rows of no thread asked about. And whether each thread's rows come in start order."""
    dense = np.empty(tid.size, np.int64)
    latest = np.full(threads.size, -(1 << 62), np.int64)
    in_order, last = True, lookup.size - 1
    for r in range(tid.size):
        if last >= 0:
            d = lookup[min(max(tid[r], 0), last)]
        else:
            d = np.searchsorted(threads, tid[r])
            if d == threads.size or threads[d] != tid[r]:
                d = -1
        dense[r] = d
        if d >= 0:
            if start[r] < latest[d]:
                in_order = False
            latest[d] = start[r]
    return dense, in_order


@njit(cache=True, nogil=True)
def _cause_rows(order, dense, pid, state, start, end, q_lo, q_hi, q_s, in_start, in_row, after_start, after_row,
                later_start, later_overlap_start, first_start, first_row, last_start, last_end, c_pids, c_start, c_pid,
                c_end, c_veto, window):
    """One block of GIL rows (ORDER: each thread's rows in start order, ties in input order)
    against the queries of their thread (q_lo[d]:q_hi[d], sorted by pause start s): per query
    the first row holding s (in_*), the first row starting at or after s (after_*), the first
    start after s (later_start) and that of a row of some length (later_overlap_start); per
    thread its first and last row; per inference candidate (c_*: sorted by its stop's start) a
    released row of its process from WINDOW before that start to the pause's end (c_veto). Rows
    found in this block are given by block row (*_row)."""
    def candidate_pid(value) -> bool:  # (a closure: an array passed per row costs two atomic operations)
        for v in c_pids:
            if v == value:
                return True
        return False

    walk_later, walk_after, walk_overlap = q_lo.copy(), q_lo.copy(), q_lo.copy()
    walk_call = np.full(q_lo.size, -1, np.int64)
    n_calls = c_start.size
    for k in range(order.size):
        r = order[k]
        d, a, b = dense[r], start[r], end[r]
        if n_calls and state[r] == 0 and candidate_pid(pid[r]):
            if d >= 0 and walk_call[d] >= 0:
                j = walk_call[d]
                while j < n_calls and c_start[j] < a:
                    j += 1
            else:
                j = np.searchsorted(c_start, a)
            if d >= 0:
                walk_call[d] = j
            while j < n_calls and c_start[j] <= a + window:
                if c_pid[j] == pid[r] and b >= c_end[j]:
                    c_veto[j] = True
                j += 1
        if d < 0:
            continue
        if a < first_start[d]:
            first_start[d], first_row[d] = a, r
        if a >= last_start[d]:
            last_start[d], last_end[d] = a, b
        hi = q_hi[d]
        if b > a:
            walk_overlap[d] = _starts_after(walk_overlap[d], hi, q_s, a, later_overlap_start)
        q = walk_later[d] = _starts_after(walk_later[d], hi, q_s, a, later_start)
        while q < hi and q_s[q] < b:  # (s in [a, b): the row holds s)
            if a < in_start[q]:
                in_start[q], in_row[q] = a, r
            q += 1
        q = walk_after[d]
        while q < hi and q_s[q] <= a:
            if a < after_start[q]:
                after_start[q], after_row[q] = a, r
            q += 1
        walk_after[d] = q


@njit(cache=True, nogil=True)
def _starts_after(q, hi, q_s, a, first):
    """A row starting at A starts after the pauses of queries Q.. whose start is before it: the
    first such start of each (FIRST); returns the first query it does not start after."""
    while q < hi and q_s[q] < a:
        if a < first[q]:
            first[q] = a
        q += 1
    return q


# A query (Causes): a pause, a thread (its index d), the pause's span, whether the query is one
# of an inference candidate's threads, and what the rows answered so far (see _cause_rows; the
# state and code found, as numbers of Causes._states / Causes._sites, 0: none found).
QUERY = (("pause", np.int64, 0), ("d", np.int64, 0), ("s", np.int64, 0), ("e", np.int64, 0), ("pair", np.bool_, False),
         ("in_start", np.int64, END), ("after_start", np.int64, END), ("later_start", np.int64, END),
         ("later_overlap_start", np.int64, END), ("in_row", np.int32, -1), ("after_row", np.int32, -1),
         ("in_state", np.int32, 0), ("in_site", np.int32, 0), ("after_site", np.int32, 0))


# (one query is closed per thread of each candidate: see Causes._close)
HOLDERS_KEPT = len(PROBE_THREAD_NAMES) + 2


class Causes:
    """CAUSE_COLUMNS for every pause of PAUSES, as a stage of the stream: fed the GIL rows block
    by block as they stream past (`push`: GilRows, the watermark after them, and a way to read
    some of them as a gil-table DataFrame); `table()` once everything is fed. The in-memory
    analysis feeds the whole gil table as one block.

    No GIL row is kept, and what is kept per pause stays small whatever the length of the
    session. A query asks, of one thread, about one pause that it may have asked for: the thread
    JFR names, else, for an inference candidate, every thread of its JVM's process alive through
    it (`lifetimes`: pid, tid, start_ns, end_ns, known up front). A query is made once the rows
    reach its pause (once a row of a thread asked about ends at or after its start: no earlier
    row can answer it), and answered by a numba pass per block walking each thread's rows in
    start order against that thread's open queries: the first interval holding the pause's
    start, the first starting at or after it (the code of a holding thread), the first start
    after it (with the former: did the thread overlap the pause). Once the watermark is
    SITE_WINDOW_NS past the pause's end, no later row can change the answer: the query is
    closed into a record of the answer, kept for a named requester and, of a candidate's
    threads, for those no interval overlapped (the possible holders: one a pause, more only
    where events were lost; at most HOLDERS_KEPT). Per thread: its first interval (its pid and
    name) and its last (is the tid this thread's at the time); per candidate whether a thread of
    its process went into a Java call just before its stop (CALL_WINDOW_NS). A block costs its
    rows plus the queries open."""

    def __init__(self, pauses: pd.DataFrame, stop: np.ndarray, lifetimes: pd.DataFrame, *, every_thread: bool = False):
        """EVERY_THREAD: LIFETIMES holds every thread the GIL rows will have (an offline drive's
        first pass): a requester outside them (a Java thread: most requesters) can find no row,
        and gets no query."""
        n = len(pauses)
        self.n = n
        self.system_gc = _system_gc_pauses(pauses)
        # (what `table` reads of the pauses: the requesters' columns are read here only)
        self.frames = pauses["system_gc_frames"] if "system_gc_frames" in pauses.columns else None
        requester = requester_tids(pauses)
        starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
        asked = requester.notna().to_numpy(bool)
        if every_thread:
            asked = asked & np.isin(requester.to_numpy(np.int64, na_value=-1), lifetimes["tid"].to_numpy(np.int64))
        named = np.flatnonzero(asked)
        candidates = (np.flatnonzero(inference_candidates(pauses, stop, requester=requester, system_gc=self.system_gc))
                      if len(lifetimes) else np.zeros(0, np.int64))
        # the queries to make, by pause start: the named requesters', and the candidates' (their threads found then)
        named = named[np.argsort(starts[named], kind="stable")]
        self.named = named, requester.to_numpy(np.int64, na_value=0)[named], starts[named], ends[named]
        del requester
        jvm = pauses["jvm_pid"].to_numpy(np.int64, na_value=-1) if candidates.size else np.zeros(n, np.int64)
        by_start = candidates[np.argsort(starts[candidates], kind="stable")]
        self.candidates = by_start, jvm[by_start], starts[by_start], ends[by_start]
        self.made_named = self.made_candidates = 0
        self.horizon = -END  # (the queries of every pause starting up to it are made)
        mine = lifetimes["pid"].isin(np.unique(jvm[candidates])).to_numpy(bool)
        self.lifetimes = tuple(lifetimes[c].to_numpy(np.int64)[mine] for c in ("pid", "tid", "start_ns", "end_ns"))
        self.threads = np.unique(np.r_[self.named[1], self.lifetimes[1]])
        self.lookup = np.zeros(0, np.int64)  # thread index by tid, as an array when tids are small (Linux: up to 2^22)
        if self.threads.size and 0 <= self.threads[0] and self.threads[-1] < 1 << 23:
            self.lookup = np.full(int(self.threads[-1]) + 2, -1, np.int64)  # (the last entry: any larger tid)
            self.lookup[self.threads] = np.arange(self.threads.size)
        # the candidates by the start of their stop, for the Java-call window
        stop_start = pd.Series(starts).groupby(stop).transform("min").to_numpy(np.int64) if n else starts
        by_stop = candidates[np.argsort(stop_start[candidates], kind="stable")]
        self.c_pause, self.c_start = by_stop, stop_start[by_stop]
        self.c_pid, self.c_end = jvm[by_stop], ends[by_stop]
        self.c_pids = np.unique(self.c_pid)
        self.c_veto = np.zeros(by_stop.size, bool)
        self.open = {name: np.zeros(0, kind) for name, kind, _ in QUERY}  # (sorted by thread, then pause start)
        self.closed: list[dict] = []
        t = self.threads.size
        self.first_start, self.first_row = np.full(t, END, np.int64), np.full(t, -1, np.int64)
        self.last_start, self.last_end = np.full(t, -END, np.int64), np.full(t, -END, np.int64)
        self.first_pid, self.first_name = np.zeros(t, np.int64), np.full(t, None, object)
        self.rows_seen = 0
        self._states: dict = {None: 0}
        self._sites: dict = {(None, None, None): 0}

    def push(self, rows, watermark_ns: int, frame_of) -> None:
        """One block of GIL rows (GilRows; later blocks start at or after WATERMARK_NS).
        FRAME_OF(mask): the rows of a boolean mask as a gil-table DataFrame (thread_name,
        state and the code columns, when the input has them)."""
        self.rows_seen += len(rows)
        if len(rows) and (self.threads.size or self.c_start.size):
            self._walk(rows, frame_of)
        self._close(watermark_ns)

    def _walk(self, rows, frame_of) -> None:
        dense, in_order = _dense_in_order(rows.tid, rows.start_ns, self.threads, self.lookup)
        asked = dense >= 0
        if asked.any():
            self._make_queries(int(rows.end_ns[asked].max()))
        order = np.arange(len(rows)) if in_order else np.lexsort((rows.start_ns, dense))
        q = self.open
        each = np.arange(self.threads.size)
        _cause_rows(order, dense, rows.pid, rows.state, rows.start_ns, rows.end_ns,
                    np.searchsorted(q["d"], each, "left"), np.searchsorted(q["d"], each, "right"), q["s"],
                    q["in_start"], q["in_row"], q["after_start"], q["after_row"], q["later_start"], q["later_overlap_start"],
                    self.first_start, self.first_row, self.last_start, self.last_end,
                    self.c_pids, self.c_start, self.c_pid, self.c_end, self.c_veto, CALL_WINDOW_NS)
        found_in, found_after = np.flatnonzero(q["in_row"] >= 0), np.flatnonzero(q["after_row"] >= 0)
        found_first = np.flatnonzero(self.first_row >= 0)
        if not (found_in.size or found_after.size or found_first.size):
            return
        # The rows found: their code, their state, and a thread's first row's pid and name. Rows
        # that number their code (carried_key) have one row of each code read, not each row.
        taken = np.unique(np.concatenate([q["in_row"][found_in], q["after_row"][found_after]]))
        first_rows = self.first_row[found_first]
        if rows.carried_key is not None and taken.size:
            _, one, code_of = np.unique(rows.carried_key[taken], return_index=True, return_inverse=True)
            read_site = taken[one]
        else:
            read_site, code_of = taken, np.arange(taken.size)
        read = np.zeros(len(rows), bool)
        read[read_site] = read[first_rows] = True
        read_rows = np.flatnonzero(read)
        frame = frame_of(read)
        column = lambda name: (frame[name].to_numpy(object) if name in frame.columns  # noqa: E731
                               else np.full(len(frame), None, object))
        read_sites = _numbered(self._sites, zip(*(column(c).tolist() for c in ("function", "file", "line"))))
        sites = read_sites[np.searchsorted(read_rows, read_site)][code_of]  # (per row of TAKEN)
        in_rows = q["in_row"][found_in]
        q["in_state"][found_in] = _numbered(self._states, STATE_NAMES[rows.state[in_rows]].tolist())
        q["in_site"][found_in] = sites[np.searchsorted(taken, in_rows)]
        q["after_site"][found_after] = sites[np.searchsorted(taken, q["after_row"][found_after])]
        self.first_pid[found_first] = rows.pid[first_rows]
        self.first_name[found_first] = column("thread_name")[np.searchsorted(read_rows, first_rows)]
        q["in_row"][found_in] = q["after_row"][found_after] = self.first_row[found_first] = -1

    def _make_queries(self, horizon: int) -> None:
        """The queries of the pauses starting up to HORIZON (the latest end of a row of a thread
        asked about: a later pause's start is past every row so far)."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        a, self.made_named = self.made_named, int(np.searchsorted(self.named[2], horizon, "right"))
        pause, tid, s, e = (column[a:self.made_named] for column in self.named)
        a, self.made_candidates = self.made_candidates, int(np.searchsorted(self.candidates[2], horizon, "right"))
        c_pause, jvm, c_s, c_e = (column[a:self.made_candidates] for column in self.candidates)
        at, pair_tid = _alive_threads(jvm, c_s, c_e, *self.lifetimes)
        made = {"pause": np.r_[pause, c_pause[at]], "s": np.r_[s, c_s[at]], "e": np.r_[e, c_e[at]],
                "d": np.searchsorted(self.threads, np.r_[tid, pair_tid]),
                "pair": np.r_[np.zeros(pause.size, bool), np.ones(at.size, bool)]}
        if not made["pause"].size:
            return
        both = {name: np.r_[self.open[name], made[name] if name in made else np.full(made["pause"].size, fill, kind)]
                for name, kind, fill in QUERY}
        order = np.lexsort((both["s"], both["d"]))
        self.open = {name: values[order] for name, values in both.items()}

    def _close(self, watermark_ns: int, every: bool = False) -> None:
        """Close the queries no row to come can change (their pause ended SITE_WINDOW_NS before
        WATERMARK_NS; EVERY: all), keeping the record of each that can name a requester."""
        q = self.open
        done = np.ones(q["e"].size, bool) if every else q["e"] + SITE_WINDOW_NS < watermark_ns
        if not (every or done.any()):  # (EVERY adds a part even if empty: `table` reads one at least)
            return
        r = {name: values[done] for name, values in q.items()}
        self.open = {name: values[~done] for name, values in q.items()}
        s, e, inside = r["s"], r["e"], r["in_start"] != END
        # held: no interval of the thread from the pause's start to its end (a zero-length pause
        # inside a release counts as not held); the inference asks that no interval overlapped
        # the pause by a nanosecond or more, as the core's overlaps rows do
        held = ~((inside & ((s < e) | (r["in_start"] < s))) | (r["later_start"] < e))
        overlapped = (inside & (s < e)) | (r["later_overlap_start"] < e)
        # a holding thread's site: that of its next release when it came within SITE_WINDOW_NS of
        # the pause's end (else unknown: code from long after is not where it was)
        near = inside | (r["after_start"] - e <= SITE_WINDOW_NS)
        site = np.where(inside, r["in_site"], np.where(near, r["after_site"], 0))
        # (a named thread with no row before the pause is not that tid's thread then)
        keep = np.where(r["pair"], ~overlapped, self.first_start[r["d"]] <= s)
        # A candidate's possible holders: a thread with no interval at the pause held the GIL or
        # lost its events, so a lossy session can have many. Past HOLDERS_KEPT, two at least are
        # not tandem's own (names are known only at the end): nothing is inferred whichever are kept.
        holders = np.flatnonzero(keep & r["pair"])
        holders = holders[np.argsort(r["pause"][holders], kind="stable")]
        _, first, count = np.unique(r["pause"][holders], return_index=True, return_counts=True)
        keep[holders[np.arange(holders.size) - np.repeat(first, count) >= HOLDERS_KEPT]] = False
        self.closed.append({"pause": r["pause"][keep], "d": r["d"][keep], "s": s[keep], "pair": r["pair"][keep],
                            "inside": inside[keep], "state": r["in_state"][keep], "site": site[keep], "held": held[keep]})

    def _name_threads(self, thread_names) -> None:
        """The threads seen whose rows gave no name named by THREAD_NAMES (see `table`): the summary
        names them, and tandem's own threads are known as such (never an inferred requester)."""
        unnamed = np.flatnonzero((self.first_start != END) & np.array([n is None for n in self.first_name.tolist()], bool))
        if unnamed.size:
            keys = (self.first_pid[unnamed] << 32) | self.threads[unnamed]
            names = thread_names(keys)
            for d, key in zip(unnamed.tolist(), keys.tolist()):
                self.first_name[d] = names.get(key)

    def _requesters(self, closed: dict) -> np.ndarray:
        """Per pause, the record in CLOSED of its requester (-1: none): the named one, else the
        inferred one: the one thread of a candidate's process alive through it that no interval
        overlapped, unless a thread of that process went into a Java call just before the stop
        and was in it to the end."""
        record = np.arange(closed["pause"].size)
        out = np.full(self.n, -1, np.int64)
        out[closed["pause"][~closed["pair"]]] = record[~closed["pair"]]
        # (tandem's own threads in the service ask for no collection: a pause they ran through is not theirs)
        own = np.array([isinstance(name, str) and name in PROBE_THREAD_NAMES for name in self.first_name.tolist()], bool)
        holding = closed["pair"] & ~own[closed["d"]]
        count = np.bincount(closed["pause"][holding], minlength=self.n)
        one = holding & (count[closed["pause"]] == 1)
        inferred = np.full(self.n, -1, np.int64)
        inferred[closed["pause"][one]] = record[one]
        inferred[self.c_pause[self.c_veto]] = -1
        return np.where(out >= 0, out, inferred)

    def table(self, thread_names=None) -> "PauseCauses":
        """CAUSE_COLUMNS of the pauses (by pauses table row) once every block was pushed.
        THREAD_NAMES(keys): per thread ((pid << 32) | tid) whose rows came without a name, its
        name (dict), from a source that reads names apart from the rows (ParquetGil)."""
        if thread_names is not None:
            self._name_threads(thread_names)
        self._close(END, every=True)
        closed = {name: np.concatenate([part[name] for part in self.closed]) for name in self.closed[0]}
        record = self._requesters(closed) if self.n else np.zeros(0, np.int64)
        if self.n == 0 or not (record >= 0).any() or self.rows_seen == 0:
            return PauseCauses.none(self.n)
        pause = np.flatnonzero(record >= 0)
        k = record[pause]
        d, s = closed["d"][k], closed["s"][k]
        # the tid is this thread's at the time: not before its first interval, not after its last
        ok = (self.first_start[d] <= s) & (self.last_end[d] >= s)
        pause, k, d = pause[ok], k[ok], d[ok]
        out = no_causes(pause.size)  # (one row per pause caused by Python, in table order)
        out["caused_by_python"][:] = True
        inferred = closed["pair"][k]
        out["cause_inferred"] = inferred
        out["cause_pid"][:] = self.first_pid[d]
        out["cause_tid"][:] = self.threads[d]
        out["cause_thread"][:] = pd.array(self.first_name[d], dtype="string")
        states = np.array(list(self._states), object)  # (dicts keep their order: number -> value)
        out["cause_state"][:] = pd.array(np.where(closed["inside"][k], states[closed["state"][k]], "holding"), dtype="string")
        codes = np.empty((len(self._sites), 3), object)
        codes[:] = list(self._sites)
        for j, name in enumerate(("function", "file", "line")):
            out[f"cause_{name}"][:] = pd.array(codes[closed["site"][k], j], dtype="Int64" if name == "line" else "string")
        held = closed["held"][k]
        out["cause_held_gil"][:] = held
        outside_jpype, frames_known = np.zeros(pause.size, bool), np.zeros(pause.size, bool)
        if self.frames is not None:
            frames = self.frames.iloc[pause].astype("string")
            out["cause_java_frames"][:] = frames.array
            outside_jpype, frames_known = _caller_outside_jpype(frames), frames.notna().to_numpy(bool)
        out["jpype_gc_link"] = held & self.system_gc[pause] & ~outside_jpype & (~inferred | frames_known)
        return PauseCauses(self.n, pause, out)


class PauseCauses:
    """CAUSE_COLUMNS of a pauses table (Causes.table): kept for the pauses caused by Python
    only (ROWS, their table rows, ascending; CAUSED, their columns), the others having none. A
    column per pause of each would be the largest thing at the end of a long session."""

    def __init__(self, n: int, rows: np.ndarray, caused: dict):
        self.n, self.rows, self.caused = n, rows, caused

    @classmethod
    def none(cls, n: int) -> "PauseCauses":
        return cls(n, np.zeros(0, np.int64), no_causes(0))

    def take(self, at: np.ndarray) -> dict:
        """CAUSE_COLUMNS of the table rows AT (any order, repeats allowed)."""
        out = no_causes(at.size)
        j = np.searchsorted(self.rows, at).clip(0, max(self.rows.size - 1, 0))
        found = self.rows[j] == at if self.rows.size else np.zeros(at.size, bool)
        if found.any():
            for name, values in self.caused.items():
                out[name][found] = values[j[found]]
        return out

    def frame(self) -> pd.DataFrame:
        """Every pause's CAUSE_COLUMNS, in table order."""
        return pd.DataFrame(self.take(np.arange(self.n)))


class PauseRows:
    """A pauses table's rows found by pause_id: its ids sorted once, for every batch of
    pause_impact rows `with_causes` completes."""

    def __init__(self, pauses: pd.DataFrame):
        self.ids = pauses["pause_id"].to_numpy(np.int64)
        self.order = np.argsort(self.ids, kind="stable")
        in_order = self.ids[self.order]
        self.unique = not bool((in_order[1:] == in_order[:-1]).any())

    def of(self, wanted: np.ndarray) -> np.ndarray:
        """The row of each of WANTED (pause_ids); ValueError unless each names one pause of the table."""
        ids = self.ids
        at = self.order[np.searchsorted(ids, wanted, sorter=self.order).clip(0, max(ids.size - 1, 0))] if ids.size else wanted
        if (wanted.size and (not ids.size or (ids[at] != wanted).any())) or not self.unique:
            raise ValueError("pause_impact rows and the pauses table do not name the same pauses once each")
        return at


def with_causes(impact: pd.DataFrame, pauses: PauseRows, stop: np.ndarray, causes: PauseCauses) -> pd.DataFrame:
    """pause_impact with the stop each pause belongs to (`stop`: engine/correlate/stops.py,
    stop_ids) and who asked for it, when it was a Python thread (`causes`: Causes.table)."""
    at = pauses.of(impact["pause_id"].to_numpy(np.int64))
    out = impact.reset_index(drop=True)
    columns = {"stop_id": np.asarray(stop, np.int64)[at]}
    columns.update(causes.take(at))
    return pd.concat([out, pd.DataFrame(columns)], axis=1)


def warm_up() -> None:
    """Load the numba kernels Causes calls (numba compiles or reads its cache at a kernel's first
    call, holding the GIL): a live run does it before its first pauses are due."""
    pauses = pd.DataFrame({"pause_id": [0], "kind": ["safepoint"], "name": ["warm-up"], "start_ns": [100], "end_ns": [200],
                           "requester_os_thread_id": pd.array([7], dtype="Int64")})
    gil = pd.DataFrame({"pid": [1], "tid": [7], "state": pd.Categorical(["released"], categories=list(GIL_STATES)),
                        "start_ns": [50], "end_ns": [150]})
    causes = Causes(pauses, pauses["pause_id"].to_numpy(np.int64), pd.DataFrame(columns=["pid", "tid", "start_ns", "end_ns"]))
    causes.push(gil_rows_from_frame(gil), END, lambda mask: gil[mask])
    causes.table()


def _numbered(known: dict, values) -> np.ndarray:
    """Per value, its number in KNOWN (value -> number, numbered as first seen; new ones added)."""
    return np.fromiter((known.setdefault(v, len(known)) for v in values), np.int32)


def _alive_threads(jvm, starts, ends, l_pid, l_tid, l_start, l_end):
    """(index, tid) of every thread (L_*: lifetimes) of each candidate's JVM process (JVM, its
    pid) alive through it (STARTS, ENDS)."""
    at, tids = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for pid in np.unique(jvm):  # (a few JVMs, each a few threads)
        mine, threads = np.flatnonzero(jvm == pid), np.flatnonzero(l_pid == pid)
        alive = (l_start[threads][None, :] <= starts[mine][:, None]) & (l_end[threads][None, :] >= ends[mine][:, None])
        c, t = np.nonzero(alive)
        at.append(mine[c])
        tids.append(l_tid[threads[t]])
    return np.concatenate(at), np.concatenate(tids)


class CodeHits:
    """The summary's code hit most: exact overlaps rows per (function, file, line), total
    overlap_ns ("sum") and rows ("size"), in order of first appearance. A sink of the driver
    (engine/correlate/drive.py): the rows added up by their carried code (Rows.overlaps_code),
    not by text. leaders: the pause_ids leading a stop of the world (engine/correlate/stops.py):
    only their rows count, so a stop's safepoint, GC pause and collection hit a release once."""

    def __init__(self, leaders: np.ndarray | None):
        self.leaders = None if leaders is None else np.asarray(leaders, np.int64)
        self.sums = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)  # the first row (over every part) of each code; -1: none
        self.rows_added = 0

    @classmethod
    def of(cls, pauses: pd.DataFrame, stop: np.ndarray) -> "CodeHits":
        """The hits of the pauses leading a stop (STOP: stop_ids of PAUSES)."""
        pause_id = pauses["pause_id"].to_numpy(np.int64)
        return cls(pause_id[stop == pause_id])

    def rows(self, step, rows) -> None:
        if rows.overlaps_code is not None and rows.overlaps.num_rows:
            overlaps = rows.overlaps
            self.add(*(overlaps.column(c).to_numpy() for c in ("pause_id", "overlap_ns", "near_miss")), rows.overlaps_code)

    def add(self, pause_id: np.ndarray, overlap_ns: np.ndarray, near_miss: np.ndarray, code: np.ndarray) -> None:
        keep = ~near_miss
        if self.leaders is not None:
            keep &= np.isin(pause_id, self.leaders)
        if code.size and int(code.max()) >= self.sums.size:
            grow = max(int(code.max()) + 1, 2 * self.sums.size) - self.sums.size
            self.sums = np.concatenate([self.sums, np.zeros(grow, np.int64)])
            self.counts = np.concatenate([self.counts, np.zeros(grow, np.int64)])
            self.first = np.concatenate([self.first, np.full(grow, -1, np.int64)])
        code_totals(keep, code.astype(np.int64, copy=False), overlap_ns.astype(np.int64, copy=False), self.rows_added,
                    self.sums, self.counts, self.first)
        self.rows_added += code.size

    def table(self, carried: pa.Table | None) -> pa.Table | None:
        """The hits (function, file, line, sum, size), or None if no row carried a function."""
        if carried is None or "function" not in carried.column_names or not self.rows_added:
            return None
        seen = np.flatnonzero(self.counts)
        seen = seen[np.argsort(self.first[seen], kind="stable")]  # in order of first appearance
        keyed = (_code_keys(carried.take(pa.array(seen, pa.int64())))
                 .append_column("sum", pa.array(self.sums[seen])).append_column("size", pa.array(self.counts[seen])))
        return add_code_hits([keyed])  # (codes whose text is alike add up)


def _code_keys(table: pa.Table) -> pa.Table:
    """TABLE's (function, file, line) as the hits group them, nulls filled."""
    def column(name, kind):  # (a gil table may carry some of the three only)
        if name in table.column_names:
            return table.column(name).cast(kind)
        return pa.nulls(table.num_rows, kind)

    return pa.table({"function": pc.fill_null(column("function", pa.string()), "<not recorded>"),
                     "file": pc.fill_null(column("file", pa.string()), ""),
                     "line": pc.fill_null(column("line", pa.int64()), -1)})


def add_code_hits(parts: list[pa.Table]) -> pa.Table:
    both = pa.concat_tables(parts)
    total = both.group_by(["function", "file", "line"], use_threads=False).aggregate([("sum", "sum"), ("size", "sum")])
    return total.rename_columns([{"sum_sum": "sum", "size_sum": "size"}.get(c, c) for c in total.column_names])




def why_facts(impact: pd.DataFrame, hits: pa.Table | None, pauses: pd.DataFrame, stop: np.ndarray, top: int = 5) -> dict:
    """For the summary: the Python code hit most (HITS, CodeHits.table), the causes by Python
    (per thread and code: stops of the world asked for, their total duration, how many with
    the GIL held, how many JPype's GC link); each stop counts once (`caused_stops`), and
    `jpype_gc_link_stops` is the sum of the per-cause link counts over every cause; and the
    stops tandem's agent asked for as it started (`tandem_start`: stops, duration_ns). IMPACT:
    pause_impact rows with their causes; it reads those caused by Python only (all it is given
    by `tandem analyze`, which completes the table a batch at a time)."""
    facts: dict = {"functions_hit": [], "caused_by_python": [], "jpype_gc_link_stops": 0,
                   "tandem_start": _tandem_start(pauses, stop)}
    if hits is not None and hits.num_rows:
        hit = hits.to_pandas().set_index(["function", "file", "line"])
        for (function, file, line), row in hit.sort_values("sum", ascending=False, kind="stable").head(top).iterrows():
            facts["functions_hit"].append({"function": function, "file": file, "line": int(line) if line >= 0 else None,
                                           "overlap_ns": int(row["sum"]), "overlaps": int(row["size"])})
    if "caused_by_python" in impact.columns and impact["caused_by_python"].any():
        caused = caused_stops(impact).assign(
            thread=lambda d: d["cause_thread"].fillna(d["cause_tid"].astype("string")),
            function=lambda d: d["cause_function"].fillna("<site unknown>"), file=lambda d: d["cause_file"].fillna(""),
            line=lambda d: d["cause_line"].fillna(-1),
            java_frames=lambda d: (d["cause_java_frames"] if "cause_java_frames" in d.columns
                                   else pd.Series(pd.NA, index=d.index, dtype="string")).fillna(""))
        grouped = caused.groupby(["thread", "function", "file", "line", "java_frames"], sort=False).agg(
            stops=("pause_id", "size"), duration_ns=("duration_ns", "sum"), held_gil=("cause_held_gil", "sum"),
            jpype_gc_link=("jpype_gc_link", "sum"), inferred=("cause_inferred", "sum"))
        for (thread, function, file, line, frames), row in grouped.sort_values("duration_ns", ascending=False).iterrows():
            facts["jpype_gc_link_stops"] += int(row["jpype_gc_link"])
            if len(facts["caused_by_python"]) < top:
                fact = {
                    "thread": thread, "function": function, "file": file, "line": int(line) if line >= 0 else None,
                    "java_frames": frames or None, "stops": int(row["stops"]), "duration_ns": int(row["duration_ns"]),
                    "held_gil": int(row["held_gil"]), "jpype_gc_link": int(row["jpype_gc_link"]),
                    "inferred": int(row["inferred"])}
                if any(frame.split(":", 1)[0] in JPYPE_REFERENCE_WORKER for frame in (frames or "").split("; ")):
                    mine = caused[(caused["thread"] == thread) & (caused["java_frames"] == frames)]
                    fact["set_off_by"] = _collections_before(mine["pause_id"].to_numpy(np.int64), pauses)
                facts["caused_by_python"].append(fact)
    return facts


def _collections_before(stops: np.ndarray, pauses: pd.DataFrame) -> list[dict]:
    """For stops asked for by JPype's reference-queue thread: the Java collection of the same JVM
    that ended last before each began (the one whose clearing of JPype's sentinel woke the
    thread), counted by collector and cause; stops with none recorded before them count under
    collector None. One sort and search per JVM, not a scan of the collections per stop."""
    jvm = (pauses["jvm_pid"].astype("Int64").fillna(-1).to_numpy(np.int64) if "jvm_pid" in pauses.columns
           else np.full(len(pauses), -1, np.int64))
    end = pauses["end_ns"].to_numpy(np.int64)
    is_gc = pauses["kind"].astype(str).to_numpy() == "gc"
    asked = pd.Series(np.arange(len(pauses)), index=pauses["pause_id"].to_numpy(np.int64))[stops].to_numpy()
    found: dict = {}
    for j in np.unique(jvm[asked]):  # (a few JVMs; a stop of no known JVM looks at every collection)
        mine = np.flatnonzero(is_gc & (jvm == j)) if j >= 0 else np.flatnonzero(is_gc)
        mine = mine[np.lexsort((-mine, end[mine]))]  # by end; of equal ends, the first row last
        these = asked[jvm[asked] == j]
        for at in np.searchsorted(end[mine], pauses["start_ns"].to_numpy(np.int64)[these], "right") - 1:
            last = pauses.iloc[mine[at]] if at >= 0 else None
            key = (None, None) if last is None else (str(last["name"]), None if pd.isna(last.get("cause")) else str(last["cause"]))
            found[key] = found.get(key, 0) + 1
    return [{"collector": collector, "cause": cause, "stops": n} for (collector, cause), n in found.items()]


def _tandem_start(pauses: pd.DataFrame, stop: np.ndarray) -> dict | None:
    """The stops of the world tandem's agent asked for as it started its recording (the pauses
    table's asked_by_tandem), and their length (each stop's leading row), or None."""
    if "asked_by_tandem" not in pauses.columns:
        return None
    own = pauses["asked_by_tandem"].fillna(False).to_numpy(bool)
    if not own.any():
        return None
    stops = np.unique(stop[own])
    leading = np.isin(pauses["pause_id"].to_numpy(np.int64), stops)
    length = pauses["end_ns"].to_numpy(np.int64) - pauses["start_ns"].to_numpy(np.int64)
    return {"stops": int(stops.size), "duration_ns": int(length[leading].sum())}
