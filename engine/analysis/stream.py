"""A recorded session through the correlation core into a sink, in bounded memory: the GIL
source's blocks are the steps of the core's driver (engine/correlate/drive.py; `tandem live`
runs it on the live sources' polls). `tandem analyze`, the fleet's workers and the notebook's
`correlate` all run `drive`:

    ParquetGil | EventsGil (files, block by block) -> ParquetSink -> OUT/*.parquet as rows become final
    FrameGil (a table in memory, one block)          -> MemorySink  -> the result tables as DataFrames

The GIL side is a stream of blocks (engine/ingest/gil_stream.py: a Parquet gil table, the
probe's events files, each format a module): a first pass learns each block's watermark and each thread's lifetime;
the second pushes the blocks, read and paired by a thread of its own up to READ_AHEAD_BYTES
ahead of the core (`read_ahead`). The pauses table (a few rows per second of recording) is
written to OUT/pauses.parquet as the drive starts; the columns the analysis reads are set aside
(`PausesOnDisk`: a file of OUT's staging directory) while the blocks stream, read back in start
order by the core's pushes, those starting before each push's watermark (`PausesInTime`), and
whole once the stream is done, for the end tables. The core holds only the pauses not final yet.
Peak memory is the summary's few bytes a pause, causes' few a pause asked for by a Python
thread, about one block per process, the blocks read ahead, and the intervals a pause still in
progress may pair with. The GIL intervals are copied to OUT/gil.parquet as they are pushed,
unless the results name the GIL files instead (docs/results.md, "gil.parquet").
"""
from __future__ import annotations

import collections
import os
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.analysis.causes import CAUSE_INPUT_COLUMNS, REQUESTER_COLUMNS, Causes, CodeHits, PauseRows, why_facts, with_causes
from engine.analysis.facts import aligned_pauses, analysis_facts
from engine.correlate import END, Correlator, KnownLifetimes, Rows
from engine.correlate.core import carried_key
from engine.correlate.drive import Step, run_core
from engine.correlate.schema import PAUSE_COLUMNS, PAUSE_FACT_COLUMNS, RESULT_TABLES, SCHEMAS, core_columns, to_pandas
from engine.correlate.stops import jvm_threads, stop_ids
from engine.ingest.gil_parquet import ParquetGil
from engine.ingest.gil_stream import GilSource, rows_frame
from engine.report.summary import print_summary
from engine.store import TableWriter, WriterThread, is_text, publish, staging_directory, write_table


# Bytes of blocks read and paired ahead of the core: one block of a million rows (36 MB plain,
# ~57 MB carrying code, ~71 MB with its copy for gil.parquet) while the core takes the one before.
# A second block ahead saves little time and makes a long session's peak grow past a short
# one's, as its reader gets further ahead (docs/join.md).
READ_AHEAD_BYTES = 64 << 20
# OUT's file of pause_impact rows waiting for their causes (ParquetSink.pause_impact)
IMPACT_ROWS = ".pause_impact-rows"
IMPACT_BATCH_ROWS = 65_536  # (pause_impact completed and written this many rows at a time)
# OUT's file of the pauses the analysis reads, set aside while the GIL blocks stream (PausesOnDisk)
SPILLED_PAUSES = ".pauses-aside"


# The pauses table's columns the analysis reads once it is checked (the core, the stops, causes,
# the summary's facts); the others go to pauses.parquet only.
ANALYSIS_PAUSE_COLUMNS = (*PAUSE_COLUMNS, *PAUSE_FACT_COLUMNS, *CAUSE_INPUT_COLUMNS)
# Of those, the ones read once the stream is done (the header's facts: analysis_facts, why_facts;
# pause_impact's rows found by pause_id), when present.
END_PAUSE_COLUMNS = (*PAUSE_COLUMNS, "jvm_pid", "cause", "asked_by_tandem")


@dataclass
class StreamedAnalysis:
    """What `tandem analyze` prints after a streamed run: the summary and the header."""

    summary_table: pd.DataFrame
    header: dict
    paths: list[Path]
    stops: pd.DataFrame

    def summary(self, console=None) -> pd.DataFrame:
        print_summary(self.summary_table, self.header, console=console, stops=self.stops)
        return self.summary_table


