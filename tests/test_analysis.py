"""correlate(): pause_impact, gil_free and summary against independent computations; clocks; files.

The witness for pause_impact and gil_free is a point model: with small integer times, the
state of every thread is evaluated at each nanosecond x (standing for [x, x+1)) by brute
force, straight from the definitions in docs/results.md, sharing no code with the engine.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from engine.analysis import analyze, correlate
from engine.errors import TandemError
from engine.store import read_table, write_table
from test_join_witness import canonical, duckdb_overlaps, gil_frame, pauses_frame

WHOLE_VM = {"safepoint", "gc_pause"}


def random_scenario(seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two processes, a few threads each with mostly disjoint intervals (and some malformed overlaps)."""
    rng = np.random.default_rng(seed)
    rows = []
    for pid in (7, 8):
        for tid in rng.choice(np.arange(100, 110), rng.integers(1, 4), replace=False):
            t = int(rng.integers(0, 100))
            for _ in range(rng.integers(1, 12)):
                t += int(rng.integers(0, 30))
                length = int(rng.integers(0, 40))
                rows.append((pid, int(tid), str(rng.choice(["released", "waiting"])), t, t + length))
                t += length
            if rng.random() < 0.3 and rows:  # a malformed source: one thread's intervals overlap
                pid_, tid_, state, s, e = rows[-1]
                rows.append((pid_, tid_, "released", max(0, s - 5), e + 3))
    tids = sorted({r[1] for r in rows})
    pauses = []
    for _ in range(rng.integers(3, 15)):
        s = int(rng.integers(0, 500))
        pauses.append((s, s + int(rng.integers(0, 80))))
    kinds = [str(rng.choice(["safepoint", "gc_pause", "vm_operation", "deoptimization"])) for _ in pauses]
    owners = [int(rng.choice(tids)) if rng.random() < 0.5 else None for _ in pauses]
    return pauses_frame(pauses, kinds=kinds, os_thread_ids=owners), gil_frame(rows)


def point_model(pauses: pd.DataFrame, gil: pd.DataFrame):
    """Per-nanosecond truth: (gil_free points per pid, pause_impact columns computed by brute force)."""
    gil = gil[gil.end_ns > gil.start_ns]
    horizon = int(max(gil.end_ns.max(), pauses.end_ns.max())) + 1
    x = np.arange(horizon)
    covered, alive = {}, {}
    for (pid, tid), rows in gil.groupby(["pid", "tid"]):
        covered[pid, tid] = np.zeros(horizon, bool)
        for s, e in zip(rows.start_ns, rows.end_ns):
            covered[pid, tid][s:e] = True
        alive[pid, tid] = (x >= rows.start_ns.min()) & (x < rows.end_ns.max())
    holding = {key: alive[key] & ~covered[key] for key in covered}
    free = {}
    for pid in gil.pid.unique():
        keys = [k for k in covered if k[0] == pid]
        span = (x >= min(alive[k].argmax() for k in keys)) & (x < max(horizon - alive[k][::-1].argmax() for k in keys))
        free[pid] = span & ~np.logical_or.reduce([holding[k] for k in keys])
    jvm_threads = set(pauses.os_thread_id.dropna().astype(int))
    impact = []
    for p in pauses.itertuples():
        inside = (x >= p.start_ns) & (x < p.end_ns)
        holders = [k for k in holding if (holding[k] & inside).any()]
        stopped = [tid for _, tid in holders
                   if (not pd.isna(p.os_thread_id) and tid == p.os_thread_id) or (p.kind in WHOLE_VM and tid in jvm_threads)]
        impact.append({
            "pause_id": p.pause_id,
            "overlap_ns": int((inside & np.logical_or.reduce(list(covered.values()))).sum()),
            "threads_holding": len(holders),
            "gil_free_ns": int(sum((inside & f).sum() for f in free.values())),
            "amplifying_tid": min(stopped) if stopped else pd.NA,
        })
    return free, pd.DataFrame(impact)


def duckdb_thread_columns(pauses: pd.DataFrame, gil: pd.DataFrame, slack_ns: int) -> pd.DataFrame:
    """threads_released/waiting, released_ns/waiting_ns and near_misses per pause, in SQL."""
    con = duckdb.connect()
    con.register("o", duckdb_overlaps(pauses, gil, slack_ns))
    con.register("p", pauses[["pause_id"]])
    return con.execute("""
        SELECT p.pause_id,
          count(DISTINCT (o.pid, o.tid)) FILTER (WHERE NOT near_miss AND state = 'released') AS threads_released,
          coalesce(sum(overlap_ns) FILTER (WHERE NOT near_miss AND state = 'released'), 0) AS released_ns,
          count(DISTINCT (o.pid, o.tid)) FILTER (WHERE NOT near_miss AND state = 'waiting') AS threads_waiting,
          coalesce(sum(overlap_ns) FILTER (WHERE NOT near_miss AND state = 'waiting'), 0) AS waiting_ns,
          count(o.pause_id) FILTER (WHERE near_miss) AS near_misses
        FROM p LEFT JOIN o USING (pause_id) GROUP BY p.pause_id ORDER BY p.pause_id
    """).df()


