"""Reading the input tables of `tandem analyze` (one place, so new input kinds are added here)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from engine.errors import TandemError


def read_input_table(path: str | os.PathLike) -> pd.DataFrame:
    """A pauses or GIL table from a Parquet file; its tandem metadata (if any) becomes df.attrs.

    Columns are checked later, against the table's role (engine.join.tables), naming this path.
    """
    from engine.store import read_table

    path = Path(path)
    if not path.is_file():
        raise TandemError(f"{path}: no such file")
    return read_table(path)
