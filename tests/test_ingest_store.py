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
    raw = pq.read_metadata(path).metadata[b"tandem"]
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


def test_a_jfr_recording_given_as_a_parquet_table_is_named_so(tmp_path):
    # (the error for a JFR recording where only a Parquet table is read: what the file is, and where it goes)
    with pytest.raises(TandemError, match=r"jdk21\.jfr: not a Parquet table but a JFR recording .*--jfr"):
        read_table(SHARED_RECORDINGS / "jdk21.jfr")
    # ... and given where GIL events belong (`--gil recording.jfr`)
    from engine.ingest.gil import read_gil
    with pytest.raises(TandemError, match=r"jdk21\.jfr: a JFR recording, the JVM side, not GIL events \(give it with --jfr\)"):
        read_gil(SHARED_RECORDINGS / "jdk21.jfr")
    # a damaged recording given as a table (`--pauses empty.jfr`) gets the JFR reader's word, not Parquet's
    from engine.ingest.inputs import pauses_from
    (tmp_path / "empty.jfr").write_bytes(b"")
    with pytest.raises(TandemError, match=r"empty\.jfr: empty file"):
        pauses_from(tables=[tmp_path / "empty.jfr"])


def test_table_writer_text_as_dictionary_reads_back_as_the_same_text(tmp_path):
    """gil.parquet's text columns are written dictionary-encoded (TableWriter's
    text_as_dictionary): a reader sees text, nulls where a name is unknown, the metadata kept."""
    import pyarrow as pa

    from engine.store import TableWriter

    schema = pa.schema([("name", pa.string()), ("state", pa.string()), ("n", pa.int64())])
    writer = TableWriter(tmp_path / "t.parquet", schema, text_as_dictionary=True)
    # a dictionary with a null entry, a plain text column, another block with other dictionaries
    writer.write(pa.table({"name": pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1], pa.int32()), pa.array(["a", None, "b"])),
                           "state": pa.array(["released", "waiting", None, "released"]), "n": [1, 2, 3, 4]}))
    writer.write(pa.table({"name": pa.DictionaryArray.from_arrays(pa.array([1, None, 0], pa.int8()), pa.array(["x", "y"])),
                           "state": pa.DictionaryArray.from_arrays(pa.array([1, 0, 1], pa.int32()), pa.array(["released", "waiting"])),
                           "n": [5, 6, 7]}))
    path = writer.close({"table": "t"})
    back = pq.read_table(path)
    assert back.schema.types == [pa.string(), pa.string(), pa.int64()]
    assert back.column("name").to_pylist() == ["a", None, "b", None, "y", None, "x"]
    assert back.column("state").to_pylist() == ["released", "waiting", None, "released", "waiting", "released", "waiting"]
    frame = read_table(path)
    assert frame.attrs == {"table": "t"} and str(frame["name"].dtype) == "string"


def test_table_writer_writes_a_dictionary_of_an_entry_per_code_with_each_text_once(tmp_path):
    """Producers hand TableWriter (text_as_dictionary) a dictionary with an entry per code: the
    code columns of gil.parquet and overlaps.parquet (a function of several lines, a code with no
    name), thread names (one in two processes). The column reads back as each row's text, and
    Parquet keeps it dictionary-encoded: given a dictionary that repeats a value, its writer
    falls back to writing every row's text PLAIN."""
    import numpy as np
    import pyarrow as pa

    from engine.store import TableWriter

    per_code = pa.array(["f", "g", "f", None, "g", "h", "f", ""])
    codes = np.random.default_rng(3).integers(0, len(per_code), 20_000).astype(np.int32)
    expected = [per_code[int(c)].as_py() for c in codes]
    writer = TableWriter(tmp_path / "t.parquet", pa.schema([("function", pa.string())]), text_as_dictionary=True)
    writer.write(pa.table({"function": pa.DictionaryArray.from_arrays(pa.array(codes), per_code)}))
    writer.write(pa.table({"function": pa.DictionaryArray.from_arrays(pa.array(codes[:5]), pa.array([None] * 8, pa.string()))}))
    path = writer.close({"table": "t"})
    assert pq.read_table(path).column("function").to_pylist() == expected + [None] * 5
    assert "RLE_DICTIONARY" in pq.ParquetFile(path).metadata.row_group(0).column(0).encodings


def test_copy_table_copies_the_pages_and_writes_its_own_metadata(tmp_path):
    """copy_table (analyze's OUT/gil.parquet from a gil.parquet input): every row group as it
    was, the source's `tandem` metadata replaced by the copy's; a source whose footer pyarrow
    would write otherwise is refused with one line (the caller then writes the rows again)."""
    import pyarrow as pa

    from engine.store import TableWriter, copy_table

    source = TableWriter(tmp_path / "in.parquet", pa.schema([("name", pa.large_string()), ("start_ns", pa.int64())]))
    for k in range(3):
        source.write(pa.table({"name": pa.array([f"f{k}", None, "g"], pa.large_string()), "start_ns": [k, k + 1, k + 2]}))
    source = source.close({"table": "gil", "from": "the input"})
    copy = copy_table(source, tmp_path / "out" / "gil.parquet", {"table": "gil", "analysis": {"n": 1}})
    assert pq.read_table(copy).equals(pq.read_table(source))
    assert pq.ParquetFile(copy).metadata.num_row_groups == 3
    assert read_table(copy).attrs == {"table": "gil", "analysis": {"n": 1}}
    assert read_table(source).attrs == {"table": "gil", "from": "the input"}
    assert [p.name for p in copy.parent.iterdir()] == ["gil.parquet"]  # (no temporary left)

    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"a": pa.array([[1, 2], [3]], pa.list_(pa.int64()))}), nested, use_compliant_nested_type=False)
    with pytest.raises(ValueError, match=r"nested\.parquet: its footer cannot be remade: [^\n]*$"):
        copy_table(nested, tmp_path / "out" / "nested.parquet", {})
    assert [p.name for p in copy.parent.iterdir()] == ["gil.parquet"]


def test_a_table_copy_begun_then_aborted_leaves_no_file(tmp_path):
    """TableCopy (the pages of a gil.parquet input copied while analyze correlates): aborted,
    neither the result nor its temporary is left; closed, the file is in place with the
    metadata given at close."""
    import pyarrow as pa

    from engine.store import TableCopy, TableWriter

    source = TableWriter(tmp_path / "in.parquet", pa.schema([("start_ns", pa.int64())]))
    source.write(pa.table({"start_ns": list(range(1000))}))
    source = source.close({"table": "gil"})
    out = tmp_path / "out"
    TableCopy(source, out / "gil.parquet").abort()
    assert list(out.iterdir()) == []
    copy = TableCopy(source, out / "gil.parquet")  # (closed later, with the metadata known then)
    assert copy.close({"table": "gil", "analysis": {"n": 2}}) == out / "gil.parquet"
    assert read_table(out / "gil.parquet").attrs == {"table": "gil", "analysis": {"n": 2}}
    assert [p.name for p in out.iterdir()] == ["gil.parquet"]
