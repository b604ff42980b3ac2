"""The GIL probe's events files (one per process) as a GIL source (engine/ingest/gil_stream.py):
each file's intervals made block by block (engine.ingest.gil.EventsIntervals), the processes'
rows merged in the order they start."""
from __future__ import annotations

import heapq
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.correlate import END, GilRows, kernels
from engine.correlate.schema import GIL_STATES
from engine.ingest import gil_stream
from engine.ingest.gil import PROBE_CLOCK, EventsIntervals
from engine.ingest.gil_stream import FIRST_PASS_THREADS, GilBlock, lifetimes_of, merged_before


class EventsGil:
    """The GIL probe's events files (one per process) as one stream of interval blocks."""

    duplicate_rows = 0  # (duplicates are dropped, and counted, by the core as they pass)

    def __init__(self, paths: list[Path], block_records: int | None = None, copy: bool = False):
        self.files = [EventsIntervals(Path(p)) for p in paths]
        # (a block of each file recorded at the same time in memory at once, about BLOCK_ROWS
        # records together: `pushes`; processes that came and went one after another are not
        # read in blocks of their total number's share)
        at_once = most_at_once([f.span for f in self.files])
        block_records = block_records or max(gil_stream.BLOCK_ROWS // at_once, gil_stream.MIN_FILE_BLOCK)
        for f in self.files:
            f.block_records = block_records
        # (rows of a push, once that many are final: about a block's, ~1.7 records an interval)
        self.push_rows = min(gil_stream.BLOCK_ROWS, block_records * at_once) // 2
        self._names_of: dict[int, dict[int, str]] = {}  # pid -> tid -> thread name
        self._files_of: dict[int, list[EventsIntervals]] = {}  # pid -> its files (a pid may be used again)
        for f in self.files:
            self._files_of.setdefault(f.pid, []).append(f)
        self.source = ", ".join(str(p) for p in paths)
        self.references = [str(Path(p).resolve()) for p in paths]
        self.carried = [pa.field("function", pa.string()), pa.field("file", pa.string()), pa.field("line", pa.int64())]
        # read_gil's table: the rows of gil.parquet when copied, and what `tables` gives. The
        # columns a probe's interval always has are declared so (REQUIRED in Parquet): no
        # definition levels written for them, a tenth of the copy's encoding.
        self.schema = pa.schema([pa.field("pid", pa.int64(), False), pa.field("tid", pa.int64(), False),
                                 ("thread_name", pa.string()), pa.field("state", pa.string(), False),
                                 pa.field("start_ns", pa.int64(), False), pa.field("end_ns", pa.int64(), False),
                                 *self.carried])
        # A file not closed may still grow (a recording in progress), segments rotate away:
        # results cannot name them.
        self.copy = copy or not all(f.header.closed and not f.segmented for f in self.files)
        self.copy_schema = self.schema if self.copy else None
        self.attrs: dict = {}
        self.codes = ProcessCodes(len(self.files))  # (kept with the files: they number their codes once)

    def copy_rows(self) -> None:
        """Each block's rows as read_gil's table (GilBlock.copy): for MergedGil's one copy of several sources."""
        self.copy, self.copy_schema = True, self.schema

    def first_pass(self) -> pd.DataFrame:
        def one_file(f):
            block_min, tid, lo, hi = f.bounds()  # (the blocks paired, their rows not made)
            return _later_minimum(block_min), (f.pid << 32 | tid, lo, hi)

        # Files are read side by side (reading and pairing release the GIL), a thread each up to
        # FIRST_PASS_THREADS: three files on two cores take 1.5 times one file's pass, not 2.
        with ThreadPoolExecutor(max_workers=min(len(self.files), FIRST_PASS_THREADS) or 1) as pool:
            done = list(pool.map(one_file, self.files))
        self._later = [later for later, _ in done]
        bounds = [file_bounds for _, file_bounds in done]
        # What read_gil says about the processes (engine/ingest/gil.py), for the header.
        processes = [f.process for f in self.files]
        self.attrs = {"processes": processes, "clock": dict(PROBE_CLOCK)}
        if len(processes) == 1:
            self.attrs.update(processes[0])
        return lifetimes_of(bounds)

    def thread_names(self, keys: np.ndarray) -> dict:
        return {}  # (the blocks' rows name their threads: table_of)

    def pushes(self):
        """Blocks of every process's rows merged in start order. The files' blocks are read one
        at a time, always from the process whose remaining intervals start earliest; the rows
        read that start before the watermark (the earliest start of anything not read yet) are
        final in order, and once `push_rows` of them are (or the files end) they are pushed, the
        others wait. The core takes rows already in start order: not a process's block to merge
        into what it holds of every other process, a cost that grew with their number. A file's
        block is BLOCK_ROWS records over the most files recorded at one time, so what waits
        stays about one block, however many processes. `copy`: the rows pushed, as read_gil's table."""
        streams = [f.blocks() for f in self.files]
        position = [0] * len(self.files)
        # the files with blocks left, by the earliest start of what is left of them (ties: file order)
        unread = [(int(later[0]), j) for j, later in enumerate(self._later) if len(later) > 1]
        heapq.heapify(unread)
        waiting: list[GilRows] = []
        rows_so_far = waiting_rows = 0
        recount_at = self.push_rows  # (the waiting rows at which the final ones are counted again)
        watermark = END
        while True:
            if unread:
                i = heapq.heappop(unread)[1]
                read = self._rows(i, *next(streams[i]))
                position[i] += 1
                if position[i] < len(self._later[i]) - 1:
                    heapq.heappush(unread, (int(self._later[i][position[i]]), i))
                else:  # (its file closed and unmapped now, not when the session ends: many processes)
                    streams[i].close()
                    streams[i] = None
                waiting.append(read)
                waiting_rows += len(read)
                rows_so_far += len(read)
                watermark = unread[0][0] if unread else END
                # (the rows' count first, and the final ones counted again only once an eighth of a
                # push more waits: counting them costs a search per run, and with many processes
                # hundreds of runs wait)
                if waiting_rows < recount_at:
                    continue
                if sum(int(np.searchsorted(r.start_ns, watermark, "left")) for r in waiting) < self.push_rows:
                    recount_at = waiting_rows + self.push_rows // 8
                    continue
            elif not waiting:
                return
            arrays, waiting = merged_before(waiting, watermark)
            rows = GilRows(*arrays[:5], self.codes.columns(arrays[5]), arrays[5])
            waiting_rows, recount_at = sum(len(r) for r in waiting), self.push_rows
            yield GilBlock(rows, watermark, rows_so_far, self._table(rows) if self.copy else None,
                           lambda mask, rows=rows: self._table(rows, mask))

    def tables(self):
        """read_gil's table of each file in turn, block by block (each thread's rows in start
        order): what reads results that name these files instead of a gil.parquet."""
        for i, f in enumerate(self.files):
            for block in f.blocks():
                yield self._table(self._rows(i, *block))

    def _rows(self, i: int, tid, state, start, end, code) -> GilRows:
        """A block of file I as GilRows whose carried_key numbers its code among every file's
        (the code columns are made from it where wanted)."""
        key = self.codes.number(i, *self.files[i].code_numbers(code))
        return GilRows(np.full(tid.size, self.files[i].pid, np.int64), tid, state, start, end, None, key)

    def _table(self, rows: GilRows, mask: np.ndarray | None = None) -> pa.Table:
        """Rows of read_gil's table (thread names from their process's files), text
        dictionary-encoded (TableWriter's text_as_dictionary); only the MASK's rows if given."""
        keep = slice(None) if mask is None else mask
        pid, tid = rows.pid[keep], rows.tid[keep]
        inverse, threads = kernels.DenseNumbers().number(tid, high=pid)  # (numba's hash: a fourth of pandas.factorize's time)
        names = [self._thread_names(t >> 32).get(t & 0xFFFFFFFF) for t in threads.tolist()]
        thread_name = pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)), pa.array(names, pa.string()))
        state = pa.DictionaryArray.from_arrays(pa.array(rows.state[keep].astype(np.int32)),
                                               pa.array(GIL_STATES, pa.string()))
        carried = (self.codes.columns(rows.carried_key[keep]) if rows.carried is None
                   else rows.carried if mask is None else rows.carried.filter(pa.array(mask)))
        columns = {"pid": pid, "tid": tid, "thread_name": thread_name, "state": state,
                   "start_ns": rows.start_ns[keep], "end_ns": rows.end_ns[keep],
                   **{c: carried.column(c) for c in carried.column_names}}
        return pa.table({field.name: columns[field.name] for field in self.schema})

    def _thread_names(self, pid: int) -> dict[int, str]:
        """tid -> name in the files of process PID (one file, but for a pid used again: the rows of
        one push no longer say which file they came from, so a tid named in two files takes the
        first file's name)."""
        if pid not in self._names_of:
            self._names_of[pid] = {}
            for f in reversed(self._files_of.get(pid, [])):  # (the first file's name of a tid wins)
                self._names_of[pid].update(f.thread_names())
        return self._names_of[pid]


