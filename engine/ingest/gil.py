"""GIL events -> intervals: the `gil` table.

    read_gil(path) -> DataFrame[pid, tid, thread_name, state, start_ns, end_ns, function, file, line]

`state` is 'released' (the thread runs without the GIL: native code, I/O, a JPype call
into Java) or 'waiting' (it asked for the GIL and has not got it yet). Times are
CLOCK_MONOTONIC nanoseconds. Per thread, in the order the thread stamped them:

    DROP -> next TAKE_REQUEST         released
    DROP -> TAKE_ACQUIRED             released (no request stamped in between)
    TAKE_REQUEST -> TAKE_ACQUIRED     waiting

Any other succession (an event lost to a full ring, a thread that ended after its last
DROP) yields no interval. Sampling-backend records (SAMPLE_HELD/SAMPLE_FREE: who holds
the GIL at each change seen) are turned into DROP/TAKE_ACQUIRED first, so their intervals
are as coarse as the sampling period and never 'waiting'.

`function`, `file`, `line`: the Python code the thread was in when it gave the GIL up (the
DROP's code, engine/ingest/codes.py); a waiting interval has the code of the thread's
release before it (a forced switch: the code that was running), or none before any.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit

from engine.correlate.kernels import DenseNumbers
from engine.correlate.schema import END, GIL_STATES
from engine.errors import TandemError
from engine.ingest.codes import NO_FRAME, UNKNOWN, read_code_table, resolve
from engine.ingest.jfr_input import looks_like_jfr
from engine.ingest.segments import SegmentedBlocks, events_blocks
from engine.ring.layout import GIL_DROP, GIL_RECORD_DTYPE, GIL_SAMPLE_FREE, GIL_SAMPLE_HELD, GIL_TAKE_ACQUIRED, GIL_TAKE_REQUEST
from engine.ring.reader import WHOLE_FILE, read_ring
from engine.session import (GIL_CODES, GIL_EVENTS, GIL_RING, PROBE_JSON, PYTHON_DIRS, THREADS_JSONL, gil_segments, has_gil_events,
                            read_json)


# The probe stamps with clock_gettime(CLOCK_MONOTONIC) itself: no conversion, no error.
PROBE_CLOCK = {"domain": "monotonic", "method": "clock_gettime(CLOCK_MONOTONIC)", "error_ns": 0}


def sampling_to_events(mono_ns: np.ndarray, tid: np.ndarray, kind: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Holder changes seen by the sampling backend -> per-thread DROP / TAKE_ACQUIRED.

    Each SAMPLE_HELD(t) or SAMPLE_FREE record ends the previous holder's hold (a DROP for
    it at that sample) and, for SAMPLE_HELD, starts t's (a TAKE_ACQUIRED)."""
    order = np.argsort(mono_ns, kind="stable")
    mono_ns, tid, kind = mono_ns[order], tid[order], kind[order]
    holder = np.where(kind == GIL_SAMPLE_HELD, tid, 0).astype(np.int64)
    previous = np.concatenate([[0], holder[:-1]])
    changed = holder != previous
    drops = changed & (previous != 0)
    takes = changed & (holder != 0)
    out_t = np.concatenate([mono_ns[drops], mono_ns[takes]])
    out_tid = np.concatenate([previous[drops], holder[takes]])
    out_kind = np.concatenate([np.full(drops.sum(), GIL_DROP), np.full(takes.sum(), GIL_TAKE_ACQUIRED)])
    # A drop and a take at the same sample: the drop comes first.
    order = np.lexsort((out_kind != GIL_DROP, out_t))
    return out_t[order].astype(np.int64), out_tid[order].astype(np.int64), out_kind[order].astype(np.int64)


def as_records(mono_ns, tid, kind, aux=None) -> np.ndarray:
    """Events given as arrays, as the probe's records (GIL_RECORD_DTYPE): one layout for the pairing."""
    records = np.zeros(len(mono_ns), GIL_RECORD_DTYPE)
    records["mono_ns"], records["tid"], records["kind"] = mono_ns, tid, kind
    if aux is not None:
        records["aux"] = aux
    return records