def read_ahead(items, budget: int = 1, size=lambda item: 1):
    """The items of an iterator, made by a thread of their own ahead of the consumer, as many as
    fit in BUDGET (by SIZE of each; one at least): the next GIL block is read and paired (I/O,
    numba and Arrow, which release the GIL) while the core takes the current one. The next item
    is begun only once one more of the last one's size would fit (an item made and waiting for
    room would be one more alive). The producer's error is raised here, after the items before it."""
    ready: collections.deque = collections.deque()  # (item, error, its size)
    queued = [0]  # (the size of the items in READY)
    changed = threading.Condition()
    stop = threading.Event()
    done = object()

    def room_for(cost: int) -> bool:
        with changed:
            while ready and queued[0] + cost > budget and not stop.is_set():
                changed.wait()
            return not stop.is_set()

    def hand_over(item, err=None, cost: int = 0) -> None:
        with changed:
            ready.append((item, err, cost))
            queued[0] += cost
            changed.notify_all()

    def produce() -> None:
        try:
            last = 0
            iterator = iter(items)
            while room_for(last):
                item = next(iterator, done)
                if item is done:
                    break
                last = size(item)
                hand_over(item, cost=last)
            hand_over(done)
        except BaseException as err:  # (raised in the consumer)
            hand_over(done, err)
        finally:
            close = getattr(items, "close", None)  # (a generator left early: its files closed now)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="tandem-gil-blocks", daemon=True)
    thread.start()
    try:
        while True:
            with changed:
                while not ready:
                    changed.wait()
                item, err, cost = ready.popleft()
                queued[0] -= cost
                changed.notify_all()
            if item is done:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        with changed:
            stop.set()
            changed.notify_all()
        thread.join()


def block_bytes(block) -> int:
    """The memory a GilBlock's arrays and tables hold (read_ahead's SIZE)."""
    rows = block.rows
    arrays = (rows.pid, rows.tid, rows.state, rows.start_ns, rows.end_ns, rows.carried_key)
    tables = (rows.carried, block.copy)
    return (sum(a.nbytes for a in arrays if a is not None)
            + sum(t.nbytes for t in tables if t is not None))


def carried_numbered(blocks):
    """The blocks with their carried text columns dictionary-encoded (a Parquet gil table's code
    columns come as plain text) and their rows' carried values numbered (carried_key): done in
    the reading thread, it takes that hashing off the core and shrinks the blocks read ahead."""
    try:
        for block in blocks:
            carried = block.rows.carried
            if carried is None or not carried.num_columns or block.rows.carried_key is not None:
                yield block
                continue
            for i, field in enumerate(carried.schema):
                if is_text(field.type):
                    carried = carried.set_column(i, field.name, pc.dictionary_encode(carried.column(i)))
            yield replace(block, rows=replace(block.rows, carried=carried, carried_key=carried_key(carried)))
    finally:
        blocks.close()


def causes_fed(blocks, causes: Causes):
    """The blocks, each given to CAUSES on its way (Causes reads the rows alone, apart from the core)."""
    try:
        for block in blocks:
            causes.push(block.rows, block.watermark_ns, lambda mask, block=block: rows_frame(block, mask))
            yield block
    finally:
        blocks.close()


