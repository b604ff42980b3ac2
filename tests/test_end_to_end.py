"""End to end on a real hybrid program recorded with `tandem record`, with no change to it.

The program (engine.demo.workload) has Python request threads doing numpy work and JPype
calls into Java, Java threads allocating, and a Python thread that calls System.gc()
through JPype at known moments, writing the time.monotonic_ns() bracket of each call.
Ground truth: each of those collections' pauses lies inside its bracket, and the calling
thread was `released` (inside the JPype call) across the whole pause.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from engine.analysis import analyze_session, load_results

pytestmark = pytest.mark.slow
TANDEM = [sys.executable, "-m", "engine"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    session, markers = root / "session", root / "markers.json"
    subprocess.run(
        [*TANDEM, "record", "-o", str(session), "--", sys.executable, "-m", "engine.demo.workload",
         "--seconds", "6", "--gc-period", "1.0", "--markers", str(markers)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    analysis = analyze_session(session)
    analysis.write(root / "out")
    return root, session, json.loads(markers.read_text()), analysis


def _system_gc_pauses(analysis, marker):
    pauses = analysis.pauses
    inside = pauses[(pauses["start_ns"] >= marker["before_ns"]) & (pauses["end_ns"] <= marker["after_ns"])]
    return inside[(inside["kind"] == "gc_pause") & (inside["cause"] == "System.gc()")]


def test_each_system_gc_pause_lies_in_its_bracket_and_hits_the_calling_thread(recorded):
    _, _, markers, analysis = recorded
    assert len(markers["gc_markers"]) >= 3
    overlaps = analysis.overlaps[~analysis.overlaps["near_miss"]]
    for marker in markers["gc_markers"]:
        gc_pauses = _system_gc_pauses(analysis, marker)
        assert len(gc_pauses) >= 1, f"no System.gc() pause inside the bracket {marker}"
        for pause in gc_pauses.itertuples():
            hits = overlaps[(overlaps["pause_id"] == pause.pause_id) & (overlaps["tid"] == marker["tid"])]
            assert list(hits["state"]) == ["released"], (pause, hits)
            # Released across the whole pause: the JPype call brackets the collection.
            assert int(hits["overlap_ns"].iloc[0]) == pause.end_ns - pause.start_ns


def test_summary_shows_gc_pauses_hitting_python(recorded):
    _, _, _, analysis = recorded
    summary = analysis.summary_table
    gc_rows = summary[summary["kind"] == "gc_pause"]
    assert int(gc_rows["pauses_hit"].sum()) >= 3
    assert (gc_rows["max_overlap_ms"].dropna() > 0).all()
    assert analysis.header["clock"]["pauses"]["method"] == "clock_sync"
    assert analysis.header["dropped_events"] == 0


def test_request_threads_are_named_and_seen(recorded):
    _, _, _, analysis = recorded
    names = set(analysis.gil["thread_name"].dropna())
    assert {"request-0", "request-1", "request-2", "gc-trigger"} <= names


def test_overlaps_equal_duckdb_on_the_real_tables(recorded):
    duckdb = pytest.importorskip("duckdb")
    root, _, _, analysis = recorded
    out = root / "out"
    expected = duckdb.sql(f"""
        SELECT p.pause_id, g.pid, g.tid, g.state,
               greatest(p.start_ns, g.start_ns) AS start_ns, least(p.end_ns, g.end_ns) AS end_ns
        FROM '{out}/pauses.parquet' p, '{out}/gil.parquet' g
        WHERE p.start_ns < g.end_ns AND g.start_ns < p.end_ns
          AND p.start_ns < p.end_ns AND g.start_ns < g.end_ns
    """).df()
    ours = pd.read_parquet(out / "overlaps.parquet")
    ours = ours[~ours["near_miss"]][["pause_id", "pid", "tid", "state", "start_ns", "end_ns"]]
    key = ["pause_id", "pid", "tid", "start_ns"]
    left = ours.sort_values(key).reset_index(drop=True).astype({"state": str})
    right = expected.sort_values(key).reset_index(drop=True)[left.columns].astype(left.dtypes.to_dict())
    assert len(left) > 0
    pd.testing.assert_frame_equal(left, right)


def test_cli_analyze_and_perfetto_export(recorded, tmp_path):
    root, session, _, analysis = recorded
    out = tmp_path / "cli-out"
    proc = subprocess.run([*TANDEM, "analyze", str(session), "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    again = load_results(out)
    assert len(again.overlaps) == len(analysis.overlaps)
    proc = subprocess.run([*TANDEM, "export", "perfetto", str(out), "-o", str(tmp_path / "t.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e["name"].startswith("JVM pause: ") for e in trace["traceEvents"])


def test_notebook_runs_top_to_bottom(recorded):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    root, _, _, _ = recorded
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "explore.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    os.environ["TANDEM_RESULTS"] = str(root / "out")
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}).execute()
    finally:
        del os.environ["TANDEM_RESULTS"]
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the timeline and the histogram


def test_system_gc_pauses_are_caused_by_the_calling_python_thread_at_its_line(recorded):
    """The gc-trigger thread calls java.lang.System.gc() through JPype: JFR names it as the
    VM operation's caller (requester_os_thread_id), so the safepoint of each collection in
    its bracket is caused by Python, by that thread, at the line of the call; JPype released
    the GIL around the call, so it is not JPype's GC link."""
    import inspect

    from engine.demo import workload

    source, first = inspect.getsourcelines(workload._gc_trigger_loop)
    call_line = first + next(i for i, text in enumerate(source) if "system.gc()" in text)
    _, _, markers, analysis = recorded
    impact = analysis.pause_impact.merge(analysis.pauses[["pause_id", "requester_os_thread_id"]], on="pause_id")
    named = 0
    for marker in markers["gc_markers"]:
        inside = impact[(impact["start_ns"] >= marker["before_ns"]) & (impact["end_ns"] <= marker["after_ns"])
                        & (impact["kind"] == "safepoint") & (impact["name"] == "G1CollectFull")]
        assert len(inside) >= 1
        # JFR sometimes writes no caller for a thread attached through JNI (`jfr print`:
        # "caller = N/A"): then nobody is named, never somebody else
        known = inside[inside["requester_os_thread_id"].notna()]
        assert (known["caused_by_python"]).all(), known
        named += len(known)
        for pause in known.itertuples():
            assert pause.cause_tid == marker["tid"] and pause.cause_thread == "gc-trigger"
            assert (pause.cause_function, pause.cause_line) == ("_gc_trigger_loop", call_line), pause
            assert pause.cause_file.endswith("engine/demo/workload.py")
            assert pause.cause_state == "released" and not pause.cause_held_gil and not pause.jpype_gc_link
    if named == 0:
        pytest.skip("JFR named no caller for any System.gc() of the gc-trigger thread (caller = N/A)")
    assert any(c["thread"] == "gc-trigger" for c in analysis.header["why"]["caused_by_python"])
