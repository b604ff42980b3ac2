"""The GIL side of an offline analysis as a stream of blocks for the correlation core
(engine/analysis/stream.py drives it): a Parquet gil table (`ParquetGil`), the probe's
events files, one per process (`EventsGil`, intervals made block by block by
engine.ingest.gil.EventsIntervals), or a table already in memory (`FrameGil`, one block).

Two passes over it. The first (`first_pass`) learns what the core cannot know from the past
alone: where each later block starts at the earliest (the watermark after each block) and each
thread's inferred lifetime (docs/results.md, "gil_free"). The second (`pushes`) gives the
blocks, from the processes' files in the order their intervals start.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.correlate import END, GilRows, kernels
from engine.correlate.inputs import _int64, check_gil_schema, gil_rows_from_arrow, gil_rows_from_frame
from engine.correlate.schema import GIL_CARRIED_COLUMNS, GIL_COLUMNS, GIL_STATES, to_pandas
from engine.correlate.tables import check_gil
from engine.errors import TandemError
from engine.ingest.gil import PROBE_CLOCK, EventsIntervals
from engine.store import TableWriter, copy_table, is_text, read_metadata


BLOCK_ROWS = 1 << 20
FIRST_PASS_THREADS = 8
TIME_COLUMNS = ("pid", "tid", "start_ns", "end_ns")


class ThreadHulls:
    """The hull of each thread's non-empty intervals (its inferred lifetime), block by block:
    key (pid << 32 | tid), start_ns, end_ns."""

    def __init__(self):
        self.numbers = kernels.DenseNumbers()
        self.lo, self.hi = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def add(self, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> "ThreadHulls":
        index, new = self.numbers.number(tid, high=pid)  # (pid << 32) | tid
        if new.size:
            self.lo = np.concatenate([self.lo, np.full(new.size, END, np.int64)])
            self.hi = np.concatenate([self.hi, np.full(new.size, -END, np.int64)])
        kernels.group_bounds(index, start, end, self.lo, self.hi)
        return self

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"key": self.numbers.keys, "start_ns": self.lo, "end_ns": self.hi})


def thread_lifetimes(gil: pd.DataFrame) -> pd.DataFrame:
    """pid, tid, start_ns, end_ns: each thread's lifetime in a whole GIL table (the hull of its
    non-empty intervals), as a streamed session's first pass gives it."""
    columns = (gil[c].to_numpy(np.int64) for c in ("pid", "tid", "start_ns", "end_ns"))
    return _lifetimes([ThreadHulls().add(*columns).table()])