def interval_frame(pid: int, tid, state, start, end, code) -> pd.DataFrame:
    """Paired intervals (Pairing.intervals) as the gil table without thread names, with their `code`."""
    return pd.DataFrame({
        "pid": np.full(len(tid), pid, dtype=np.int64),
        "tid": np.asarray(tid, np.int64),
        "thread_name": pd.array([pd.NA] * len(tid), dtype="string"),
        "state": pd.Categorical.from_codes(np.asarray(state, np.int8), categories=list(GIL_STATES)),
        "start_ns": start,
        "end_ns": end,
        "code": code,
    })


def events_to_intervals(mono_ns: np.ndarray, tid: np.ndarray, kind: np.ndarray, pid: int = 0, aux: np.ndarray | None = None,
                        first_code: int = NO_FRAME) -> pd.DataFrame:
    """Released/waiting intervals from GIL events (arrays of equal length, production order).

    Returns the gil table without thread names (column thread_name all missing), rows by
    (start_ns, tid). AUX (the records' aux): the `code` column holds each interval's code
    (engine/ingest/codes.py), 0 without it. FIRST_CODE: see Pairing."""
    records = as_records(mono_ns, tid, kind, aux)
    sampled = np.isin(records["kind"], (GIL_SAMPLE_HELD, GIL_SAMPLE_FREE))
    if sampled.any():
        converted = sampling_to_events(records["mono_ns"][sampled], records["tid"][sampled], records["kind"][sampled])
        records = np.concatenate([records[~sampled], as_records(*converted)])
    return interval_frame(pid, *Pairing(first_code=first_code).intervals(records))


# ---- files ---------------------------------------------------------------------------------


def _events_files(path: Path) -> list[Path]:
    """The events files of a file, a py-<pid> directory or a session directory."""
    if path.is_file() and looks_like_jfr(path):
        raise TandemError(f"{path}: a JFR recording, the JVM side, not GIL events (give it with --jfr)")
    if path.is_file() or gil_segments(path):  # (a recording in segments: FILE.000000, ... beside FILE)
        return [path]
    if has_gil_events(path):
        return [path / GIL_EVENTS]  # (the events file, or the name its segments share: engine/ingest/segments.py)
    found = [d / GIL_EVENTS for d in sorted(path.glob(PYTHON_DIRS)) if has_gil_events(d)]
    if found:
        return found
    raise TandemError(f"{path}: no GIL events here (expected an events file, a py-<pid> directory or a session)")


def _side_file(path: Path, session_name: str, suffix: str) -> Path:
    """A file the probe writes beside its events: SESSION/py-<pid>/<session_name> in a session,
    else FILE<suffix> for `engine.probe.start(FILE)` (FILE.ring names the same recording)."""
    if path.name in (GIL_EVENTS, GIL_RING):
        return path.parent / session_name
    base = path.name[: -len(".ring")] if path.name.endswith(".ring") else path.name
    return path.with_name(base + suffix)


def _description(path: Path) -> dict:
    """probe.json (session layout) or FILE.json (engine.probe.start(FILE)), if present."""
    meta = _side_file(path, session_name=PROBE_JSON, suffix=".json")
    return read_json(meta)


def _thread_names(path: Path, meta: dict) -> dict[int, str]:
    """tid -> name: probe.json's (written at stop) updated by the side file of started threads
    (threads.jsonl / FILE.threads.jsonl), which survives a process that never stopped the probe."""
    names = {int(k): v for k, v in meta.get("thread_names", {}).items()}
    return names | started_threads(_side_file(path, session_name=THREADS_JSONL, suffix=".threads.jsonl"))