@pytest.mark.parametrize("seed", range(12))
def test_pause_impact_and_gil_free_equal_the_point_model(seed):
    pauses, gil = random_scenario(seed)
    result = correlate(pauses, gil, slack_ns=10)
    free, truth = point_model(pauses, gil)
    for pid, points in free.items():
        mine = result.gil_free[result.gil_free.pid == pid]
        drawn = np.zeros(points.size, bool)
        for s, e in zip(mine.start_ns, mine.end_ns):
            drawn[s:e] = True
        assert (drawn == points).all(), f"gil_free of pid {pid}"
    impact = result.pause_impact.sort_values("pause_id").reset_index(drop=True)
    truth = truth.sort_values("pause_id").reset_index(drop=True)
    for column in ("overlap_ns", "threads_holding", "gil_free_ns"):
        assert impact[column].tolist() == truth[column].tolist(), column
    assert impact.amplifying_tid.astype(object).where(impact.amplifying_tid.notna(), None).tolist() == \
        truth.amplifying_tid.astype(object).where(truth.amplifying_tid.notna(), None).tolist()
    assert (impact.amplified == impact.amplifying_tid.notna()).all()
    assert (impact.hit_python == (impact.overlap_ns > 0)).all()
    checked_gil = result.gil  # duplicates dropped, as the engine saw it
    sql = duckdb_thread_columns(pauses, checked_gil, 10)
    for column in ("threads_released", "released_ns", "threads_waiting", "waiting_ns", "near_misses"):
        assert impact[column].tolist() == sql[column].astype(np.int64).tolist(), column
    pd.testing.assert_frame_equal(canonical(result.overlaps), canonical(duckdb_overlaps(pauses, checked_gil, 10)))


def test_a_hand_built_story():
    """A GC pause while thread 1 is in Java (released) and thread 2 holds the GIL and is stopped."""
    pauses = pauses_frame([(1_000, 3_000), (5_000, 5_500)], kinds=["gc_pause", "vm_operation"],
                          names=["G1 Young", "System.gc"], os_thread_ids=[None, 2])
    gil = gil_frame([
        (9, 1, "released", 500, 3_500),    # across the whole GC pause
        (9, 2, "waiting", 0, 100),         # thread 2 lives from 0 ...
        (9, 2, "released", 2_500, 2_600),  # ... holds the GIL around this ...
        (9, 2, "waiting", 5_900, 6_000),   # ... and through the second pause, until 6,000
        (9, 3, "waiting", 1_500, 2_000),   # another thread, waiting (for thread 2)
    ])
    result = correlate(pauses, gil)
    gc, op = result.pause_impact.itertuples(index=False)
    assert (gc.threads_released, gc.released_ns, gc.threads_waiting, gc.waiting_ns) == (2, 2_100, 1, 500)
    assert gc.overlap_ns == 2_000 and gc.hit_python
    assert gc.threads_holding == 1  # thread 2; thread 3 lives 1,500-2,000 but only waits
    # thread 2 is a JVM thread (os_thread_id of the System.gc operation) and a GC pause stops the VM:
    assert gc.amplifying_tid == 2 and gc.amplified
    assert (op.hit_python, op.threads_holding, op.amplifying_tid, op.amplified) == (False, 1, 2, True)
    # Nobody holds the GIL while thread 2 waits alone (0-100, 5,900-6,000) and while threads 1 and 2
    # are both released (2,500-2,600): only the last lies in the GC pause.
    assert result.gil_free[["start_ns", "end_ns"]].values.tolist() == [[0, 100], [2_500, 2_600], [5_900, 6_000]]
    assert (gc.gil_free_ns, gc.gil_free, op.gil_free_ns) == (100, True, 0)
    summary = result.summary_table.set_index("name")
    assert summary.loc["G1 Young", "pauses_hit"] == 1 and summary.loc["System.gc", "pauses_hit"] == 0
    assert summary.loc["G1 Young", "threads_affected"] == 3


