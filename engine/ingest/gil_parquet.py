"""Parquet gil tables as a GIL source (engine/ingest/gil_stream.py): one table, or several
read as one table of their columns' union, in blocks of BLOCK_ROWS rows, pushed in the order
their rows start: a table in time order as it is, several tables and a table made of a few
runs in start order side by side, any other order through time buckets on disk."""
from __future__ import annotations

import math
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.clock.facts import clock_parts
from engine.correlate import END, GilRows
from engine.correlate.inputs import _int64, check_gil_schema, gil_rows_from_arrow
from engine.correlate.schema import GIL_CARRIED_COLUMNS, GIL_COLUMNS
from engine.errors import TandemError
from engine.ingest import gil_stream
from engine.ingest.gil_stream import FIRST_PASS_THREADS, GilBlock, ThreadHulls, lifetimes_of, merged_before
from engine.join.kernels import stable_order
from engine.store import TableCopy, TableWriter, is_text, not_parquet, read_metadata


SCRATCH_IPC = pa.ipc.IpcWriteOptions(compression="lz4")  # (rows waiting on disk: _by_time)
SCRATCH_ROWS = 1 << 16  # (rows of a block written to their time buckets at once)
# Rows of a Parquet table's row group under one watermark bound at most (RowsAhead: the largest
# divisor of BLOCK_ROWS up to this, so that blocks cut as the first pass's get exact watermarks).
WATERMARK_ROWS = 1 << 16
# A Parquet table not in time order (sorted by thread, say) read in its order would have the core
# hold every row the watermark has not passed: past HELD_BLOCKS blocks of them (estimated by the
# first pass), its rows are pushed by time instead (ParquetGil._by_time). SAMPLES_A_BLOCK starts
# of each block's worth of rows place the time buckets.
HELD_BLOCKS = 1
SAMPLES_A_BLOCK = 256
MAX_BUCKETS = 512  # (a file open for each while they are written; past it, buckets of more than a block)
# A table not in time order made of at most MAX_RUNS runs in start order (a thread's rows, then
# the next thread's) is read a run at a time side by side, as several tables are, not through
# time buckets: unless its runs' readers would decode more than RUN_DECODES times its rows (a
# reader decodes every row group its run lies in, whole).
MAX_RUNS = 64
RUN_DECODES = 2
TIME_COLUMNS = ("pid", "tid", "start_ns", "end_ns")