def started_threads(side: Path) -> dict[int, str]:
    """tid -> name from the side file the probe appends a line to as each thread starts (a line
    cut short by SIGKILL is skipped)."""
    names = {}
    try:
        lines = side.read_text(errors="replace").splitlines()
    except OSError:
        return names
    for line in lines:
        try:
            entry = json.loads(line)
            names[int(entry["tid"])] = str(entry["name"])
        except (ValueError, KeyError, TypeError):
            continue
    return names


def first_code_of(header) -> int:
    """Pairing's FIRST_CODE for events that begin with HEADER's file: UNKNOWN when positions came
    before it (a segment after the first: what rotation took named those threads' code)."""
    return UNKNOWN if header.lanes["base_head"].any() or header.lanes["base_dropped"].any() else NO_FRAME


def _process_facts(header, meta: dict, lost: int, closed: bool, events: int, reader=None) -> dict:
    """What read_gil says of one process (attrs["processes"]); READER: the events' reader, whose
    `drain_lost` and `window` (a flight recorder's kept segments) count over every segment."""
    facts = {"pid": int(header.producer_pid), "python_version": header.runtime_version, "backend": header.backend,
             "misses": meta.get("misses"), "boot_id": header.boot_id, "dropped": int(lost),
             "drain_lost": int(getattr(reader, "drain_lost", header.drain_lost)), "closed": bool(closed),
             "events": int(events)}
    window = getattr(reader, "window", None)
    if window is not None:
        facts["kept_window"] = window.as_dict()
    return facts


def _load(path: Path):
    """(header, records, lost, closed, read_gil's facts or None) of a drained events file (with the ring's leftovers when
    it was never closed: EventsIntervals) or of a ring file. A ring holds only its last
    `capacity` records (older ones went to the events file): read the events file for a whole
    recording."""
    if path.name.endswith(".ring"):
        header, records, missed = read_ring(path)
        return header, records, int(header.dropped), bool(header.closed), None
    events = EventsIntervals(path, WHOLE_FILE)
    blocks = list(events._records())
    records = np.concatenate(blocks) if len(blocks) > 1 else blocks[0] if blocks else np.zeros(0, events.header.record_dtype)
    return events.header, records, events.process["dropped"], events.process["closed"], events.process


def _ring_leftovers(path: Path, mine, next_seq: np.ndarray):
    """A recording that was never closed (SIGKILL, os._exit, a JVM that exits under Jep): its
    events file holds what the drain thread wrote up to its last pass (at most one drain
    period, 20 ms by default, before the end); the ring file beside it still holds the records
    committed since, so a killed process loses nothing it had stamped. Those records (per
    lane, seq >= next_seq: a record's seq is its lane position + 1 in both files), and the
    ring's drop count (it includes drops after the drain's last pass). (None, 0) when the ring
    is missing, from another producer or unreadable: the events file alone is still whole up
    to its last pass."""
    ring_path = _side_file(path, session_name=GIL_RING, suffix=".ring")
    if not ring_path.exists():
        return None, 0
    try:
        ring, leftovers, _missed = read_ring(ring_path)
    except TandemError:
        return None, 0
    if (ring.producer_pid, ring.boot_id, ring.record_type, ring.lane_count, ring.sync_monotonic_ns) != (
            mine.producer_pid, mine.boot_id, mine.record_type, mine.lane_count, mine.sync_monotonic_ns):
        return None, 0
    return leftovers[leftovers["seq"] >= next_seq[leftovers["lane"].astype(np.intp)]], int(ring.dropped)


# ---- streaming: one process's events file as blocks of intervals ---------------------------


class SampledRecords(Exception):
    """A sampling-backend recording: its records are ordered across threads, not per thread, so
    it is read whole (read_gil), not streamed."""


# Linux thread ids are at most pid_max, 2^22 on 64-bit: a larger one is a damaged record.
TID_AT_MOST = 1 << 22