def _lifetimes(bounds: list[pd.DataFrame]) -> pd.DataFrame:
    threads = pd.concat(bounds, ignore_index=True) if bounds else pd.DataFrame(
        {"key": np.zeros(0, np.int64), "start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64)})
    threads = threads[threads.end_ns > threads.start_ns].groupby("key", as_index=False).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    key = threads["key"].to_numpy(np.int64)
    threads["pid"], threads["tid"] = key >> 32, key & 0xFFFFFFFF
    return threads[["pid", "tid", "start_ns", "end_ns"]]


def _later_minimum(block_min: list[int]) -> np.ndarray:
    """Per block, the earliest start in it or any later block (END past the last)."""
    return np.append(np.minimum.accumulate(np.array(block_min[::-1], np.int64))[::-1], END) if block_min else \
        np.array([END], np.int64)


class FrameGil:
    """A gil table already in memory (a DataFrame) as one block: the notebook's `correlate`. It is
    checked (engine.correlate.tables.check_gil) by the first pass; its duplicate rows dropped there."""

    copy, copy_schema, references = True, None, []  # (the table is the caller's: results keep it, name no file)

    def __init__(self, gil: pd.DataFrame, source: str):
        self.frame, self.source, self.attrs = gil, source, gil.attrs
        carried = [c for c in GIL_CARRIED_COLUMNS if c in gil.columns]
        self.carried = list(pa.Schema.from_pandas(gil[carried], preserve_index=False)) if carried else []
        self.duplicate_rows = 0

    def first_pass(self) -> pd.DataFrame:
        self.frame, self.duplicate_rows = check_gil(self.frame, self.source)
        return thread_lifetimes(self.frame)

    def pushes(self):
        frame = self.frame
        yield GilBlock(gil_rows_from_frame(frame), END, len(frame), frame_of=lambda mask: frame[mask])


class ParquetGil:
    """A gil table in a Parquet file, read in blocks of BLOCK_ROWS rows."""

    duplicate_rows = 0  # (duplicates are dropped, and counted, by the core as they pass)

    def __init__(self, path: Path, copy: bool = False):
        self.path = Path(path)
        if not self.path.is_file():
            raise TandemError(f"{self.path}: no such file")
        try:
            self.file = pq.ParquetFile(self.path, read_dictionary=["state"])
        except (OSError, ValueError) as err:
            raise TandemError(f"{self.path}: not a readable Parquet table: {err}") from None
        check_gil_schema(self.file.schema_arrow, str(self.path))
        self.attrs = read_metadata(self.path)
        self.source = str(self.path)
        self.references = [str(self.path.resolve())]
        self.carried = [self.file.schema_arrow.field(c) for c in GIL_CARRIED_COLUMNS if c in self.file.schema_arrow.names]
        self.copy = copy  # (the file itself is copied to OUT: docs/results.md, "gil.parquet")
        self.copy_schema = None

    def _blocks(self, columns=None, read_dictionary=("state",)):
        """The batches of up to BLOCK_ROWS rows, row group by row group, each group from a reader
        of its own: one ParquetFile's iter_batches keeps about a third of every batch it made until
        the file is closed (1.4 GB over 98 M rows), and it ends a batch at a row group's end when a
        column is read as a dictionary (state) but not otherwise, so the first pass (times only)
        and the pushes would cut the file into different blocks."""
        for group in range(self.file.metadata.num_row_groups):
            yield from self._group_blocks(group, columns, read_dictionary)

    def _group_blocks(self, group: int, columns=None, read_dictionary=("state",)):
        reader = pq.ParquetFile(self.path, metadata=self.file.metadata, read_dictionary=list(read_dictionary))
        yield from reader.iter_batches(batch_size=BLOCK_ROWS, row_groups=[group], columns=columns)

    def write_copy(self, path: Path, meta: dict) -> Path:
        """The table as it is, every column, into PATH (atomically): its pages copied as they are,
        else (a footer pyarrow cannot remake) read and written again block by block."""
        try:
            return copy_table(self.path, path, meta)
        except ValueError:
            pass
        source = pq.ParquetFile(self.path)  # (its own types: no dictionary read for state)
        writer = TableWriter(path, source.schema_arrow)
        try:
            for batch in self._blocks(read_dictionary=()):
                writer.write(pa.Table.from_batches([batch]).replace_schema_metadata(writer.schema.metadata))
        except BaseException:
            writer.abort()
            raise
        return writer.close(meta)

    def first_pass(self) -> pd.DataFrame:
        """Each thread's lifetime (pid, tid, start_ns, end_ns); the watermarks for `pushes`."""

        def one_group(group: int) -> tuple[list[int], pd.DataFrame]:
            block_min, hulls = [], ThreadHulls()
            for batch in self._group_blocks(group, list(TIME_COLUMNS)):
                pid, tid, start, end = (_int64(batch, c, self.source) for c in TIME_COLUMNS)
                block_min.append(int(start.min()) if start.size else END)
                hulls.add(pid, tid, start, end)
            return block_min, hulls.table()

        # Row groups side by side (decoding and the hulls release the GIL), as EventsGil's files.
        groups = self.file.metadata.num_row_groups
        with ThreadPoolExecutor(max_workers=min(groups, os.cpu_count() or 1, FIRST_PASS_THREADS) or 1) as pool:
            done = list(pool.map(one_group, range(groups)))
        self._later = _later_minimum([m for block_min, _ in done for m in block_min])
        return _lifetimes([hulls for _, hulls in done])

    def pushes(self):
        """(GilRows, watermark, rows so far) per block."""
        columns = [c for c in (*GIL_COLUMNS, *GIL_CARRIED_COLUMNS) if c in self.file.schema_arrow.names]
        first_row = 0
        # text read as dictionaries: a file's dictionary pages become the blocks' dictionaries,
        # not a string per row hashed again (carried_numbered)
        text = ["state", *(f.name for f in self.carried if is_text(f.type))]
        for k, batch in enumerate(self._blocks(columns, read_dictionary=text)):
            rows = gil_rows_from_arrow(batch, self.source, first_row)
            first_row += batch.num_rows
            yield GilBlock(rows, int(self._later[k + 1]), first_row)


class EventsGil:
    """The GIL probe's events files (one per process) as one stream of interval blocks."""

    duplicate_rows = 0  # (duplicates are dropped, and counted, by the core as they pass)

    def __init__(self, paths: list[Path], block_records: int | None = None, copy: bool = False):
        self.files = [EventsIntervals(Path(p), block_records or BLOCK_ROWS) for p in paths]
        self.source = ", ".join(str(p) for p in paths)
        self.references = [str(Path(p).resolve()) for p in paths]
        self.carried = [pa.field("function", pa.string()), pa.field("file", pa.string()), pa.field("line", pa.int64())]
        # read_gil's table: the rows of gil.parquet when copied, and what `tables` gives
        self.schema = pa.schema([("pid", pa.int64()), ("tid", pa.int64()), ("thread_name", pa.string()),
                                 ("state", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                                 *self.carried])
        # A file not closed may still grow (a recording in progress), segments rotate away:
        # results cannot name them.
        self.copy = copy or not all(f.header.closed and not f.segmented for f in self.files)
        self.copy_schema = self.schema if self.copy else None
        self.attrs: dict = {}

    def first_pass(self) -> pd.DataFrame:
        def one_file(f):
            block_min, tid, lo, hi = f.bounds()  # (the blocks paired, their rows not made)
            return _later_minimum(block_min), pd.DataFrame({"key": f.pid << 32 | tid, "start_ns": lo, "end_ns": hi})

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
        return _lifetimes(bounds)

    def pushes(self):
        """Blocks of all processes, always from the process whose remaining intervals start
        earliest; the watermark is the earliest start of anything not pushed yet."""
        streams = [f.blocks() for f in self.files]
        position = [0] * len(self.files)
        rows_so_far = 0
        while True:
            left = [j for j, (later, k) in enumerate(zip(self._later, position)) if k < len(later) - 1]
            if not left:
                return
            i = min(left, key=lambda j: self._later[j][position[j]])
            tid, state, start, end, code = next(streams[i])
            position[i] += 1
            f = self.files[i]
            watermark = min(later[k] for later, k in zip(self._later, position))
            rows_so_far += start.size
            rows = self._rows(f, tid, state, start, end, code)
            table_of = lambda mask, f=f, rows=rows: self._table(f, rows, mask)  # noqa: E731
            yield GilBlock(rows, int(watermark), rows_so_far, table_of(None) if self.copy else None, table_of)

    def tables(self):
        """read_gil's table of each file in turn, block by block (each thread's rows in start
        order): what reads results that name these files instead of a gil.parquet."""
        for f in self.files:
            for block in f.blocks():
                yield self._table(f, self._rows(f, *block))

    @staticmethod
    def _rows(f, tid, state, start, end, code) -> GilRows:
        key, carried = f.code_columns(code)
        return GilRows(np.full(tid.size, f.pid, np.int64), tid, state, start, end, pa.table(carried), key)

    def _table(self, f, rows: GilRows, mask: np.ndarray | None = None) -> pa.Table:
        """Rows of read_gil's table (thread names from the process's files), text
        dictionary-encoded (TableWriter's text_as_dictionary); only the MASK's rows if given."""
        keep = slice(None) if mask is None else mask
        tid = rows.tid[keep]
        names = f.thread_names()
        inverse, tids = pd.factorize(tid)  # (a hash: a sort of a million rows costs 10x more)
        thread_name = pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)),
                                                     pa.array([names.get(int(t)) for t in tids], pa.string()))
        state = pa.DictionaryArray.from_arrays(pa.array(rows.state[keep].astype(np.int32)),
                                               pa.array(GIL_STATES, pa.string()))
        carried = rows.carried if mask is None else rows.carried.filter(pa.array(mask))
        columns = {"pid": rows.pid[keep], "tid": tid, "thread_name": thread_name, "state": state,
                   "start_ns": rows.start_ns[keep], "end_ns": rows.end_ns[keep],
                   **{c: carried.column(c) for c in carried.column_names}}
        return pa.table({field.name: columns[field.name] for field in self.schema})