class ParquetGil:
    """Gil tables in Parquet files, read in blocks of BLOCK_ROWS rows: one table, or several read
    as one table of their columns' union (each process's, or a session's in parts), their rows
    merged in the order they start (`pushes`)."""

    duplicate_rows = 0  # (duplicates are dropped, and counted, by the core as they pass)

    def __init__(self, paths: Path | list[Path], copy: bool = False):
        self.paths = [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]
        self.files = [_parquet_gil(path) for path in self.paths]
        self.schema = schema = union_schema(self.paths, [file.schema_arrow for file in self.files])
        # (a table with the union's columns and types is read as it is; another is conformed)
        self._alike = [plain_schema(file.schema_arrow).equals(schema) for file in self.files]
        self.attrs = gil_parts_attrs([read_metadata(path) for path in self.paths], [str(p) for p in self.paths])
        self.source = ", ".join(str(p) for p in self.paths)
        self.references = [str(p.resolve()) for p in self.paths]
        self.carried = [schema.field(c) for c in GIL_CARRIED_COLUMNS if c in schema.names]
        self.copy = copy  # (the file itself is copied to OUT: docs/results.md, "gil.parquet")
        # (one table's pages are copied as they are; several tables' rows, as they are pushed)
        self.copy_schema = schema if copy and len(self.paths) > 1 else None
        self._copy = None  # (the copy begun: begin_copy)
        self.scratch: Path | None = None  # (where rows pushed by time wait: the results' staging directory)
        self._edges: np.ndarray | None = None  # (the time buckets' edges, when pushed by time)
        # (file, first row, end row, first start) of each run in start order, when read a run at a time
        self._runs: list[tuple[int, int, int, int]] | None = None

    def _blocks(self, f: int, columns=None, read_dictionary=("state",), batch_rows=None):
        """File F's batches of up to BATCH_ROWS (BLOCK_ROWS) rows, row group by row group, each group from a
        reader of its own: one ParquetFile's iter_batches keeps about a third of every batch it
        made until the file is closed (memory growing with the table), and it ends a batch at a row
        group's end when a column is read as a dictionary (state) but not otherwise, so the first
        pass (times only) and the pushes would cut the file into different blocks."""
        for group in range(self.files[f].metadata.num_row_groups):
            yield from self._group_blocks(f, group, columns, read_dictionary, batch_rows)

    def _group_blocks(self, f: int, group: int, columns=None, read_dictionary=("state",), batch_rows=None):
        """(COLUMNS, READ_DICTIONARY: of the union; those file F has are read, the others made nulls.)"""
        names = self.files[f].schema_arrow.names
        reader = pq.ParquetFile(self.paths[f], metadata=self.files[f].metadata,
                                read_dictionary=[c for c in read_dictionary if c in names])
        for batch in reader.iter_batches(batch_size=batch_rows or gil_stream.BLOCK_ROWS, row_groups=[group],
                                         columns=None if columns is None else [c for c in columns if c in names]):
            yield batch if self._alike[f] else conformed(batch, self.schema, columns or self.schema.names, read_dictionary)

    def _run_blocks(self, f: int, first: int, end: int, columns, read_dictionary, batch_rows):
        """File F's rows FIRST..END-1 (a run), in _group_blocks' batches of the row groups they lie
        in, cut to them."""
        starts = self._ahead[f].group_start
        for g in range(int(np.searchsorted(starts, first, "right")) - 1, starts.size - 1):
            at = int(starts[g])
            for batch in self._group_blocks(f, g, columns, read_dictionary, batch_rows):
                lo, hi = max(first - at, 0), min(end - at, batch.num_rows)
                at += batch.num_rows
                if hi > lo:
                    yield batch if hi - lo == batch.num_rows else batch.slice(lo, hi - lo)
                if at >= end:
                    return

    def copy_rows(self) -> None:
        """Each block's rows as a table of every column (GilBlock.copy), not the file's pages
        copied: for MergedGil's one copy of several sources."""
        self.copy, self.copy_schema = True, self.schema

    def begin_copy(self, path: Path) -> None:
        """Begin copying the (one) table as it is, every column, into PATH: its pages as they are,
        in a thread of their own (TableCopy), unless its footer cannot be remade (`write_copy`
        then reads and writes it again)."""
        try:
            self._copy = TableCopy(self.paths[0], path)
        except ValueError:
            self._copy = None

    def abort_copy(self) -> None:
        if self._copy is not None:
            self._copy.abort()
            self._copy = None

    def write_copy(self, path: Path, meta: dict) -> Path:
        """The (one) table as it is, every column, into PATH (atomically): the copy `begin_copy`
        began, else read and written again block by block."""
        if self._copy is not None:
            copy, self._copy = self._copy, None
            return copy.close(meta)
        source = pq.ParquetFile(self.paths[0])  # (its own types: no dictionary read for state)
        writer = TableWriter(path, source.schema_arrow)
        try:
            for batch in self._blocks(0, read_dictionary=()):
                writer.write(pa.Table.from_batches([batch]).replace_schema_metadata(writer.schema.metadata))
        except BaseException:
            writer.abort()
            raise
        return writer.close(meta)

    def first_pass(self) -> pd.DataFrame:
        """Each thread's lifetime (pid, tid, start_ns, end_ns); the watermarks for `pushes`: the
        earliest start in each `chunk` rows of each row group (RowsAhead)."""
        chunk = math.gcd(gil_stream.BLOCK_ROWS, WATERMARK_ROWS)
        every = max(gil_stream.BLOCK_ROWS // SAMPLES_A_BLOCK, 1)

        def one_group(at: tuple[int, int]):
            f, g = at
            n = -(-self.files[f].metadata.row_group(g).num_rows // chunk)
            chunk_min, chunk_max = np.full(n, END, np.int64), np.full(n, -END, np.int64)
            hulls, offset, sample = ThreadHulls(), 0, []
            breaks, ends = [], []  # (where a run in start order begins, and its start; the group's first and last start)
            for batch in self._group_blocks(f, g, list(TIME_COLUMNS)):
                pid, tid, start, end = (_int64(batch, c, str(self.paths[f])) for c in TIME_COLUMNS)
                _chunk_bounds(chunk_min, chunk_max, start, offset, chunk)
                hulls.add(pid, tid, start, end)
                sample.append(start[(-offset) % every::every])
                if start.size and breaks is not None:
                    down = np.flatnonzero(start[1:] < start[:-1]) + 1
                    if ends and start[0] < ends[-1]:
                        down = np.r_[0, down]
                    breaks = (breaks + list(zip((down + offset).tolist(), start[down].tolist()))
                              if len(breaks) + down.size <= MAX_RUNS else None)
                if start.size:
                    ends = [ends[0] if ends else int(start[0]), int(start[-1])]
                offset += batch.num_rows
            return (chunk_min, chunk_max, np.concatenate(sample) if sample else np.zeros(0, np.int64), hulls.arrays(),
                    breaks, ends)

        # Row groups side by side (decoding and the hulls release the GIL), as EventsGil's files.
        groups = [(f, g) for f, file in enumerate(self.files) for g in range(file.metadata.num_row_groups)]
        with ThreadPoolExecutor(max_workers=min(len(groups), os.cpu_count() or 1, FIRST_PASS_THREADS) or 1) as pool:
            done = list(pool.map(one_group, groups))
        of_file = [[d for (in_file, _), d in zip(groups, done) if in_file == f] for f in range(len(self.files))]
        self._ahead = [RowsAhead(self.files[f].metadata, chunk, [d[0] for d in of_file[f]]) for f in range(len(self.files))]
        held = sum(ahead.rows_held([d[1] for d in parts]) for ahead, parts in zip(self._ahead, of_file))
        if held > HELD_BLOCKS * gil_stream.BLOCK_ROWS:
            self._runs = self._sorted_runs([[(d[4], d[5]) for d in parts] for parts in of_file])
            if self._runs is None:
                rows = sum(ahead.rows for ahead in self._ahead)
                self._edges = time_edges(np.concatenate([d[2] for d in done]), min(-(-rows // gil_stream.BLOCK_ROWS), MAX_BUCKETS))
        return lifetimes_of([d[3] for d in done])

    def _sorted_runs(self, groups: list[list[tuple]]) -> list[tuple[int, int, int, int]] | None:
        """The runs in start order the tables are made of (file, first row, end row, first start),
        from each row group's (GROUPS, per file: where a run begins in it and its start, None past
        MAX_RUNS; its first and last start); None where there are more than MAX_RUNS, or their
        readers would decode more than RUN_DECODES times the rows."""
        runs, decoded = [], 0
        for f, file_groups in enumerate(groups):
            starts, last, cuts = self._ahead[f].group_start, None, []  # (cuts: a run's first row, its start)
            for g, (breaks, ends) in enumerate(file_groups):
                if breaks is None:
                    return None
                if ends and (last is None or ends[0] < last):  # (the file's first row, or a group's going back in time)
                    cuts.append((int(starts[g]), ends[0]))
                cuts += [(int(starts[g]) + row, start) for row, start in breaks if row]
                last = ends[1] if ends else last
            for (first, start), (end, _) in zip(cuts, [*cuts[1:], (self._ahead[f].rows, None)]):
                runs.append((f, first, end, start))
                lo, hi = np.searchsorted(starts, first, "right") - 1, np.searchsorted(starts, end, "left")
                decoded += int(starts[hi] - starts[lo])
        rows = sum(ahead.rows for ahead in self._ahead)
        return runs if len(runs) <= MAX_RUNS and decoded <= RUN_DECODES * rows else None

    def thread_names(self, keys: np.ndarray) -> dict:
        """The names of the threads KEYS ((pid << 32) | tid) at their first row in the tables, where
        they have thread_name (the blocks leave it out: a column a hundred times larger than the few
        threads that need their name): their row groups read, three columns, until each is found."""
        schema = self.schema
        kind = schema.field("thread_name").type if "thread_name" in schema.names else None
        if kind is not None and pa.types.is_dictionary(kind):
            kind = kind.value_type
        if kind is None or not is_text(kind) or not keys.size:  # (names are text; another column is no name)
            return {}
        wanted, names = set(keys.tolist()), {}
        for f in range(len(self.files)):
            if "thread_name" not in self.files[f].schema_arrow.names:
                continue
            for batch in self._blocks(f, ["pid", "tid", "thread_name"], read_dictionary=("thread_name",)):
                key = (_int64(batch, "pid", self.source) << 32) | _int64(batch, "tid", self.source)
                seen, first = np.unique(key, return_index=True)
                column = batch.column("thread_name")
                for k, at in zip(seen.tolist(), first.tolist()):
                    if k in wanted and k not in names:
                        names[k] = column[at].as_py()
                if len(names) == len(wanted):
                    return names
        return names

    def pushes(self):
        """(GilRows, watermark, rows so far) per block: one table's blocks in its order, the
        watermark after each the earliest start of the rows after it (RowsAhead); several tables
        merged (`_side_by_side`); a table not in time order through time buckets (`_by_time`)."""
        schema = self.schema
        columns = [c for c in (*GIL_COLUMNS, *GIL_CARRIED_COLUMNS) if c in schema.names]
        # text read as dictionaries: a file's dictionary pages become the blocks' dictionaries,
        # not a string per row hashed again (carried_numbered); every column when copied
        text = ["state", *(f.name for f in (schema if self.copy_schema else self.carried) if is_text(f.type))]
        read = None if self.copy_schema else columns
        if self._edges is not None:
            yield from self._by_time(columns, read, text)
            return
        if self._runs is not None or len(self.files) > 1:
            yield from self._side_by_side(columns, read, text,
                                          self._runs or [(f, 0, a.rows, None) for f, a in enumerate(self._ahead)])
            return
        ahead, batches, read_rows = self._ahead[0], self._blocks(0, read, read_dictionary=text), 0
        while read_rows < ahead.rows:
            parts, first_row = [], read_rows  # (small row groups' batches made one block: a push costs more than its rows)
            while not parts or (read_rows - first_row < gil_stream.BLOCK_ROWS and read_rows < ahead.rows):
                parts.append(self._next_batch(batches, 0, read_rows))
                read_rows += parts[-1].num_rows
            batch = parts[0] if len(parts) == 1 else pa.Table.from_batches(parts).combine_chunks().to_batches()[0]
            rows = gil_rows_from_arrow(batch.select(columns), str(self.paths[0]), first_row)
            yield GilBlock(rows, int(ahead.earliest_from(read_rows)), read_rows,
                           copy=pa.Table.from_batches([batch]) if self.copy_schema else None)

    def _next_batch(self, batches, f: int, read_rows: int, end: int | None = None) -> pa.RecordBatch:
        """The next of file F's BATCHES, READ_ROWS read so far: an error where the file ends before
        its footer's rows (END: those of the run read; it changed since the first pass)."""
        batch = next(batches, None)
        if batch is None:
            end = self._ahead[f].rows if end is None else end
            raise TandemError(f"{self.paths[f]}: ends at row {read_rows:,} of {end:,} (changed while read?)")
        return batch

    def _side_by_side(self, columns: list[str], read, text: list[str], parts: list[tuple[int, int, int, int | None]]):
        """The pushes of several tables, or of a table's runs in start order (PARTS: file, first
        row, end row of each, and a run's first start). Each read is about BLOCK_ROWS over the
        number of parts, from the part whose rows not read yet start earliest, and is a run
        (sorted by start if it was not); the runs' rows that start before the watermark (the
        earliest start of any row not read yet) are final, and once half a block of them are (or
        the parts end) they are pushed merged in start order (merged_before), the others wait. So
        the core appends rows in order and holds about a block, however many parts (EventsGil
        does so with the processes' files). A run's carried_key says where its rows were read:
        their code and copied columns are taken by it (`tables`: each read's, by its first key)."""
        n = len(parts)
        aheads = [self._ahead[f] if start is None else SortedRun(end, start) for f, _, end, start in parts]
        batch_rows = max(gil_stream.BLOCK_ROWS // n, gil_stream.MIN_FILE_BLOCK)
        blocks = [self._run_blocks(f, first, end, read, text, batch_rows) for f, first, end, _ in parts]
        read_rows = [first for _, first, _, _ in parts]
        left = [k for k, (_, first, end, _) in enumerate(parts) if end > first]
        waiting: list[GilRows] = []
        tables: dict[int, pa.Table] = {}
        keys = rows_so_far = 0
        while left or waiting:
            watermark = END
            if left:
                k = min(left, key=lambda k: aheads[k].earliest_from(read_rows[k]))
                f = parts[k][0]
                batch = self._next_batch(blocks[k], f, read_rows[k], parts[k][2])
                rows = gil_rows_from_arrow(batch.select(columns), str(self.paths[f]), read_rows[k])
                aheads[k].read(rows.start_ns)
                read_rows[k] += batch.num_rows
                if read_rows[k] >= parts[k][2]:
                    left.remove(k)
                table = pa.Table.from_batches([batch]) if self.copy_schema else rows.carried
                arrays = [rows.pid, rows.tid, rows.state, rows.start_ns, rows.end_ns]
                if rows.start_ns.size > 1 and (np.diff(rows.start_ns) < 0).any():
                    order = stable_order(rows.start_ns)
                    arrays = [a[order] for a in arrays]
                    table = table.take(pa.array(order)) if table is not None else None
                if table is not None:
                    tables[keys] = table
                waiting.append(GilRows(*arrays, None, np.arange(keys, keys + len(rows), dtype=np.int64)))
                keys += len(rows)
                watermark = min((aheads[j].earliest_from(read_rows[j]) for j in left), default=END)
                if left and sum(int(np.searchsorted(r.start_ns, watermark, "left")) for r in waiting) < gil_stream.BLOCK_ROWS // 2:
                    continue
            arrays, waiting = merged_before(waiting, watermark)
            taken = _taken(tables, arrays[5]) if tables else None
            kept = {_read_at(tables, int(r.carried_key[0])) for r in waiting} if tables else set()
            for first in [k for k in tables if k not in kept]:  # (reads whose every row is pushed)
                del tables[first]
            carried = (taken.select([f.name for f in self.carried]) if self.copy_schema else taken) if self.carried else None
            rows_so_far += arrays[3].size
            yield GilBlock(GilRows(*arrays[:5], carried), int(watermark), rows_so_far,
                           copy=taken if self.copy_schema else None)

    def _by_time(self, columns: list[str], read, text: list[str]):
        """The pushes of tables not in time order: every row first written to the time bucket its
        start falls in (self._edges: about BLOCK_ROWS rows each, from the first pass's sample; an
        Arrow file each, in a scratch directory), then each bucket pushed in turn, its rows sorted
        by start; the watermark after a bucket is the next one's edge. While the rows are written,
        an empty block after each batch read (the watermark: the tables' earliest start), so that
        the drive can stop it (Ctrl-C) without waiting for the whole table."""
        earliest = min(ahead.earliest_from(0) for ahead in self._ahead)
        with tempfile.TemporaryDirectory(prefix=".gil-by-time-", dir=self.scratch) as scratch:
            paths = [Path(scratch) / f"{b}.arrow" for b in range(self._edges.size + 1)]
            writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
            numbered = TextNumbers()
            try:
                for f in range(len(self.files)):
                    for batch in self._blocks(f, read, read_dictionary=text):
                        for at in range(0, batch.num_rows, SCRATCH_ROWS):  # (each piece's text made whole: a piece at a time)
                            piece = numbered.numbered(pa.Table.from_batches([batch.slice(at, SCRATCH_ROWS)]))
                            self._to_buckets(piece, writers, paths, f)
                        yield GilBlock(GilRows.empty(), earliest, 0)
            finally:
                for writer in writers.values():
                    writer.close()
            rows_so_far, filled = 0, sorted(writers)
            for i, b in enumerate(filled):
                with pa.OSFile(str(paths[b])) as source:
                    table = pa.ipc.open_file(source).read_all().combine_chunks()
                paths[b].unlink()
                order = stable_order(table.column("start_ns").to_numpy())
                table = numbered.text(table.take(pa.array(order)))
                rows = gil_rows_from_arrow(table.select(columns).to_batches()[0], self.source, rows_so_far)
                rows_so_far += table.num_rows
                watermark = int(self._edges[filled[i + 1] - 1]) if i + 1 < len(filled) else END  # (the next bucket's lower edge)
                yield GilBlock(rows, watermark, rows_so_far, copy=table if self.copy_schema else None)

    def _to_buckets(self, piece: pa.Table, writers: dict, paths: list[Path], f: int) -> None:
        """PIECE's rows (of file F) appended to the time buckets their starts fall in (PATHS),
        each bucket's file begun with its first rows (WRITERS)."""
        piece = piece.cast(pa.schema([pa.field(c.name, c.type.value_type) if pa.types.is_dictionary(c.type) else c
                                      for c in piece.schema]))  # (a dictionary a batch: not in one file)
        bucket = np.searchsorted(self._edges, _int64(piece, "start_ns", str(self.paths[f])), "right")
        piece = piece.take(pa.array(stable_order(bucket)))
        first = 0
        for b, n in enumerate(np.bincount(bucket, minlength=len(paths)).tolist()):
            if n:
                if b not in writers:
                    writers[b] = pa.ipc.new_file(str(paths[b]), piece.schema, options=SCRATCH_IPC)
                writers[b].write_table(piece.slice(first, n))
                first += n


def _read_at(tables: dict[int, pa.Table], key: int) -> int:
    """The first key of the read (a key of TABLES) that holds KEY."""
    return max(first for first in tables if first <= key)


def _taken(tables: dict[int, pa.Table], keys: np.ndarray) -> pa.Table:
    """The rows KEYS of the reads TABLES (each by its first key; its rows numbered on from it), in that order."""
    firsts = np.array(sorted(tables), np.int64)
    offsets = np.cumsum([0, *(tables[k].num_rows for k in firsts.tolist())])
    which = np.searchsorted(firsts, keys, "right") - 1
    return pa.concat_tables([tables[k] for k in firsts.tolist()]).take(pa.array(offsets[which] + keys - firsts[which]))


class TextNumbers:
    """The text columns of few values a gil table has (state, thread names, code) as int32
    numbers into one set of values per column for the whole table (`numbered`), and back as
    dictionary-encoded text (`text`): rows waiting in time buckets hold integers, whatever
    dictionary each batch was read with, and are sorted and taken as integers."""

    COLUMNS = ("state", "thread_name", "function", "file")

    def __init__(self):
        self.numbers: dict[str, dict] = {}  # column -> value -> number
        self.types: dict[str, pa.DataType] = {}

    def numbered(self, piece: pa.Table) -> pa.Table:
        for i, field in enumerate(piece.schema):
            if field.name not in self.COLUMNS or not pa.types.is_dictionary(field.type):
                continue
            column = piece.column(i).combine_chunks()
            numbers = self.numbers.setdefault(field.name, {})
            self.types.setdefault(field.name, field.type.value_type)
            of_entry = np.array([-1 if v is None else numbers.setdefault(v, len(numbers))
                                 for v in column.dictionary.to_pylist()] + [-1], np.int32)
            entry = column.indices.fill_null(len(column.dictionary)).to_numpy(zero_copy_only=False)
            number = of_entry[entry]
            piece = piece.set_column(i, field.name, pa.array(number, pa.int32(), mask=number < 0))
        return piece

    def text(self, table: pa.Table) -> pa.Table:
        for name, numbers in self.numbers.items():
            if name in table.column_names:
                values = pa.array(list(numbers), self.types[name])
                i = table.column_names.index(name)
                table = table.set_column(i, name, pa.DictionaryArray.from_arrays(table.column(i).combine_chunks(), values))
        return table


class RowsAhead:
    """Where the rows of a Parquet table not read yet start at the earliest, whatever batches its
    reader cuts: the earliest start of each CHUNK rows of each row group (from the first pass),
    so that after any row, the earliest of the chunk it lies in and every chunk after it bounds
    what is left (rows of that chunk already read only make the bound earlier: still a watermark)."""

    def __init__(self, metadata: pq.FileMetaData, chunk: int, chunk_min: list[np.ndarray]):
        self.chunk = chunk
        group_rows = np.array([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)], np.int64)
        self.rows = int(group_rows.sum())
        self.group_start = np.concatenate([[0], np.cumsum(group_rows)])  # (a row's group: by its number)
        self.chunk_base = np.concatenate([[0], np.cumsum([c.size for c in chunk_min])])  # (a group's first chunk)
        flat = np.concatenate([*chunk_min, [END]]).astype(np.int64)
        self.later = np.minimum.accumulate(flat[::-1])[::-1]  # (per chunk, the earliest of it and every later one)

    def rows_held(self, chunk_max: list[np.ndarray]) -> int:
        """At most how many rows the core would hold at once were the table pushed in its order:
        after each chunk read, those of the chunks read so far whose latest start (CHUNK_MAX, per
        row group) the watermark has not passed, each chunk counted whole."""
        top = np.concatenate(chunk_max) if chunk_max else np.zeros(0, np.int64)
        k = np.arange(top.size)
        group = np.searchsorted(self.chunk_base, k, "right") - 1
        sizes = np.minimum(self.chunk, np.diff(self.group_start)[group] - (k - self.chunk_base[group]) * self.chunk)
        # (the watermark after each chunk only grows: a chunk is held from its own to the last before it passes its top)
        last = np.searchsorted(self.later[1:], top, "right") - 1
        held = last >= k
        change = np.zeros(top.size + 1, np.int64)
        np.add.at(change, k[held], sizes[held])
        np.add.at(change, last[held] + 1, -sizes[held])
        return int(np.cumsum(change).max(initial=0))

    def earliest_from(self, row: int) -> int:
        """The earliest start of rows ROW on (END past the last)."""
        if row >= self.rows:
            return END
        g = int(np.searchsorted(self.group_start, row, "right")) - 1
        return int(self.later[self.chunk_base[g] + (row - self.group_start[g]) // self.chunk])

    def read(self, start: np.ndarray) -> None:
        """Nothing: the first pass's chunks bound what is left (SortedRun learns from the rows read)."""


class SortedRun:
    """Where the rows not read yet of a run in start order (rows FIRST..END-1 of a table whose
    first start is known) start at the earliest: at the last start read."""

    def __init__(self, end: int, first_start: int):
        self.end, self.last = end, first_start

    def earliest_from(self, row: int) -> int:
        return END if row >= self.end else self.last

    def read(self, start: np.ndarray) -> None:
        if start.size:
            self.last = int(start[-1])


def _chunk_bounds(chunk_min: np.ndarray, chunk_max: np.ndarray, start: np.ndarray, offset: int, chunk: int) -> None:
    """CHUNK_MIN and CHUNK_MAX (per CHUNK rows of a row group) widened by START, rows OFFSET on of the group."""
    if not start.size:
        return
    first = offset // chunk
    cuts = np.arange((first + 1) * chunk - offset, start.size, chunk)
    at = np.concatenate([[0], cuts])
    chunks = first + np.arange(at.size)
    chunk_min[chunks] = np.minimum(chunk_min[chunks], np.minimum.reduceat(start, at))
    chunk_max[chunks] = np.maximum(chunk_max[chunks], np.maximum.reduceat(start, at))


def time_edges(sample: np.ndarray, buckets: int) -> np.ndarray:
    """The inner edges of about BUCKETS time buckets holding as many rows each, by a SAMPLE of the starts."""
    if buckets <= 1 or not sample.size:
        return np.zeros(0, np.int64)
    return np.unique(np.quantile(np.sort(sample), np.arange(1, buckets) / buckets, method="lower").astype(np.int64))


def _parquet_gil(path: Path) -> pq.ParquetFile:
    """PATH opened as a gil table (its state column read as a dictionary), or a clear error."""
    if not path.is_file():
        raise TandemError(f"{path}: no such file")
    try:
        file = pq.ParquetFile(path, read_dictionary=["state"])
    except (OSError, ValueError) as err:
        raise not_parquet(path, err) from None
    except KeyError:  # (no state column to read as a dictionary: said as the schema check says it)
        check_gil_schema(pq.read_schema(path), str(path))
        raise
    check_gil_schema(file.schema_arrow, str(path))
    return file


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """SCHEMA without metadata, its dictionary-encoded columns as their values' type."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema.remove_metadata()])


def union_schema(names: list, schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of several gil tables read as one (NAMES: where each is from): each column any
    of them has (a table without it: nulls), its type widened where they differ (int32 and int64:
    int64; string and large_string: large_string), dictionary-encoded or not alike; a clear error
    where a column's types cannot be one."""
    union = plain_schema(schemas[0])
    for name, schema in zip(names[1:], schemas[1:]):
        try:
            union = pa.unify_schemas([union, plain_schema(schema)], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
            raise TandemError(f"{name}: its columns cannot be read with those of {names[0]} "
                              f"(several gil tables are read as one): {str(err).splitlines()[0]}") from None
    return union


def conformed(data: pa.RecordBatch | pa.Table, schema: pa.Schema, columns, as_dictionary=()):
    """DATA (a batch or table of one of several gil tables) with the COLUMNS of SCHEMA (their
    union_schema): a column it lacks as nulls (dictionary-encoded where in AS_DICTIONARY), another
    type cast to the union's; text dictionary-encoded stays so (its dictionary cast, where wider)."""
    arrays = []
    for name in columns:
        kind = schema.field(name).type
        if name not in data.schema.names:
            column = pa.nulls(data.num_rows, kind)
            if name in as_dictionary:
                column = pa.DictionaryArray.from_arrays(pa.nulls(data.num_rows, pa.int32()), pa.array([], kind))
        else:
            column = data.column(name)
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            if pa.types.is_dictionary(column.type):
                if column.type.value_type != kind:
                    column = pa.DictionaryArray.from_arrays(column.indices, column.dictionary.cast(kind))
            elif column.type != kind and (name not in TIME_COLUMNS or pa.types.is_integer(kind)):
                column = column.cast(kind)  # (times that are not integers: refused by their own table's name)
        arrays.append(column)
    make = pa.RecordBatch.from_arrays if isinstance(data, pa.RecordBatch) else pa.Table.from_arrays
    return make(arrays, names=list(columns))


def gil_parts_attrs(attrs: list[dict], names: list[str]) -> dict:
    """The facts of a gil table made of parts (ATTRS: each part's; NAMES: where each is from):
    one part's as they are; of several, every part's processes and clock facts."""
    if len(attrs) == 1:
        return attrs[0]
    return {"processes": [p for a in attrs for p in a.get("processes", [a])], "clock_parts": clock_parts(attrs, names)}

