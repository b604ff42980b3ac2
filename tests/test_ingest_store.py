"""engine.store: Parquet tables with tandem metadata, written atomically."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import SHARED_RECORDINGS
from engine.ingest.jfr import read_pauses
from engine.store import read_table, write_table
from engine.errors import TandemError


def test_round_trip_keeps_dtypes_nulls_and_metadata(tmp_path):
    df = read_pauses(SHARED_RECORDINGS / "flush_metadata.jfr")
    path = write_table(df, tmp_path / "t" / "pauses.parquet")
    back = read_table(path)
    pd.testing.assert_frame_equal(back, df)
    assert back.attrs == json.loads(json.dumps(df.attrs))
    # Readable without tandem: plain Parquet with the metadata as JSON under `tandem`.
    raw = pq.read_schema(path).metadata[b"tandem"]
    assert json.loads(raw)["clock_domain"] == "wall"


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    df = read_pauses(SHARED_RECORDINGS / "jdk21.jfr")
    path = write_table(df, tmp_path / "pauses.parquet")
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_table(df, path, metadata={"bad": object()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pauses.parquet"]


def test_not_parquet_is_one_line_error(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("nope")
    with pytest.raises(TandemError, match="x.parquet"):
        read_table(bad)