@njit(cache=True, nogil=True, inline="always")
def _slot_of(slot_hash, slot_tid, th):
    """The entry of thread id TH in SLOT_HASH (open addressing, linear probing; an entry is a
    slot, -1 when free): its slot's, or the free one it would take. Not an array indexed by tid:
    tids run to pid_max, and a session of many short-lived processes (a Spark executor's Python
    workers) has a Pairing per process. The table is kept at most half full by its caller."""
    mask = slot_hash.size - 1
    h = np.int64((np.uint64(th) * np.uint64(11400714819323198485)) >> np.uint64(40)) & mask
    while slot_hash[h] >= 0 and slot_tid[slot_hash[h]] != th:
        h = (h + 1) & mask
    return h


@njit(cache=True, nogil=True)
def _pair_events(mono, tid, kind, aux, slot_hash, slot_tid, last_t, last_k, last_drop, out_slot, out_state, out_start,
                 out_end, out_code, n_slots, write_rows, lo, hi, block_min, at, first_code) -> int:
    """events_to_intervals, one block at a time: each thread's last event (last_t/last_k, and
    the aux of its last DROP) is carried to the next block, so the pairs are those of the whole
    stream. Rows come in the order of their closing events. Returns the intervals made, or -1 at
    a sampling-backend record. n_slots[0]: threads seen so far (slot_hash: _slot_of's table).
    Starts at record at[0] with at[1] rows written; stops early, with at[0] at the record, when
    a new thread finds the slot arrays full (the caller grows them and calls again) or a thread
    id is past TID_AT_MOST (the caller raises), else sets at[0] to the block's size.
    Without `write_rows` the intervals are only measured (the out arrays may be empty): per
    slot the hull of its non-empty intervals (lo/hi), and the block's earliest start
    (block_min[0])."""
    n = at[1]
    cached_tid, s = -1, 0  # (the drain writes a lane's records together: runs of one thread)
    for i in range(at[0], mono.size):
        k = kind[i]
        if k == GIL_SAMPLE_HELD or k == GIL_SAMPLE_FREE:
            return -1
        t = np.int64(mono[i])
        th = np.int64(tid[i])
        if th != cached_tid:
            if th > TID_AT_MOST:
                at[0] = i
                return n
            h = _slot_of(slot_hash, slot_tid, th)
            s = slot_hash[h]
            if s < 0:
                if n_slots[0] >= slot_tid.size:
                    at[0] = i
                    return n
                s = n_slots[0]
                n_slots[0] += 1
                slot_hash[h] = s
                slot_tid[s] = th
                last_k[s] = 0
                last_drop[s] = first_code
                lo[s] = END
                hi[s] = -END
            cached_tid = th
        pk = last_k[s]
        previous = last_t[s]
        state = -1
        if pk == GIL_DROP and (k == GIL_TAKE_REQUEST or k == GIL_TAKE_ACQUIRED):
            state = 0
        elif pk == GIL_TAKE_REQUEST and k == GIL_TAKE_ACQUIRED and t > previous:
            state = 1
        if state >= 0:
            if write_rows:
                out_slot[n] = s
                out_state[n] = state
                out_start[n] = previous
                out_end[n] = t
                out_code[n] = last_drop[s]
            else:
                if previous < block_min[0]:
                    block_min[0] = previous
                if t > previous:
                    if previous < lo[s]:
                        lo[s] = previous
                    if t > hi[s]:
                        hi[s] = t
            n += 1
        if k == GIL_DROP:
            last_drop[s] = aux[i]
        last_k[s] = k
        last_t[s] = t
    at[0] = mono.size
    return n


BUCKET_ROWS_AT_MOST = 64


