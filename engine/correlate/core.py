"""The correlation core: pauses and GIL intervals in, final rows of every result table out.

    core = Correlator(slack_ns=S, lifetimes=...)
    rows = core.push(pauses=..., gil=..., watermark_ns=W)   # any number of times
    rows = core.finish()                                     # everything still pending
    core.summary()                                           # the summary table so far
    core.stops()                                             # the same, one stop of the world once

A push with watermark W promises that no row pushed later starts before W (a GIL row that
does is refused; a driver that cannot promise it for every row says how far back late rows may
start with `retain_ns`: they are accepted and counted, below). A pause is *final* once nothing still to come can change its rows: every
later GIL interval starts at or after W > end + S, and who held the GIL is known up to its
end. Its overlaps rows and its pause_impact row are then emitted, in pause start order, and
gil_free rows as soon as their end is known. `tandem analyze` drives the core over a whole
session block by block; the union of what any sequence of pushes emits is the same as one
push then finish (tests/test_correlate.py checks it with random window edges).

Who holds the GIL depends on thread lifetimes, which are inferred (docs/results.md,
"gil_free"): a thread lives from its first interval's start to its last interval's end. That
last end is a fact about the future: the driver says what it knows through `lifetimes`
(offline: a first pass over the session; live: /proc). Without it, gil_free and
pause_impact of the time after a thread's latest interval wait for `finish()`.

A live driver (engine/live/runner.py) adds two things an offline pass does not need:

- `open`: the GIL intervals open now (a thread released or waiting whose closing event has
  not come; a main thread blocked in a call, for minutes). Each push names all of them; one
  starting before W is held as a row with end END: its pairs with a pause final now are
  already exact (it covers the pause's end and more), and who holds the GIL knows the thread
  is not holding. Its closed row, when it comes, replaces it (it starts before W: it is not
  late). One that stops being named without closing (its thread exited while released, or
  the stream had a gap) is dropped, as offline has no such interval; rows already emitted
  with it stay (docs/live.md, "Weak points").
- `eager_pairs`: an overlaps row with a closed GIL interval is a fact no later row changes, so
  it comes out at the push where the second of its two members came (the pause, or the
  interval closed), not when the pause is final: a live view shows a pause's effect on Python
  a step after it is read. Pairs with intervals still open, pause_impact and gil_free wait for
  finality as before. The union of the rows is the same; their order is not pause order.
- `retain_ns`: pauses may arrive late (a JVM's repository-only pauses come seconds after
  their end). GIL rows and gil_free segments are kept `retain_ns` behind W, so a late pause
  starting no earlier than that gets the rows offline gives it; it is emitted when it comes,
  after pauses that started later. Late GIL rows that close no open one are accepted too:
  pending pauses pair with them, pauses already final and the gil_free rows already swept do
  not (counted: `late_gil_rows`).

`Lifetimes` may also say a thread or process is GONE (/proc: it has exited): its lifetime
ended with its latest interval. A thread already counted as holding the GIL past that end
(the sweep went there while it still ran) stops holding at the frontier it is found gone at.

Memory: the pauses not final yet, the GIL intervals they or later pauses may still pair with
(end >= min(W - retain_ns, oldest pending pause start) - S), rows not swept yet, and one entry
per thread and per process; the summary's input, a few bytes per final pause.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.correlate import kernels
from engine.correlate.schema import END, GIL_STATES, SCHEMAS, WHOLE_VM_KINDS, empty_table, state_strings
from engine.correlate.stops import STOP_KEY, at_safepoint_of, jvm_of, jvm_threads, leader_rows, order_stops, stop_ids_of
from engine.correlate.summary import summary_table
from engine.errors import TandemError
from engine.join.kernels import is_sorted
from engine.join.pairs import overlap_pairs, overlap_totals


NONE = kernels.NONE
# Lifetimes: gone (exited): its lifetime ended with its latest interval.
GONE = NONE + 1
# What summary() and stops() need of a final pause (a driver that does not keep every
# pause_impact row): its (part_of, kind, name) as a number of Correlator._stop_keys (part_of: the
# stop of the world it is inside, engine/correlate/stops.py), its overlap and flags. 15 bytes a
# pause over a long run; the summary's input is remade of them (SUMMARY_INPUT).
FINAL_PAUSE = np.dtype([("key", np.int32), ("overlap_ns", np.int64), ("hit_python", np.bool_),
                        ("near_misses", np.bool_), ("amplified", np.bool_)])
SUMMARY_INPUT = ("kind", "name", "overlap_ns", "hit_python", "near_misses", "amplified", "part_of")
# What the stop of a pause is found from (engine/correlate/stops.py), as columns of the pauses kept.
STOP_ARRAYS = ("pause_id", "kind", "name", "start_ns", "end_ns", "_jvm", "_at_safepoint")


class RecordsOffHeap:
    """Records appended a push at a time and kept for the whole run, in an anonymous mapping of
    their own (grown by doubling), not in glibc's heap: there, each push's few kilobytes would
    sit between the blocks' large temporaries for good, leaving holes later blocks cannot reuse
    (the heap of a long session would grow with them)."""

    def __init__(self, dtype: np.dtype):
        self._records = np.zeros(0, dtype)
        self._size = 0

    def append(self, rows: np.ndarray) -> None:
        end = self._size + rows.size
        if end > self._records.size:
            capacity = max(end, 2 * self._records.size, mmap.PAGESIZE // self._records.itemsize)
            grown = np.frombuffer(mmap.mmap(-1, capacity * self._records.itemsize), self._records.dtype)
            grown[:self._size] = self._records[:self._size]
            self._records = grown  # (the mapping is unmapped with the last array over it)
        self._records[self._size:end] = rows
        self._size = end

    def records(self) -> np.ndarray:
        """The records so far: a view, until the next append (a long run's are MiBs)."""
        return self._records[:self._size]


@dataclass
class GilRows:
    """A batch of GIL intervals as arrays: state 0 released, 1 waiting; `carried`: the columns of
    schema.GIL_CARRIED_COLUMNS the table has, which the overlaps rows carry."""

    pid: np.ndarray
    tid: np.ndarray
    state: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    carried: pa.Table | None = None
    carried_key: np.ndarray | None = None  # optional: per row a dense number, equal for rows of equal carried values

    def __len__(self) -> int:
        return int(self.start_ns.size)

    @classmethod
    def empty(cls) -> "GilRows":
        z = np.zeros(0, np.int64)
        return cls(z, z, np.zeros(0, np.int8), z, z)


@dataclass
class Rows:
    """Rows that became final in one push (Arrow tables with the schemas of engine.correlate.schema)."""

    overlaps: pa.Table
    pause_impact: pa.Table
    gil_free: pa.Table
    # Per overlaps row, the carried code of its GIL row (Correlator.carried_table's row), when
    # the GIL rows carry values: a sink totals overlaps per code without reading their text.
    overlaps_code: np.ndarray | None = None

    def tables(self) -> dict[str, pa.Table]:
        return {"overlaps": self.overlaps, "pause_impact": self.pause_impact, "gil_free": self.gil_free}


class Lifetimes:
    """What a driver knows of thread lifetimes. `thread_ends`: per thread, the end of its lifetime
    (a thread whose value is past its latest interval lives on; GONE: it ended with its latest
    interval), or NONE if not known; `process_ends`: per process, the end of its span (END: goes
    on; GONE: it ended with its latest interval)."""

    def thread_ends(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        return np.full(pid.size, NONE, np.int64)

    def process_ends(self, pid: np.ndarray) -> np.ndarray:
        return np.full(pid.size, END, np.int64)


class KnownLifetimes(Lifetimes):
    """Lifetimes of a whole recorded session (pid, tid, start_ns, end_ns), known before the pass."""

    def __init__(self, table: pd.DataFrame):
        self._threads = {(int(p), int(t)): int(e) for p, t, e in zip(table["pid"], table["tid"], table["end_ns"])}
        ends = table.groupby("pid")["end_ns"].max() if len(table) else pd.Series(dtype=np.int64)
        self._processes = {int(p): int(e) for p, e in ends.items()}

    def thread_ends(self, pid, tid):
        return np.array([self._threads.get((int(p), int(t)), NONE) for p, t in zip(pid, tid)], np.int64)

    def process_ends(self, pid):
        return np.array([self._processes.get(int(p), END) for p in pid], np.int64)


def _grow(array: np.ndarray, n: int, fill) -> np.ndarray:
    if array.size >= n:
        return array
    out = np.full(max(n, 2 * array.size, 16), fill, array.dtype)
    out[:array.size] = array
    return out


def shared_text(values: pd.Series) -> np.ndarray:
    """VALUES as a Python object array whose equal strings are one object (8 bytes a row, where
    astype(object) makes a string object per row: ~60 bytes each, for every pause of a session)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    table = np.empty(len(uniques) + 1, object)
    table[:-1] = np.asarray(uniques, dtype=object)
    table[-1] = values.dtype.na_value if hasattr(values.dtype, "na_value") else None  # (code -1: missing, as astype(object) gives it)
    return table[codes]


def carried_key(table: pa.Table) -> np.ndarray:
    """Per row of TABLE (carried columns), a dense number, equal for rows of equal values, in
    the order they first come: a mixed-radix key over each column's dictionary indexes (as given
    when dictionary-encoded: equal values under two indexes only make two keys of one code; an
    integer column of a narrow range, a line number, is its own index from its minimum, with no
    hash), then the keys numbered (DenseNumbers: a third of pandas.factorize's time).
    (In place, with no copy of a column of one chunk or with no nulls: a block's columns are
    a million rows, and fresh memory is most of what a copy costs.)"""
    key, bound = np.zeros(table.num_rows, np.int64), 1  # (every key < bound)
    for column in table.columns:
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        indices, radix = _column_indices(column)
        if bound * radix >= 1 << 62:  # (renumbered densely before it could overflow)
            numbers = kernels.DenseNumbers()
            key, bound = numbers.number(key)[0], max(len(numbers), 1)
        key *= radix
        key += indices
        key += 1
        bound *= radix
    return kernels.DenseNumbers().number(key)[0]


# An integer column spanning at most this many values is its own index (below that, the key's
# radix stays far from overflowing; a wider one is dictionary-encoded).
DIRECT_INDEX_SPAN = 1 << 24


def _column_indices(column: pa.Array) -> tuple[np.ndarray, int]:
    """Per row of COLUMN, an index in 0..radix-2 equal for equal values (-1 for a null), and radix."""
    if pa.types.is_signed_integer(column.type):
        if column.null_count == len(column):
            return np.full(len(column), -1, np.int64), 1
        low, high = (value.as_py() for value in pa.compute.min_max(column).values())
        if high - low < DIRECT_INDEX_SPAN:
            values = (column.fill_null(low) if column.null_count else column).to_numpy()
            indices = np.subtract(values, low, dtype=np.int64)  # (one new array, not a cast and then a difference)
            if column.null_count:
                indices[column.is_null().to_numpy(zero_copy_only=False)] = -1
            return indices, high - low + 2
    if not pa.types.is_dictionary(column.type):
        column = pa.compute.dictionary_encode(column)
    indices = column.indices.fill_null(-1) if column.indices.null_count else column.indices
    return indices.to_numpy(zero_copy_only=False), len(column.dictionary) + 1


class Correlator:
    def __init__(self, slack_ns: int = 0, *, lifetimes: Lifetimes | None = None, gil_source: str = "gil table",
                 pauses_source: str = "pauses table", retain_ns: int = 0,
                 eager_pairs: bool = False, text_as_dictionary: bool = False, jvm_tids=()):
        if slack_ns < 0:
            raise ValueError(f"slack_ns must be >= 0, got {slack_ns}")
        self.slack_ns = int(slack_ns)
        self.retain_ns = int(retain_ns)  # > 0: late rows accepted (see the module's docstring)
        self.eager_pairs = eager_pairs    # overlaps rows with closed intervals at once (see the module's docstring)
        # overlaps rows' text (state, carried text) dictionary-encoded, not made per row: for a
        # driver writing them with TableWriter(text_as_dictionary=True)
        self.text_as_dictionary = text_as_dictionary
        self._pushes = 0                  # pushes so far: when each pause and each closed GIL row came
        self.lifetimes = lifetimes or Lifetimes()
        self.gil_source, self.pauses_source = gil_source, pauses_source
        self.watermark_ns = NONE
        self._swept = NONE  # gil_free and lifetimes are final before this
        # Threads (dense index) and processes (dense index): state of the gil_free sweep.
        self._thread_index: dict[tuple[int, int], int] = {}
        self._thread_numbers = kernels.DenseNumbers()  # (pid << 32 | tid) -> index
        self._pid_index: dict[int, int] = {}
        self.t_pid = np.zeros(0, np.int64)
        self.t_tid = np.zeros(0, np.int64)
        self.t_pidx = np.zeros(0, np.int64)
        self.t_first = np.zeros(0, np.int64)
        self.t_seen_end = np.zeros(0, np.int64)
        self.t_run = np.zeros(0, np.bool_)
        self.t_reach = np.zeros(0, np.int64)
        self.t_reach_closed = np.zeros(0, np.int64)
        self.t_open_row = np.zeros(0, np.bool_)
        self.t_alive = np.zeros(0, np.bool_)
        self.t_dead = np.zeros(0, np.bool_)
        self.p_pid = np.zeros(0, np.int64)
        self.p_holding = np.zeros(0, np.int64)
        self.p_alive = np.zeros(0, np.int64)
        self.p_in_span = np.zeros(0, np.bool_)
        self.p_free_since = np.zeros(0, np.int64)
        self.p_close_start = np.zeros(0, np.int64)
        self.p_close_end = np.zeros(0, np.int64)
        self.p_last_end = np.zeros(0, np.int64)
        # Open rows held (thread index, state, start); threads whose open row vanished after the
        # sweep passed its start (their run ends at the next sweep).
        self._open: set[tuple[int, int, int]] = set()
        self._vanished: list[int] = []
        # Retained GIL rows, sorted by start (ties: arrival order).
        self.r_tidx = np.zeros(0, np.int64)
        self.r_state = np.zeros(0, np.int8)
        self.r_start = np.zeros(0, np.int64)
        self.r_end = np.zeros(0, np.int64)
        self.r_carried = np.zeros(0, np.int64)  # code of the row's carried values (self._carried)
        self.r_came = np.zeros(0, np.int64)  # the push it came in closed (eager_pairs)
        # Carried per-interval values (GIL_CARRIED_COLUMNS), each distinct combination once: a
        # release site is one of few thousand, so rows keep a code.
        self._carried_codes: dict[tuple, int] = {}
        self._carried_schema: pa.Schema | None = None
        self._carried_table: pa.Table | None = None
        # The carried codes of the overlaps tables made in this push, in the order they go out (Rows.overlaps_code)
        self._made_codes: list[np.ndarray] = []
        # gil_free segments a pending or later pause may still overlap.
        self.f_start = np.zeros(0, np.int64)
        self.f_end = np.zeros(0, np.int64)
        # Pauses not final yet, sorted by (start_ns, arrival). Every pause seen (few), for duplicates:
        # pause_id -> the number of the batch it came in; batch number -> (its rows, latest start).
        self._pending: pd.DataFrame | None = None
        # the pause_ids pushed (sorted) and the batch each came in: a pause pushed again is dropped
        self._seen_ids, self._seen_in = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._seen_batches: dict[int, tuple[pd.DataFrame, int]] = {}
        self._next_seq = 0
        # Threads that are the JVM's (a pause's os_thread_id): a driver that knows them before their
        # pauses come (offline: the whole pauses table) names them, so early pauses see them too.
        self.jvm_tids: set[int] = {int(t) for t in jvm_tids}
        # Summary: what it reads of every final pause_impact row (FINAL_PAUSE: a few per second of
        # JVM pauses; the rows themselves go out in Rows) and the distinct (part_of, kind, name,
        # thread) with an exact overlap.
        self._final = RecordsOffHeap(FINAL_PAUSE)
        self._stop_keys: dict[tuple[str, str, str], int] = {}  # (part_of, kind, name) -> number
        self._affected = np.zeros((0, 0), np.bool_)  # [number, thread index]: an exact overlap
        # Pauses that may lead a stop of the world a pause still to be finalized is inside
        # (engine/correlate/stops.py): kept while they end after the oldest such pause's start.
        self._leaders: pd.DataFrame | None = None
        self.gil_intervals = 0
        self.duplicate_gil_rows = 0
        self.pauses = 0
        self.late_pauses = 0
        self.late_pauses_beyond_retention = 0
        self.late_gil_rows = 0
        self.open_rows_dropped = 0
        self.span = [END, NONE]

    # ---- input -----------------------------------------------------------------------------

    def push(self, *, pauses: pd.DataFrame | None = None, gil: GilRows | None = None, open: GilRows | None = None,
             watermark_ns: int) -> Rows:
        """Add rows of both sides (pauses checked by engine.correlate.tables.check_pauses, any order) and the
        GIL intervals open now (`open`, end_ns ignored; see the module's docstring); return the
        rows that became final."""
        watermark_ns = int(watermark_ns)
        if watermark_ns < self.watermark_ns:
            raise ValueError(f"watermark went backwards: {watermark_ns} < {self.watermark_ns}")
        self._pushes += 1
        if pauses is not None and len(pauses):
            self._add_pauses(pauses)
        if gil is not None and len(gil):
            self._add_gil(self._close_open(gil))
        if open is not None or self._open:
            self._update_open(open if open is not None else GilRows.empty(), watermark_ns)
        self.watermark_ns = watermark_ns
        eager = self._eager_overlaps() if self.eager_pairs else None
        rows = self._advance(final=False)
        if eager is not None and eager.num_rows:
            rows.overlaps = pa.concat_tables([eager, rows.overlaps])
        return rows

    def finish(self) -> Rows:
        """Nothing more will come: every pending row, final (intervals still open are dropped)."""
        if self._open:
            self._update_open(GilRows.empty(), self.watermark_ns)
        self.watermark_ns = END
        return self._advance(final=True)

    def _late(self, starts: np.ndarray, source: str) -> int:
        """How many of STARTS are before the watermark (refused unless late rows are retained)."""
        if not starts.size or self.watermark_ns <= NONE or int(starts.min()) >= self.watermark_ns:
            return 0
        if self.retain_ns <= 0:
            raise TandemError(f"{source}: an interval starts at {int(starts.min())} ns, before the watermark "
                              f"{self.watermark_ns} ns already passed")
        return int(np.count_nonzero(starts < self.watermark_ns))

    def _add_pauses(self, pauses: pd.DataFrame) -> None:
        starts = pauses["start_ns"].to_numpy(np.int64)
        self.late_pauses += self._late(starts, self.pauses_source)
        if self.late_pauses and self.watermark_ns > NONE:
            self.late_pauses_beyond_retention += int(np.count_nonzero(starts < self.watermark_ns - self.retain_ns))
        pauses = self._new_pauses(pauses)
        if not len(pauses):
            return
        batch = pauses.reset_index(drop=True)  # (its columns are replaced or added below, never written in place)
        for name in ("kind", "name"):  # (plain text: pandas' small-frame work on Arrow strings costs ms a push)
            if name in batch.columns:
                batch[name] = shared_text(batch[name])
        batch["_seq"] = np.arange(self._next_seq, self._next_seq + len(batch), dtype=np.int64)
        batch["_came"] = np.int64(self._pushes)
        batch["_jvm"], batch["_at_safepoint"] = jvm_of(batch), at_safepoint_of(batch)  # (read per push: plain arrays)
        self._next_seq += len(batch)
        self.pauses += len(batch)
        self.jvm_tids.update(jvm_threads(batch))
        self.span = [min(self.span[0], int(batch["start_ns"].min())), max(self.span[1], int(batch["end_ns"].max()))]
        pending = batch if self._pending is None else pd.concat([self._pending, batch], ignore_index=True)
        self._pending = pending.sort_values(["start_ns", "_seq"], ignore_index=True)
        leaders = batch[leader_rows(batch)][list(STOP_ARRAYS)]
        if len(leaders):
            self._leaders = leaders if self._leaders is None else pd.concat([self._leaders, leaders], ignore_index=True)

    def _new_pauses(self, pauses: pd.DataFrame) -> pd.DataFrame:
        """PAUSES without the rows pushed before (the same pause_id and values); a pause_id seen
        with other values is an error."""
        ids = pauses["pause_id"].to_numpy(np.int64)
        at = np.searchsorted(self._seen_ids, ids).clip(0, max(self._seen_ids.size - 1, 0))
        seen_before = (self._seen_ids[at] == ids) if self._seen_ids.size else np.zeros(ids.size, np.bool_)
        _, first = np.unique(ids, return_index=True)
        repeated = np.ones(ids.size, np.bool_)
        repeated[first] = False
        keep = ~(seen_before | repeated)
        for i in np.flatnonzero(~keep).tolist():  # (repeats are rare)
            pause_id = int(ids[i])
            earlier = self._seen_batches[int(self._seen_in[at[i]])][0] if seen_before[i] else pauses
            if _values(earlier, pause_id) != _values(pauses.iloc[i:i + 1], pause_id):  # (_values: the id's first row)
                raise TandemError(f"{self.pauses_source}: pause_id {pause_id} names two different pauses")
        if not keep.all():
            pauses = pauses[keep]
        if len(pauses):
            number = self._next_seq  # (unique: it grows by the rows of every batch kept)
            self._seen_batches[number] = (pauses, int(pauses["start_ns"].max()))
            self._remember_ids(np.r_[self._seen_ids, ids[keep]], np.r_[self._seen_in, np.full(int(keep.sum()), number)])
        return pauses

    def _remember_ids(self, ids: np.ndarray, batch: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")
        self._seen_ids, self._seen_in = ids[order], batch[order].astype(np.int64)

    def _part_of(self, batch: pd.DataFrame) -> np.ndarray:
        """Per pause of a batch being finalized: the `kind: name` of the stop of the world it is
        inside, "" when it leads one or stands alone (its leader started before it: seen)."""
        columns = {c: batch[c].to_numpy() for c in STOP_ARRAYS}
        if self._leaders is not None and len(batch):  # (the batch's own leaders are among them: its rows go last)
            # only the leaders that could hold one of the batch's pauses: those overlapping its span
            leaders = {c: self._leaders[c].to_numpy() for c in STOP_ARRAYS}
            near = ((leaders["end_ns"] >= int(columns["start_ns"].min()))
                    & (leaders["start_ns"] <= int(columns["end_ns"].max()))
                    & ~np.isin(leaders["pause_id"], columns["pause_id"]))
            if near.any():
                columns = {c: np.concatenate([leaders[c][near], columns[c]]) for c in STOP_ARRAYS}
        pause_id, kind, name, start, end, jvm, at_safepoint = (columns[c] for c in STOP_ARRAYS)
        ids = stop_ids_of(pause_id, kind, start, end, jvm, at_safepoint)[-len(batch):]
        part_of = np.full(len(batch), "", object)
        inside = np.flatnonzero(ids != pause_id[-len(batch):])
        if inside.size:
            order = np.argsort(pause_id, kind="stable")
            leader = order[np.searchsorted(pause_id, ids[inside], sorter=order)]
            part_of[inside] = [f"{k}: {n}" for k, n in zip(kind[leader], name[leader])]
        return part_of

    def _carried_code_of(self, gil: GilRows) -> np.ndarray:
        """Per row, the code of its carried values (-1 when the table carries none)."""
        if gil.carried is None or not gil.carried.num_columns:
            if self._carried_schema is not None:
                raise TandemError(f"{self.gil_source}: a batch without the columns {', '.join(self._carried_schema.names)} "
                                  "the earlier ones had")
            return np.full(len(gil), -1, np.int64)
        table = gil.carried.combine_chunks()
        schema = pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                            for f in table.schema])  # (dictionary-encoded text is text)
        if self._carried_schema is None:
            self._carried_schema = schema
        elif schema.names != self._carried_schema.names:
            table = table.select(self._carried_schema.names)
        # (the driver may have numbered the rows' values already: in a thread of its own)
        inverse = np.asarray(gil.carried_key, np.int64) if gil.carried_key is not None else carried_key(table)
        some_rows = kernels.a_row_per_key(inverse)  # (its rows hold the same values; row 0 for a number no row has)
        firsts = table.take(pa.array(some_rows)).to_pylist()
        codes = np.empty(len(firsts), np.int64)
        grew = False
        for i, row in enumerate(firsts):
            value = tuple(row.values())
            code = self._carried_codes.get(value)
            if code is None:
                code = self._carried_codes[value] = len(self._carried_codes)
                grew = True
            codes[i] = code
        if grew:
            rows = list(self._carried_codes)
            self._carried_table = pa.table({name: pa.array([r[i] for r in rows], self._carried_schema.field(name).type)
                                            for i, name in enumerate(self._carried_schema.names)})
        return codes[inverse]

    @property
    def carried_table(self) -> pa.Table | None:
        """The carried values of each code (row = code), once GIL rows carried any."""
        return self._carried_table

    def overlaps_schema(self) -> pa.Schema:
        """The overlaps table's schema: SCHEMAS["overlaps"], then the carried columns the GIL rows have."""
        schema = SCHEMAS["overlaps"]
        for field in self._carried_schema or []:
            schema = schema.append(field)
        return schema

    def _index_threads(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        index, new = self._thread_numbers.number(tid, high=pid)  # (pid << 32) | tid
        for key in new.tolist():
            self._new_thread(key >> 32, key & 0xFFFFFFFF)
        return index

    def _new_thread(self, pid: int, tid: int) -> int:
        pidx = self._pid_index.get(pid)
        if pidx is None:
            pidx = len(self._pid_index)
            self._pid_index[pid] = pidx
            n = pidx + 1
            self.p_pid = _grow(self.p_pid, n, 0)
            self.p_holding = _grow(self.p_holding, n, 0)
            self.p_alive = _grow(self.p_alive, n, 0)
            self.p_in_span = _grow(self.p_in_span, n, False)
            self.p_free_since = _grow(self.p_free_since, n, NONE)
            self.p_close_start = _grow(self.p_close_start, n, NONE)
            self.p_close_end = _grow(self.p_close_end, n, NONE)
            self.p_last_end = _grow(self.p_last_end, n, NONE)
            self.p_pid[pidx] = pid
        index = len(self._thread_index)
        self._thread_index[(pid, tid)] = index
        n = index + 1
        for name, fill in (("t_pid", 0), ("t_tid", 0), ("t_pidx", 0), ("t_first", END), ("t_seen_end", NONE),
                           ("t_run", False), ("t_reach", NONE), ("t_reach_closed", NONE), ("t_open_row", False),
                           ("t_alive", False), ("t_dead", False)):
            setattr(self, name, _grow(getattr(self, name), n, fill))
        self.t_pid[index], self.t_tid[index], self.t_pidx[index] = pid, tid, pidx
        return index

    @property
    def n_threads(self) -> int:
        return len(self._thread_index)

    @property
    def n_pids(self) -> int:
        return len(self._pid_index)

    def _add_gil(self, gil: GilRows, *, is_open: bool = False) -> None:
        if not len(gil):
            return
        start = np.asarray(gil.start_ns, np.int64)
        end = np.full(start.size, END, np.int64) if is_open else np.asarray(gil.end_ns, np.int64)
        if not is_open:
            self.late_gil_rows += self._late(start, self.gil_source)
        tidx = self._index_threads(np.asarray(gil.pid), np.asarray(gil.tid))
        state = np.asarray(gil.state, np.int8)
        carried = self._carried_code_of(gil)
        if start.size and not is_sorted(start):
            order = np.argsort(start, kind="stable")
            start, end, tidx, state, carried = start[order], end[order], tidx[order], state[order], carried[order]
        n_old = self.r_start.size
        if n_old and start.size and start[0] < self.r_start[-1]:  # two sorted runs: a merge
            r_start, r_end, r_tidx, r_state, r_carried, r_came, is_new = kernels.merge_rows(
                self.r_start, self.r_end, self.r_tidx, self.r_state, self.r_carried, self.r_came,
                start, end, tidx.astype(np.int64, copy=False), state, carried.astype(np.int64, copy=False), self._pushes)
        else:
            r_start, r_end = np.concatenate([self.r_start, start]), np.concatenate([self.r_end, end])
            r_tidx, r_state = np.concatenate([self.r_tidx, tidx]), np.concatenate([self.r_state, state])
            r_carried = np.concatenate([self.r_carried, carried])
            r_came = np.empty(n_old + start.size, np.int64)
            r_came[:n_old], r_came[n_old:] = self.r_came, self._pushes
            is_new = np.concatenate([np.zeros(n_old, np.bool_), np.ones(start.size, np.bool_)])
        dup = kernels.duplicate_rows(r_start, r_end, r_tidx, r_state, is_new)
        n_dup = int(np.count_nonzero(dup))
        self.r_start, self.r_end, self.r_tidx, self.r_state, self.r_carried, self.r_came = (
            r_start, r_end, r_tidx, r_state, r_carried, r_came)
        if n_dup:
            self._keep_rows(~dup)
        self.duplicate_gil_rows += n_dup
        if is_open:  # (counted when it closes: until then it may vanish)
            return
        self.gil_intervals += start.size - n_dup
        self._seen(tidx, start, end)

    def _seen(self, tidx: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """The span; each thread's first non-empty start and latest end; each process's latest end."""
        self.span = [min(self.span[0], int(start.min())), max(self.span[1], int(end.max()))]
        kernels.group_bounds(tidx, start, end, self.t_first, self.t_seen_end)
        nt = self.n_threads  # (a process's latest end: the latest of its threads')
        np.maximum.at(self.p_last_end, self.t_pidx[:nt], self.t_seen_end[:nt])

    def _keep_rows(self, keep: np.ndarray) -> None:
        """Of the retained GIL rows before keep.size, only those where KEEP is true stay (the rows
        after all stay). They are moved up against the rows after them, in place (the arrays are
        the core's own: nothing else holds a view of them), and the arrays become views from the
        first row kept: nothing after the mask moves."""
        first = kernels.keep_before(keep, self.r_start, self.r_end, self.r_tidx, self.r_state, self.r_carried, self.r_came)
        self.r_start, self.r_end, self.r_tidx, self.r_state, self.r_carried, self.r_came = (
            self.r_start[first:], self.r_end[first:], self.r_tidx[first:], self.r_state[first:], self.r_carried[first:],
            self.r_came[first:])

    # ---- open intervals (live) ---------------------------------------------------------------

    def _open_row(self, th: int, state: int, start: int) -> int:
        """Position of the held open row (thread index, state, start) among the retained rows."""
        i = int(np.searchsorted(self.r_start, start, "left"))
        while i < self.r_start.size and self.r_start[i] == start:
            if self.r_tidx[i] == th and self.r_state[i] == state and self.r_end[i] == END:
                return i
            i += 1
        raise AssertionError(f"open row {(th, state, start)} not retained")  # pragma: no cover

    def _close_open(self, gil: GilRows) -> GilRows:
        """Closed rows of held open ones take their place; the others are returned."""
        if not self._open:
            return gil
        start = np.asarray(gil.start_ns, np.int64)
        candidates = np.flatnonzero(start < self.watermark_ns)
        if not candidates.size:
            return gil
        keys = np.asarray(gil.pid, np.int64)[candidates] << 32 | np.asarray(gil.tid, np.int64)[candidates]
        closing = np.zeros(len(gil), np.bool_)
        for k, key in zip(candidates.tolist(), keys.tolist()):
            th = self._thread_index.get((key >> 32, key & 0xFFFFFFFF))
            ident = (th, int(gil.state[k]), int(start[k]))
            if th is None or ident not in self._open:
                continue
            self._open.discard(ident)
            closing[k] = True
            end = int(gil.end_ns[k])
            row = self._open_row(*ident)
            self.r_end[row], self.r_came[row] = end, self._pushes
            if ident[2] < self._swept and self.t_run[th] and self.t_open_row[th]:
                # The sweep went past its start: the thread's run now ends (at the earliest where the sweep is).
                self.t_open_row[th] = False
                self.t_reach_closed[th] = max(self.t_reach_closed[th], end, self._swept)
                self.t_reach[th] = self.t_reach_closed[th]  # (the sweep's heap is built from t_reach each call)
        if not closing.any():
            return gil
        done = np.flatnonzero(closing)
        self.gil_intervals += done.size
        self._seen(np.array([self._thread_index[(int(gil.pid[k]), int(gil.tid[k]))] for k in done], np.int64),
                   start[done], np.asarray(gil.end_ns, np.int64)[done])
        keep = ~closing
        return GilRows(np.asarray(gil.pid)[keep], np.asarray(gil.tid)[keep], np.asarray(gil.state)[keep], start[keep],
                       np.asarray(gil.end_ns)[keep], gil.carried.filter(pa.array(keep)) if gil.carried is not None else None,
                       gil.carried_key[keep] if gil.carried_key is not None else None)

    def _update_open(self, open: GilRows, watermark_ns: int) -> None:
        """Hold the open intervals starting before the watermark; drop those no longer named."""
        start = np.asarray(open.start_ns, np.int64)
        mine = start < watermark_ns
        if mine.any():
            tidx = self._index_threads(np.asarray(open.pid)[mine], np.asarray(open.tid)[mine])
            named = set(zip(tidx.tolist(), np.asarray(open.state)[mine].astype(int).tolist(), start[mine].tolist()))
        else:
            named = set()
        for ident in self._open - named:  # its thread exited while released (or the stream had a gap)
            keep = np.ones(self.r_start.size, np.bool_)
            keep[self._open_row(*ident)] = False
            self._keep_rows(keep)
            self.open_rows_dropped += 1
            if ident[2] < self._swept:
                self._vanished.append(ident[0])
        new = named - self._open
        self._open = named
        if new:
            rows = [(k, ident) for k, ident in enumerate(zip(tidx.tolist(), np.asarray(open.state)[mine].astype(int).tolist(),
                                                              start[mine].tolist())) if ident in new]
            pick = np.flatnonzero(mine)[[k for k, _ in rows]]
            self.late_gil_rows += self._late(start[pick], self.gil_source)
            carried = open.carried.take(pa.array(pick)) if open.carried is not None else None
            self._add_gil(GilRows(np.asarray(open.pid)[pick], np.asarray(open.tid)[pick], np.asarray(open.state)[pick],
                                  start[pick], start[pick], carried), is_open=True)

    # ---- finalization ------------------------------------------------------------------------

    def _advance(self, final: bool) -> Rows:
        w = self.watermark_ns
        nt, npids = self.n_threads, self.n_pids
        seen = self.t_seen_end[:nt]
        if final:
            self.t_dead[:nt] = True
            span_end = self.p_last_end[:npids].copy()
            frontier = END
        else:
            ends = self.lifetimes.thread_ends(self.t_pid[:nt], self.t_tid[:nt])
            quiet = seen < w  # no interval seen past W: alive (holding) or gone?
            unknown = quiet & (ends == NONE)
            self.t_dead[:nt] = quiet & ~unknown & (ends <= seen)
            frontier = min(w, int(seen[unknown].min())) if unknown.any() else w
            span_end = self.lifetimes.process_ends(self.p_pid[:npids])
            span_end = np.where(span_end == NONE, END, np.where(span_end == GONE, self.p_last_end[:npids], span_end))
        free = self._sweep(frontier, span_end)
        overlaps, impact = self._finalize_pauses(frontier, final)
        self._prune()
        made, self._made_codes = self._made_codes, []
        codes = (np.concatenate(made) if made else np.zeros(0, np.int64)) if self._carried_table is not None else None
        return Rows(overlaps, impact, free, codes)

    def _sweep(self, frontier: int, span_end: np.ndarray) -> pa.Table:
        if frontier <= self._swept:
            return empty_table("gil_free")
        i0 = int(np.searchsorted(self.r_start, self._swept, "left")) if self._swept > NONE else 0
        i1 = int(np.searchsorted(self.r_start, frontier, "left"))
        nt, npids = self.n_threads, self.n_pids
        order = np.argsort(self.t_pidx[:nt], kind="stable")
        ptr = np.searchsorted(self.t_pidx[:nt][order], np.arange(npids + 1)).astype(np.int64)
        # Threads found gone after the sweep counted them holding (or released, in a vanished open row).
        seen = self.t_seen_end[:nt]
        holders_gone = np.flatnonzero(self.t_alive[:nt] & ~self.t_run[:nt] & self.t_dead[:nt] & (seen < self._swept))
        vanished = np.array(sorted(set(self._vanished)), np.int64)
        self._vanished = []
        size = 2 * (i1 - i0) + 2 * npids + 2 * (holders_gone.size + vanished.size) + 1
        out_pid, out_start, out_end = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
        n = kernels.sweep_gil_free(
            self.t_pidx[:nt], self.r_tidx, self.r_start, self.r_end, i0, i1, frontier, ptr, order.astype(np.int64),
            self.t_run[:nt], self.t_reach[:nt], self.t_reach_closed[:nt], self.t_open_row[:nt], self.t_seen_end[:nt],
            self.t_dead[:nt], self.t_alive[:nt], self.p_holding[:npids], self.p_alive[:npids], self.p_in_span[:npids],
            np.ascontiguousarray(span_end, np.int64), self.p_free_since[:npids], self.p_close_start[:npids],
            self.p_close_end[:npids], out_pid, out_start, out_end, holders_gone.astype(np.int64), vanished, self._swept)
        self._swept = frontier
        # The table's columns in one pass, copies (the table must not hold the sweep's larger
        # buffers); the sweep mostly emits them in order already.
        pid, start, end, duration, in_order = kernels.free_columns(out_pid[:n], out_start[:n], out_end[:n], self.p_pid)
        if not in_order:
            order = np.lexsort((start, pid))
            pid, start, end, duration = pid[order], start[order], end[order], duration[order]
        # Kept for pause_impact's gil_free_ns: the segments a pause not final yet, or one pushed
        # later, may overlap (what _prune keeps of them, known before they are copied).
        reach = end > self._horizon()
        self.f_start = np.concatenate([self.f_start, start[reach]])
        self.f_end = np.concatenate([self.f_end, end[reach]])
        return pa.table({"pid": pid, "start_ns": start, "end_ns": end, "duration_ns": duration}, schema=SCHEMAS["gil_free"])

    def _finalize_pauses(self, frontier: int, final: bool) -> tuple[pa.Table, pa.Table]:
        pending = self._pending
        if pending is None or not len(pending):
            return self.overlaps_schema().empty_table(), empty_table("pause_impact")
        ends = pending["end_ns"].to_numpy(np.int64)
        done = (ends + self.slack_ns < self.watermark_ns) & (ends <= frontier) if not final else np.ones(len(pending), bool)
        # In start order: a pause waits for every pause that started before it.
        n = len(pending) if done.all() else int(np.argmin(done))
        if n == 0:
            return self.overlaps_schema().empty_table(), empty_table("pause_impact")
        batch = pending.iloc[:n].reset_index(drop=True)
        self._pending = pending.iloc[n:].reset_index(drop=True)
        return self._pause_rows(batch, frontier)

    def _pause_rows(self, batch: pd.DataFrame, frontier: int) -> tuple[pa.Table, pa.Table]:
        p_start = batch["start_ns"].to_numpy(np.int64)
        p_end = batch["end_ns"].to_numpy(np.int64)
        pair_b, pair_a = overlap_pairs(p_start, p_end, self.r_start, self.r_end, slack_ns=self.slack_ns)
        near_miss = np.empty(pair_b.size, np.bool_)
        emit = self.r_end[pair_a] >= END if self.eager_pairs else slice(None)  # (eager: the closed ones came out)
        overlaps = self._overlaps_table(batch, pair_b, pair_a, near_miss, emit)
        nt = self.n_threads
        own = (batch["os_thread_id"].astype("Int64").fillna(-1).to_numpy(np.int64) if "os_thread_id" in batch.columns
               else np.full(len(batch), -1, np.int64))
        whole_vm = batch["kind"].isin(WHOLE_VM_KINDS).to_numpy(bool) | batch["_at_safepoint"].to_numpy(bool)
        life_end = np.where(self.t_dead[:nt], self.t_seen_end[:nt], END)
        jvm = np.isin(self.t_tid[:nt], np.fromiter(self.jvm_tids, np.int64, len(self.jvm_tids)))
        columns = np.zeros((len(batch), 8), np.int64)
        kernels.pause_columns(p_start, p_end, own, whole_vm, pair_b, pair_a, self.r_tidx, self.r_state, self.r_start,
                              self.r_end, self.t_tid[:nt], self.t_first[:nt], life_end, jvm, columns)
        f_start, f_end = self._free_so_far(frontier)
        _, free_ns = overlap_totals(p_start, p_end, f_start, f_end)
        amplifying = columns[:, 7]
        impact = pa.table({
            "pause_id": batch["pause_id"].to_numpy(np.int64),
            "kind": pa.array(batch["kind"].astype(object), pa.string()),
            "name": pa.array(batch["name"].astype(object), pa.string()),
            "start_ns": p_start,
            "end_ns": p_end,
            "duration_ns": p_end - p_start,
            "threads_released": columns[:, 0],
            "released_ns": columns[:, 1],
            "threads_waiting": columns[:, 2],
            "waiting_ns": columns[:, 3],
            "overlap_ns": columns[:, 4],
            "hit_python": columns[:, 4] > 0,
            "near_misses": columns[:, 5],
            "threads_holding": columns[:, 6],
            "gil_free_ns": free_ns,
            "gil_free": free_ns > 0,
            "amplifying_tid": pa.array(amplifying, pa.int64(), mask=amplifying < 0),
            "amplified": amplifying >= 0,
        }, schema=SCHEMAS["pause_impact"])
        stop_key = np.array([self._stop_keys.setdefault(key, len(self._stop_keys)) for key in
                             zip(self._part_of(batch).tolist(), batch["kind"].tolist(), batch["name"].tolist())], np.int64)
        final = np.empty(len(batch), FINAL_PAUSE)
        final["key"], final["overlap_ns"], final["hit_python"] = stop_key, columns[:, 4], columns[:, 4] > 0
        final["near_misses"], final["amplified"] = columns[:, 5] > 0, amplifying >= 0
        self._final.append(final)
        exact = np.flatnonzero(~near_miss)
        if exact.size:
            shape = (len(self._stop_keys), self.n_threads)
            if shape[0] > self._affected.shape[0] or shape[1] > self._affected.shape[1]:
                grown = np.zeros((max(shape[0], 2 * self._affected.shape[0]), max(shape[1], 2 * self._affected.shape[1])),
                                 np.bool_)
                grown[:self._affected.shape[0], :self._affected.shape[1]] = self._affected
                self._affected = grown
            self._affected[stop_key[pair_b[exact]], self.r_tidx[pair_a[exact]]] = True
        return overlaps, impact

    def _overlaps_table(self, pauses: pd.DataFrame, pair_b: np.ndarray, pair_a: np.ndarray, near_miss: np.ndarray,
                        emit=slice(None)) -> pa.Table:
        """The overlaps rows of pairs (PAUSES row, retained GIL row), those selected by EMIT; NEAR_MISS
        is filled for every pair."""
        n = pair_b.size
        columns = {name: np.empty(n, np.int64) for name in ("pause_id", "pid", "tid", "start_ns", "end_ns", "overlap_ns",
                                                            "slack_ns")}
        state = np.empty(n, np.int8)
        kernels.overlap_rows(pair_b, pair_a, pauses["pause_id"].to_numpy(np.int64), pauses["start_ns"].to_numpy(np.int64),
                             pauses["end_ns"].to_numpy(np.int64), self.r_start, self.r_end, self.r_tidx, self.r_state,
                             self.t_pid, self.t_tid, columns["pause_id"], columns["pid"], columns["tid"], state,
                             columns["start_ns"], columns["end_ns"], columns["overlap_ns"], columns["slack_ns"], near_miss)
        columns = {name: values[emit] for name, values in columns.items()}
        if self.text_as_dictionary:
            columns["state"] = pa.DictionaryArray.from_arrays(pa.array(state[emit]), pa.array(GIL_STATES), safe=False)
        else:
            columns["state"] = state_strings(state[emit])
        overlaps = pa.table({**columns, "near_miss": near_miss[emit]}).select(list(SCHEMAS["overlaps"].names))
        if self._carried_table is not None:
            codes = self.r_carried[pair_a[emit]]
            self._made_codes.append(codes)
            index = pa.array(codes.astype(np.int32))
            for field, values in zip(self._carried_table.schema, self._carried_table.columns):
                values = values.combine_chunks()
                if self.text_as_dictionary and pa.types.is_string(field.type):
                    overlaps = overlaps.append_column(field.name, pa.DictionaryArray.from_arrays(index, values, safe=False))
                else:
                    overlaps = overlaps.append_column(field, values.take(index))
        return overlaps

    def _eager_overlaps(self) -> pa.Table | None:
        """Overlaps rows of pending pauses with closed GIL rows, the later of the two come in this push."""
        pending = self._pending
        if pending is None or not len(pending):
            return None
        pause_new = pending["_came"].to_numpy(np.int64) == self._pushes
        row_new = self.r_came == self._pushes
        if not pause_new.any() and not row_new.any():
            return None
        pair_b, pair_a = overlap_pairs(pending["start_ns"].to_numpy(np.int64), pending["end_ns"].to_numpy(np.int64),
                                       self.r_start, self.r_end, slack_ns=self.slack_ns)
        emit = (self.r_end[pair_a] < END) & (pause_new[pair_b] | row_new[pair_a])
        if not emit.any():
            return None
        return self._overlaps_table(pending, pair_b, pair_a, np.empty(pair_b.size, np.bool_), emit)

    def _free_so_far(self, frontier: int) -> tuple[np.ndarray, np.ndarray]:
        """gil_free segments known up to the frontier: those written, and each process's current one."""
        npids = self.n_pids
        since = self.p_free_since[:npids]
        current = since != NONE
        return (np.concatenate([self.f_start, since[current]]),
                np.concatenate([self.f_end, np.full(int(current.sum()), frontier, np.int64)]))

    def _horizon(self) -> int:
        """No pause not final yet, nor one pushed later, starts before this (the rows and
        segments that end before it are not needed any more)."""
        pending_from = int(self._pending["start_ns"].iloc[0]) if self._pending is not None and len(self._pending) else END
        return min(self.watermark_ns - self.retain_ns, pending_from)

    def _prune(self) -> None:
        w = self.watermark_ns
        horizon = self._horizon()
        if w < END:
            # A pause pushed later starts after w - retain_ns, as its duplicate would.
            gone = [number for number, (_, latest_start) in self._seen_batches.items() if latest_start < w - self.retain_ns]
            if gone:
                for number in gone:
                    del self._seen_batches[number]
                kept = ~np.isin(self._seen_in, gone)
                self._seen_ids, self._seen_in = self._seen_ids[kept], self._seen_in[kept]
        if self._leaders is not None and len(self._leaders) and w < END:
            # a pause finalized later starts at or after the horizon; a stop holding it ends after it
            gone = self._leaders["end_ns"].to_numpy(np.int64) < horizon
            if gone.any():
                self._leaders = self._leaders[~gone].reset_index(drop=True)
        # Rows not swept yet (a suffix: rows are sorted by start) stay; of the others, those a
        # pause may still overlap.
        keep = self.r_end[:int(np.searchsorted(self.r_start, self._swept, "left"))] >= horizon - self.slack_ns
        if not keep.all():
            self._keep_rows(keep)
        keep = self.f_end > horizon
        if not keep.all():
            self.f_start, self.f_end = self.f_start[keep], self.f_end[keep]

    # ---- aggregates ----------------------------------------------------------------------------

    @property
    def span_ns(self) -> int:
        return max(0, self.span[1] - self.span[0]) if self.span[1] > NONE else 0

    def _summary_input(self) -> pd.DataFrame:
        """SUMMARY_INPUT of every final pause so far (text as categories; near_misses: whether any)."""
        final = self._final.records()
        flags = {c: final[c] for c in FINAL_PAUSE.names if c != "key"}
        # (the text as categories, sorted as text sorts: a long run's pauses are hundreds of
        # thousands, their keys a few dozen)
        keys = self._keys_of(np.arange(len(self._stop_keys)))
        text = {}
        for name in STOP_KEY:
            known = pd.Categorical(keys[name])
            text[name] = pd.Categorical.from_codes(np.asarray(known.codes)[final["key"]], dtype=known.dtype)
        return pd.DataFrame({**text, **flags})[list(SUMMARY_INPUT)]

    def _keys_of(self, numbers: np.ndarray) -> pd.DataFrame:
        """The (part_of, kind, name) of each of NUMBERS (of _stop_keys), as text columns."""
        keys = pd.DataFrame(list(self._stop_keys), columns=list(STOP_KEY), dtype=pd.StringDtype())
        return keys.iloc[numbers].reset_index(drop=True)

    def _affected_by(self, by: tuple[str, ...]) -> pd.Series:
        """Per `by` key: the distinct Python threads with an exact overlap."""
        key, thread = np.nonzero(self._affected)
        affected = self._keys_of(key).assign(thread=thread)
        if not len(affected):
            return pd.Series(dtype=np.int64)
        return affected.drop_duplicates([*by, "thread"]).groupby(list(by)).size()

    def summary(self) -> pd.DataFrame:
        """The summary table over the final pauses so far (docs/results.md, "summary")."""
        return summary_table(self._summary_input(), self._affected_by(("kind", "name")), self.span_ns)

    def stops(self) -> pd.DataFrame:
        """The stops table over the final pauses so far: one stop of the world counts once, the
        pauses inside it are its detail rows (docs/results.md, "stops"; engine/correlate/stops.py)."""
        table = summary_table(self._summary_input(), self._affected_by(STOP_KEY), self.span_ns, by=STOP_KEY)
        table["part_of"] = table["part_of"].replace("", pd.NA)  # ("": a stop's own row, as a group key)
        return order_stops(table)

    def pending_ends(self) -> np.ndarray:
        """The end of every pause pushed and not final yet."""
        return np.zeros(0, np.int64) if self._pending is None else self._pending["end_ns"].to_numpy(np.int64)

    def python_pids(self) -> list[int]:
        return sorted(int(p) for p in self.p_pid[:self.n_pids])


def warm_up() -> None:
    """Drive a throwaway core over a few rows, so that every kernel it calls is loaded (numba
    compiles or reads its cache at a kernel's first call: tenths of a second, holding the GIL).
    A live run does it before its first pauses come, not on their way out."""
    class Alive(Lifetimes):
        def thread_ends(self, pid, tid):
            return np.full(pid.size, END, np.int64)

    pauses = pd.DataFrame({"pause_id": [0, 1], "kind": ["safepoint", "gc"], "name": ["warm-up", "warm-up"],
                           "start_ns": [100, 110], "end_ns": [200, 150]})
    core = Correlator(5, lifetimes=Alive(), retain_ns=1_000, eager_pairs=True)
    core.push(pauses=pauses, gil=GilRows(np.array([1, 1]), np.array([1, 2]), np.array([0, 1], np.int8),
                                         np.array([50, 120]), np.array([150, 300])),
              open=GilRows(np.array([1]), np.array([3]), np.array([0], np.int8), np.array([60]), np.array([60])),
              watermark_ns=90)
    # (a row starting before the retained ones end: the merge of two sorted runs)
    core.push(gil=GilRows(np.array([1]), np.array([4]), np.array([0], np.int8), np.array([100]), np.array([110])),
              watermark_ns=400)
    core.finish()
    core.summary()


def _values(pauses: pd.DataFrame, pause_id: int) -> dict:
    """The first row of PAUSES with PAUSE_ID, as {column: value}, missing values left out."""
    row = pauses.iloc[int(np.flatnonzero(pauses["pause_id"].to_numpy(np.int64) == pause_id)[0])]
    return {k: v for k, v in row.items() if not (v is None or v is pd.NA or (isinstance(v, float) and v != v))}
