"""tandem fleet on a real local Ray cluster: 12 recorded sessions as 4 hosts x 3 days.

Three short sessions of the demo workload are recorded once; each is copied (hard links,
session.json rewritten) under 4 host names and 3 dates, so the 12 copies are 12 sessions
of the dataset. Witnesses: each session analyzed alone (`engine.analyze`, what `tandem
analyze` runs), a DuckDB query written here over the dataset, and one analysis of all
sessions concatenated on one made-up timeline.
"""
from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.analysis import analyze_session, correlate
from engine.fleet.dataset import dataset_tables
from engine.fleet.run import run_fleet
from engine.session import Session

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
duckdb = pytest.importorskip("duckdb")

TANDEM = [sys.executable, "-m", "engine"]
HOSTS = ("web-1", "web-2", "db-1", "db-2")
DATES = ("2026-11-28", "2026-11-29", "2026-11-30")
DAY_NS = 86_400 * 10**9


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("recorded")
    sessions = []
    for i in range(3):
        session = root / f"s{i}"
        subprocess.run([*TANDEM, "record", "-o", str(session), "--", sys.executable, "-m", "engine.demo.workload",
                        "--seconds", "2", "--gc-period", "0.4"], check=True, capture_output=True, timeout=300)
        sessions.append(session)
    return sessions


def _copy_as(original: Path, target: Path, host: str, date: str) -> Path:
    """A copy of a session (hard links) whose session.json says another host and day."""
    import shutil

    shutil.copytree(original, target, copy_function=os.link)
    description = json.loads((original / "session.json").read_text())
    start = pd.Timestamp(description["start_wall_ns"], unit="ns", tz="UTC")
    description["hostname"] = host
    description["start_wall_ns"] += (pd.Timestamp(date, tz="UTC") - start.normalize()).value
    (target / "session.json").unlink()  # a new file: the link is shared with the original
    (target / "session.json").write_text(json.dumps(description))
    return target