@njit(cache=True, nogil=True)
def _bucket_sort(tid, state, start, end, code, o_tid, o_state, o_start, o_end, o_code) -> bool:
    """The rows sorted by (start, tid), stably, into o_*: spread into about one bucket a row by
    start, then each bucket insertion-sorted. A block's rows are runs of one thread's rows in
    start order, so a bucket holds a row or two. Returns False, writing nothing, when a bucket
    would hold more than BUCKET_ROWS_AT_MOST rows (starts bunched) or the span of starts overflows
    (the caller sorts otherwise)."""
    n = start.size
    lo, hi = start.min(), start.max()
    if hi - lo < 0:  # (the span overflows int64: garbage times of a damaged file)
        return False
    shift = 0
    while ((hi - lo) >> shift) >= n:
        shift += 1
    n_buckets = ((hi - lo) >> shift) + 1
    first = np.zeros(n_buckets + 1, np.int64)  # first row of each bucket (counts, then their sums)
    for i in range(n):
        first[((start[i] - lo) >> shift) + 1] += 1
    for b in range(n_buckets):
        if first[b + 1] > BUCKET_ROWS_AT_MOST:
            return False
        first[b + 1] += first[b]
    at = first[:n_buckets].copy()
    for i in range(n):
        b = (start[i] - lo) >> shift
        j = at[b]
        at[b] += 1
        o_tid[j], o_state[j], o_start[j], o_end[j], o_code[j] = tid[i], state[i], start[i], end[i], code[i]
    for b in range(n_buckets):
        for j in range(first[b] + 1, first[b + 1]):  # insertion sort by (start, tid); equal rows keep their order
            t, st, s, e, c = o_tid[j], o_state[j], o_start[j], o_end[j], o_code[j]
            k = j - 1
            while k >= first[b] and (o_start[k] > s or (o_start[k] == s and o_tid[k] > t)):
                o_tid[k + 1], o_state[k + 1], o_start[k + 1], o_end[k + 1], o_code[k + 1] = (
                    o_tid[k], o_state[k], o_start[k], o_end[k], o_code[k])
                k -= 1
            o_tid[k + 1], o_state[k + 1], o_start[k + 1], o_end[k + 1], o_code[k + 1] = t, st, s, e, c
    return True


def sort_rows(tid, state, start, end, code):
    """Interval rows sorted by (start, tid), stably (read_gil's order)."""
    rows = (tid, state, start, end, code)
    out = [np.empty_like(a) for a in rows]
    if start.size and _bucket_sort(*rows, *out):
        return out
    order = np.lexsort((tid, start))  # (stable)
    return [a[order] for a in rows]


# Threads a Pairing has room for before it grows (doubling): a process has a few threads.
SLOTS_FIRST = 16


@njit(cache=True, nogil=True)
def _slot_table(tids, size):
    """A _slot_of table of SIZE entries (a power of two) holding TIDS (slot i: tids[i])."""
    table = np.full(size, -1, np.int32)
    for s in range(tids.size):
        table[_slot_of(table, tids, tids[s])] = s
    return table