class ParquetSink:
    """The result tables into OUT/*.parquet, the streamed ones (overlaps, gil_free, a copied gil)
    written by a thread of their own as their rows become final."""

    text_as_dictionary = True

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.staging: Path | None = None  # (the files are written here, and moved into OUT together by `finish`)
        self.writers: dict[str, TableWriter] = {}
        self.background = self.gil = None

    def open(self, gil) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.staging = staging = staging_directory(self.out)
        self.gil = gil
        if hasattr(gil, "scratch"):
            gil.scratch = staging  # (rows it pushes by time wait there: ParquetGil._by_time)
        self.writers = {"overlaps": TableWriter(staging / "overlaps.parquet", pa.schema([*SCHEMAS["overlaps"], *gil.carried]),
                                                text_as_dictionary=True),
                        "gil_free": TableWriter(staging / "gil_free.parquet", SCHEMAS["gil_free"])}
        if gil.copy_schema is not None:
            self.writers["gil"] = TableWriter(staging / "gil.parquet", gil.copy_schema, text_as_dictionary=True)
        elif isinstance(gil, ParquetGil) and gil.copy:
            gil.begin_copy(staging / "gil.parquet")  # (its pages copied while the drive goes on)
        # pause_impact's rows wait on disk for the causes, known at the end (not in a file ending .parquet:
        # a reader never takes it for a result; `pause_impact` takes it out of the writers)
        self.writers["pause_impact"] = TableWriter(staging / IMPACT_ROWS, SCHEMAS["pause_impact"])
        self.background = WriterThread()

    def pauses(self, pauses: pd.DataFrame, facts: dict) -> pd.DataFrame:
        """The checked pauses table into OUT/pauses.parquet now (its metadata at `finish`); the
        columns the analysis reads are returned, their text as categories (a long session's
        table is ~270 bytes a pause, half of it text and counts only the file holds; its kinds,
        names and causes are a few dozen strings)."""
        with_facts = pauses.copy(deep=False)
        with_facts.attrs = facts  # (what write_table of the table would store of them)
        table = pa.Table.from_pandas(with_facts, preserve_index=False)
        self.writers["pauses"] = TableWriter(self.staging / "pauses.parquet", table.schema)
        # (here, not in the writer thread: the whole table is gone before the GIL blocks fill memory)
        self.writers["pauses"].write(table)
        kept = pauses[[c for c in pauses.columns if c in ANALYSIS_PAUSE_COLUMNS]]
        return kept.assign(**{c: kept[c].astype("category") for c in kept.columns
                              if isinstance(kept[c].dtype, pd.StringDtype)})

    def set_aside(self, pauses: pd.DataFrame, stop: np.ndarray) -> PausesAside:
        return PausesOnDisk(pauses, stop, self.staging / SPILLED_PAUSES)

    def rows(self, step: Step | None, rows: Rows) -> None:
        for name, table in rows.tables().items():
            if name in self.writers:
                self.background.write(self.writers[name], table)
        if step is not None and step.read is not None and step.read.copy is not None:
            self.background.write(self.writers["gil"], step.read.copy)  # (the GIL block's rows, as pushed)

    def drain(self) -> None:
        self.background.drain()

    def pause_impact(self, completed) -> None:
        """Every pause_impact row given, in the order given, made whole by COMPLETED (a batch of
        rows -> the DataFrame to write) a batch at a time into pause_impact.parquet, closed by
        `finish` (call after `drain`). A batch, not the table: at the end of a long session the
        whole table, read back and completed, is the largest thing in memory."""
        path = self.writers.pop("pause_impact").close({})
        rows = pq.ParquetFile(path)
        try:
            parts = (pa.Table.from_batches([batch]) for batch in rows.iter_batches(batch_size=IMPACT_BATCH_ROWS))
            for part in parts if rows.metadata.num_rows else [SCHEMAS["pause_impact"].empty_table()]:
                table = pa.Table.from_pandas(completed(part), preserve_index=False)
                if "pause_impact" not in self.writers:  # (the first part's schema: every part has its columns' types)
                    self.writers["pause_impact"] = TableWriter(self.staging / "pause_impact.parquet", table.schema)
                self.writers["pause_impact"].write(table)
        finally:
            rows.close()
            path.unlink()

    def finish(self, header: dict, tables: dict[str, pd.DataFrame]) -> list[Path]:
        meta = lambda name: {"table": name, "analysis": header}  # noqa: E731
        paths = [self.writers.pop(name).close(meta(name)) for name in list(self.writers)]
        if isinstance(self.gil, ParquetGil) and self.gil.copy and self.gil.copy_schema is None:
            paths.append(self.gil.write_copy(self.staging / "gil.parquet", meta("gil")))
        for name, table in tables.items():
            paths.append(write_table(table, self.staging / f"{name}.parquet", meta(name)))
        paths = publish(self.staging, paths, self.out)
        if not self.gil.copy:
            (self.out / "gil.parquet").unlink(missing_ok=True)  # (of an earlier run on another input)
        order = {name: i for i, name in enumerate(RESULT_TABLES)}
        return sorted(paths, key=lambda p: order[p.stem])

    def abort(self) -> None:
        try:
            if self.background is not None:
                self.background.drain()
        except BaseException:
            pass
        for writer in self.writers.values():
            writer.abort()
        if isinstance(self.gil, ParquetGil):
            self.gil.abort_copy()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def close(self) -> None:
        if self.background is not None:
            self.background.stop()


