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
from engine.memory import write_memory

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
    write_memory(session, root / "out")  # (as `tandem analyze` does)
    return root, session, json.loads(markers.read_text()), analysis


def _stops_asked_by_others(analysis, marker) -> set[int]:
    """The stops JFR names another thread than MARKER's as asking for: JPype's reference-queue
    thread may ask for a collection of its own inside a bracket (JPype's GC link on that
    thread, engine/analysis/causes.py)."""
    from engine.analysis.causes import requester_tids

    pauses = analysis.pauses
    requester = requester_tids(pauses)
    other = (requester.notna() & (requester != marker["tid"])).fillna(False).to_numpy(bool)
    stop_of = analysis.pause_impact.set_index("pause_id")["stop_id"]
    return set(stop_of[pauses.loc[other, "pause_id"]].tolist())


def _in_bracket(table, analysis, marker):
    """TABLE's rows (pause_id, start_ns, end_ns) inside MARKER's bracket, of a stop not asked
    for by another thread."""
    stop_of = analysis.pause_impact.set_index("pause_id")["stop_id"]
    inside = table[(table["start_ns"] >= marker["before_ns"]) & (table["end_ns"] <= marker["after_ns"])]
    return inside[~stop_of.reindex(inside["pause_id"]).isin(_stops_asked_by_others(analysis, marker)).to_numpy(bool)]


