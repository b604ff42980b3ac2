"""The correlation core: one push equals many pushes, for every result table.

The witness is the core itself run the simplest way (everything in one push, then finish),
which tests/test_analysis.py and tests/test_join_witness.py hold to the point model and
DuckDB. Here the same tables go in windows with random edges, watermark at each edge; the
rows emitted over all pushes must be the same rows, in the same order (with eager_pairs, the
overlaps rows in another order: compared sorted).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine.correlate import END, Correlator, KnownLifetimes
from engine.correlate.inputs import gil_rows_from_frame
from engine.correlate.stops import jvm_threads
from engine.errors import TandemError
from engine.correlate.tables import check_gil, check_pauses
from test_analysis import random_scenario
from test_join_witness import adversarial_tables, gil_frame, pauses_frame

TABLES = ("overlaps", "pause_impact", "gil_free")
PAIR_ORDER = ["pause_id", "start_ns", "pid", "tid", "state", "end_ns"]  # (eager_pairs: overlaps compared sorted)


def lifetimes_of(gil: pd.DataFrame) -> KnownLifetimes:
    nonempty = gil[gil.end_ns > gil.start_ns]
    return KnownLifetimes(nonempty.groupby(["pid", "tid"], as_index=False).agg(start_ns=("start_ns", "min"),
                                                                              end_ns=("end_ns", "max")))


def run(pauses, gil, slack_ns, edges=None, pauses_first=False, lifetimes=None, eager_pairs=False, jvm_tids=()):
    """Emitted rows per table (concatenated over pushes), and the summary."""
    core = Correlator(slack_ns, lifetimes=lifetimes, eager_pairs=eager_pairs, jvm_tids=jvm_tids)
    pushes = []
    if edges is None:
        pushes.append(core.push(pauses=pauses, gil=gil_rows_from_frame(gil), watermark_ns=END))
    else:
        low = -END
        for i, edge in enumerate([*edges, END]):
            p = pauses if (pauses_first and i == 0) else (
                pauses.iloc[:0] if pauses_first else pauses[(pauses.start_ns >= low) & (pauses.start_ns < edge)])
            g = gil[(gil.start_ns >= low) & (gil.start_ns < edge)]
            pushes.append(core.push(pauses=p, gil=gil_rows_from_frame(g), watermark_ns=edge))
            low = edge
    pushes.append(core.finish())
    out = {name: pa.concat_tables([getattr(r, name) for r in pushes]).to_pandas() for name in TABLES}
    out["gil_free"] = out["gil_free"].sort_values(["pid", "start_ns"], ignore_index=True)
    out["pause_impact"] = out["pause_impact"].sort_values("pause_id", ignore_index=True)
    if eager_pairs:
        out["overlaps"] = out["overlaps"].sort_values(PAIR_ORDER, ignore_index=True)
    out["summary"] = core.summary()
    out["stops"] = core.stops()
    return out, core


def assert_same(one, many):
    for name in (*TABLES, "summary", "stops"):
        pd.testing.assert_frame_equal(one[name], many[name], obj=name)


def random_edges(rng, lo, hi, n):
    return sorted(int(x) for x in rng.integers(lo, hi, n))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("slack_ns", [0, 7])
def test_one_push_equals_many_pushes_on_the_adversarial_tables(seed, slack_ns):
    pauses, gil = adversarial_tables(seed)
    pauses, (gil, _) = check_pauses(pauses), check_gil(gil)
    rng = np.random.default_rng(seed)
    one, _ = run(pauses, gil, slack_ns)
    assert len(one["overlaps"]) and len(one["gil_free"]) and one["pause_impact"].hit_python.any()
    one_sorted, _ = run(pauses, gil, slack_ns, eager_pairs=True)
    pd.testing.assert_frame_equal(one["overlaps"].sort_values(PAIR_ORDER, ignore_index=True),
                                  one_sorted["overlaps"])
    for lifetimes in (None, lifetimes_of(gil)):
        for n_edges in (1, 5, 40):
            edges = random_edges(rng, -10, 2_100, n_edges)
            assert_same(one, run(pauses, gil, slack_ns, edges, lifetimes=lifetimes)[0])
            assert_same(one_sorted, run(pauses, gil, slack_ns, edges, lifetimes=lifetimes, eager_pairs=True)[0])


@pytest.mark.parametrize("seed", range(12))
def test_one_push_equals_many_pushes_with_amplification(seed):
    """Which threads are the JVM's is known from all the pauses: they go in first, or in time
    order with their JVM threads named up front (jvm_tids, as `tandem analyze`'s driver does)."""
    pauses, gil = random_scenario(seed)
    pauses, (gil, _) = check_pauses(pauses), check_gil(gil)
    rng = np.random.default_rng(seed)
    one, _ = run(pauses, gil, 10)
    one_sorted, _ = run(pauses, gil, 10, eager_pairs=True)
    jvm_tids = jvm_threads(pauses)
    for lifetimes in (None, lifetimes_of(gil)):
        edges = random_edges(rng, 0, 600, int(rng.integers(1, 30)))
        assert_same(one, run(pauses, gil, 10, edges, pauses_first=True, lifetimes=lifetimes)[0])
        assert_same(one_sorted, run(pauses, gil, 10, edges, pauses_first=True, lifetimes=lifetimes, eager_pairs=True)[0])
        assert_same(one, run(pauses, gil, 10, edges, lifetimes=lifetimes, jvm_tids=jvm_tids)[0])


def test_known_lifetimes_let_rows_out_before_the_end():
    """With lifetimes known, a pause is final once the watermark passes it; without, it waits for finish()."""
    pauses = check_pauses(pauses_frame([(100, 200)]))
    gil = gil_frame([(1, 1, "released", 0, 50), (1, 1, "released", 150, 160), (1, 2, "waiting", 10, 1_000)])
    for lifetimes, expected in ((lifetimes_of(gil), 1), (None, 0)):
        core = Correlator(lifetimes=lifetimes)
        rows = core.push(pauses=pauses, gil=gil_rows_from_frame(gil), watermark_ns=300)
        assert len(rows.pause_impact) == expected
    rows = core.push(watermark_ns=400)  # has thread 1 ended at 160, or does it hold the GIL since? Not known.
    assert len(rows.pause_impact) == 0 and len(core.finish().pause_impact) == 1


def test_a_row_before_the_watermark_is_refused():
    core = Correlator()
    core.push(gil=gil_rows_from_frame(gil_frame([(1, 1, "released", 0, 50)])), watermark_ns=100)
    with pytest.raises(TandemError, match="before the watermark"):
        core.push(gil=gil_rows_from_frame(gil_frame([(1, 1, "released", 60, 70)])), watermark_ns=200)
    with pytest.raises(ValueError, match="backwards"):
        core.push(watermark_ns=50)


def test_dense_numbers_in_parts_equal_one_factorize():
    """Keys numbered part by part (the table grown on the way, keys -1 and 0 among them) get the
    numbers one pass over all of them gives: first seen, first numbered."""
    from engine.correlate.kernels import DenseNumbers

    rng = np.random.default_rng(3)
    keys = np.concatenate([[-1, 0, -1], rng.integers(-(1 << 62), 1 << 62, 5000), rng.integers(-3, 3000, 20_000)])
    keys = keys[rng.permutation(keys.size)]
    expected, uniques = pd.factorize(keys)
    numbers = DenseNumbers()
    edges = np.sort(rng.choice(keys.size, 40, replace=False))
    got = [numbers.number(part) for part in np.split(keys, edges)]
    assert np.array_equal(np.concatenate([n for n, _ in got]), expected)
    assert np.array_equal(np.concatenate([new for _, new in got]), uniques) and np.array_equal(numbers.keys, uniques)
    # pairs (pid, tid) as (pid << 32) | tid
    pid, tid = rng.integers(1, 1 << 22, keys.size), rng.integers(0, 1 << 31, keys.size) % 5000
    expected, uniques = pd.factorize(pid << 32 | tid)
    numbers = DenseNumbers()
    got = [numbers.number(t, high=p) for t, p in zip(np.split(tid, edges), np.split(pid, edges))]
    assert np.array_equal(np.concatenate([n for n, _ in got]), expected) and np.array_equal(numbers.keys, uniques)


@pytest.mark.parametrize("starts", ["spread", "ties", "bunched", "overflowing"])
def test_a_block_sorted_by_buckets_equals_a_stable_sort_by_start_then_tid(starts):
    """sort_rows (engine/ingest/gil.py): buckets by start where starts spread, np.lexsort where
    they bunch; either way a stable sort by (start, tid), as read_gil orders rows."""
    from engine.ingest.gil import _bucket_sort, sort_rows

    rng = np.random.default_rng(5)
    n = 20_000
    # (runs of one thread's rows in start order, as a block of the probe's file holds them)
    start = np.concatenate([np.sort(rng.integers(0, {"spread": 10 ** 12, "ties": n // 2}.get(starts, 10), 50))
                            for _ in range(n // 50)])
    if starts == "bunched":
        start[-1] = 1 << 50
    if starts == "overflowing":  # (times of a damaged file: their span overflows int64)
        start[0], start[-1] = -(1 << 62) - 5, (1 << 62) + 5
    tid, state = rng.integers(1, 9, n), rng.integers(0, 2, n).astype(np.int8)
    end, code = start + rng.integers(0, 100, n), rng.integers(0, 1 << 63, n).astype(np.uint64)
    rows = (tid, state, start, end, code)
    bucketed = _bucket_sort(*rows, *(np.empty_like(a) for a in rows))
    assert bucketed == (starts in ("spread", "ties"))
    key = np.lexsort((np.arange(n), tid, start))
    for got, column in zip(sort_rows(*rows), rows):
        assert np.array_equal(got, column[key])


def test_more_than_a_thousand_new_threads_in_one_push():
    gil = gil_frame([(1, t, "released", 10 * t, 10 * t + 5) for t in range(1, 3001)])
    core = Correlator()
    core.push(gil=gil_rows_from_frame(gil), watermark_ns=END)
    assert core.n_threads == 3000 and core.t_tid[:3000].tolist() == list(range(1, 3001))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_rows", [7, 64, 1 << 20])
def test_a_streamed_analysis_writes_what_correlate_returns(tmp_path, monkeypatch, seed, block_rows):
    """`tandem analyze --gil G.parquet` streams G in blocks; every table equals the in-memory analysis
    (which keeps the whole pauses table, where the streamed one keeps the columns it reads). The
    streamed one completes pause_impact (causes) a batch at a time: here as many batches as blocks."""
    import os

    from engine.analysis import correlate, load_results
    from engine.analysis import stream
    from engine.ingest import gil_parquet, gil_stream
    from engine.store import read_table, write_table

    pauses, gil = adversarial_tables(seed) if seed % 2 else random_scenario(seed)
    if seed >= 2:
        gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)  # as the probe writes them
    if seed == 3:  # the code of each release, carried into overlaps
        gil["function"] = pd.array([f"f{i % 7}" for i in range(len(gil))], dtype="string")
        gil["line"] = pd.array([None if i % 4 == 0 else i % 11 for i in range(len(gil))], dtype="Int64")
    if seed == 2:  # the columns of a JVM recording: causes read some (requesters, System.gc()), none read others
        n, tids = len(pauses), gil["tid"].unique()
        pauses["jvm_pid"] = pd.array([7 if i % 4 else None for i in range(n)], dtype="Int64")
        pauses["cause"] = pd.array(["System.gc()" if i % 2 else "G1 Evacuation Pause" for i in range(n)], dtype="string")
        pauses["requester_os_thread_id"] = pd.array([int(tids[i % len(tids)]) if i % 3 == 0 else None for i in range(n)],
                                                    dtype="Int64")
        pauses["system_gc_frames"] = pd.array(["java.lang.Runtime.gc; java.lang.System.gc" if i % 5 == 1 else None
                                               for i in range(n)], dtype="string")
        pauses["asked_by_tandem"] = [i % 6 == 1 for i in range(n)]
        pauses["source"] = pd.array(["recording.jfr"] * n, dtype="string")
        pauses["total_threads"] = pd.array(list(range(n)), dtype="Int64")
    write_table(gil, tmp_path / "g.parquet", {"source": "test"})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(stream, "IMPACT_BATCH_ROWS", block_rows)
    monkeypatch.setattr(stream.PausesAside, "batch_rows", 1 + seed)  # (the pauses set aside read back in batches)
    old_mask = os.umask(0o027)
    try:
        streamed = stream.analyze_streamed(tmp_path / "out", pauses, gil_parquet.ParquetGil(tmp_path / "g.parquet"), slack_ns=5)
    finally:
        os.umask(old_mask)
    expected = correlate(pauses, read_table(tmp_path / "g.parquet"), slack_ns=5, gil_source=str(tmp_path / "g.parquet"))
    assert not (tmp_path / "out" / "gil.parquet").exists()  # not copied: the header names it
    assert all(p.suffix == ".parquet" for p in (tmp_path / "out").iterdir())  # (pause_impact's rows on their way: gone)
    if seed == 3:  # unless asked: then it is the table as given
        stream.analyze_streamed(tmp_path / "copied", pauses, gil_parquet.ParquetGil(tmp_path / "g.parquet", copy=True), slack_ns=5)
        pd.testing.assert_frame_equal(read_table(tmp_path / "copied" / "gil.parquet"), read_table(tmp_path / "g.parquet"))
    assert streamed.header.pop("gil_table") == [str(tmp_path / "g.parquet")]
    assert streamed.header == expected.header
    loaded = load_results(tmp_path / "out")
    for name, table in expected.tables().items():
        if name == "gil":
            pd.testing.assert_frame_equal(loaded.gil, table, check_dtype=False)
            continue
        path = tmp_path / "out" / f"{name}.parquet"
        assert os.stat(path).st_mode & 0o777 == 0o640, name  # the umask's mode, not mkstemp's 0600
        back = read_table(path)
        assert back.attrs["analysis"]["gil_intervals"] == expected.header["gil_intervals"]
        if name == "gil_free":
            back = back.sort_values(["pid", "start_ns"], ignore_index=True)
        pd.testing.assert_frame_equal(back, table.reset_index(drop=True), check_dtype=False, obj=name)


def _streamed_equals_whole(out, pauses, paths, source, slack_ns: int) -> None:
    """SOURCE (of the GIL tables or files PATHS) streamed into OUT: the header and every result
    table equal the in-memory analysis of PATHS read whole and concatenated (rows of one moment in
    any order); OUT's copy of the GIL side, when it has one, holds every row and every column of
    them, else the header names PATHS."""
    from engine.analysis import correlate
    from engine.analysis.stream import analyze_streamed
    from engine.ingest.inputs import gil_from
    from engine.store import read_table

    streamed = analyze_streamed(out, pauses, source, slack_ns=slack_ns)
    whole, names = gil_from(paths=paths)
    expected = correlate(pauses, whole, slack_ns=slack_ns, gil_source=names)
    if not source.copy:
        assert streamed.header.pop("gil_table") == [str(p) for p in paths]
    assert streamed.header == expected.header
    for name in ("overlaps", "pause_impact", "gil_free", "summary", "stops", *(("gil",) if source.copy else ())):
        back = read_table(out / f"{name}.parquet")
        # (the copy: every row given, duplicates too, which the analysis drops)
        table = whole if name == "gil" else getattr(expected, "summary_table" if name == "summary" else name)
        if name in ("gil_free", "overlaps", "gil"):  # (rows of one moment in the order their sources gave them)
            columns = [c for c in ("pause_id", "pid", "tid", "start_ns", "end_ns", "state") if c in back.columns]
            if name == "gil":
                assert set(back.columns) == set(table.columns)
                back = back[table.columns].astype({"state": "string"})
                table = table.astype({"state": "string"})
            back, table = (t.sort_values(columns, ignore_index=True) for t in (back, table))
        pd.testing.assert_frame_equal(back, table.reset_index(drop=True), check_dtype=False, obj=name)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_rows", [7, 64])
def test_several_parquet_gil_tables_stream_as_their_concatenation(tmp_path, monkeypatch, seed, block_rows):
    """`tandem analyze --gil A.parquet --gil B.parquet ...` streams the tables side by side (each
    in its order, the next block from the table whose blocks to come start earliest): every table
    equals the in-memory analysis of their concatenation, the header too, and the copy of the
    GIL side holds every table's rows."""
    from engine.ingest import gil_parquet, gil_stream
    from engine.ingest.inputs import streamable_gil
    from engine.store import write_table

    pauses, gil = adversarial_tables(seed) if seed % 2 else random_scenario(seed)
    if seed >= 2:
        gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    # parts mixing threads and time: a thread's rows in two tables, a table's rows from all along
    part = (gil["tid"].to_numpy() + np.arange(len(gil)) // 50) % 3
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"g{k}.parquet")
        write_table(gil[part == k].reset_index(drop=True), paths[-1], {"source": f"part {k}"})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(gil_stream, "MIN_FILE_BLOCK", 1)  # (each table read a few rows at a time)
    source = streamable_gil(None, paths, copy=seed == 3)
    assert isinstance(source, gil_parquet.ParquetGil)
    _streamed_equals_whole(tmp_path / "out", pauses, paths, source, slack_ns=5)


@pytest.mark.parametrize("seed", range(4))
def test_parquet_gil_tables_of_other_columns_stream_as_their_concatenation(tmp_path, monkeypatch, seed):
    """Tables from different recordings need not have the same columns: one with code columns,
    one with thread names and 32-bit ids, one with neither. They stream as one table of every
    column (nulls where a table has none), and every result equals the in-memory analysis of
    their concatenation; the copy of the GIL side holds every row with the columns' union."""
    from engine.ingest import gil_parquet, gil_stream
    from engine.ingest.inputs import streamable_gil
    from engine.store import write_table

    pauses, gil = adversarial_tables(seed) if seed % 2 else random_scenario(seed)
    if seed >= 2:  # (in time order: read in it; else pushed by time)
        gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    part = (gil["tid"].to_numpy() + np.arange(len(gil)) // 5) % 3
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(3):
        table = gil[part == k].reset_index(drop=True)
        if k == 0:
            table["function"] = pd.array([f"f{i}" for i in rng.integers(0, 4, len(table))], dtype="string")
            table["file"] = pd.array(["w.py"] * len(table), dtype="string")
            table["line"] = pd.array(rng.integers(1, 9, len(table)), dtype="Int64")
        elif k == 1:
            table["thread_name"] = pd.array([f"t{t}" for t in table["tid"]], dtype="string")
            table["tid"] = table["tid"].astype("int32")
        paths.append(tmp_path / f"g{k}.parquet")
        write_table(table, paths[-1], {"source": f"part {k}"})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 8)
    monkeypatch.setattr(gil_stream, "MIN_FILE_BLOCK", 1)  # (each table read a few rows at a time)
    source = streamable_gil(None, paths, copy=seed in (0, 3))  # (copied: every column read; else the pushed ones)
    assert isinstance(source, gil_parquet.ParquetGil)
    _streamed_equals_whole(tmp_path / "out", pauses, paths, source, slack_ns=5)


def test_parquet_gil_tables_whose_column_types_cannot_be_one_are_refused_by_name(tmp_path):
    from engine.ingest import gil_parquet
    from engine.store import write_table

    gil = gil_frame([(1, 10, "released", 0, 5), (1, 10, "waiting", 6, 9)])
    write_table(gil.assign(line=pd.array([1, 2], dtype="Int64")), tmp_path / "a.parquet", {})
    write_table(gil.assign(line=pd.array(["x", "y"], dtype="string")), tmp_path / "b.parquet", {})
    with pytest.raises(TandemError, match=r"b\.parquet: its columns cannot be read with those of .*a\.parquet"):
        gil_parquet.ParquetGil([tmp_path / "a.parquet", tmp_path / "b.parquet"])


def test_several_parquet_gil_tables_are_pushed_side_by_side_in_time(tmp_path, monkeypatch):
    """Three tables of the same hour (three processes): read a third of a block at a time, from
    the table whose rows to come start earliest, and pushed merged: each push in start order and
    before its watermark, so the core appends and holds no row the watermark has not passed."""
    from engine.ingest import gil_parquet, gil_stream
    from engine.store import write_table

    paths = []
    for k in range(3):
        paths.append(tmp_path / f"g{k}.parquet")
        starts = np.arange(300, dtype=np.int64) * 1_000 + k * 7
        write_table(gil_frame([(k + 1, 10 + k, "released", s, s + 500) for s in starts.tolist()]), paths[-1], {})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 16)
    monkeypatch.setattr(gil_stream, "MIN_FILE_BLOCK", 1)
    source = gil_parquet.ParquetGil(paths)
    source.first_pass()
    pushed, waiting = [], []
    for block in source.pushes():
        pushed.append(block.rows.start_ns)
        waiting.append(sum(int((s >= block.watermark_ns).sum()) for s in pushed))
    assert sum(s.size for s in pushed) == 900 and max(s.size for s in pushed) <= 3 * 16 and max(waiting) == 0
    assert (np.diff(np.concatenate(pushed)) >= 0).all()


def test_a_parquet_tables_first_pass_over_row_groups_side_by_side_equals_one_pass(tmp_path, monkeypatch):
    """ParquetGil's first pass reads its row groups side by side: each thread's lifetime (a thread
    in several groups, one with only empty intervals) is that of the whole table read in order,
    and after any row the watermark is at most the earliest start of the rows after it: that
    start itself after a block's last row."""
    import pyarrow as pa

    from engine.ingest import gil_parquet, gil_stream
    from engine.store import TableWriter

    _, gil = random_scenario(5)
    gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    gil.loc[len(gil) // 2, ["start_ns", "end_ns"]] = [int(gil.start_ns.iloc[len(gil) // 2])] * 2  # (an empty one)
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 2)
    table = pa.Table.from_pandas(gil[["pid", "tid", "state", "start_ns", "end_ns"]], preserve_index=False)
    writer = TableWriter(tmp_path / "g.parquet", table.schema)
    for at in range(0, table.num_rows, 5):  # (row groups of 5 rows: blocks of 2, 2, 1)
        writer.write(table.slice(at, 5))
    source = gil_parquet.ParquetGil(writer.close({"table": "gil"}))
    assert source.files[0].metadata.num_row_groups > 3
    lifetimes = source.first_pass().sort_values(["pid", "tid"], ignore_index=True)
    whole = gil_stream.thread_lifetimes(gil).sort_values(["pid", "tid"], ignore_index=True)
    pd.testing.assert_frame_equal(lifetimes, whole)
    starts = np.concatenate([b.column("start_ns").to_numpy() for b in source._blocks(0, ["start_ns"])])
    after = np.append(np.minimum.accumulate(starts[::-1])[::-1], END)  # (the earliest start from each row on)
    ahead = source._ahead[0]
    bounds = np.array([ahead.earliest_from(row) for row in range(len(starts) + 1)])
    assert (bounds <= after).all()
    ends = np.cumsum([b.num_rows for b in source._blocks(0, ["start_ns"])])
    assert (bounds[ends] == after[ends]).all() and bounds[-1] == END


@pytest.mark.parametrize("first_rows, push_rows", [(8, 5), (3, 16), (16, 16)])
def test_parquet_blocks_cut_unlike_the_first_passes_keep_every_row_and_result(tmp_path, monkeypatch, first_rows, push_rows):
    """The pushes of Parquet gil tables need not cut their blocks where the first pass did (a
    reader may end a batch at a dictionary page): every row is pushed and every result equals
    the in-memory analysis of the tables' concatenation."""
    from engine.analysis import correlate
    from engine.analysis import stream
    from engine.ingest import gil_parquet, gil_stream
    from engine.ingest.inputs import gil_from
    from engine.store import read_table, write_table

    pauses, gil = random_scenario(6)
    gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"g{k}.parquet")
        write_table(gil[gil["tid"].to_numpy() % 2 == k].reset_index(drop=True), paths[-1], {"source": f"part {k}"})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", first_rows)
    monkeypatch.setattr(gil_stream, "MIN_FILE_BLOCK", 1)  # (each table read a few rows at a time)
    source = gil_parquet.ParquetGil(paths)
    first_pass = source.first_pass

    def then_other_cuts():
        lifetimes = first_pass()
        gil_stream.BLOCK_ROWS = push_rows
        return lifetimes

    source.first_pass = then_other_cuts
    stream.analyze_streamed(tmp_path / "out", pauses, source, slack_ns=5)
    whole, names = gil_from(paths=paths)
    expected = correlate(pauses, whole, slack_ns=5, gil_source=names)
    for name in ("overlaps", "pause_impact", "gil_free"):
        back, table = read_table(tmp_path / "out" / f"{name}.parquet"), getattr(expected, name)
        columns = [c for c in ("pause_id", "pid", "tid", "start_ns", "end_ns", "state") if c in back.columns]
        pd.testing.assert_frame_equal(back.sort_values(columns, ignore_index=True),
                                      table.sort_values(columns, ignore_index=True), check_dtype=False, obj=name)


def test_overlaps_carry_the_code_of_their_gil_interval():
    """Columns of schema.GIL_CARRIED_COLUMNS go from each GIL row into its overlaps rows, through any windows."""
    pauses, gil = adversarial_tables(3)
    pauses, (gil, _) = check_pauses(pauses), check_gil(gil)
    rng = np.random.default_rng(3)
    gil["function"] = pd.array([f"f{i % 7}" for i in range(len(gil))], dtype="string")
    gil["file"] = pd.array([None if i % 5 == 0 else f"m{i % 3}.py" for i in range(len(gil))], dtype="string")
    gil["line"] = pd.array([None if i % 4 == 0 else i % 11 for i in range(len(gil))], dtype="Int64")
    one, _ = run(pauses, gil, 3)
    assert list(one["overlaps"].columns[-3:]) == ["function", "file", "line"]
    assert len(one["overlaps"]) and not one["overlaps"].function.isna().any()
    many, _ = run(pauses, gil, 3, random_edges(rng, -10, 2_100, 20))
    assert_same(one, many)
    from test_join_witness import overlap_frame

    text = {"state": "string", "function": "string", "file": "string", "line": "Int64"}
    pd.testing.assert_frame_equal(  # the join's own table (engine.join.overlap_frame) as the witness
        one["overlaps"].astype(text),
        overlap_frame(pauses.sort_values("start_ns", kind="stable"), gil, slack_ns=3).astype(text), check_dtype=False)


def test_dictionary_encoded_code_columns_carry_the_same_values_as_text():
    """The probe's events give function and file dictionary-encoded, one entry per code: the
    same name may sit under two entries, an unknown one is a null entry. Overlaps carry the
    values, as from plain text."""
    pauses, gil = adversarial_tables(3)
    pauses, (gil, _) = check_pauses(pauses), check_gil(gil)
    gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    n = len(gil)
    functions = pa.array(["f0", "f1", None, "f0", "f2"])  # "f0" twice, a null entry
    files = pa.array(["m.py", None, "m.py"])
    f_index, m_index = np.arange(n) % len(functions), (np.arange(n) // 3) % len(files)
    lines = pa.array([None if i % 4 == 0 else i % 11 for i in range(n)], pa.int64())

    def pushed(dictionary_encoded: bool):
        core = Correlator(3)
        rows = []
        for lo in range(0, n, 97):  # several batches, each with its own chunks
            hi = min(n, lo + 97)
            part = gil.iloc[lo:hi]
            if dictionary_encoded:
                carried = pa.table({"function": pa.DictionaryArray.from_arrays(pa.array(f_index[lo:hi], pa.int32()), functions),
                                    "file": pa.DictionaryArray.from_arrays(pa.array(m_index[lo:hi], pa.int32()), files),
                                    "line": lines[lo:hi]})
            else:
                carried = pa.table({"function": functions.take(pa.array(f_index[lo:hi])),
                                    "file": files.take(pa.array(m_index[lo:hi])), "line": lines[lo:hi]})
            frame = gil_rows_from_frame(part)
            frame.carried = carried
            rows.append(core.push(pauses=pauses if lo == 0 else None, gil=frame,
                                  watermark_ns=int(gil.start_ns.iloc[hi]) if hi < n else END))
        rows.append(core.finish())
        return pa.concat_tables([r.overlaps for r in rows]).to_pandas()

    text, encoded = pushed(False), pushed(True)
    assert len(text) and text["function"].isna().any() and (text["function"] == "f0").any()
    pd.testing.assert_frame_equal(text, encoded)


PROBED = """
import sys, threading, time
import engine.probe as probe
probe.start(sys.argv[1])
def work(n):
    for i in range(n):
        time.sleep(0.0002)
        sum(range(300))
threads = [threading.Thread(target=work, args=(400 * (k + 1),)) for k in range(3)]  # ending at different times
[t.start() for t in threads]
[t.join() for t in threads]
probe.stop()
"""


def test_a_streamed_session_equals_the_whole_table_analysis(tmp_path):
    """Real GIL probe events files of two processes, streamed in small blocks (engine/analysis/stream.py,
    EventsGil), against read_gil + correlate."""
    import subprocess
    import sys

    from engine.analysis import correlate, load_results
    from engine.analysis.stream import analyze_streamed
    from engine.ingest.gil_events import EventsGil
    from engine.ingest.inputs import gil_from
    from engine.store import read_table

    files = [tmp_path / f"p{i}.events" for i in range(2)]
    for f in files:
        subprocess.run([sys.executable, "-c", PROBED, str(f)], check=True, timeout=120)
    gil, _ = gil_from(paths=files)
    rng = np.random.default_rng(1)
    lo, hi = int(gil.start_ns.min()), int(gil.end_ns.max())
    starts = np.sort(rng.integers(lo - 1_000_000, hi + 1_000_000, 300))
    pauses = pauses_frame([(s, s + int(rng.integers(0, 3_000_000))) for s in starts],
                          os_thread_ids=[int(rng.choice(gil.tid)) if rng.random() < 0.3 else None for _ in starts])
    # pauses some Python thread asked for (the causality step, engine/analysis/causes.py)
    pauses["requester_os_thread_id"] = pd.array([int(rng.choice(gil.tid)) if rng.random() < 0.3 else None
                                                 for _ in starts], dtype="Int64")
    expected = correlate(pauses, gil, slack_ns=20_000)
    assert expected.pause_impact.caused_by_python.any() and expected.header["why"]["functions_hit"]
    streamed = analyze_streamed(tmp_path / "out", pauses, EventsGil(files, block_records=3_000), slack_ns=20_000)
    # (read_gil's clock facts of several files are lost in gil_from's concatenation; the stream keeps them)
    assert streamed.header.pop("clock")["gil"]["method"] == "clock_gettime(CLOCK_MONOTONIC)"
    expected.header.pop("clock")
    # the results name the events files instead of copying their intervals (docs/results.md, "gil.parquet")
    assert streamed.header.pop("gil_table") == [str(f.resolve()) for f in files]
    assert not (tmp_path / "out" / "gil.parquet").exists()
    assert streamed.header == expected.header and expected.header["gil_intervals"] > 2_000
    assert expected.pause_impact.hit_python.any() and expected.pause_impact.threads_holding.any() and len(expected.gil_free)
    for name in ("overlaps", "pause_impact", "gil_free", "summary", "stops"):
        back = read_table(tmp_path / "out" / f"{name}.parquet")
        if name == "gil_free":
            back = back.sort_values(["pid", "start_ns"], ignore_index=True)
        pd.testing.assert_frame_equal(back, getattr(expected, "summary_table" if name == "summary" else name),
                                      check_dtype=False, obj=name)
    key = ["start_ns", "pid", "tid"]
    named = load_results(tmp_path / "out").gil  # read from the events files it names
    pd.testing.assert_frame_equal(named.sort_values(key, ignore_index=True), expected.gil.sort_values(key, ignore_index=True),
                                  check_dtype=False)
    # --copy-gil: gil.parquet is read_gil's table, in start order, and the header names no files
    copied = analyze_streamed(tmp_path / "copied", pauses, EventsGil(files, block_records=3_000, copy=True), slack_ns=20_000)
    assert "gil_table" not in copied.header
    back = read_table(tmp_path / "copied" / "gil.parquet")
    assert (np.diff(back["start_ns"].to_numpy()) >= 0).all()
    pd.testing.assert_frame_equal(back.sort_values(key, ignore_index=True),
                                  expected.gil.astype({"state": "string"}).sort_values(key, ignore_index=True),
                                  check_dtype=False)
    for name in ("overlaps", "pause_impact", "gil_free", "summary", "stops"):
        pd.testing.assert_frame_equal(read_table(tmp_path / "copied" / f"{name}.parquet"),
                                      read_table(tmp_path / "out" / f"{name}.parquet"), obj=name)


@pytest.mark.parametrize("runs", [0, 1, 2, 7, 40])
def test_merged_runs_are_a_stable_sort_by_start_pid_tid(runs):
    """kernels.merge_runs against numpy's lexsort, on runs with many equal keys (and empty runs):
    every column moved with its row (the key column: the rows' numbers, the stable order)."""
    from engine.correlate.kernels import merge_runs

    rng = np.random.default_rng(runs)
    parts = []
    for _ in range(runs):
        n = int(rng.integers(0, 300))
        start, pid, tid = rng.integers(0, 50, n), rng.integers(0, 3, n), rng.integers(0, 3, n)
        order = np.lexsort((tid, pid, start))
        parts.append((start[order], pid[order], tid[order]))
    start, pid, tid = (np.concatenate([p[k] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
                       for k in range(3))
    bounds = np.cumsum([0, *(p[0].size for p in parts)]).astype(np.int64)
    state, end, key = (start % 2).astype(np.int8), start + 7 * tid + 1, np.arange(start.size, dtype=np.int64)
    out = [np.empty_like(a) for a in (start, pid, tid, state, end, key)]
    merge_runs(bounds, start, pid, tid, state, end, key, *out)
    order = np.lexsort((key, tid, pid, start))
    assert np.array_equal(out[5], order)
    for made, column in zip(out, (start, pid, tid, state, end, key)):
        assert np.array_equal(made, column[order])


def test_processes_running_at_once_are_pushed_merged_in_start_order(tmp_path):
    """Three probed processes at once (their intervals interleave in time), streamed in blocks of
    500 records (engine/ingest/gil_stream.py, EventsGil.pushes: rows wait across many reads and
    are merged once): every table equals read_gil + correlate's, and the copied gil.parquet is
    in (start, pid, tid) order."""
    import subprocess
    import sys

    from engine.ingest.inputs import gil_from
    from engine.store import read_table

    files = [tmp_path / f"p{i}.events" for i in range(3)]
    running = [subprocess.Popen([sys.executable, "-c", PROBED, str(f)]) for f in files]
    assert [p.wait(timeout=120) for p in running] == [0, 0, 0]
    gil, _ = gil_from(paths=files)
    spans = gil.groupby("pid").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    assert spans.lo.max() < spans.hi.min(), "the processes did not run at the same time"
    expected = _streamed_equals_correlate(tmp_path / "out", files, gil, seed=2)
    back = read_table(tmp_path / "out" / "gil.parquet")
    order = ["start_ns", "pid", "tid"]
    pd.testing.assert_frame_equal(back, expected.gil.astype({"state": "string"}).sort_values(order, kind="stable", ignore_index=True),
                                  check_dtype=False)


@pytest.mark.parametrize("by_thread", [None, "buckets", "runs"])
def test_parquet_tables_beside_events_files_stream_merged_in_time(tmp_path, monkeypatch, by_thread):
    """`tandem analyze --gil p0.events --gil p1.events --gil p2.parquet`: three processes at once,
    one of them given as a Parquet table without code or thread names (in time order, or grouped
    by thread: in one row group, pushed through time buckets; in small ones, read a run at a
    time). The two kinds stream side by side (MergedGil), in small blocks: every table equals the
    in-memory analysis of the whole tables, and the copied gil.parquet holds every row."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from engine.ingest import gil_stream
    from engine.ingest.gil_merged import MergedGil
    from engine.ingest.inputs import gil_from, streamable_gil
    from engine.store import write_table

    files = [tmp_path / f"p{i}.events" for i in range(3)]
    running = [subprocess.Popen([sys.executable, "-c", PROBED, str(f)]) for f in files]
    assert [p.wait(timeout=120) for p in running] == [0, 0, 0]
    table, _ = gil_from(paths=files[2:])
    if by_thread:
        table = table.sort_values(["tid", "start_ns"], kind="stable", ignore_index=True)
    table = table.drop(columns=["thread_name", "function", "file", "line"], errors="ignore")
    write_table(table, tmp_path / "p2.parquet", {"source": "p2"})
    if by_thread == "runs":  # (the same rows in row groups of a tenth of them)
        pq.write_table(pq.read_table(tmp_path / "p2.parquet"), tmp_path / "p2.parquet", row_group_size=len(table) // 10)
    given = [*files[:2], tmp_path / "p2.parquet"]
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 256)
    monkeypatch.setattr(gil_stream, "MIN_FILE_BLOCK", 128)
    source = streamable_gil(None, given, copy=False)
    assert isinstance(source, MergedGil)
    if by_thread:
        source.first_pass()
        table_source = source.sources[1]
        assert (table_source._edges is not None) == (by_thread == "buckets") and (table_source._runs is not None) == (
            by_thread == "runs")
    gil, _ = gil_from(paths=given)
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(int(gil.start_ns.min()), int(gil.end_ns.max()), 200))
    pauses = pauses_frame([(s, s + int(rng.integers(0, 2_000_000))) for s in starts])
    _streamed_equals_whole(tmp_path / "out", pauses, given, source, slack_ns=20_000)


class _Told:
    """Lifetimes a test sets by hand: threads in `gone` (and their processes) have exited, the others live on."""

    def __init__(self):
        self.gone: set[tuple[int, int]] = set()

    def thread_ends(self, pid, tid):
        from engine.correlate.core import GONE

        return np.array([GONE if (int(p), int(t)) in self.gone else END for p, t in zip(pid, tid)], np.int64)

    def process_ends(self, pid):
        from engine.correlate.core import GONE

        return np.array([GONE if any(q == p for q, _ in self.gone) else END for p in pid], np.int64)


def test_an_open_interval_pairs_exactly_while_open_and_its_closed_row_replaces_it():
    """A thread released since 0 (named open at each push) pairs with a pause final at W=300;
    its closed row [0, 500) then takes its place; with the thread gone after it, every table
    equals the offline one. An open interval never closed is dropped."""
    from engine.correlate import GilRows
    from engine.correlate.schema import to_pandas

    pauses = check_pauses(pauses_frame([(100, 200), (600, 700)]))
    lifetimes = _Told()
    core = Correlator(lifetimes=lifetimes, retain_ns=1_000)
    open_rows = GilRows(np.array([1, 1]), np.array([1, 2]), np.array([0, 0], np.int8), np.array([0, 250]), np.array([0, 250]))
    first = core.push(pauses=pauses, open=open_rows, watermark_ns=300)
    assert first.overlaps.to_pylist() == [dict(pause_id=100, pid=1, tid=1, state="released", start_ns=100, end_ns=200,
                                               overlap_ns=100, slack_ns=0, near_miss=False)]
    assert first.pause_impact["threads_holding"].to_pylist() == [0]
    lifetimes.gone = {(1, 1), (1, 2)}
    rows = [first, core.push(gil=gil_rows_from_frame(gil_frame([(1, 1, "released", 0, 500)])), watermark_ns=800),
            core.finish()]
    assert core.open_rows_dropped == 1  # thread 2's, never closed: offline has no such interval
    got = {name: to_pandas(pa.concat_tables([r.tables()[name] for r in rows]), name) for name in TABLES}
    from engine.analysis import correlate

    expected = correlate(pauses, gil_frame([(1, 1, "released", 0, 500)]))
    pd.testing.assert_frame_equal(got["overlaps"], expected.overlaps, check_dtype=False)
    pd.testing.assert_frame_equal(got["gil_free"], expected.gil_free, check_dtype=False)
    pd.testing.assert_frame_equal(got["pause_impact"], expected.pause_impact[list(got["pause_impact"].columns)],
                                  check_dtype=False)


def test_eager_pairs_come_with_their_second_member_and_open_ones_when_final():
    """eager_pairs: a pair with a closed interval comes at the push that brings the later of its
    two members, long before its pause is final; a pair with an interval open at finality comes
    then; nothing comes twice."""
    from engine.correlate import GilRows

    pauses = check_pauses(pauses_frame([(100, 200)]))
    core = Correlator(lifetimes=_Told(), retain_ns=1_000, eager_pairs=True)
    assert len(core.push(gil=gil_rows_from_frame(gil_frame([(1, 1, "released", 50, 120)])), watermark_ns=90).overlaps) == 0
    open_row = GilRows(np.array([1]), np.array([3]), np.array([1], np.int8), np.array([95]), np.array([95]))
    first = core.push(pauses=pauses, open=open_row, watermark_ns=110)
    assert [(r["tid"], r["start_ns"], r["end_ns"]) for r in first.overlaps.to_pylist()] == [(1, 100, 120)]
    assert len(first.pause_impact) == 0  # not final: the pause has not ended before W
    second = core.push(gil=gil_rows_from_frame(gil_frame([(1, 2, "waiting", 150, 400)])), open=open_row, watermark_ns=140)
    assert [(r["tid"], r["start_ns"], r["end_ns"]) for r in second.overlaps.to_pylist()] == [(2, 150, 200)]
    third = core.push(open=open_row, watermark_ns=1_000)  # final: the open interval's pair now
    assert len(third.pause_impact) == 1
    assert [(r["tid"], r["state"], r["start_ns"], r["end_ns"]) for r in third.overlaps.to_pylist()] == [
        (3, "waiting", 100, 200)]
    assert len(core.finish().overlaps) == 0


def test_late_rows_are_accepted_within_the_retention():
    core = Correlator(retain_ns=100)
    core.push(gil=gil_rows_from_frame(gil_frame([(1, 1, "released", 0, 50)])), watermark_ns=100)
    rows = core.push(pauses=check_pauses(pauses_frame([(20, 30), (-500, -400)])), watermark_ns=200)
    assert (core.late_pauses, core.late_pauses_beyond_retention) == (2, 1)
    assert rows.overlaps["pause_id"].to_pylist() == [100]  # final at once, with the GIL row kept for it
    assert len(core.finish().overlaps) == 0


def test_a_pause_pushed_again_counts_once_and_a_reused_pause_id_is_an_error():
    pauses = check_pauses(pauses_frame([(100, 200), (300, 400)]))
    pauses["jvm_pid"] = pd.array([7, None], dtype="Int64")  # (a missing value equals a missing value)
    core = Correlator(retain_ns=1_000)
    core.push(pauses=pauses, watermark_ns=50)
    core.push(pauses=pd.concat([pauses, pauses.iloc[1:]], ignore_index=True), watermark_ns=60)
    assert core.pauses == 2
    changed = pauses.iloc[:1].assign(end_ns=250)
    with pytest.raises(TandemError, match="names two different pauses"):
        core.push(pauses=changed, watermark_ns=70)
    with pytest.raises(TandemError, match="names two different pauses"):
        Correlator().push(pauses=pd.concat([pauses.iloc[:1], changed], ignore_index=True), watermark_ns=0)


def test_the_pauses_check_drops_a_row_recorded_twice_and_refuses_one_id_on_two_pauses():
    """A row repeated on every column is one pause recorded twice (dropped, the first kept, the
    table's order otherwise unchanged); two different rows with one pause_id are an error."""
    pauses = pauses_frame([(100, 200), (300, 400), (500, 600)])
    pauses["cause"] = pd.array(["a", None, "c"], dtype="string")  # (a missing value equals a missing value)
    twice = pd.concat([pauses, pauses.iloc[[1, 0]]], ignore_index=True)
    checked = check_pauses(twice, "t.parquet")
    assert checked["pause_id"].tolist() == pauses["pause_id"].tolist()
    assert checked["cause"].isna().tolist() == [False, True, False] and checked["cause"].dropna().tolist() == ["a", "c"]
    assert checked.index.tolist() == [0, 1, 2]
    other = pauses.iloc[[2]].assign(cause="x")
    with pytest.raises(TandemError, match=r"t.parquet: pause_id \d+ names two different pauses"):
        check_pauses(pd.concat([pauses, other], ignore_index=True), "t.parquet")


def test_thread_ids_up_to_pid_max_cost_a_pairing_its_threads_not_their_ids():
    """Thread ids run to pid_max (2^22 where systemd sets it), and a session has a Pairing per
    process (a Spark executor's Python workers: thousands). Pairing keeps per-thread state (a
    table of its threads), not an array indexed by thread id: 40 threads with ids up to 2^22,
    paired block by block, give gil_model's intervals, and the table stays a few times their
    number (bytes: eight arrays of 64 entries at most)."""
    from gil_model import model_intervals
    from engine.ingest.gil import TID_AT_MOST, Pairing, as_records
    from engine.ring.layout import GIL_DROP, GIL_TAKE_ACQUIRED, GIL_TAKE_REQUEST

    rng = np.random.default_rng(11)
    tids = np.r_[TID_AT_MOST, TID_AT_MOST - 1, 65_536, 65_537, 1 << 21, rng.choice(TID_AT_MOST, 35, replace=False)]
    lanes = []
    for k, tid in enumerate(tids):  # per thread: DROP, [TAKE_REQUEST], TAKE_ACQUIRED, ...
        kinds = np.tile([GIL_DROP, GIL_TAKE_REQUEST, GIL_TAKE_ACQUIRED], 50)
        kinds = kinds[rng.random(kinds.size) < 0.85]
        mono = np.cumsum(rng.integers(1, 5_000, kinds.size)) + 1_000_000
        lanes.append((np.full(kinds.size, tid), mono, kinds, np.full(kinds.size, k + 1, np.uint64)))
    # the drain's order: passes over the lanes, each taking a run of a lane's records
    runs = [tuple(a[lo:lo + 7] for a in lane) for lane in lanes for lo in range(0, lane[0].size, 7)]
    runs.sort(key=lambda run: run[1][0])
    tid, mono, kind, aux = (np.concatenate([r[i] for r in runs]) for i in range(4))
    records = as_records(mono, tid, kind, aux)
    pairing, rows = Pairing(), []
    for block in np.array_split(records, 5):
        rows.append(pairing.intervals(block))
    got = sorted(zip(*(np.concatenate([r[i] for r in rows]).tolist() for i in range(5))))
    assert got == model_intervals(mono, tid, kind, aux) and len(got) > 2_000
    held = sum(a.nbytes for a in vars(pairing).values() if isinstance(a, np.ndarray))
    assert held <= 64 * 8 * 8, f"a Pairing of {len(tids)} threads holds {held:,} bytes"
    with pytest.raises(TandemError, match="beyond any Linux thread id"):
        Pairing("f").intervals(as_records(np.array([1, 2]), np.array([TID_AT_MOST + 1] * 2), np.array([GIL_DROP, GIL_TAKE_ACQUIRED])))


def test_a_session_of_many_short_lived_processes_holds_those_running_not_every_one(tmp_path):
    """Processes that come and go (a Spark executor's Python workers), streamed (EventsGil.pushes):
    the tables equal read_gil + correlate's, and a process's events file is closed and unmapped
    once its last block is read, so what is open while pushing is the processes of the moment,
    not every one of the session. Each file's span, read from its first and last records, lies in
    the recording's and covers most of it: the blocks are sized by the 3 processes recorded at
    once, not the 12."""
    import os
    import subprocess
    import sys

    from engine.ingest.gil_events import EventsGil, most_at_once
    from engine.ingest.inputs import gil_from
    from engine.ring import read_events

    files = [tmp_path / f"p{i}.events" for i in range(12)]
    for at in range(0, len(files), 3):  # three at a time, one round after another
        running = [subprocess.Popen([sys.executable, "-c", PROBED, str(f)]) for f in files[at:at + 3]]
        assert [p.wait(timeout=120) for p in running] == [0, 0, 0]
    spans = [f.span for f in EventsGil(files).files]
    for path, (first, last) in zip(files, spans):
        times = read_events(path).records["mono_ns"]
        assert times.min() <= first < last <= times.max()
        assert last - first >= 0.8 * (times.max() - times.min()), path
    assert most_at_once(spans) == 3
    assert most_at_once([*spans, None]) == 4 and most_at_once([None]) == most_at_once([]) == 1
    source = EventsGil(files, block_records=500, copy=True)
    source.first_pass()
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before, most = fds(), 0
    for _ in source.pushes():
        most = max(most, fds() - before)
    assert most <= 2 * 3 + 2, f"{most} files open while pushing 12 processes' files, 3 at a time"
    _streamed_equals_correlate(tmp_path / "out", files, gil_from(paths=files)[0], seed=3)


def _streamed_equals_correlate(out, files, gil, seed: int):
    """FILES streamed in blocks of 500 records into OUT against correlate of their gil table GIL
    (random pauses): every table equal (gil_free as rows). Returns correlate's results."""
    from engine.analysis import correlate
    from engine.analysis.stream import analyze_streamed
    from engine.ingest.gil_events import EventsGil
    from engine.store import read_table

    rng = np.random.default_rng(seed)
    starts = np.sort(rng.integers(int(gil.start_ns.min()), int(gil.end_ns.max()), 200))
    pauses = pauses_frame([(s, s + int(rng.integers(0, 2_000_000))) for s in starts])
    expected = correlate(pauses, gil, slack_ns=20_000)
    analyze_streamed(out, pauses, EventsGil(files, block_records=500, copy=True), slack_ns=20_000)
    for name in ("overlaps", "pause_impact", "summary", "stops"):
        pd.testing.assert_frame_equal(read_table(out / f"{name}.parquet"),
                                      getattr(expected, "summary_table" if name == "summary" else name),
                                      check_dtype=False, obj=name)
    key = ["pid", "start_ns"]
    pd.testing.assert_frame_equal(read_table(out / "gil_free.parquet").sort_values(key, ignore_index=True),
                                  expected.gil_free.sort_values(key, ignore_index=True), check_dtype=False)
    return expected


@pytest.mark.parametrize("seed", range(12))
def test_stable_order_is_numpys_stable_argsort(seed):
    """join.kernels.stable_order against np.argsort(kind="stable"): times with ties, a few values
    (bucket numbers), already sorted, negative, and spans too wide to pack (the stable sort)."""
    from engine.join.kernels import stable_order

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 5000))
    for keys in (rng.integers(0, max(n // 3, 1), n), rng.integers(0, 10**12, n), np.sort(rng.integers(-50, 50, n)),
                 rng.integers(-(1 << 62), 1 << 62, n), rng.integers(0, 512, n).astype(np.int16)):
        assert np.array_equal(stable_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("seed", range(40))
def test_carried_key_numbers_equal_values_alike_in_the_order_they_first_come(seed):
    """carried_key against the rows' value tuples numbered by first appearance (pandas), over
    narrow and wide integer columns with nulls, plain and dictionary-encoded text."""
    from engine.correlate.core import carried_key

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    columns = {
        "line": pa.array(rng.integers(-3, 40, n), pa.int64(), mask=rng.random(n) < 0.2),
        "wide": pa.array(rng.integers(0, 3, n) * (1 << 40), pa.int64(), mask=rng.random(n) < 0.1),
        "file": pa.array(np.array(["a.py", "b.py", None], object)[rng.integers(0, 3, n)], pa.string()),
        "function": pa.array(np.array(["f", "g"], object)[rng.integers(0, 2, n)], pa.string()).dictionary_encode(),
        "none": pa.nulls(n, pa.int64()),
    }
    table = pa.table({name: columns[name] for name in rng.permutation(list(columns))[:int(rng.integers(1, 6))]})
    rows = list(zip(*(table.column(name).to_pylist() for name in table.column_names))) if n else []
    expected, _ = pd.factorize(pd.Series(rows, dtype=object)) if rows else (np.zeros(0, np.int64), None)
    assert np.array_equal(carried_key(table), expected)


@pytest.mark.parametrize("seed", range(10))
def test_text_numbers_give_back_each_pieces_text_whatever_its_dictionary(seed):
    """Rows waiting in time buckets hold their text as numbers for the whole table (TextNumbers):
    pieces read with dictionaries of their own (values in another order, a null entry, a null
    index, an entry no row uses), numbered, then concatenated and taken in another order, come
    back with each row's text; a column it does not number is left as it is."""
    from engine.ingest.gil_parquet import TextNumbers

    rng = np.random.default_rng(seed)
    words = ["released", "waiting", "main", "worker-1", None]
    numbers, pieces = TextNumbers(), []
    for _ in range(int(rng.integers(1, 5))):
        n = int(rng.integers(0, 40))
        dictionary = pa.array(list(rng.permutation(np.array(words, object))), pa.string())
        index = pa.array(rng.integers(0, len(words), n).astype(np.int32), mask=rng.random(n) < 0.1)
        piece = pa.table({"thread_name": pa.DictionaryArray.from_arrays(index, dictionary),
                          "file": pa.array(["a.py"] * n).dictionary_encode(), "other": pa.array(np.arange(n))})
        pieces.append((piece, numbers.numbered(piece)))
    assert all(p.schema.field("thread_name").type == pa.int32() for _, p in pieces)
    order = rng.permutation(sum(p.num_rows for p, _ in pieces))
    back = numbers.text(pa.concat_tables([p for _, p in pieces]).combine_chunks().take(pa.array(order)))
    for name in ("thread_name", "file", "other"):
        given = [value for p, _ in pieces for value in p.column(name).to_pylist()]
        assert back.column(name).to_pylist() == [given[i] for i in order], name


def _threads_at_once(rng, tids, rows_each: int, functions: int) -> pd.DataFrame:
    """A gil table of threads TIDS of one process over the same time, ROWS_EACH rows each in
    start order (thread by thread), their code one of FUNCTIONS functions."""
    rows = []
    for tid in tids:
        t = int(rng.integers(0, 50))
        for _ in range(rows_each):
            t += int(rng.integers(1, 40))
            length = int(rng.integers(0, 30))
            rows.append((9, tid, str(rng.choice(["released", "waiting"])), t, t + length))
            t += length
    gil = gil_frame(rows)
    gil["function"] = pd.array([f"f{i % functions}" for i in range(len(gil))], dtype="string")
    return gil


@pytest.mark.parametrize("tables", [1, 2])
def test_a_parquet_table_sorted_by_thread_is_pushed_by_time_in_bounded_memory(tmp_path, monkeypatch, tables):
    """A gil table in thread order (each thread's rows, then the next thread's: a table a tool
    wrote grouped by thread) read in its order would have the core hold nearly every row, the
    watermark held back by the last thread's first start. The first pass sees it and its rows are
    pushed by time (through time buckets on disk): each push leaves at most about a block's rows
    the watermark has not passed, and every result equals the in-memory analysis; in time order
    the same rows are pushed as they stand. Copied, gil.parquet holds every row."""
    from engine.analysis import correlate
    from engine.analysis import stream
    from engine.ingest import gil_parquet, gil_stream
    from engine.ingest.inputs import gil_from
    from engine.store import read_table, write_table

    rng = np.random.default_rng(11)
    gil = _threads_at_once(rng, range(20, 32), 60, functions=5)  # twelve threads over the same time
    starts = rng.integers(0, 2_000, 40)
    pauses = pauses_frame([(int(s), int(s) + int(rng.integers(0, 60))) for s in starts])
    by_thread = gil.sort_values(["pid", "tid", "start_ns"], kind="stable", ignore_index=True)
    paths = []
    for k in range(tables):
        paths.append(tmp_path / f"g{k}.parquet")
        write_table(by_thread[by_thread["tid"].to_numpy() % tables == k].reset_index(drop=True), paths[-1], {})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 64)
    source = gil_parquet.ParquetGil(paths, copy=True)
    source.first_pass()
    assert source._edges is not None and source._edges.size >= 5
    pushed, waiting = [], []
    for block in source.pushes():
        pushed.append(block.rows.start_ns)
        waiting.append(sum(int((s >= block.watermark_ns).sum()) for s in pushed))
    assert sum(s.size for s in pushed) == len(gil) and max(waiting) <= 2 * 64

    streamed = stream.analyze_streamed(tmp_path / "out", pauses, gil_parquet.ParquetGil(paths, copy=True), slack_ns=5)
    assert all(p.suffix == ".parquet" for p in (tmp_path / "out").iterdir())  # (the buckets, gone with the staging)
    whole, names = gil_from(paths=paths)
    expected = correlate(pauses, whole, slack_ns=5, gil_source=names)
    assert streamed.header == expected.header
    for name in ("overlaps", "pause_impact", "gil_free", "summary", "stops", "gil"):
        back = read_table(tmp_path / "out" / f"{name}.parquet")
        table = getattr(expected, "summary_table" if name == "summary" else name)
        columns = [c for c in ("pause_id", "pid", "tid", "start_ns", "end_ns", "state") if c in back.columns]
        if columns and name not in ("summary", "stops"):
            back, table = back.sort_values(columns, ignore_index=True), table.sort_values(columns, ignore_index=True)
        pd.testing.assert_frame_equal(back, table.reset_index(drop=True), check_dtype=False, obj=name)

    in_time = tmp_path / "in-time.parquet"
    write_table(gil.sort_values("start_ns", kind="stable", ignore_index=True), in_time, {})
    source = gil_parquet.ParquetGil(in_time)
    source.first_pass()
    assert source._edges is None


@pytest.mark.parametrize("tables", [1, 2])
def test_a_parquet_table_of_a_few_runs_in_start_order_is_read_a_run_at_a_time(tmp_path, monkeypatch, tables):
    """A gil table grouped by thread in row groups smaller than a thread's rows (a tool writing a
    thread at a time): its runs in start order are found by the first pass (each thread's rows
    here) and read side by side, as several tables are, not through time buckets: each push
    leaves at most about a block's rows the watermark has not passed, and every result equals the
    in-memory analysis. Past MAX_RUNS runs it goes through time buckets, as it does where the
    runs' readers would decode each row group several times (runs smaller than the groups)."""
    import pyarrow.parquet as pq

    from engine.ingest import gil_parquet, gil_stream

    rng = np.random.default_rng(5)
    gil = _threads_at_once(rng, range(40, 46), 400, functions=7)  # six threads over the same time
    by_thread = gil.sort_values(["pid", "tid", "start_ns"], kind="stable", ignore_index=True)
    paths = []
    for k in range(tables):
        paths.append(tmp_path / f"g{k}.parquet")
        part = by_thread[by_thread["tid"].to_numpy() % tables == k].reset_index(drop=True)
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), paths[-1], row_group_size=150)
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 64)
    source = gil_parquet.ParquetGil(paths)
    source.first_pass()
    assert source._edges is None
    assert [(f, first, end) for f, first, end, _ in source._runs] == [
        (k, 400 * j, 400 * (j + 1)) for k in range(tables) for j in range(6 // tables)]
    pushed, waiting = [], []
    for block in source.pushes():
        pushed.append(block.rows.start_ns)
        waiting.append(sum(int((s >= block.watermark_ns).sum()) for s in pushed))
    assert sum(s.size for s in pushed) == len(gil) and max(waiting) <= 2 * 64
    starts = rng.integers(0, 20_000, 60)
    pauses = pauses_frame([(int(s), int(s) + int(rng.integers(0, 60))) for s in starts])
    _streamed_equals_whole(tmp_path / "out", pauses, paths, gil_parquet.ParquetGil(paths, copy=tables == 1), slack_ns=5)

    monkeypatch.setattr(gil_parquet, "MAX_RUNS", 6 // tables - 1)
    source = gil_parquet.ParquetGil(paths)
    source.first_pass()
    assert source._runs is None and source._edges is not None


def test_a_parquet_table_of_small_row_groups_is_pushed_in_blocks_of_many_groups(tmp_path, monkeypatch):
    """A table written in small row groups (a streaming writer's) is pushed in blocks of about
    BLOCK_ROWS rows, its groups' batches made one (a push costs more than its rows), with the
    results of the in-memory analysis."""
    import pyarrow as pa

    from engine.analysis import correlate
    from engine.analysis import stream
    from engine.ingest import gil_parquet, gil_stream
    from engine.store import TableWriter, read_table

    pauses, gil = random_scenario(8)
    gil = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    gil["function"] = pd.array([f"f{i % 3}" for i in range(len(gil))], dtype="string")
    table = pa.Table.from_pandas(gil, preserve_index=False)
    writer = TableWriter(tmp_path / "g.parquet", table.schema, text_as_dictionary=True)
    for at in range(0, table.num_rows, 3):
        writer.write(table.slice(at, 3))
    path = writer.close({"table": "gil"})
    monkeypatch.setattr(gil_stream, "BLOCK_ROWS", 16)
    source = gil_parquet.ParquetGil(path)
    source.first_pass()
    sizes = [len(block.rows) for block in source.pushes()]
    assert sum(sizes) == len(gil) and all(n >= 16 for n in sizes[:-1]) and len(sizes) == -(-len(gil) // 18)
    stream.analyze_streamed(tmp_path / "out", pauses, gil_parquet.ParquetGil(path), slack_ns=5)
    expected = correlate(pauses, read_table(path), slack_ns=5)
    for name in ("overlaps", "pause_impact", "gil_free"):
        back, table = read_table(tmp_path / "out" / f"{name}.parquet"), getattr(expected, name)
        if name == "gil_free":  # (the stream writes each push's segments: by process, in time)
            back, table = (t.sort_values(["pid", "start_ns"], ignore_index=True) for t in (back, table))
        pd.testing.assert_frame_equal(back, table.reset_index(drop=True), check_dtype=False, obj=name)