@pytest.fixture(scope="module")
def fleet_sessions(originals, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    copies = []
    for h, host in enumerate(HOSTS):
        for d, date in enumerate(DATES):
            copies.append(_copy_as(originals[(h + d) % len(originals)], root / f"{host}-{date}", host, date))
    return copies


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def corrupt(fleet_sessions):
    """The last session with its JFR recording overwritten by garbage."""
    session = fleet_sessions[-1]
    for recording in session.glob("jvm-*/recording.jfr"):
        recording.unlink()
        recording.write_bytes(b"FLR\0" + os.urandom(4096))
    return session


@pytest.fixture(scope="module")
def fleet_run(fleet_sessions, corrupt, cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    run = run_fleet([str(s) for s in fleet_sessions], root, progress=False)
    return root, run


@pytest.fixture(scope="module")
def alone(fleet_sessions, corrupt):
    """Each good session analyzed by itself, with its identity."""
    return {s: (analyze_session(s), Session.open(s).identity()) for s in fleet_sessions if s != corrupt}


def _dataset(root: Path, table: str) -> pd.DataFrame:
    return duckdb.sql(f"""SELECT * FROM read_parquet('{root}/{table}/*/*/*.parquet', hive_partitioning = true,
                          union_by_name = true, hive_types = {{'host': VARCHAR, 'date': VARCHAR}})""").df()


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype({c: str for c in frame.columns if frame[c].dtype == object or str(frame[c].dtype) == "string"})
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_corrupt_session_is_reported_and_the_other_11_land(fleet_run, corrupt, fleet_sessions):
    root, run = fleet_run
    assert len(run.outcomes) == 12
    failed = run.failed
    assert [o.source for o in failed] == [str(corrupt)]
    assert "recording.jfr" in failed[0].error and "\n" not in failed[0].error
    sessions = _dataset(root, "sessions")
    assert len(sessions) == 11
    assert sorted(zip(sessions["host"], sessions["date"])) == sorted(
        (h, d) for h in HOSTS for d in DATES if (h, d) != (HOSTS[-1], DATES[-1]))
    assert not list(root.rglob(".*.staged"))
    assert all(p.stat().st_mode & 0o077 == 0 for p in [root, *root.rglob("*")] if p.is_dir())


def test_dataset_overlaps_equal_the_union_of_sessions_analyzed_alone(fleet_run, alone):
    root, _ = fleet_run
    for table in ("overlaps", "pause_impact", "gil_free"):
        expected = pd.concat([
            getattr(analysis, table).assign(session_id=identity.session_id, host=identity.host, date=identity.date)
            for analysis, identity in alone.values()], ignore_index=True)
        ours = _dataset(root, table)
        assert len(ours) > 0 if table != "gil_free" else True
        ours = ours[list(expected.columns)].astype(expected.dtypes.to_dict())
        pd.testing.assert_frame_equal(_canonical(ours), _canonical(expected), obj=table)
    overlaps = _dataset(root, "overlaps")
    assert overlaps.groupby("session_id").size().size == 11


def test_the_results_reader_reads_the_dataset_as_duckdb_does(fleet_run):
    """engine.results.Results, the one reader of results, over a dataset: every table's rows
    are DuckDB's over the same files (host and date are in the path only)."""
    from engine.analysis import load_results
    from engine.results import Results

    root, _ = fleet_run
    results = Results(root)
    assert results.layout == "dataset"
    for table in ("pauses", "overlaps", "pause_impact", "sessions"):
        ours = results.table(table)
        expected = _dataset(root, table).drop(columns=["host", "date"])
        assert len(ours) == len(expected) > 0, table
        ours = ours[list(expected.columns)].astype(expected.dtypes.to_dict())
        pd.testing.assert_frame_equal(_canonical(ours), _canonical(expected), obj=table)
    loaded = load_results(root)
    assert loaded.overlaps["session_id"].nunique() == 11


def test_files_carry_the_session_header(fleet_run, alone):
    import pyarrow.parquet as pq

    root, _ = fleet_run
    analysis, identity = next(iter(alone.values()))
    for table in dataset_tables():
        path = root / table / f"host={identity.host}" / f"date={identity.date}" / f"{identity.session_id}.parquet"
        meta = json.loads(pq.read_metadata(path).metadata[b"tandem"])  # the footer's key-value metadata: any engine reads it
        assert meta["table"] == table
        assert meta["session"]["session_id"] == identity.session_id
        assert meta["session"]["hostname"] == identity.host and meta["session"]["exit_code"] == 0
        assert "argv" not in meta["session"] and "command" not in meta["session"]  # never the command line
        assert meta["analysis"]["pauses"] == analysis.header["pauses"]


def _busy_workers() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().startswith(b"ray::analyze_one"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def _run_killing_one_worker(sessions, root, retries):
    """run_fleet while the first worker seen analyzing a session is SIGKILLed; returns (run,
    killed pid). A worker's title says analyze_one a moment past its task's end: a kill that
    landed there hit no task (the task's outcome names that worker), so the run is made again,
    up to six times (on a loaded machine more kills land there), until a kill lands inside a task."""
    for _ in range(6):
        shutil.rmtree(root, ignore_errors=True)
        run, killed = _one_run_killing_one_worker(sessions, root, retries)
        if killed and killed[0] not in {o.worker_pid for o in run.outcomes}:
            break
    return run, killed


def _one_run_killing_one_worker(sessions, root, retries):
    killed = []
    done = threading.Event()

    def killer():
        while not done.is_set() and not killed:
            for pid in _busy_workers():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        run = run_fleet([str(s) for s in sessions], root, retries=retries, progress=False)
    finally:
        done.set()
        thread.join()
    return run, killed


def test_a_worker_killed_mid_task_is_retried_and_the_result_is_the_same(fleet_run, fleet_sessions, corrupt, tmp_path):
    root, _ = fleet_run
    good = [s for s in fleet_sessions if s != corrupt][:4]
    ids = {Session.open(s).identity().session_id for s in good}
    run, killed = _run_killing_one_worker(good, tmp_path / "again", retries=2)
    assert killed, "no worker was seen analyzing"
    assert not run.failed, run.failed
    assert killed[0] not in {o.worker_pid for o in run.outcomes}
    for table in dataset_tables():
        before = _dataset(root, table)
        pd.testing.assert_frame_equal(_canonical(_dataset(tmp_path / "again", table)),
                                      _canonical(before[before["session_id"].isin(ids)]), obj=table)


def test_without_retries_the_killed_session_is_reported(fleet_sessions, corrupt, cluster, tmp_path):
    run, killed = _run_killing_one_worker(fleet_sessions[:2], tmp_path / "once", retries=0)
    assert killed
    assert len(run.failed) == 1 and "worker died" in run.failed[0].error


def test_fresh_workers_give_each_session_its_own_process(fleet_sessions, cluster, tmp_path):
    run = run_fleet([str(s) for s in fleet_sessions[:3]], tmp_path / "fresh", fresh_workers=True, progress=False)
    assert not run.failed
    assert len({o.worker_pid for o in run.outcomes}) == 3


# ---- the summary ---------------------------------------------------------------------------

def _witness_summary(root: Path, where: str = "true") -> pd.DataFrame:
    """The summary of docs/results.md over the dataset, written from the spec independently."""
    src = lambda t: f"read_parquet('{root}/{t}/*/*/*.parquet', hive_partitioning = true, union_by_name = true)"  # noqa: E731
    return duckdb.sql(f"""
        WITH p AS (SELECT * FROM {src('pause_impact')} WHERE {where}),
        hit AS (SELECT kind, name, overlap_ns / 1e6 AS ms FROM p WHERE overlap_ns > 0),
        threads AS (
            SELECT p.kind, p.name, count(*) AS n FROM (
                SELECT DISTINCT p.kind, p.name, o.session_id, o.pid, o.tid
                FROM {src('overlaps')} o JOIN p ON o.session_id = p.session_id AND o.pause_id = p.pause_id
                WHERE NOT o.near_miss) p GROUP BY 1, 2)
        SELECT k.kind, k.name, k.pauses, k.hits AS pauses_hit,
               k.hits / ((SELECT sum(span_ns) FROM {src('sessions')} WHERE {where}) / 3.6e12) AS hits_per_hour,
               (SELECT avg(ms) FROM hit WHERE hit.kind = k.kind AND hit.name = k.name) AS mean_overlap_ms,
               (SELECT quantile_cont(ms, 0.5) FROM hit WHERE hit.kind = k.kind AND hit.name = k.name) AS p50_overlap_ms,
               (SELECT quantile_cont(ms, 0.99) FROM hit WHERE hit.kind = k.kind AND hit.name = k.name) AS p99_overlap_ms,
               (SELECT max(ms) FROM hit WHERE hit.kind = k.kind AND hit.name = k.name) AS max_overlap_ms,
               coalesce((SELECT sum(ms) FROM hit WHERE hit.kind = k.kind AND hit.name = k.name), 0) AS total_overlap_ms,
               coalesce(threads.n, 0) AS threads_affected, k.near AS pauses_near_miss, k.amplified AS pauses_amplified
        FROM (SELECT kind, name, count(*) AS pauses, sum(hit_python::INT) AS hits,
                     sum((near_misses > 0 AND NOT hit_python)::INT) AS near, sum(amplified::INT) AS amplified
              FROM p GROUP BY kind, name) k LEFT JOIN threads USING (kind, name)
    """).df()


def _same_summary(ours: pd.DataFrame, expected: pd.DataFrame) -> None:
    key = ["kind", "name"]
    ours = ours.sort_values(key).reset_index(drop=True)
    expected = expected.sort_values(key).reset_index(drop=True)[list(ours.columns)]
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False, rtol=1e-9)


def test_fleet_summary_equals_a_duckdb_query_over_the_dataset(fleet_run, tmp_path):
    root, _ = fleet_run
    proc = subprocess.run([*TANDEM, "fleet", "summary", str(root), "-o", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "11 sessions on 4 hosts over 3 days" in proc.stdout
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    assert int(summary["pauses_hit"].sum()) > 0
    _same_summary(summary, _witness_summary(root))
    by_host = pd.read_parquet(tmp_path / "summary_by_host.parquet")
    for host in HOSTS:
        _same_summary(by_host[by_host["host"] == host].drop(columns="host"), _witness_summary(root, f"host = '{host}'"))
    by_date = pd.read_parquet(tmp_path / "summary_by_date.parquet")
    assert sorted(by_date["date"].unique()) == list(DATES)

    proc = subprocess.run([*TANDEM, "fleet", "summary", str(root), "--since", DATES[1], "--host", "web-*",
                           "-o", str(tmp_path / "some")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "4 sessions on 2 hosts over 2 days" in proc.stdout
    _same_summary(pd.read_parquet(tmp_path / "some" / "summary.parquet"),
                  _witness_summary(root, f"host LIKE 'web-%' AND date >= '{DATES[1]}'"))


def test_fleet_summary_equals_one_concatenated_analysis(fleet_run):
    """All sessions on one timeline (each shifted to start 1 ns after the previous one ends;
    pids, tids and pause ids made distinct per session) analyzed at once: its summary is the
    fleet's, hits_per_hour included (the concatenated span is the sessions' spans summed,
    plus 1 ns per gap)."""
    from engine.fleet.summary import fleet_summary

    root, _ = fleet_run
    pauses, gil, sessions = _dataset(root, "pauses"), _dataset(root, "gil"), _dataset(root, "sessions")
    all_pauses, all_gil, at = [], [], 0
    for i, session in enumerate(sessions.sort_values("session_id").itertuples()):
        # Linux pids and tids are below 2**22: shifted by multiples of it they stay distinct and 32-bit.
        shift, ids, threads = at - session.span_start_ns, np.int64(i + 1) << 32, np.int64(i + 1) << 22
        p = pauses[pauses["session_id"] == session.session_id].drop(columns=["session_id", "host", "date"])
        g = gil[gil["session_id"] == session.session_id].drop(columns=["session_id", "host", "date"])
        p = p.assign(start_ns=p["start_ns"] + shift, end_ns=p["end_ns"] + shift, pause_id=p["pause_id"] + ids,
                     os_thread_id=p["os_thread_id"] + threads)
        g = g.assign(start_ns=g["start_ns"] + shift, end_ns=g["end_ns"] + shift, pid=g["pid"] + threads,
                     tid=g["tid"] + threads)
        all_pauses.append(p)
        all_gil.append(g)
        at += session.span_ns + 1
    one = correlate(pd.concat(all_pauses, ignore_index=True), pd.concat(all_gil, ignore_index=True))
    assert one.header["span_ns"] == int(sessions["span_ns"].sum()) + len(sessions) - 1
    fleet = fleet_summary(root).summary
    _same_summary(fleet.drop(columns="hits_per_hour"), one.summary_table.drop(columns="hits_per_hour"))
    np.testing.assert_allclose(fleet.sort_values(["kind", "name"])["hits_per_hour"],
                               one.summary_table.sort_values(["kind", "name"])["hits_per_hour"], rtol=1e-6)


# ---- the commands ---------------------------------------------------------------------------

def test_analyze_into_a_dataset_replaces_the_session_and_sessions_never_collide(fleet_sessions, tmp_path):
    root = tmp_path / "ds"
    first, second = fleet_sessions[0], fleet_sessions[3]  # one recording, two hosts: two sessions
    for session in (first, first, second):
        proc = subprocess.run([*TANDEM, "analyze", str(session), "--dataset", str(root)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    files = sorted(p.relative_to(root) for p in root.rglob("*.parquet"))
    assert len(files) == 2 * len(dataset_tables())
    ids = {Session.open(s).identity().session_id for s in (first, second)}
    assert {p.stem for p in files} == ids and len(ids) == 2
    assert not list(root.rglob(".*"))


def test_cli_joins_an_existing_cluster_and_reports_failures(fleet_sessions, corrupt, cluster, tmp_path):
    proc = subprocess.run([*TANDEM, "fleet", "analyze", str(fleet_sessions[0]), str(corrupt), "--dataset",
                           str(tmp_path / "ds"), "--address", cluster], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "1 of 2 sessions" in proc.stdout
    assert "1 of 2 sessions failed:" in proc.stderr
    assert f"  {corrupt}: {corrupt}/jvm-" in proc.stderr and "recording.jfr" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_notebook_fleet_section_reads_the_dataset(fleet_run, alone, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    root, _ = fleet_run
    next(iter(alone.values()))[0].write(tmp_path / "one")
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "explore.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    env = {"TANDEM_RESULTS": str(tmp_path / "one"), "TANDEM_DATASET": str(root)}
    os.environ.update(env)
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", coalesce_streams=True,
                                resources={"metadata": {"path": str(notebook.parent)}}).execute()
    finally:
        for key in env:
            del os.environ[key]
    fleet_cells = nb.cells[[i for i, c in enumerate(nb.cells) if c.source.startswith("## A fleet")][0]:]
    outputs = [o for cell in fleet_cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)  # a print may reach the client in pieces
    assert "11 sessions on 4 hosts" in text, text
    assert any("image/png" in o.get("data", {}) for o in outputs)
