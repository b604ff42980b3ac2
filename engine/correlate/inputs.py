"""GIL rows for the core from a checked DataFrame or from Arrow record batches (streamed files).

The table contract and its one-line refusals are engine.correlate.tables' (docs/results.md,
"Input tables"); this is the same check done column-wise on Arrow data, without pandas.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from engine.correlate.core import GilRows
from engine.correlate.schema import GIL_CARRIED_COLUMNS, GIL_COLUMNS
from engine.errors import TandemError


def gil_rows_from_frame(gil: pd.DataFrame) -> GilRows:
    """A gil table checked by engine.correlate.tables.check_gil, as arrays."""
    carried = [c for c in GIL_CARRIED_COLUMNS if c in gil.columns]
    return GilRows(gil["pid"].to_numpy(np.int64), gil["tid"].to_numpy(np.int64),
                   (gil["state"].astype("string") == "waiting").to_numpy(bool).astype(np.int8),
                   gil["start_ns"].to_numpy(np.int64), gil["end_ns"].to_numpy(np.int64),
                   pa.Table.from_pandas(gil[carried], preserve_index=False) if carried else None)


def _int64(batch: pa.RecordBatch, column: str, source: str) -> np.ndarray:
    values = batch.column(column)
    if values.null_count:
        raise TandemError(f"{source}: column {column!r} has missing values")
    if not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        raise TandemError(f"{source}: column {column!r} must be integers (int64 ns), found {values.type}")
    if values.type != pa.int64():
        values = values.cast(pa.int64())
    return values.to_numpy(zero_copy_only=False)


def check_gil_schema(schema: pa.Schema, source: str) -> None:
    missing = [c for c in GIL_COLUMNS if c not in schema.names]
    if missing:
        raise TandemError(f"{source}: missing column {missing[0]!r} (needs {', '.join(GIL_COLUMNS)})")


def gil_rows_from_arrow(batch: pa.RecordBatch, source: str, first_row: int = 0) -> GilRows:
    """One record batch of a gil table, checked as engine.correlate.tables.check_gil checks a whole table."""
    check_gil_schema(batch.schema, source)
    pid, tid = _int64(batch, "pid", source), _int64(batch, "tid", source)
    start, end = _int64(batch, "start_ns", source), _int64(batch, "end_ns", source)
    state = batch.column("state")
    if pa.types.is_dictionary(state.type) and not state.null_count:
        # (as ParquetGil reads it) the check runs on the dictionary, the rows only index it
        words = state.dictionary.to_pylist()
        if all(w in ("released", "waiting") for w in words):
            codes = np.array([w == "waiting" for w in words], np.int8)
            _ordered(start, end, source, first_row)
            return GilRows(pid, tid, codes[state.indices.to_numpy(zero_copy_only=False)], start, end, _carried(batch))
        state = state.cast(state.type.value_type)
    waiting = pc.equal(state, "waiting")
    known = pc.or_(pc.equal(state, "released"), waiting)
    if state.null_count or not pc.all(known).as_py():
        bad = state.filter(pc.invert(pc.fill_null(known, False))) if not state.null_count else None
        value = bad[0].as_py() if bad is not None and len(bad) else None
        raise TandemError(f"{source}: column 'state' has value {value!r} (must be 'released' or 'waiting')")
    _ordered(start, end, source, first_row)
    return GilRows(pid, tid, waiting.to_numpy(zero_copy_only=False).astype(np.int8), start, end, _carried(batch))


def _carried(batch: pa.RecordBatch) -> pa.Table | None:
    names = [c for c in GIL_CARRIED_COLUMNS if c in batch.schema.names]
    return pa.Table.from_batches([batch.select(names)]) if names else None


def _ordered(start: np.ndarray, end: np.ndarray, source: str, first_row: int) -> bool:
    backwards = end < start
    if backwards.any():
        row = first_row + int(np.flatnonzero(backwards)[0])
        raise TandemError(f"{source}: row {row} ends before it starts (start_ns > end_ns)")
    return True