def test_summary_equals_sql_over_pause_impact():
    pauses, gil = random_scenario(3)
    pauses = pd.concat([pauses, pauses_frame([(s, s + 30) for s in range(0, 400, 37)], kinds=["gc_pause"] * 11,
                                             names=["G1 Young"] * 11).assign(pause_id=lambda f: f.pause_id + 1000)],
                       ignore_index=True)
    result = correlate(pauses, gil, slack_ns=5)
    span_ns = result.header["span_ns"]
    con = duckdb.connect()
    con.register("i", result.pause_impact.astype({"kind": object, "name": object}))
    con.register("o", result.overlaps.astype({"state": object}))
    sql = con.execute(f"""
        SELECT kind, name, count(*) AS pauses, count(*) FILTER (WHERE hit_python) AS pauses_hit,
               count(*) FILTER (WHERE hit_python) / ({span_ns} / 3.6e12) AS hits_per_hour,
               avg(overlap_ns / 1e6) FILTER (WHERE hit_python) AS mean_overlap_ms,
               quantile_cont(overlap_ns / 1e6, 0.5) FILTER (WHERE hit_python) AS p50_overlap_ms,
               quantile_cont(overlap_ns / 1e6, 0.99) FILTER (WHERE hit_python) AS p99_overlap_ms,
               max(overlap_ns / 1e6) FILTER (WHERE hit_python) AS max_overlap_ms,
               coalesce(sum(overlap_ns / 1e6) FILTER (WHERE hit_python), 0) AS total_overlap_ms,
               (SELECT count(DISTINCT (o.pid, o.tid)) FROM o JOIN i AS j USING (pause_id)
                 WHERE NOT o.near_miss AND j.kind = i.kind AND j.name = i.name) AS threads_affected,
               count(*) FILTER (WHERE near_misses > 0 AND NOT hit_python) AS pauses_near_miss,
               count(*) FILTER (WHERE amplified) AS pauses_amplified
        FROM i GROUP BY kind, name ORDER BY kind, name
    """).df()
    ours = result.summary_table.sort_values(["kind", "name"]).reset_index(drop=True)
    assert ours.pauses_hit.sum() > 0
    assert list(ours.columns) == list(sql.columns)
    for column in sql.columns:
        if column in ("kind", "name"):
            assert ours[column].tolist() == sql[column].tolist()
        else:
            np.testing.assert_allclose(ours[column].to_numpy(float), sql[column].to_numpy(float), rtol=1e-9,
                                       err_msg=column)


