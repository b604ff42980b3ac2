"""The two input tables of the join (spec: docs/results.md, "Input tables"), checked and normalized.

Any interval source can be correlated if it produces these columns; a problem is reported
as one TandemError line naming the source (a file path, or a description) and the column.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.correlate.schema import GIL_COLUMNS, GIL_STATES, PAUSE_COLUMNS
from engine.errors import TandemError



def _require_columns(df: pd.DataFrame, columns, source: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TandemError(f"{source}: missing column {missing[0]!r} (needs {', '.join(columns)})")


def _int64_column(df: pd.DataFrame, column: str, source: str) -> pd.Series:
    values = df[column]
    if values.isna().any():
        raise TandemError(f"{source}: column {column!r} has missing values")
    if not (pd.api.types.is_integer_dtype(values) or pd.api.types.is_bool_dtype(values)):
        raise TandemError(f"{source}: column {column!r} must be integers (int64 ns), found {values.dtype}")
    return values.astype(np.int64)


def _check_interval_order(df: pd.DataFrame, source: str) -> None:
    backwards = df["end_ns"].to_numpy() < df["start_ns"].to_numpy()
    if backwards.any():
        row = int(np.flatnonzero(backwards)[0])
        raise TandemError(f"{source}: row {row} ends before it starts (start_ns > end_ns)")


def check_pauses(df: pd.DataFrame, source: str = "pauses table") -> pd.DataFrame:
    """Validated copy of a pauses table: int64 times and ids, string kind/name, unique pause_id.

    Rows identical on every column are one pause recorded twice and are dropped; two
    different rows sharing a pause_id are an error.
    """
    _require_columns(df, PAUSE_COLUMNS, source)
    out = df.copy(deep=False)  # (columns are replaced, never written in place: DF's buffers are shared, not copied)
    for column in ("pause_id", "start_ns", "end_ns"):
        out[column] = _int64_column(df, column, source)
    for column in ("kind", "name"):
        out[column] = df[column].astype("string")
    # Other kinds are accepted (any interval source can be correlated); PAUSE_KINDS are tandem's own.
    for column in ("kind", "name"):
        if out[column].isna().any():
            raise TandemError(f"{source}: column {column!r} has missing values")
    if "duration_ns" in out.columns:
        out = out.drop(columns="duration_ns")
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    _check_interval_order(out, source)
    # (a row repeated whole repeats its pause_id: only rows of a repeated id are compared whole,
    # not every column of a long session's table hashed)
    shared_id = out["pause_id"].duplicated(keep=False).to_numpy(bool)
    if shared_id.any():
        duplicate = out[shared_id].duplicated()
        out = out.drop(index=duplicate.index[duplicate.to_numpy(bool)]).reset_index(drop=True)
    repeated = out["pause_id"].duplicated()
    if repeated.any():
        raise TandemError(f"{source}: pause_id {int(out['pause_id'][repeated].iloc[0])} names two different pauses")
    out.attrs = dict(df.attrs)
    return out


def check_gil(df: pd.DataFrame, source: str = "gil table") -> tuple[pd.DataFrame, int]:
    """Validated copy of a GIL intervals table and the number of exact duplicate rows dropped."""
    _require_columns(df, GIL_COLUMNS, source)
    out = df.copy()
    for column in ("pid", "tid", "start_ns", "end_ns"):
        out[column] = _int64_column(df, column, source)
    out["state"] = df["state"].astype("string")
    unknown = ~out["state"].isin(GIL_STATES).to_numpy(bool)
    if unknown.any():
        bad = out["state"][unknown].iloc[0]
        raise TandemError(f"{source}: column 'state' has value {None if pd.isna(bad) else bad!r} "
                          "(must be 'released' or 'waiting')")
    if "thread_name" in out.columns:
        out["thread_name"] = out["thread_name"].astype("string")
    _check_interval_order(out, source)
    duplicate = out.duplicated(subset=list(GIL_COLUMNS))  # (exact copies: one interval recorded twice, docs/join.md)
    dropped = int(duplicate.sum())
    if dropped:
        out = out[~duplicate].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out, dropped
