"""GIL sources of different kinds given together (Parquet tables beside the probe's events
files, `tandem analyze --gil G.parquet --gil py-4242/`) as one stream of blocks, in bounded
memory as each alone.

Each source gives its blocks in its own order, each with the watermark after it. The next block
pushed is always the one, among each source's next, whose source's rows to come start
earliest: at the earliest start in that block, or the watermark after it, if earlier. So the
watermark after a push, the earliest of that over every source, bounds every row still to come.
One block of each source is read ahead.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.correlate import END
from engine.correlate.schema import GIL_CARRIED_COLUMNS
from engine.ingest.gil_parquet import conformed, gil_parts_attrs, union_schema
from engine.ingest.gil_stream import GilBlock


class MergedGil:
    """SOURCES (ParquetGil, EventsGil) as one. Their rows are always copied into the results
    (docs/results.md, "gil.parquet"): one gil.parquet of every column any of them has."""

    copy, references = True, []

    def __init__(self, sources: list, source: str | None = None):
        """SOURCE: what the sources are read from, as the user named them (default: each source's)."""
        self.sources = sources
        self.source = source or ", ".join(s.source for s in sources)
        for s in sources:
            s.copy_rows()  # (each block's rows as a table, to be written into the one copy)
        self.copy_schema = union_schema([s.source for s in sources], [s.copy_schema for s in sources])
        self.carried = [self.copy_schema.field(c) for c in GIL_CARRIED_COLUMNS if c in self.copy_schema.names]
        self._carried_schema = pa.schema(self.carried)
        self.attrs: dict = {}
        self.scratch = None  # (given to each source that takes it: ParquetGil's rows pushed by time)

    @property
    def duplicate_rows(self) -> int:
        return sum(s.duplicate_rows for s in self.sources)

    def first_pass(self) -> pd.DataFrame:
        lifetimes = pd.concat([s.first_pass() for s in self.sources], ignore_index=True)
        self.attrs = gil_parts_attrs([s.attrs for s in self.sources], [s.source for s in self.sources])
        return lifetimes.groupby(["pid", "tid"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))

    def thread_names(self, keys: np.ndarray) -> dict:
        names: dict = {}
        for s in reversed(self.sources):  # (a thread named by two sources: the first's name)
            names.update(s.thread_names(keys))
        return names

    def pushes(self):
        for s in self.sources:
            if hasattr(s, "scratch"):
                s.scratch = self.scratch
        streams = [s.pushes() for s in self.sources]
        ahead = [next(stream, None) for stream in streams]
        bounds = [_bound(block) for block in ahead]  # (each source's, kept as its next block is read)
        rows_so_far = 0
        try:
            while any(block is not None for block in ahead):
                k = min((i for i, block in enumerate(ahead) if block is not None), key=bounds.__getitem__)
                block, ahead[k] = ahead[k], next(streams[k], None)
                bounds[k] = _bound(ahead[k])
                rows_so_far += len(block.rows)
                copy = None if block.copy is None else conformed(block.copy, self.copy_schema, self.copy_schema.names)
                yield GilBlock(self._carried(block.rows), min(bounds), rows_so_far, copy, block.table_of, block.frame_of)
        finally:
            for stream in streams:
                stream.close()

    def _carried(self, rows):
        """ROWS with the carried columns of every source (nulls where its source has none)."""
        if not self.carried:
            return rows
        if rows.carried is None:
            carried = pa.table({f.name: pa.nulls(len(rows), f.type) for f in self.carried})
        else:  # (a carried_key stays valid: a column added is null in every row)
            carried = conformed(rows.carried, self._carried_schema, self._carried_schema.names)
        return replace(rows, carried=carried)


def _bound(block: GilBlock | None) -> int:
    """The earliest start of a source's rows from BLOCK on (END once the source has ended)."""
    if block is None:
        return END
    start = block.rows.start_ns
    return min(int(start.min()) if start.size else END, int(block.watermark_ns))