class Pairing:
    """GIL events paired into intervals per thread (_pair_events), batch after batch: each
    thread's last event, and the code of its last DROP, is carried to the next batch, so the
    intervals are those of the whole stream at once. The tables per thread grow as threads come.
    SOURCE names the events in errors. FIRST_CODE: the code of a thread's intervals before its
    first DROP: NO_FRAME (a thread starts with no Python frame), or UNKNOWN for a stream that
    starts after its beginning (a flight recorder's kept window: that DROP was rotated out)."""

    def __init__(self, source: str = "GIL events", first_code: int = NO_FRAME):
        self.source = source
        self.first_code = np.uint64(first_code)
        self.n_slots = np.zeros(1, np.int64)
        self.last_t, self.last_k = np.zeros(SLOTS_FIRST, np.int64), np.zeros(SLOTS_FIRST, np.int64)
        self.last_drop, self.slot_tid = np.zeros(SLOTS_FIRST, np.uint64), np.zeros(SLOTS_FIRST, np.int64)
        self.lo, self.hi = np.zeros(SLOTS_FIRST, np.int64), np.zeros(SLOTS_FIRST, np.int64)
        self.slot_hash = np.full(2 * SLOTS_FIRST, -1, np.int32)  # (tid -> slot: _slot_of)
        self._none = [np.empty(0, t) for t in (np.int64, np.int8, np.int64, np.int64, np.uint64)]

    def _pair(self, records, out: list, write_rows: bool = True, block_min=None) -> int:
        tid = records["tid"]
        at = np.zeros(2, np.int64)
        while True:
            n = _pair_events(records["mono_ns"], tid, records["kind"], records["aux"], self.slot_hash, self.slot_tid,
                             self.last_t, self.last_k, self.last_drop, *out, self.n_slots, write_rows, self.lo, self.hi,
                             block_min if block_min is not None else np.zeros(1, np.int64), at, self.first_code)
            if n < 0:
                raise SampledRecords(self.source)
            if at[0] == tid.size:
                return n
            at[1] = n  # stopped: a thread id past any Linux one, or a new thread with every slot taken
            th = int(tid[at[0]])
            if th > TID_AT_MOST:
                raise TandemError(f"{self.source}: thread id {th} is beyond any Linux thread id (a damaged file?)")
            size = 2 * self.slot_tid.size
            for name in ("last_t", "last_k", "last_drop", "slot_tid", "lo", "hi"):
                setattr(self, name, np.resize(getattr(self, name), size))
            self.slot_hash = _slot_table(self.slot_tid[:int(self.n_slots[0])], 2 * size)

    def intervals(self, records) -> list[np.ndarray]:
        """The intervals the RECORDS close (tid, state, start_ns, end_ns, code), by (start, tid);
        raises SampledRecords."""
        out = [np.empty(records.size, t) for t in (np.int64, np.int8, np.int64, np.int64, np.uint64)]
        n = self._pair(records, out)
        slot, state, start, end, code = (a[:n] for a in out)
        return sort_rows(self.slot_tid[slot], state, start, end, code)

    def measure(self, records) -> int:
        """Pairs a block without making its rows; returns its earliest start (END if none)."""
        block_min = np.full(1, END, np.int64)
        self._pair(records, self._none, write_rows=False, block_min=block_min)
        return int(block_min[0])

    def open_intervals(self, codes: bool = False) -> tuple[np.ndarray, ...]:
        """(tid, state, start_ns) of each interval open now: its thread's last event is a DROP
        (released) or a TAKE_REQUEST (waiting), and its closing event has not come; CODES: and the
        code it will have (its DROP's, as the closed interval's)."""
        n = int(self.n_slots[0])
        last_k = self.last_k[:n]
        released, waiting = last_k == GIL_DROP, last_k == GIL_TAKE_REQUEST
        open_ = released | waiting
        columns = (self.slot_tid[:n][open_], waiting[open_].astype(np.int8), self.last_t[:n][open_])
        return (*columns, self.last_drop[:n][open_]) if codes else columns

    def forget(self) -> None:
        """No thread has a last event any more (after a gap in the stream): the next events start
        new pairs, as at the start of a stream."""
        self.last_k[:int(self.n_slots[0])] = 0


