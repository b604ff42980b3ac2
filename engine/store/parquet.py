"""Parquet tables with tandem metadata, written atomically.

`write_table` writes to a temporary file in the destination directory and renames it into
place (os.replace), so a reader sees the old file or the new one, never half of one.
The table's metadata dict is stored JSON-encoded under the Parquet key-value key
`tandem`, and comes back as `DataFrame.attrs` from `read_table`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from engine.errors import TandemError

METADATA_KEY = b"tandem"


def write_table(df: pd.DataFrame, path: str | Path, metadata: dict | None = None) -> Path:
    """Writes `df` to `path` atomically with `metadata` (default: df.attrs) as JSON under `tandem`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = df.attrs if metadata is None else metadata
    table = pa.Table.from_pandas(df, preserve_index=False)
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[METADATA_KEY] = json.dumps(meta, default=_json_default).encode()
    table = table.replace_schema_metadata(schema_meta)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    """Reads a table written by `write_table`; its metadata becomes `df.attrs`."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:
        raise TandemError(f"{path}: not a readable Parquet table: {err}") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    df = table.to_pandas()
    df.attrs = json.loads(raw) if raw else {}
    return df


def _json_default(value):
    # numpy scalars and paths appear in metadata dicts; store them as plain JSON values.
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"metadata value {value!r} is not JSON-serialisable")