@dataclass
class GilBlock:
    """One push's GIL side: the rows, the watermark after them, the rows pushed so far; `copy`:
    the rows of gil.parquet (when copied); `table_of(mask)`: some rows as read_gil's table;
    `frame_of(mask)`: some rows of a table already in memory."""

    rows: GilRows
    watermark_ns: int
    rows_so_far: int
    copy: pa.Table | None = None
    table_of: Callable[[np.ndarray | None], pa.Table] | None = None
    frame_of: Callable[[np.ndarray], pd.DataFrame] | None = None


def rows_frame(block: GilBlock, mask: np.ndarray) -> pd.DataFrame:
    """Some rows of a block as a gil-table DataFrame (with thread names and code when known)."""
    if block.frame_of is not None:
        return block.frame_of(mask)
    if block.table_of is not None:
        return to_pandas(block.table_of(mask))
    rows = block.rows
    frame = pd.DataFrame({"pid": rows.pid[mask], "tid": rows.tid[mask],
                          "state": pd.array(np.array(GIL_STATES)[rows.state[mask]], dtype="string"),
                          "start_ns": rows.start_ns[mask], "end_ns": rows.end_ns[mask]})
    if rows.carried is not None:
        for name, column in zip(rows.carried.column_names, to_pandas(rows.carried.filter(mask)).items()):
            frame[name] = column[1].to_numpy()
    return frame
