"""Offline analysis in bounded memory: the correlation core driven over a whole GIL table, block
by block, every result table written to Parquet as its rows become final.

Two passes over the GIL table. The first reads four columns to learn what the core cannot
know from the past alone: where each later block starts at the earliest (the watermark
after each block) and each thread's inferred lifetime (docs/results.md, "gil_free"). The
second pushes the blocks. Pauses (a few per second of recording) stay in memory. Peak
memory is about one block plus the intervals a pause still in progress may pair with.
The GIL table itself is not copied to OUT (docs/results.md, "gil.parquet").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.analysis.clock import check_same_clock, clock_facts
from engine.correlate import END, Correlator, KnownLifetimes
from engine.correlate import kernels
from engine.correlate.inputs import _int64, check_gil_schema, gil_rows_from_arrow
from engine.correlate.schema import GIL_CARRIED_COLUMNS, GIL_COLUMNS, RESULT_TABLES, SCHEMAS
from engine.errors import TandemError
from engine.join import check_pauses
from engine.store import TableWriter, read_metadata

BLOCK_ROWS = 1 << 20
TIME_COLUMNS = ("pid", "tid", "start_ns", "end_ns")


@dataclass
class StreamedAnalysis:
    """What `tandem analyze` prints after a streamed run: the summary and the header."""

    summary_table: pd.DataFrame
    header: dict
    paths: list[Path]

    def summary(self, console=None) -> pd.DataFrame:
        from engine.report.summary import print_summary

        print_summary(self.summary_table, self.header, console=console)
        return self.summary_table


class ParquetGil:
    """A gil table in a Parquet file, read in blocks of BLOCK_ROWS rows."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise TandemError(f"{self.path}: no such file")
        try:
            self.file = pq.ParquetFile(self.path, read_dictionary=["state"])
        except (OSError, ValueError) as err:
            raise TandemError(f"{self.path}: not a readable Parquet table: {err}") from None
        check_gil_schema(self.file.schema_arrow, str(self.path))
        self.attrs = read_metadata(self.path)

    def blocks(self, columns=None):
        return self.file.iter_batches(batch_size=BLOCK_ROWS, columns=columns)

    def first_pass(self) -> tuple[np.ndarray, pd.DataFrame]:
        """The watermark after each block (the earliest start of any later block; END after the
        last), and each thread's lifetime (pid, tid, start_ns, end_ns)."""
        source = str(self.path)
        block_min, keys, los, his = [], [], [], []
        for batch in self.blocks(list(TIME_COLUMNS)):
            pid, tid, start, end = (_int64(batch, c, source) for c in TIME_COLUMNS)
            block_min.append(int(start.min()) if start.size else END)
            codes, uniques = pd.factorize(pid * (1 << 32) + tid)
            lo = np.full(len(uniques), END, np.int64)
            hi = np.full(len(uniques), -END, np.int64)
            kernels.group_bounds(codes.astype(np.int64), start, end, lo, hi)
            keys.append(np.asarray(uniques, np.int64))
            los.append(lo)
            his.append(hi)
        later_min = np.minimum.accumulate(np.array(block_min[::-1] or [END], np.int64))[::-1]
        watermarks = np.append(later_min[1:], END) if block_min else np.array([END], np.int64)
        threads = pd.DataFrame({"key": np.concatenate(keys) if keys else np.zeros(0, np.int64),
                                "start_ns": np.concatenate(los) if los else np.zeros(0, np.int64),
                                "end_ns": np.concatenate(his) if his else np.zeros(0, np.int64)})
        threads = threads[threads.end_ns > threads.start_ns].groupby("key", as_index=False).agg(
            start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        key = threads["key"].to_numpy(np.int64)
        threads["pid"], threads["tid"] = key >> 32, key & 0xFFFFFFFF
        return watermarks, threads[["pid", "tid", "start_ns", "end_ns"]]


def analyze_parquet(out: str | os.PathLike, pauses: pd.DataFrame, gil_path: Path, *, slack_ns: int = 0,
                    offset_ns: int | None = None, pauses_source: str | None = None, progress=None) -> StreamedAnalysis:
    """Correlate a pauses table with a GIL table in a Parquet file, writing OUT/*.parquet as it goes."""
    from engine.analysis import _header

    gil = ParquetGil(gil_path)
    pause_clock = clock_facts(pauses.attrs, pauses_source or pauses.attrs.get("source") or "pauses table")
    gil_clock = clock_facts(gil.attrs, str(gil.path))
    alignment = check_same_clock(pause_clock, gil_clock, offset_ns)
    pauses = check_pauses(pauses, pause_clock.source)
    if offset_ns:
        pauses["start_ns"] += offset_ns
        pauses["end_ns"] += offset_ns
    watermarks, lifetimes = gil.first_pass()
    core = Correlator(slack_ns, lifetimes=KnownLifetimes(lifetimes), gil_source=gil_clock.source,
                      pauses_source=pause_clock.source)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    carried = [gil.file.schema_arrow.field(c) for c in GIL_CARRIED_COLUMNS if c in gil.file.schema_arrow.names]
    writers = {"overlaps": TableWriter(out / "overlaps.parquet", pa.schema([*SCHEMAS["overlaps"], *carried])),
               "gil_free": TableWriter(out / "gil_free.parquet", SCHEMAS["gil_free"])}
    try:
        first_row = 0
        pending_pauses = pauses
        columns = [c for c in (*GIL_COLUMNS, *GIL_CARRIED_COLUMNS) if c in gil.file.schema_arrow.names]
        for k, batch in enumerate(gil.blocks(columns)):
            rows = gil_rows_from_arrow(batch, gil_clock.source, first_row)
            emitted = core.push(pauses=pending_pauses, gil=rows, watermark_ns=int(watermarks[k]))
            pending_pauses = None
            first_row += batch.num_rows
            for name, table in emitted.tables().items():
                if name in writers:
                    writers[name].write(table)
            if progress is not None:
                progress(first_row)
        if pending_pauses is not None:
            core.push(pauses=pending_pauses, watermark_ns=END)
        for name, table in core.finish().tables().items():
            if name in writers:
                writers[name].write(table)
        header = _header(core, pauses, gil.attrs, pause_clock, gil_clock, alignment, offset_ns, core.duplicate_gil_rows)
        # The GIL table is not copied: it is on disk already; the results name it.
        header["gil_table"] = str(gil.path.resolve())
        summary = core.summary()
        meta = lambda name: {"table": name, "analysis": header}  # noqa: E731
        paths = [writers.pop(name).close(meta(name)) for name in list(writers)]
        stale = out / "gil.parquet"  # (of an earlier run on another input)
        stale.unlink(missing_ok=True)
        for name, table in (("pause_impact", core.pause_impact()),
                            ("pauses", pa.Table.from_pandas(pauses, preserve_index=False)),
                            ("summary", pa.Table.from_pandas(summary, preserve_index=False))):
            writer = TableWriter(out / f"{name}.parquet", table.schema)
            writer.write(table)
            paths.append(writer.close(meta(name)))
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    order = {name: i for i, name in enumerate(RESULT_TABLES)}
    return StreamedAnalysis(summary, header, sorted(paths, key=lambda p: order[p.stem]))