class EventsIntervals:
    """The gil table of one process's events file, block by block in bounded memory: each
    block's intervals as arrays sorted by start (then tid), with their code (the aux of the
    DROP before them, engine/ingest/codes.py). After a full pass, `process` holds read_gil's
    facts about the process (attrs["processes"])."""

    def __init__(self, events_path: Path, block_records: int = 1 << 20):
        self.path = Path(events_path)
        self.block_records = block_records
        first = events_blocks(self.path, block_records)
        self.header = first.header
        # A flight recorder's segments rotate away: never a file that results can name.
        self.segmented = isinstance(first, SegmentedBlocks)
        self.span = first.span()  # (start, end) of the recording, or None: not known
        self.pid = int(self.header.producer_pid)
        self.meta = _description(self.path)
        # code_numbers' state: the file's codes numbered as they come, and the names they have
        self._code_numbers, self._code_table = DenseNumbers(), None
        self.process: dict = {}

    def blocks(self):
        """(tid, state, start_ns, end_ns, code) arrays per block, in start order (ties by tid);
        raises SampledRecords."""
        pairing = Pairing(str(self.path), first_code_of(self.header))
        for records in self._records():
            yield tuple(pairing.intervals(records))

    def bounds(self) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
        """What one pass of `blocks` would show, without making the rows: each block's earliest
        start (END for a block without intervals), and per thread (tid, lo, hi) the hull of
        its non-empty intervals (lo > hi for a thread without any)."""
        pairing = Pairing(str(self.path), first_code_of(self.header))
        block_min = [pairing.measure(records) for records in self._records()]
        n = int(pairing.n_slots[0])
        return block_min, pairing.slot_tid[:n].copy(), pairing.lo[:n].copy(), pairing.hi[:n].copy()

    def _records(self):
        """The file's record blocks (then, for a file not closed, the ring's leftovers); after
        the last, `process` holds read_gil's facts about the process."""
        reader = events_blocks(self.path, self.block_records)
        yield from reader
        lost = reader.lost
        events = reader.records_read
        if not reader.closed:
            leftovers, ring_dropped = _ring_leftovers(self.path, self.header, reader.next_seq)
            if leftovers is not None:
                lost = max(lost, ring_dropped)
                events += leftovers.size
                if leftovers.size:
                    yield leftovers
        self.process = _process_facts(self.header, self.meta, lost, reader.closed, events, reader)

    def thread_names(self) -> dict[int, str]:
        if not hasattr(self, "_names"):
            self._names = _thread_names(self.path, self.meta)
        return self._names

    def code_numbers(self, code: np.ndarray) -> tuple[np.ndarray, pd.DataFrame | None]:
        """Per row a dense number of its code (the file's codes numbered as they come), and the
        names (function, file, line) of the codes numbered for the first time, in number order
        (None: no new code)."""
        numbers, new = self._code_numbers.number(np.asarray(code, np.uint64).view(np.int64))
        if not new.size:
            return numbers, None
        if self._code_table is None:  # (read when the first code is named: _load names none)
            codes_path = _side_file(self.path, session_name=GIL_CODES, suffix=".codes")
            self._recorded = codes_path.exists()
            self._code_table = read_code_table(codes_path) if self._recorded else {}
        return numbers, resolve(new.view(np.uint64), self._code_table, recorded=self._recorded)


def read_gil(path: str | os.PathLike) -> pd.DataFrame:
    """The gil table of an events file, a ring file (the records it still holds), a
    py-<pid> directory or a whole session (events files preferred over rings).

    df.attrs: `processes` (one dict per process: pid, python_version, backend, misses,
    boot_id, dropped, drain_lost, closed, events), and for a single process the same keys
    at the top level. `dropped` counts events lost to a full ring."""
    frames, processes = [], []
    for events_path in _events_files(Path(path)):
        header, records, lost, closed, process = _load(events_path)
        meta = _description(events_path)
        pid = int(header.producer_pid)
        df = events_to_intervals(records["mono_ns"], records["tid"], records["kind"], pid=pid, aux=records["aux"],
                                 first_code=first_code_of(header))
        codes_path = _side_file(events_path, session_name=GIL_CODES, suffix=".codes")
        code = resolve(df.pop("code").to_numpy(), read_code_table(codes_path), recorded=codes_path.exists())
        df[list(code.columns)] = code
        names = _thread_names(events_path, meta)
        if names:
            df["thread_name"] = df["tid"].map(names).astype("string")
        frames.append(df)
        processes.append(process or _process_facts(header, meta, lost, closed, len(records)))
    df = pd.concat(frames, ignore_index=True)  # (_events_files found one at least, or refused the path)
    df.attrs["processes"] = processes
    df.attrs["clock"] = dict(PROBE_CLOCK)
    if len(processes) == 1:
        df.attrs.update({k: v for k, v in processes[0].items()})
    return df