def _system_gc_pauses(analysis, marker):
    inside = _in_bracket(analysis.pauses, analysis, marker)
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
    gil = root / "witness-gil.parquet"  # the session's GIL intervals (the results name its events files)
    analysis.gil.astype({"state": str}).to_parquet(gil)
    expected = duckdb.sql(f"""
        SELECT p.pause_id, g.pid, g.tid, g.state,
               greatest(p.start_ns, g.start_ns) AS start_ns, least(p.end_ns, g.end_ns) AS end_ns
        FROM '{out}/pauses.parquet' p, '{gil}' g
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


def test_perfetto_links_each_caused_stop_to_the_python_slice_that_asked(recorded):
    """The protobuf trace: GIL slices are named by the Python code they gave the GIL up in, and
    each stop of the world a Python thread asked for has one flow arrow from that thread's
    slice at the request (here: released in the JPype call to System.gc(), named by its line)
    to the stop's pause."""
    from engine.correlate.stops import caused_stops
    from engine.report.perfetto import export_perfetto
    from test_perfetto import decode_proto

    root, _, _, analysis = recorded
    tracks, slices = decode_proto(export_perfetto(root / "out", root / "t.pftrace"))
    caused = caused_stops(analysis.pause_impact)
    if not len(caused):
        pytest.skip("JFR named no requester for any pause")
    by_flow_out = {f: s for s in slices for f in s["flows_out"]}
    for stop in caused.itertuples():
        pause = [s for s in slices if s["args"].get("pause_id") == stop.pause_id]
        assert len(pause) == 1
        python = [by_flow_out[f] for f in pause[0]["flows_in"] if f in by_flow_out
                  and tracks[by_flow_out[f]["track"]]["tid"] is not None]
        assert len(python) == 1, (stop, pause)
        origin = python[0]
        assert tracks[origin["track"]]["tid"] == stop.cause_tid
        assert origin["start"] <= stop.start_ns < origin["end"]
        state = "held" if stop.cause_state == "holding" else stop.cause_state
        assert origin["name"].startswith(state)
        if state != "held":
            assert origin["name"] == f"{state}{_code_label(stop.cause_function, stop.cause_file, stop.cause_line)}"
    # every released/waiting slice names its code as the gil table does
    gil = analysis.gil
    named = gil[gil["end_ns"] > gil["start_ns"]]
    drawn = {(tracks[s["track"]]["tid"], s["start"]): s["name"] for s in slices
             if tracks[s["track"]]["tid"] is not None and not s["name"].startswith(("JVM pause: ", "held"))}
    sample = named.sample(min(len(named), 2_000), random_state=1)
    for row in sample.itertuples():
        assert drawn[(row.tid, row.start_ns)] == f"{row.state}{_code_label(row.function, row.file, row.line)}"


def _code_label(function, file, line) -> str:
    """How a GIL slice names its code (": function (file:line)", less what is unknown)."""
    if pd.notna(file) and pd.notna(line):
        return f": {function} ({Path(file).name}:{line})"
    return f": {function}" if pd.notna(function) else ""


def test_one_stop_of_the_world_counts_once(recorded):
    """Each System.gc() of the gc-trigger thread (its bracket, written by the program) is one
    stop: the G1CollectFull safepoint leads it, its GC pause and collection are its detail.
    Witness of the grouping: a brute-force containment of every GC row in a safepoint of its
    JVM. The printed summary has one row per stop, the per-kind rows under it."""
    import io

    from rich.console import Console

    _, _, markers, analysis = recorded
    impact, pauses = analysis.pause_impact, analysis.pauses
    for marker in markers["gc_markers"]:
        inside = _in_bracket(impact, analysis, marker)
        lead = inside[(inside["kind"] == "safepoint") & (inside["name"] == "G1CollectFull")]
        assert len(lead) == 1, inside
        members = inside[inside["stop_id"] == lead["pause_id"].iloc[0]]
        assert sorted(members["kind"]) == ["gc", "gc_pause", "safepoint"], inside  # one collection, one stop
        # (an allocation's young collection may overlap the bracket too: a stop of its own)
    safepoints = pauses[pauses["kind"] == "safepoint"]
    for row in pauses[pauses["kind"].isin(["gc_pause", "gc"])].itertuples():
        hosts = safepoints[(safepoints["jvm_pid"] == row.jvm_pid) & (safepoints["start_ns"] <= row.start_ns)
                           & (safepoints["end_ns"] >= row.end_ns)]
        expected = int(hosts["pause_id"].iloc[0]) if len(hosts) == 1 else row.pause_id
        assert len(hosts) <= 1 and int(impact.loc[impact["pause_id"] == row.pause_id, "stop_id"].iloc[0]) == expected
    stops = analysis.stops
    leads, detail = stops[stops["part_of"].isna()], stops[stops["part_of"].notna()]
    own = impact[impact["pause_id"] == impact["stop_id"]]
    assert int(leads["pauses"].sum()) == impact["stop_id"].nunique() == len(own)
    assert int(leads["pauses_hit"].sum()) == int(own["hit_python"].sum())
    assert int(leads["pauses"].sum()) + int(detail["pauses"].sum()) == len(impact)
    assert int(detail.loc[detail["part_of"] == "safepoint: G1CollectFull", "pauses"].sum()) >= 2 * len(markers["gc_markers"])
    out = io.StringIO()
    analysis.summary(console=Console(file=out, width=160))
    lines = out.getvalue().splitlines()
    assert sum(1 for line in lines if line.lstrip().startswith("safepoint: G1CollectFull ")) == 1
    assert any(line.lstrip().startswith("└ gc_pause: ") for line in lines)
    # the per-kind rows stay in summary.parquet: there the stop's three rows each count it
    summary = analysis.summary_table
    assert {"safepoint", "gc_pause", "gc"} <= set(summary["kind"])


def test_notebook_runs_top_to_bottom(recorded):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    root, _, _, _ = recorded
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "explore.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    os.environ["TANDEM_RESULTS"] = str(root / "out")
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", coalesce_streams=True, resources={"metadata": {"path": str(notebook.parent)}}).execute()
    finally:
        del os.environ["TANDEM_RESULTS"]
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the timeline and the histogram
    # "who was hit, who caused it": the code hit most, the stops the gc-trigger thread asked for
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "stop(s) of the world caused by Python" in text and "_gc_trigger_loop" in text
    # "where the memory goes": the demo's process plotted (its own figure) and who grew said
    memory_cell = next(c for c in nb.cells if c.cell_type == "code" and "plot_memory(" in c.source)
    assert any("image/png" in o.get("data", {}) for o in memory_cell.outputs)
    assert "memory of pid" in "".join(o.get("text", "") for o in memory_cell.outputs)


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
        # another thread's collection in the bracket (JPype's reference queue) is that thread's
        others = (inside["requester_os_thread_id"].notna() & (inside["requester_os_thread_id"] != marker["tid"])).fillna(False)
        assert (inside.loc[others, "cause_tid"] != marker["tid"]).all(), inside[others]
        inside = inside[~others]
        assert len(inside) >= 1
        # JFR sometimes writes no caller for a thread attached through JNI (`jfr print`:
        # "caller = N/A"): then nobody is named, never somebody else
        known = inside[inside["requester_os_thread_id"].notna()]
        assert (known["caused_by_python"]).all(), known
        # ... nor inferred as somebody else (the gc-trigger released the GIL around its call:
        # the inference, engine/analysis/causes.py, looks for a thread holding it)
        unknown = inside[inside["requester_os_thread_id"].isna()]
        assert (~unknown["caused_by_python"] | (unknown["cause_tid"] == marker["tid"])).all(), unknown
        named += len(known)
        for pause in known.itertuples():
            assert pause.cause_tid == marker["tid"] and pause.cause_thread == "gc-trigger"
            assert (pause.cause_function, pause.cause_line) == ("_gc_trigger_loop", call_line), pause
            assert pause.cause_file.endswith("engine/demo/workload.py")
            assert pause.cause_state == "released" and not pause.cause_held_gil and not pause.jpype_gc_link
    if named == 0:
        pytest.skip("JFR named no caller for any System.gc() of the gc-trigger thread (caller = N/A)")
    assert any(c["thread"] == "gc-trigger" for c in analysis.header["why"]["caused_by_python"])