def test_a_mix_of_inputs_keeps_every_parts_clock_facts(tmp_path):
    """Two pauses tables given together: the wall-clock one is refused as it is alone, named,
    whichever comes first (the concatenation kept only the first part's metadata)."""
    gil = gil_frame([(1, 1, "released", 150, 160)])
    write_table(gil, tmp_path / "g.parquet")
    write_table(pauses_frame([(100, 200)]), tmp_path / "mono.parquet")
    write_table(pauses_frame([(300, 400)]), tmp_path / "wall.parquet",
                {"clock_domain": "wall", "clock_method": "chunk_header_wall", "boot_id": "boot-W"})
    tandem = Path(sys.executable).parent / "tandem"
    for order in (("mono", "wall"), ("wall", "mono"), ("wall",)):
        args = [a for name in order for a in ("--pauses", str(tmp_path / f"{name}.parquet"))]
        proc = subprocess.run([str(tandem), "analyze", *args, "--gil", str(tmp_path / "g.parquet"), "-o", str(tmp_path / "out")],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (order, proc.stderr)
        assert f"{tmp_path / 'wall.parquet'} is on the wall clock" in proc.stderr, (order, proc.stderr)
    # Both on the monotonic clock: joined, the facts of both parts in the results' clock.
    write_table(pauses_frame([(300, 400)]), tmp_path / "mono2.parquet", {"boot_id": "boot-M", "error_ns": 7})
    proc = subprocess.run([str(tandem), "analyze", "--pauses", str(tmp_path / "mono.parquet"), "--pauses",
                           str(tmp_path / "mono2.parquet"), "--gil", str(tmp_path / "g.parquet"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    clock = read_table(tmp_path / "out" / "pauses.parquet").attrs["analysis"]["clock"]["pauses"]
    assert (clock["domain"], clock["error_ns"], clock["boot_ids"]) == ("monotonic", 7, ["boot-M"]), clock
    # The same of the GIL side: several Parquet gil tables are streamed side by side, each part's facts kept.
    write_table(gil, tmp_path / "g-wall.parquet", {"clock_domain": "wall", "clock_method": "chunk_header_wall"})
    for order in (("g", "g-wall"), ("g-wall", "g")):
        args = [a for name in order for a in ("--gil", str(tmp_path / f"{name}.parquet"))]
        proc = subprocess.run([str(tandem), "analyze", "--pauses", str(tmp_path / "mono.parquet"), *args,
                               "-o", str(tmp_path / "out")], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (order, proc.stderr)
        assert f"{tmp_path / 'g-wall.parquet'} is on the wall clock" in proc.stderr, (order, proc.stderr)


def test_refuses_tables_from_different_clocks_unless_given_an_offset():
    pauses = pauses_frame([(100, 200)])
    gil = gil_frame([(1, 1, "released", 150, 160)])
    pauses.attrs = {"clock_domain": "wall", "clock_method": "chunk_header_wall", "source": "a.jfr"}
    with pytest.raises(TandemError, match=r"cannot join a\.jfr with gil table: a\.jfr is on the wall clock"):
        correlate(pauses, gil)
    pauses.attrs = {"boot_id": "boot-A", "source": "a.jfr"}
    gil.attrs = {"processes": [{"pid": 1, "boot_id": "boot-B"}]}
    with pytest.raises(TandemError, match="a.jfr is from boot boot-A and g.parquet from boot boot-B"):
        correlate(pauses, gil, gil_source="g.parquet")
    shifted = correlate(pauses, gil, offset_ns=-90)
    assert shifted.header["alignment"] == "explicit_offset"
    assert len(shifted.overlaps) == 0  # [10, 110) no longer meets [150, 160)
    assert shifted.pauses[["start_ns", "end_ns"]].values.tolist() == [[10, 110]]
    gil.attrs = {"processes": [{"pid": 1, "boot_id": "boot-A"}], "dropped": 3}
    same = correlate(pauses, gil)
    assert same.header["alignment"] == "same_monotonic_clock" and len(same.overlaps) == 1


def test_bad_tables_give_one_line_naming_the_file(tmp_path):
    pauses = pauses_frame([(0, 10)])
    with pytest.raises(TandemError, match="^p.parquet: missing column 'tid'"):
        correlate(pauses, gil_frame([(1, 1, "released", 0, 5)]).drop(columns="tid"), gil_source="p.parquet")
    with pytest.raises(TandemError, match="ends before it starts"):
        correlate(pauses_frame([(10, 0)]), gil_frame([]))
    with pytest.raises(TandemError, match="state' has value 'holding'"):
        correlate(pauses, gil_frame([(1, 1, "holding", 0, 5)]))
    with pytest.raises(TandemError, match="must be integers"):
        correlate(pauses.astype({"start_ns": float}), gil_frame([]))
    with pytest.raises(TandemError, match="no such file"):
        analyze(tmp_path / "missing.parquet", tmp_path / "g.parquet")


def test_write_is_replaced_on_rerun_and_carries_the_alignment(tmp_path):
    pauses, gil = random_scenario(5)
    pauses.attrs = {"clock_domain": "monotonic", "clock_method": "clock_sync", "sources": [{"runs": [{"clock": {"error_ns": 1234}}]}]}
    first = correlate(pauses, gil)
    first.write(tmp_path)
    second = correlate(pauses.iloc[:2], gil, slack_ns=7)
    paths = second.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.parquet" for n in second.tables())
    assert sorted(paths) == sorted(tmp_path.iterdir())
    for name, table in second.tables().items():
        back = read_table(tmp_path / f"{name}.parquet")
        assert len(back) == len(table), name
        assert back.attrs["analysis"]["clock"]["pauses"]["method"] == "clock_sync"
        assert back.attrs["analysis"]["clock"]["pauses"]["error_ns"] == 1234
        assert back.attrs["analysis"]["slack_ns"] == 7
    pd.testing.assert_frame_equal(read_table(tmp_path / "overlaps.parquet"), second.overlaps, check_dtype=False)


def test_the_header_is_typed_facts_that_survive_the_parquet_metadata(tmp_path):
    """engine.facts: the header written is AnalysisFacts.as_metadata; read back from any result file it
    gives the same facts, and the same header again; a key another version wrote is kept as it was."""
    from engine.facts import AnalysisFacts
    from engine.results import Results

    pauses, gil = random_scenario(3)
    pauses.attrs = {"sources": [{"source": "a.jfr", "lost_bytes": 10, "runs": [{"clock": {"error_ns": 5}}]},
                                {"source": "b.jfr", "damage": [{"chunk": 2, "from_byte": 7, "lost_bytes": 3,
                                                                "lost_pause_events": 4}]}]}
    gil.attrs = {"processes": [{"pid": 1, "dropped": 2, "drain_lost": 1}, {"pid": 2, "dropped": 3}]}
    result = correlate(pauses, gil, slack_ns=11)
    facts = result.facts
    assert (facts.losses.dropped_events, facts.losses.drain_lost_events) == (5, 1)
    assert (facts.losses.jfr_lost.bytes, facts.losses.jfr_lost.pause_events) == (13, None)  # (a cut chunk: uncounted)
    assert facts.losses.jfr_lost.pause_events_at_least == 4 and len(facts.losses.jfr_lost.chunks) == 2
    assert facts.slack_ns == 11 and facts.clock["pauses"].error_ns == 5 and facts.span_ns == result.header["span_ns"] > 0
    result.write(tmp_path)
    back = Results(tmp_path)
    assert back.facts() == AnalysisFacts.from_metadata(json.loads(json.dumps(result.header, default=list)))
    assert back.facts().as_metadata() == back.header()
    newer = {**back.header(), "a_later_key": {"x": 1}}
    assert AnalysisFacts.from_metadata(newer).as_metadata() == newer
    assert AnalysisFacts.from_metadata({}).as_metadata()["pauses"] == 0  # (a file without a header)


def test_timeline_draws_a_png(tmp_path):
    from matplotlib.image import imread

    pauses, gil = random_scenario(1)
    result = correlate(pauses, gil)
    figure = result.timeline(path=tmp_path / "t.png")
    image = imread(tmp_path / "t.png")
    assert figure.get_axes() and image.shape[0] > 200 and image.shape[1] > 800
    colors = {tuple(c) for c in (image[..., :3].reshape(-1, 3) * 255).round().astype(int)}
    assert (44, 160, 44) in colors  # released (green) is drawn
    assert (214, 39, 40) in colors or (31, 119, 180) in colors  # a GC pause or a safepoint is drawn
    assert len(colors) > 20
    with pytest.raises(ValueError, match="empty window"):
        result.timeline(10, 10)


def test_the_command_writes_results_and_prints_the_summary(tmp_path):
    pauses, gil = random_scenario(2)
    write_table(pauses, tmp_path / "p.parquet", {})
    write_table(gil, tmp_path / "g.parquet", {})
    tandem = Path(sys.executable).parent / "tandem"
    run = subprocess.run([str(tandem), "analyze", "--pauses", str(tmp_path / "p.parquet"), "--gil",
                          str(tmp_path / "g.parquet"), "-o", str(tmp_path / "out"), "--slack", "5ns"],
                         capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    printed = " ".join(run.stdout.split())
    assert "JVM pauses that hit Python" in printed and "near misses within 5 ns" in printed
    assert read_table(tmp_path / "out" / "overlaps.parquet").slack_ns.max() <= 5
    bad = subprocess.run([str(tandem), "analyze", "--pauses", str(tmp_path / "g.parquet"), "--gil",
                          str(tmp_path / "g.parquet"), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"tandem: error: {tmp_path / 'g.parquet'}: missing column 'pause_id' " \
                                 "(needs pause_id, kind, name, start_ns, end_ns)"
    # the two tables given the wrong way round: the GIL side's missing column is said (it is read first)
    swapped = subprocess.run([str(tandem), "analyze", "--pauses", str(tmp_path / "g.parquet"), "--gil",
                              str(tmp_path / "p.parquet"), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert swapped.returncode == 2
    assert swapped.stderr.strip() == f"tandem: error: {tmp_path / 'p.parquet'}: missing column 'pid' " \
                                     "(needs pid, tid, state, start_ns, end_ns)"


def test_pauses_set_aside_come_back_in_start_order_for_any_watermarks_and_whole_in_table_order(tmp_path, monkeypatch):
    """While the GIL blocks stream, `tandem analyze` keeps its pauses in a file (PausesOnDisk):
    the core's pushes read them in start order, and the end gets the table back as it was (every
    dtype, the table's order, the stop ids). One push equals many: the rows given before each of
    any watermarks, together, are the table in start order (equal starts in table order)."""
    from engine.analysis.stream import PausesAside, PausesInTime, PausesOnDisk
    from engine.correlate import END

    rng = np.random.default_rng(4)
    n = 1_000
    starts = rng.integers(0, 50, n) * 1_000  # (many equal starts, out of order)
    pauses = pd.DataFrame({
        "pause_id": rng.permutation(n).astype(np.int64),
        "kind": pd.Categorical(rng.choice(["gc", "safepoint"], n), categories=pd.Index(["gc", "safepoint"], dtype="string")),
        "start_ns": starts, "end_ns": starts + rng.integers(0, 5_000, n),
        "jvm_pid": pd.array([None if i % 3 else 7 for i in range(n)], dtype="Int64"),
        "at_safepoint": pd.array([None if i % 5 else bool(i % 2) for i in range(n)], dtype="boolean"),
        "asked_by_tandem": np.arange(n) % 7 == 0,
    })
    stop = rng.integers(0, n, n)
    columns = ["pause_id", "kind", "start_ns", "end_ns", "jvm_pid"]
    by_start = pauses.iloc[np.argsort(starts, kind="stable"), [0, 1, 2, 3, 4]].reset_index(drop=True)
    monkeypatch.setattr(PausesAside, "batch_rows", 64)
    for aside in (PausesAside(pauses, stop), PausesOnDisk(pauses, stop, tmp_path / "aside")):
        for cuts in (rng.integers(0, 60_000, 7), [END], rng.integers(0, 60_000, 200)):
            coming, given = PausesInTime(aside.in_start_order(columns)), []
            for watermark in [*np.sort(cuts).tolist(), END]:
                part = coming.before(int(watermark))
                if part is not None:
                    assert (part["start_ns"] < watermark).all() or watermark == END
                    given.append(part)
            assert not coming.left()
            pd.testing.assert_frame_equal(pd.concat(given, ignore_index=True), by_start)
        back, back_stop = aside.back(["start_ns", "pause_id", "kind", "at_safepoint", "asked_by_tandem"])
        pd.testing.assert_frame_equal(back.reset_index(drop=True),
                                      pauses[["start_ns", "pause_id", "kind", "at_safepoint", "asked_by_tandem"]])
        assert back_stop.tolist() == stop.tolist()
    assert not (tmp_path / "aside").exists()  # (its file gone once the table is back)


def test_read_ahead_hands_over_every_item_in_order_then_the_producers_error_and_closes_a_generator_left_early():
    """The streamed analysis reads the next GIL block in a thread of its own (read_ahead)."""
    import threading

    from engine.analysis.stream import read_ahead

    closed = threading.Event()

    def blocks(n, fail_at=None):
        try:
            for i in range(n):
                if i == fail_at:
                    raise TandemError(f"block {i}: damaged")
                yield i
        finally:
            closed.set()

    assert list(read_ahead(blocks(50), budget=2)) == list(range(50))
    # by size: an item bigger than the budget still passes, alone
    assert list(read_ahead(blocks(50), budget=10, size=lambda i: 1 + 7 * (i % 3))) == list(range(50))
    made = []

    def counted():
        for i in range(100):
            made.append(i)
            yield i

    ahead = read_ahead(counted(), budget=10, size=lambda i: 4)
    assert next(ahead) == 0
    # the one taken and two of size 4 queued (8 <= 10): a third is not begun (12 > 10)
    deadline = time.monotonic() + 5
    while len(made) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(made) == 3
    assert next(ahead) == 1
    while len(made) < 4 and time.monotonic() < deadline:  # room for one more
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(made) == 4
    ahead.close()
    got = []
    with pytest.raises(TandemError, match="block 7: damaged"):
        for item in read_ahead(blocks(50, fail_at=7)):
            got.append(item)
    assert got == list(range(7))
    closed.clear()
    ahead = read_ahead(blocks(10**9), budget=2)
    assert next(ahead) == 0
    ahead.close()  # the consumer leaves early: the producer stops and closes its generator
    assert closed.wait(5)


SERVICE_WITH_A_JVM = """
import threading, time, jpype
jpype.startJVM()

def work(n):
    for _ in range(n):
        sum(range(20_000))  # holds the GIL
        time.sleep(0.001)   # releases it

threads = [threading.Thread(target=work, args=(300,), name=f"worker-{i}") for i in range(3)]
for t in threads:
    t.start()
for _ in range(3):
    jpype.java.lang.System.gc()
    time.sleep(0.1)
for t in threads:
    t.join()
"""

# Each OUT/*.parquet read by DuckDB in a process that imports nothing of tandem: its row count
# and column names, and the GIL table's rows (JSON on stdout).
DUCKDB_READER = """
import json, sys
from pathlib import Path
import duckdb
out = Path(sys.argv[1])
tables = {p.stem: {"rows": duckdb.sql(f"SELECT count(*) FROM '{p}'").fetchall()[0][0],
                   "columns": [c for c in duckdb.sql(f"SELECT * FROM '{p}' LIMIT 0").columns]}
          for p in sorted(out.glob("*.parquet"))}
gil = duckdb.sql(f"SELECT pid, tid, state, start_ns, end_ns FROM '{out}/gil.parquet' "
                 "ORDER BY pid, tid, start_ns, end_ns, state").fetchall() if "gil" in tables else []
assert not [m for m in sys.modules if m == "engine" or m.startswith("engine.")]
print(json.dumps({"tables": tables, "gil": gil}))
"""


@pytest.mark.slow
def test_results_of_a_recorded_session_are_every_table_readable_by_duckdb_alone(tmp_path):
    """OUT of `tandem analyze SESSION` holds every table (docs/results.md, "gil.parquet"): moved
    away from the session, DuckDB alone reads each one, the GIL table equal to read_gil's."""
    import json
    import os

    from conftest import default_java_home
    from engine import load_results  # (the package's API, as the README names it)
    from engine.correlate.schema import RESULT_TABLES
    from engine.ingest.gil import read_gil
    from test_record_helpers import jdk_env, run_tandem

    session, program = tmp_path / "s", tmp_path / "service.py"
    program.write_text(SERVICE_WITH_A_JVM)
    env = jdk_env(default_java_home())
    run = run_tandem("record", "-o", str(session), "--", sys.executable, str(program), env=env)
    assert run.returncode == 0, run.stderr
    witness = read_gil(session)  # every events file is closed: --reference-gil could name them
    assert len(witness) > 1000
    run = run_tandem("analyze", str(session), "-o", str(tmp_path / "out"), env=env)
    assert run.returncode == 0, run.stderr
    referenced = run_tandem("analyze", str(session), "--reference-gil", "-o", str(tmp_path / "referenced"), env=env)
    assert referenced.returncode == 0, referenced.stderr
    assert not (tmp_path / "referenced" / "gil.parquet").exists()
    assert len(load_results(tmp_path / "referenced").gil) == len(witness)

    moved = tmp_path / "elsewhere"
    (tmp_path / "out").rename(moved)
    session.rename(tmp_path / "session-gone")
    read = subprocess.run([sys.executable, "-I", "-c", DUCKDB_READER, str(moved)], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert read.returncode == 0, read.stderr
    seen = json.loads(read.stdout)
    assert set(RESULT_TABLES) <= set(seen["tables"])  # (and any other table tandem analyze wrote: memory)
    back = load_results(moved)
    for name, table in back.tables().items():
        assert seen["tables"][name]["rows"] == len(table), name
    assert seen["tables"]["gil"]["rows"] == len(witness) == back.header["gil_intervals"]
    assert {"pid", "tid", "thread_name", "state", "start_ns", "end_ns"} <= set(seen["tables"]["gil"]["columns"])
    expected = witness.astype({"state": str}).sort_values(["pid", "tid", "start_ns", "end_ns", "state"])
    assert [tuple(r) for r in seen["gil"]] == list(expected[["pid", "tid", "state", "start_ns", "end_ns"]]
                                                   .itertuples(index=False, name=None))
    with pytest.raises(TandemError, match="missing; the GIL intervals of the results"):
        load_results(tmp_path / "referenced")  # (named files, moved away)


def test_reference_gil_does_not_go_with_a_dataset(tmp_path):
    run = subprocess.run([str(Path(sys.executable).parent / "tandem"), "analyze", str(tmp_path), "--reference-gil",
                          "--dataset", str(tmp_path / "root")], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip() == "tandem: error: --reference-gil cannot go with --copy-gil or --dataset " \
                                 "(a fleet dataset holds the GIL rows)"


def test_durations_parse_as_a_user_writes_them():
    """--slack, --roll, --window: a unit per part, parts added up; a bare number is ns."""
    import typer

    from engine.commands.analyze import parse_duration_ns

    assert [parse_duration_ns(t) for t in ("50ms", "1.5s", "200us", "700ns", "10m", "2m30s", "1h", "0", " 5 ms")] == [
        50_000_000, 1_500_000_000, 200_000, 700, 600_000_000_000, 150_000_000_000, 3_600_000_000_000, 0, 5_000_000]
    for bad in ("x", "5q", "1.2.3s", "m", "", "ms5", "-1s"):
        with pytest.raises(typer.BadParameter):
            parse_duration_ns(bad)


def test_results_given_again_as_input_keep_their_clock_and_losses_and_give_the_same_results(tmp_path):
    """OUT/pauses.parquet and OUT/gil.parquet carry the analysis's header, not their inputs'
    metadata: given again to `tandem analyze` they keep each side's clock facts (the pauses an
    explicit offset moved are on the GIL side's clock since) and losses, and give the same results."""
    from conftest import SHARED_RECORDINGS
    from engine.ingest.jfr import read_pauses
    from engine.store import read_metadata

    recording = SHARED_RECORDINGS / "jdk21.jfr"  # (a wall-clock recording: joined with an explicit offset)
    starts = read_pauses(recording)["start_ns"].to_numpy(np.int64)
    offset = 10**12 - int(starts.min())
    span = int(starts.max() - starts.min()) + 10**9
    rng = np.random.default_rng(3)
    rows, t = [], 10**12 - 10**8
    while t < 10**12 + span:  # two threads releasing the GIL for 0-30 ms at a time
        for tid in (101, 102):
            length = int(rng.integers(0, 30_000_000))
            rows.append((7, tid, "released", t, t + length))
        t += 40_000_000
    gil = gil_frame(rows)
    gil.attrs = {"clock": {"domain": "monotonic", "method": "clock_gettime(CLOCK_MONOTONIC)", "error_ns": 0},
                 "processes": [{"pid": 7, "boot_id": "boot-1", "dropped": 5, "drain_lost": 2}]}
    write_table(gil, tmp_path / "g.parquet")

    def analyze_cli(out, *args):
        done = subprocess.run([sys.executable, "-m", "engine", "analyze", *args, "-o", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return read_metadata(out / "pause_impact.parquet")["analysis"]

    first = analyze_cli(tmp_path / "first", "--jfr", str(recording), "--gil", str(tmp_path / "g.parquet"),
                        "--offset", str(offset))
    again = analyze_cli(tmp_path / "again", "--pauses", str(tmp_path / "first" / "pauses.parquet"),
                        "--gil", str(tmp_path / "first" / "gil.parquet"))
    assert first["clock"]["pauses"]["domain"] == "wall" and first["dropped_events"] == 5
    gil_clock = {k: v for k, v in first["clock"]["gil"].items() if k != "source"}
    assert {k: v for k, v in again["clock"]["gil"].items() if k != "source"} == gil_clock
    assert again["clock"]["pauses"]["domain"] == "monotonic"
    assert again["clock"]["pauses"]["method"].startswith(f"explicit offset of {offset} ns")
    assert again["alignment"] == "same_monotonic_clock" and again["offset_ns"] is None
    for key in ("dropped_events", "drain_lost_events", "jfr_lost", "pauses", "gil_intervals", "span_ns", "why"):
        assert again[key] == first[key], key
    assert len(read_table(tmp_path / "first" / "overlaps.parquet")) > 0
    for name in ("overlaps", "pause_impact", "gil_free", "stops", "summary"):
        pd.testing.assert_frame_equal(read_table(tmp_path / "again" / f"{name}.parquet"),
                                      read_table(tmp_path / "first" / f"{name}.parquet"), obj=name)
    # the recording given with --pauses (here under a name that does not end in .jfr) is read as with --jfr
    shutil.copyfile(recording, tmp_path / "recording.data")
    as_table = analyze_cli(tmp_path / "as_table", "--pauses", str(tmp_path / "recording.data"),
                           "--gil", str(tmp_path / "g.parquet"), "--offset", str(offset))
    assert as_table["pauses"] == first["pauses"] and as_table["clock"]["pauses"]["domain"] == "wall"
    for name in ("pauses", "overlaps", "pause_impact", "gil_free", "stops", "summary"):
        # (but for the file each pause came from, named as given)
        pd.testing.assert_frame_equal(read_table(tmp_path / "as_table" / f"{name}.parquet").drop(columns="source", errors="ignore"),
                                      read_table(tmp_path / "first" / f"{name}.parquet").drop(columns="source", errors="ignore"), obj=name)
    # the results directory given where a session belongs: said so, in one line, with what to give instead
    done = subprocess.run([sys.executable, "-m", "engine", "analyze", str(tmp_path / "first"), "-o", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"the results of `tandem analyze`, not a session (analyze them again with --pauses {tmp_path / 'first'}" \
        in done.stderr.replace("\n", "")


def test_the_notebooks_tables_and_the_same_results_read_back_have_one_dtype_per_column(tmp_path):
    """Text as pandas "string" and a line number with nulls as Int64 (docs/results.md), whether
    the tables come from `analyze` in memory, from results read back (`load_results`), or from a
    gil table written block by block (no pandas metadata; large_string text, as tandem's own
    copies of the probe's intervals are)."""
    import pyarrow as pa

    from engine.analysis import load_results
    from engine.store import TableWriter

    pauses = pauses_frame([(100, 200), (400, 450)], os_thread_ids=[11, None])
    write_table(pauses, tmp_path / "pauses.parquet")
    gil = pa.table({"pid": pa.array([1, 1, 1], pa.int64()), "tid": pa.array([11, 11, 12], pa.int64()),
                    "state": pa.array(["released", "waiting", "released"], pa.large_string()),
                    "start_ns": pa.array([50, 150, 120], pa.int64()), "end_ns": pa.array([150, 300, 420], pa.int64()),
                    "function": pa.array(["f", None, "h"], pa.large_string()),
                    "file": pa.array(["a.py", None, "c.py"], pa.large_string()),
                    "line": pa.array([3, None, 7], pa.int64())})
    writer = TableWriter(tmp_path / "gil.parquet", gil.schema)
    writer.write(gil)
    writer.close({"table": "gil"})
    ours = analyze(tmp_path / "pauses.parquet", tmp_path / "gil.parquet")
    assert str(ours.gil["line"].dtype) == "Int64" and ours.gil["line"].isna().sum() == 1
    ours.write(tmp_path / "out")
    back = load_results(tmp_path / "out")
    for name, table in ours.tables().items():
        read = getattr(back, "summary_table" if name == "summary" else name)
        assert table.dtypes.astype(str).to_dict() == read.dtypes.astype(str).to_dict(), name
        for column in table.columns:
            assert str(table[column].dtype) not in ("str", "object"), (name, column)  # (lists aside: none here)
    assert len(ours.overlaps) and str(ours.overlaps["function"].dtype) == "string" and str(ours.overlaps["line"].dtype) == "Int64"