def most_at_once(spans: list[tuple[int, int] | None]) -> int:
    """The most of SPANS ((start, end); None: not known, taken to overlap every other) that
    overlap at one time; at least 1."""
    known = [s for s in spans if s is not None]
    unknown = len(spans) - len(known)
    if not known:
        return max(unknown, 1)
    starts, ends = np.sort([s for s, _ in known]), np.sort([e for _, e in known])
    # at each start: the spans begun by then, less those ended before it
    return unknown + int((np.arange(1, starts.size + 1) - np.searchsorted(ends, starts, "left")).max())


class ProcessCodes:
    """The code of GIL rows from several processes' files as one set of dense numbers (each file
    numbers its own: EventsIntervals.code_numbers), and the code columns of rows from them:
    function and file dictionary-encoded over every code named so far, a code with no name a
    null index (Parquet takes no null in a dictionary; the writer would mend it row by row)."""

    def __init__(self, files: int):
        self.of_file = [np.zeros(0, np.int64) for _ in range(files)]  # a file's numbers -> these
        # per code: its function's and file's text ("" unnamed) and whether unnamed; its line and whether none
        self._text = {c: (pa.array([], pa.string()), np.zeros(0, bool)) for c in ("function", "file")}
        self._line = np.zeros(0, np.int64), np.zeros(0, bool)
        self._index = np.zeros(0, np.int32)  # (each code's index into the text columns)
        self._count = 0
        self._new: list[pd.DataFrame] = []  # names numbered since the columns were last made

    def number(self, file: int, numbers: np.ndarray, new_names: pd.DataFrame | None) -> np.ndarray:
        if new_names is not None and len(new_names):
            n = self._count
            self.of_file[file] = np.concatenate([self.of_file[file], np.arange(n, n + len(new_names), dtype=np.int64)])
            self._new.append(new_names)
            self._count += len(new_names)
        return self.of_file[file][numbers]

    def _named(self, names: pd.DataFrame) -> None:
        """The codes numbered next named NAMES (function, file, line), appended to those before."""
        for c in ("function", "file"):
            unnamed = names[c].isna().to_numpy(bool)
            text, before = self._text[c]
            self._text[c] = (pa.concat_arrays([text, pa.array(names[c].astype(object).where(~unnamed, ""), pa.string())]),
                             np.concatenate([before, unnamed]))
        line, no_line = self._line
        self._line = (np.concatenate([line, names["line"].fillna(0).to_numpy(np.int64)]),
                      np.concatenate([no_line, names["line"].isna().to_numpy(bool)]))
        self._index = np.arange(self._line[0].size, dtype=np.int32)

    def columns(self, numbers: np.ndarray) -> pa.Table:
        if self._new:  # (made once per push, not per file's block: a session of many processes)
            self._named(pd.concat(self._new, ignore_index=True))
            self._new = []
        index = pa.array(numbers.astype(np.int32))  # (shared by the text columns whose codes all have text: most)
        line, no_line = self._line
        return pa.table({**{c: pa.DictionaryArray.from_arrays(_per_row(self._index, numbers, unnamed, pa.int32())
                                                              if unnamed.any() else index, text, safe=False)
                            for c, (text, unnamed) in self._text.items()},
                         "line": _per_row(line, numbers, no_line, pa.int64())})


def _per_row(values: np.ndarray, numbers: np.ndarray, null: np.ndarray, arrow_type) -> pa.Array:
    """Each row's value of its code (VALUES and NULL per code, NUMBERS per row) as Arrow, null
    where its code's is: all nulls at once where no code has one (a session recorded without code
    attribution), no mask where every code has one."""
    if null.all():
        return pa.nulls(numbers.size, arrow_type)
    return pa.array(values[numbers], arrow_type, mask=null[numbers] if null.any() else None)


def _later_minimum(block_min: list[int]) -> np.ndarray:
    """Per block, the earliest start in it or any later block (END past the last)."""
    return np.append(np.minimum.accumulate(np.array(block_min[::-1], np.int64))[::-1], END) if block_min else \
        np.array([END], np.int64)
