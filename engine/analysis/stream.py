"""Offline analysis in bounded memory: the correlation core driven over a whole session's GIL
intervals, block by block, every result table written to Parquet as its rows become final.
(The core's other driver is `tandem live`, engine/live/runner.py, fed by the live sources.)

The GIL side is a stream of blocks (engine/ingest/gil_stream.py: a Parquet gil table or the
probe's events files): a first pass learns each block's watermark and each thread's lifetime;
the second pushes the blocks, read and paired by a thread of its own up to READ_AHEAD_BLOCKS
blocks ahead of the core (`read_ahead`). Pauses (a few per second of recording) stay in
memory. Peak memory is about one block per process, the blocks read ahead, and the intervals a
pause still in progress may pair with. The GIL intervals are copied to OUT/gil.parquet as
they are pushed, unless the results name the GIL files instead (docs/results.md, "gil.parquet").
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from engine.analysis.causes import Causes, CodeHits, why_facts, with_causes
from engine.analysis.facts import aligned_pauses, result_header
from engine.correlate import END, Correlator, KnownLifetimes, Rows
from engine.correlate.core import carried_key
from engine.correlate.schema import RESULT_TABLES, SCHEMAS, core_columns, to_pandas
from engine.correlate.stops import stop_ids
from engine.ingest.gil_stream import ParquetGil, rows_frame
from engine.report.summary import print_summary
from engine.store import TableWriter, WriterThread, write_table


# Blocks read and paired ahead of the core: with one, the core waited for its next block ~0.5 s
# an hour (the reading thread shares a core with the writer); three absorb that (docs/join.md).
READ_AHEAD_BLOCKS = 3


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


def read_ahead(items, depth: int = 1):
    """The items of an iterator, made by a thread of their own up to DEPTH items ahead: the next
    GIL block is read and paired (I/O, numba and Arrow, which release the GIL) while the core
    takes the current one. The producer's error is raised here, after the items before it."""
    import queue
    import threading

    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand_over((item, None)):
                    return
            hand_over((done, None))
        except BaseException as err:  # (raised in the consumer)
            hand_over((done, err))
        finally:
            close = getattr(items, "close", None)  # (a generator left early: its files closed now)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="tandem-gil-blocks", daemon=True)
    thread.start()
    try:
        while True:
            item, err = ready.get()
            if item is done:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()
        thread.join()


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
                if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
                    carried = carried.set_column(i, field.name, pc.dictionary_encode(carried.column(i)))
            yield replace(block, rows=replace(block.rows, carried=carried, carried_key=carried_key(carried)))
    finally:
        blocks.close()


def analyze_streamed(out: str | os.PathLike, pauses: pd.DataFrame, gil, *, slack_ns: int = 0,
                     offset_ns: int | None = None, pauses_source: str | None = None, progress=None) -> StreamedAnalysis:
    """Correlate a pauses table with a streamed GIL side (ParquetGil or EventsGil), writing
    OUT/*.parquet as it goes."""
    lifetimes = gil.first_pass()  # (also reads what the GIL files say about their clock)
    pauses, pause_clock, gil_clock, alignment = aligned_pauses(pauses, pauses_source, gil.attrs, gil.source, offset_ns)
    # (pandas deep-copies a frame's attrs in every operation on it: the recordings' facts wait for the header)
    pause_facts, pauses.attrs = pauses.attrs, {}
    core = Correlator(slack_ns, lifetimes=KnownLifetimes(lifetimes), gil_source=gil_clock.source,
                      pauses_source=pause_clock.source, text_as_dictionary=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    writers = {"overlaps": TableWriter(out / "overlaps.parquet", pa.schema([*SCHEMAS["overlaps"], *gil.carried]),
                                       text_as_dictionary=True),
               "gil_free": TableWriter(out / "gil_free.parquet", SCHEMAS["gil_free"])}
    if gil.copy_schema is not None:
        writers["gil"] = TableWriter(out / "gil.parquet", gil.copy_schema, text_as_dictionary=True)
    background = WriterThread()
    stop = stop_ids(pauses)  # each pause's stop: code hits count a stop once; causes and inference read it
    causes = Causes(pauses, stop, lifetimes)  # who asked for each pause: fed the rows and overlaps as they pass
    hits = CodeHits.fed_by(core, pauses, stop)  # the summary's "why": overlap per code, added up as the core makes the rows

    def emit(rows: Rows) -> None:
        for name, table in rows.tables().items():
            if name in writers:
                background.write(writers[name], table)
        if rows.overlaps.num_rows:
            causes.overlaps(*(rows.overlaps[c].to_numpy() for c in ("pause_id", "tid", "overlap_ns", "near_miss")))

    try:
        pending_pauses = pauses[core_columns(pauses)]  # (the core keeps what it reads, not every column)
        for block in read_ahead(carried_numbered(gil.pushes()), depth=READ_AHEAD_BLOCKS):
            rows = block.rows
            emit(core.push(pauses=pending_pauses, gil=rows, watermark_ns=block.watermark_ns))
            pending_pauses = None
            if block.copy is not None:
                background.write(writers["gil"], block.copy)
            causes.push(rows, block.watermark_ns, lambda mask, block=block: rows_frame(block, mask))
            if progress is not None:
                progress(block.rows_so_far)
        if pending_pauses is not None:
            emit(core.push(pauses=pending_pauses, watermark_ns=END))
        emit(core.finish())
        background.drain()
        pauses.attrs = pause_facts
        header = result_header(core, pauses, gil.attrs, pause_clock, gil_clock, alignment, offset_ns, core.duplicate_gil_rows)
        if not gil.copy:  # (docs/results.md, "gil.parquet"): the results name the GIL files
            header["gil_table"] = gil.references
        summary, stops = core.summary(), core.stops()
        impact = with_causes(to_pandas(core.pause_impact(), "pause_impact"), pauses, stop, causes.table())
        header["why"] = why_facts(impact, hits.table(core.carried_table), pauses, stop)
        meta = lambda name: {"table": name, "analysis": header}  # noqa: E731
        paths = [writers.pop(name).close(meta(name)) for name in list(writers)]
        if isinstance(gil, ParquetGil) and gil.copy:
            paths.append(gil.write_copy(out / "gil.parquet", meta("gil")))
        elif not gil.copy:
            (out / "gil.parquet").unlink(missing_ok=True)  # (of an earlier run on another input)
        for name, table in (("pause_impact", impact), ("pauses", pauses), ("summary", summary), ("stops", stops)):
            paths.append(write_table(table, out / f"{name}.parquet", meta(name)))
    except BaseException:
        try:
            background.drain()
        except BaseException:
            pass
        for writer in writers.values():
            writer.abort()
        raise
    finally:
        background.stop()
    order = {name: i for i, name in enumerate(RESULT_TABLES)}
    return StreamedAnalysis(summary, header, sorted(paths, key=lambda p: order[p.stem]), stops)