class MemorySink:
    """The result tables as DataFrames (the notebook's `correlate`): the streamed ones gathered."""

    text_as_dictionary = False  # (text columns as the caller's pandas strings, not categoricals)

    def __init__(self):
        self.parts: dict[str, list[pa.Table]] = {"overlaps": [], "gil_free": [], "pause_impact": []}

    def open(self, gil) -> None:
        pass

    def pauses(self, pauses: pd.DataFrame, facts: dict) -> pd.DataFrame:
        self.whole_pauses = pauses  # (the caller's table comes back whole)
        return pauses

    def set_aside(self, pauses: pd.DataFrame, stop: np.ndarray) -> PausesAside:
        return PausesAside(pauses, stop)

    def rows(self, step: Step | None, rows: Rows) -> None:
        self.parts["overlaps"].append(rows.overlaps)
        self.parts["gil_free"].append(rows.gil_free)
        self.parts["pause_impact"].append(rows.pause_impact)

    def drain(self) -> None:
        pass

    def pause_impact(self, completed) -> None:
        self.whole_impact = completed(pa.concat_tables([SCHEMAS["pause_impact"].empty_table(), *self.parts.pop("pause_impact")]))

    def finish(self, header: dict, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        gil_free = pa.concat_tables(self.parts["gil_free"]).sort_by([("pid", "ascending"), ("start_ns", "ascending")])
        return {**tables, "pauses": self.whole_pauses, "pause_impact": self.whole_impact,
                "overlaps": to_pandas(pa.concat_tables(self.parts["overlaps"]), "overlaps"), "gil_free": to_pandas(gil_free, "gil_free")}

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


class PausesInTime:
    """A pauses table handed to the core in start order, each push the pauses starting before its
    watermark: the core holds only the pauses not final yet, not the whole session's. BATCHES:
    the table's rows in start order, a DataFrame at a time (PausesAside.in_start_order)."""

    def __init__(self, batches):
        self.batches = iter(batches)
        self.held = None  # (the rows of the batch read last not given yet)

    def before(self, watermark_ns: int) -> pd.DataFrame | None:
        parts = []
        while self.left():
            starts = self.held["start_ns"].to_numpy(np.int64)
            upto = len(starts) if watermark_ns >= END else int(np.searchsorted(starts, watermark_ns, "left"))
            if upto:
                parts.append(self.held.iloc[:upto])
            if upto < len(starts):
                self.held = self.held.iloc[upto:]
                break
            self.held = None
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)

    def left(self) -> bool:
        if self.held is None:
            self.held = next(self.batches, None)
        return self.held is not None


def start_order(pauses: pd.DataFrame) -> np.ndarray:
    """The rows of PAUSES by start (equal starts keep the table's order)."""
    return np.argsort(pauses["start_ns"].to_numpy(np.int64), kind="stable")


