"""The result tables' names, columns and dtypes (spec: docs/results.md), in one place.

Every producer (offline analysis, `tandem live`) and every reader builds its empty tables
and its Arrow schemas from here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.store import pandas_string_type

# A time after everything: the watermark of a finished stream, the end of an interval still open.
END = 1 << 62

GIL_STATES = ("released", "waiting")  # state codes 0 and 1
PAUSE_KINDS = ("safepoint", "gc_pause", "gc", "vm_operation", "compilation", "deoptimization")
# Kinds during which the whole VM is stopped: every thread running Java code waits.
WHOLE_VM_KINDS = ("safepoint", "gc_pause")

PAUSE_COLUMNS = ("pause_id", "kind", "name", "start_ns", "end_ns")
GIL_COLUMNS = ("pid", "tid", "state", "start_ns", "end_ns")
# Pause columns the correlation reads beyond PAUSE_COLUMNS, when present (pause amplification;
# the stops of the world, engine/correlate/stops.py).
PAUSE_FACT_COLUMNS = ("os_thread_id", "at_safepoint", "jvm_pid")


def core_columns(pauses) -> list[str]:
    """The columns of a pauses table the core reads (PAUSE_COLUMNS and the facts it has)."""
    return [*PAUSE_COLUMNS, *(c for c in PAUSE_FACT_COLUMNS if c in pauses.columns)]


# Per-interval columns carried from a GIL interval into its overlaps rows, when the gil table
# has them (the Python code of a release, docs/results.md). Add a column here to carry it.
GIL_CARRIED_COLUMNS = ("function", "file", "line")
# Integer columns that may be missing: Int64 in pandas.
NULLABLE_INT_COLUMNS = ("amplifying_tid", "line")

RESULT_TABLES = ("pauses", "gil", "gil_free", "overlaps", "pause_impact", "summary", "stops")
# Tables of one row per something, produced row group by row group (summary and stops are aggregates).
ROW_TABLES = ("pauses", "gil", "gil_free", "overlaps", "pause_impact")

_I8, _STR, _BOOL, _F8 = pa.int64(), pa.string(), pa.bool_(), pa.float64()

SCHEMAS: dict[str, pa.Schema] = {
    "pauses": pa.schema([("pause_id", _I8), ("kind", _STR), ("name", _STR), ("start_ns", _I8), ("end_ns", _I8),
                         ("duration_ns", _I8)]),
    "gil": pa.schema([("pid", _I8), ("tid", _I8), ("thread_name", _STR), ("state", _STR), ("start_ns", _I8),
                      ("end_ns", _I8)]),
    "gil_free": pa.schema([("pid", _I8), ("start_ns", _I8), ("end_ns", _I8), ("duration_ns", _I8)]),
    "overlaps": pa.schema([("pause_id", _I8), ("pid", _I8), ("tid", _I8), ("state", _STR), ("start_ns", _I8),
                           ("end_ns", _I8), ("overlap_ns", _I8), ("slack_ns", _I8), ("near_miss", _BOOL)]),
    "pause_impact": pa.schema([
        ("pause_id", _I8), ("kind", _STR), ("name", _STR), ("start_ns", _I8), ("end_ns", _I8), ("duration_ns", _I8),
        ("threads_released", _I8), ("released_ns", _I8), ("threads_waiting", _I8), ("waiting_ns", _I8),
        ("overlap_ns", _I8), ("hit_python", _BOOL), ("near_misses", _I8), ("threads_holding", _I8),
        ("gil_free_ns", _I8), ("gil_free", _BOOL), ("amplifying_tid", _I8), ("amplified", _BOOL)]),
    "summary": pa.schema([
        ("kind", _STR), ("name", _STR), ("pauses", _I8), ("pauses_hit", _I8), ("hits_per_hour", _F8),
        ("mean_overlap_ms", _F8), ("p50_overlap_ms", _F8), ("p99_overlap_ms", _F8), ("max_overlap_ms", _F8),
        ("total_overlap_ms", _F8), ("threads_affected", _I8), ("pauses_near_miss", _I8), ("pauses_amplified", _I8)]),
}
# stops: the summary's columns per (part_of, kind, name): one stop of the world counts once
# (engine/correlate/stops.py).
SCHEMAS["stops"] = pa.schema([("part_of", _STR), *SCHEMAS["summary"]])
COLUMNS = {name: tuple(schema.names) for name, schema in SCHEMAS.items()}

# pandas dtypes of the in-memory tables (engine.analysis.Analysis): nullable ints where a value
# may be missing, pandas strings for text (dictionary-encoded text too).
def to_pandas(table: pa.Table, name: str | None = None) -> pd.DataFrame:
    """An Arrow result table as the DataFrame `engine.analysis` hands out (strings, plain or
    dictionary-encoded, as pandas strings; integers that may be missing as Int64)."""
    frame = table.to_pandas(types_mapper=pandas_string_type)
    for column in NULLABLE_INT_COLUMNS:
        if column in frame.columns:
            frame[column] = frame[column].astype("Int64")
    return frame


def empty_table(name: str) -> pa.Table:
    return SCHEMAS[name].empty_table()


def empty_frame(name: str) -> pd.DataFrame:
    """The empty DataFrame of a result table, with its dtypes."""
    return to_pandas(empty_table(name), name)


def state_strings(codes: np.ndarray) -> pa.Array:
    """GIL state codes (0 released, 1 waiting) as an Arrow string array."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, np.int8)), pa.array(GIL_STATES)).cast(pa.string())