class PausesAside:
    """The pauses the analysis reads (a DataFrame) and their stops (`stop_ids`), set aside while
    the GIL blocks stream: read back in start order by the core's pushes (`in_start_order`), and
    whole once the stream is done (`back`). In memory: the caller's table, kept."""

    batch_rows = 16_384  # (pauses a batch of in_start_order holds)

    def __init__(self, pauses: pd.DataFrame, stop: np.ndarray):
        self.pauses, self.stop = pauses, stop

    def in_start_order(self, columns: list[str]):
        pauses = self.pauses
        order = start_order(pauses)
        at = [pauses.columns.get_loc(c) for c in columns]
        for k in range(0, len(order), self.batch_rows):
            yield pauses.iloc[order[k:k + self.batch_rows], at]

    def back(self, columns: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
        """The table's COLUMNS, in table order, and the stops."""
        return self.pauses[columns], self.stop


class PausesOnDisk(PausesAside):
    """PausesAside in a file of the run's staging directory (Arrow IPC, in start order): a long
    session's pauses are tens of MiB the stream does without. Text comes back with the same
    categories (pandas' own dtype, as given), the rows in table order."""

    def __init__(self, pauses: pd.DataFrame, stop: np.ndarray, path: Path):
        self.path, self.dtypes = path, pauses.dtypes
        order = start_order(pauses)
        table = pa.Table.from_pandas(pauses, preserve_index=False).append_column("_stop", pa.array(stop, pa.int64()))
        self.in_order = bool((order == np.arange(order.size)).all())
        if not self.in_order:
            table = table.append_column("_row", pa.array(np.arange(order.size))).take(pa.array(order))
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=self.batch_rows):
                writer.write_batch(batch)

    def _frame(self, table: pa.Table, columns) -> pd.DataFrame:
        # (each column's Arrow memory freed as it is converted: the table is the caller's no more)
        frame = table.select(columns).to_pandas(split_blocks=True, self_destruct=True)
        for name in columns:  # (to_pandas makes categories of its own text type: the given dtype's back)
            dtype = self.dtypes[name]
            if isinstance(dtype, pd.CategoricalDtype):
                codes = frame[name].cat.codes.to_numpy()
                same = list(frame[name].cat.categories) == list(dtype.categories)
                frame[name] = pd.Categorical.from_codes(codes, dtype=dtype) if same else frame[name].astype(dtype)
        return frame

    def in_start_order(self, columns: list[str]):
        with pa.OSFile(str(self.path)) as source:  # (read, not mapped: a page once read would stay resident)
            reader = pa.ipc.open_file(source)
            for k in range(reader.num_record_batches):
                yield self._frame(pa.Table.from_batches([reader.get_batch(k)]), columns)

    def back(self, columns: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
        with pa.OSFile(str(self.path)) as source:
            table = pa.ipc.open_file(source).read_all()
        if not self.in_order:
            row = table.column("_row").to_numpy()
            table = table.take(pa.array(np.argsort(row)))
        stop = table.column("_stop").to_numpy()
        pauses = self._frame(table, columns)
        del table
        self.path.unlink()
        return pauses, stop


def block_steps(blocks, coming: PausesInTime, progress=None):
    """A GIL source's blocks as the core's steps, each with the pauses starting before its
    watermark; the pauses left, once the blocks end. PROGRESS(rows so far), after each block's push."""
    for block in blocks:
        yield Step(block.watermark_ns, pauses=coming.before(block.watermark_ns), gil=block.rows, read=block)
        if progress is not None:
            progress(block.rows_so_far)
    if coming.left():
        yield Step(END, pauses=coming.before(END))


@dataclass
class Driven:
    """What one drive made: the header, the summary and stops, and what the sink gave back."""

    header: dict
    summary_table: pd.DataFrame
    stops: pd.DataFrame
    out: object


def drive(pauses: pd.DataFrame, gil: GilSource, sink, *, slack_ns: int = 0, offset_ns: int | None = None,
          pauses_source: str | None = None, progress=None) -> Driven:
    """Correlate a pauses table with a GIL source (FrameGil, ParquetGil or EventsGil: engine/ingest/
    gil_stream.py) block by block, the rows given to SINK (ParquetSink, MemorySink) as they become
    final; causes and the summary's code hits are fed on the way. PAUSES: the table, or a function
    handing it over once the GIL side's first pass is done (the drive then holds the only
    reference, and keeps only the columns it reads: ParquetSink.pauses)."""
    lifetimes = gil.first_pass()  # (also reads what the GIL files say about their clock)
    if callable(pauses):
        pauses = pauses()
    pauses, pause_clock, gil_clock, alignment = aligned_pauses(pauses, pauses_source, gil.attrs, gil.source, offset_ns)
    # (pandas deep-copies a frame's attrs in every operation on it: the recordings' facts wait for the header)
    pause_facts, pauses.attrs = pauses.attrs, {}

    try:
        sink.open(gil)
        pauses = sink.pauses(pauses, pause_facts)  # (written now: what the analysis reads is kept)
        # (pause_impact's rows go to the sink as they become final: the core keeps the summary's input only)
        core = Correlator(slack_ns, lifetimes=KnownLifetimes(lifetimes), gil_source=gil_clock.source,
                          pauses_source=pause_clock.source, text_as_dictionary=sink.text_as_dictionary,
                          jvm_tids=jvm_threads(pauses))
        stop = stop_ids(pauses)  # each pause's stop: code hits count a stop once; causes and inference read it
        # who asked for each pause: fed the rows as they pass (the first pass knows every thread)
        causes = Causes(pauses, stop, lifetimes, every_thread=True)
        pauses = pauses.drop(columns=list(REQUESTER_COLUMNS), errors="ignore")  # (read by Causes only, and now)
        hits = CodeHits.of(pauses, stop)  # the summary's "why": overlap per code, added up as the core makes the rows
        # (numbering makes the carried text dictionaries: only for a sink that takes text so)
        blocks = carried_numbered(gil.pushes()) if sink.text_as_dictionary else gil.pushes()
        blocks = causes_fed(blocks, causes)  # (in the reading thread: the core's thread is the busier)
        # (the core keeps what it reads, not every column; the pauses wait outside memory, as the sink keeps them)
        aside, end_columns = sink.set_aside(pauses, stop), [c for c in END_PAUSE_COLUMNS if c in pauses.columns]
        coming = PausesInTime(aside.in_start_order(core_columns(pauses)))
        del pauses, stop
        run_core(core, block_steps(read_ahead(blocks, budget=READ_AHEAD_BYTES, size=block_bytes), coming, progress), [sink, hits])
        sink.drain()
        pauses, stop = aside.back(end_columns)
        pauses.attrs = pause_facts
        summary, stops = core.summary(), core.stops()
        cause_columns, pause_rows, caused = causes.table(gil.thread_names), PauseRows(pauses), []

        def caused_rows_kept(rows: pa.Table) -> pd.DataFrame:
            """ROWS of pause_impact with their causes; those caused by Python kept for the summary."""
            impact = with_causes(to_pandas(rows, "pause_impact"), pause_rows, stop, cause_columns)
            caused.append(impact[impact["caused_by_python"].fillna(False).to_numpy(bool)])
            return impact

        # (in the order the pauses were pushed: by start, PausesInTime)
        sink.pause_impact(caused_rows_kept)
        facts = analysis_facts(core, pauses, gil.attrs, pause_clock, gil_clock, alignment, offset_ns,
                               core.duplicate_gil_rows + gil.duplicate_rows,
                               # (docs/results.md, "gil.parquet"): the results name the GIL files
                               gil_table=None if gil.copy else gil.references,
                               why=why_facts(pd.concat(caused, ignore_index=True), hits.table(core.carried_table), pauses, stop))
        header = facts.as_metadata()
        out = sink.finish(header, {"summary": summary, "stops": stops})
    except BaseException:
        sink.abort()
        raise
    finally:
        sink.close()
    return Driven(header, summary, stops, out)


def analyze_streamed(out: str | os.PathLike, pauses, gil, *, slack_ns: int = 0,
                     offset_ns: int | None = None, pauses_source: str | None = None, progress=None) -> StreamedAnalysis:
    """Correlate a pauses table (or a function handing it over: `drive`) with a streamed GIL side
    (ParquetGil or EventsGil), writing OUT/*.parquet as it goes."""
    driven = drive(pauses, gil, ParquetSink(out), slack_ns=slack_ns, offset_ns=offset_ns,
                   pauses_source=pauses_source, progress=progress)
    return StreamedAnalysis(driven.summary_table, driven.header, driven.out, driven.stops)
