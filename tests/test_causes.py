"""Who asked for a pause, from the JVM side: jdk.SystemGC's thread and Java frames in
pauses.parquet, and the causes they give (engine/analysis/causes.py), on real JVMs.

Witnesses: `jfr print --json` of the same recording (the call's thread and frames), the
program's own monotonic brackets around each call, its threads' native ids and the source
line of each call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_java_home
from engine.ingest.jfr import read_pauses
from test_ingest_jfr import recordings, workload_dirs  # noqa: F401 (fixtures)
from test_ingest_witness import iso_duration_ns, iso_instant_ns, jfr_print

JDK17 = default_java_home()
JDK25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64")
PROGRAM = Path(__file__).with_name("system_gc_program.py")
GC_CALLER = """
public class GcCaller {
    public static void collect() {
        System.gc();
    }
}
"""


def _frames(event: dict) -> str:
    """system_gc_frames as the spec says, from `jfr print --json`'s stack trace."""
    out = []
    for frame in event["values"]["stackTrace"]["frames"][:5]:
        method = frame["method"]
        text = f"{method['type']['name'].replace('/', '.')}.{method['name']}"
        if frame.get("lineNumber", -1) > 0:
            text += f":{frame['lineNumber']}"
        out.append(text)
    return "; ".join(out)


def _methods(frames: str) -> list[str]:
    return [frame.split(":", 1)[0] for frame in frames.split("; ")]


def test_system_gc_calls_name_their_thread_and_java_frames(recordings):  # noqa: F811
    """The witness workload calls System.gc() from Workload.bracketedGc, bracketed by
    System.nanoTime(): every stop-the-world row inside a bracket carries that call's thread
    and frames as `jfr print` shows them; no row outside a call carries any."""
    path, windows = recordings(JDK17, "g1")
    pauses = read_pauses(path)
    events = jfr_print(JDK17, path, ["jdk.SystemGC"])
    assert len(events) == len(windows) >= 2
    events.sort(key=lambda e: e["values"]["startTime"])
    # The recording's ticks reach CLOCK_MONOTONIC within its clock error; the brackets are exact.
    error = max(r["clock"]["error_ns"] for s in pauses.attrs["sources"] for r in s["runs"])
    marked = set()
    for (before, after), event in zip(sorted(windows), events):
        rows = pauses[(pauses["start_ns"] >= before - error) & (pauses["end_ns"] <= after + error)
                      & pauses["kind"].isin(["safepoint", "gc_pause", "gc"])]
        assert {"safepoint", "gc_pause", "gc"} <= set(rows["kind"]), rows
        assert (rows["system_gc_os_thread_id"] == event["values"]["eventThread"]["osThreadId"]).all(), rows
        frames = _frames(event)
        assert (rows["system_gc_frames"] == frames).all(), (rows["system_gc_frames"], frames)
        assert _methods(frames)[:3] == ["java.lang.Runtime.gc", "java.lang.System.gc", "Workload.bracketedGc"]
        marked.update(rows["pause_id"])
    assert set(pauses.loc[pauses["system_gc_os_thread_id"].notna(), "pause_id"]) == marked


GC_AMONG_DUMPS = """
import java.lang.management.ManagementFactory;

public class GcAmongDumps {
    public static void main(String[] args) throws Exception {
        Thread dumper = new Thread(() -> {
            while (true) {
                ManagementFactory.getThreadMXBean().dumpAllThreads(false, false);
            }
        }, "dumper");
        dumper.setDaemon(true);
        dumper.start();
        Thread.sleep(100);
        for (int i = 0; i < Integer.parseInt(args[0]); i++) {
            System.gc();
        }
    }
}
"""


def test_a_safepoint_another_thread_asked_for_inside_a_system_gc_call_is_not_the_calls(tmp_path, workload_dirs):  # noqa: F811
    """A thread dumps all threads (VM operation ThreadDump, at a safepoint) in a loop while
    main calls System.gc(): the VM thread runs the dumper's operations queued before main's
    collection, inside main's call. Those stops are the dumper's; only the collection is
    main's. Witness: `jfr print` (each operation's caller, each call's span)."""
    (tmp_path / "GcAmongDumps.java").write_text(GC_AMONG_DUMPS)
    subprocess.run([str(JDK17 / "bin" / "javac"), "-d", str(tmp_path), str(tmp_path / "GcAmongDumps.java")], check=True)
    settings = workload_dirs(JDK17) / "pauses.jfc"
    # (on a machine busy with other work the dumper may not run during main's calls: more calls)
    for attempt, n_calls in enumerate((60, 240, 960)):
        path = tmp_path / f"dumps-{attempt}.jfr"
        subprocess.run([str(JDK17 / "bin" / "java"), "-XX:+UseG1GC", f"-XX:StartFlightRecording=filename={path},settings={settings}",
                        "-cp", str(tmp_path), "GcAmongDumps", str(n_calls)], check=True, capture_output=True, timeout=240)
        calls = [(iso_instant_ns(e["values"]["startTime"]), iso_duration_ns(e["values"]["duration"]),
                  e["values"]["eventThread"]["osThreadId"]) for e in jfr_print(JDK17, path, ["jdk.SystemGC"])]
        (main,) = {thread for _, _, thread in calls}
        dumps_inside = 0
        for event in jfr_print(JDK17, path, ["jdk.ExecuteVMOperation"]):
            values = event["values"]
            start = iso_instant_ns(values["startTime"])
            if values["operation"] == "ThreadDump" and any(s <= start < s + d for s, d, _ in calls):
                dumps_inside += 1
                assert values["caller"]["osThreadId"] != main
        if dumps_inside:
            break
    assert dumps_inside > 0, "no dump landed inside a System.gc() call: the case was not exercised"

    pauses = read_pauses(path)
    dumps = pauses[pauses["name"] == "ThreadDump"]
    assert len(dumps) > dumps_inside and dumps["system_gc_os_thread_id"].isna().all(), dumps
    marked = pauses[pauses["system_gc_os_thread_id"].notna()]
    assert (marked["system_gc_os_thread_id"] == main).all()
    assert marked["requester_os_thread_id"].isna().sum() + (marked["requester_os_thread_id"] == main).sum() == len(marked)
    full = pauses[pauses["name"] == "G1CollectFull"]
    assert len(full) == len(calls) and (full["system_gc_os_thread_id"] == main).all(), full
    assert (marked["kind"].value_counts().to_dict() == {"safepoint": len(calls), "gc_pause": len(calls), "gc": len(calls)})


@pytest.mark.slow
@pytest.mark.parametrize("java_home", [JDK17, JDK25], ids=["jdk17", "jdk25"])
def test_python_threads_calling_system_gc_are_named_with_their_line_and_java_frames(tmp_path, java_home):
    """Through JPype, a Python thread calls java.lang.System.gc() directly, another a Java
    method that calls it: each collection (one stop of the world) is caused by Python, by the
    calling thread, at the line of the call, with the GIL released (JPype releases it around
    every call: not JPype's GC link); the call through Java shows its Java frames.

    JDK 17's JFR names no thread attached through JNI (a Python thread): its jdk.SystemGC
    events are not written and jdk.ExecuteVMOperation's caller is N/A (`jfr print`). There
    nobody is named, never somebody else; JDK 25 names them all."""
    if not java_home.is_dir():
        pytest.skip(f"{java_home} is not installed")
    from engine.analysis import analyze_session
    import pandas as pd

    from engine.analysis.causes import requester_tids
    from engine.correlate.stops import caused_stops
    from engine.report.summary import why_lines

    classes = tmp_path / "classes"
    classes.mkdir()
    (tmp_path / "GcCaller.java").write_text(GC_CALLER)
    subprocess.run(["javac", "--release", "17", "-d", str(classes), str(tmp_path / "GcCaller.java")], check=True)
    session, calls_file = tmp_path / "session", tmp_path / "calls.json"
    env = {**os.environ, "JAVA_HOME": str(java_home)}  # (the JVM JPype starts)
    done = subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(session), "--", sys.executable, str(PROGRAM),
                           str(classes), str(calls_file)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    calls = json.loads(calls_file.read_text())
    analysis = analyze_session(session)
    impact = analysis.pause_impact.merge(analysis.pauses[["pause_id", "system_gc_os_thread_id"]], on="pause_id")
    requester = requester_tids(analysis.pauses).set_axis(analysis.pauses["pause_id"])
    source = PROGRAM.read_text().splitlines()
    line_of = {"direct-gc": 1 + next(i for i, t in enumerate(source) if "# the direct call" in t),
               "java-gc": 1 + next(i for i, t in enumerate(source) if "# the call through Java" in t)}
    function_of = {"direct-gc": "direct", "java-gc": "through_java"}
    named = 0
    for call in calls:
        inside = impact[(impact["start_ns"] >= call["before_ns"]) & (impact["end_ns"] <= call["after_ns"])]
        lead = inside[(inside["kind"] == "safepoint") & (inside["name"] == "G1CollectFull")]
        # (JPype's reference-queue thread may ask for a collection of its own meanwhile: JFR names it)
        asked_by = requester.reindex(lead["pause_id"]).to_numpy()
        lead = lead[[pd.isna(tid) or tid == call["tid"] for tid in asked_by]]
        assert len(lead) == 1, inside
        inside = inside[inside["stop_id"] == lead["pause_id"].iloc[0]]  # one stop of the world: its rows
        assert set(inside["kind"]) == {"safepoint", "gc_pause", "gc"}, inside
        named_other = inside["caused_by_python"] & (inside["cause_tid"] != call["tid"])
        assert not named_other.fillna(False).any(), inside
        known = inside[inside["system_gc_os_thread_id"].notna()]
        if not len(known):
            assert java_home == JDK17 and not inside["caused_by_python"].any(), inside
            continue
        named += 1
        assert (known["system_gc_os_thread_id"] == call["tid"]).all()
        assert known["caused_by_python"].all() and (known["cause_tid"] == call["tid"]).all()
        assert (known["cause_thread"] == call["thread"]).all()
        assert (known["cause_function"] == function_of[call["thread"]]).all()
        assert (known["cause_line"] == line_of[call["thread"]]).all()
        assert (known["cause_state"] == "released").all() and not known["cause_held_gil"].any()
        assert not known["jpype_gc_link"].any()
        frames = set(known["cause_java_frames"])
        assert len(frames) == 1
        frames = frames.pop()
        if call["thread"] == "java-gc":
            assert _methods(frames)[:3] == ["java.lang.Runtime.gc", "java.lang.System.gc", "GcCaller.collect"]
            assert frames.split("; ")[2] == "GcCaller.collect:4"
        else:
            assert _methods(frames) == ["java.lang.Runtime.gc", "java.lang.System.gc"]
    if java_home == JDK25:
        assert named == len(calls) == 6
    if named == 0:
        return
    # one figure per stop: the summary counts each collection once
    stops = caused_stops(analysis.pause_impact)
    assert stops["stop_id"].is_unique
    lines = why_lines(analysis.header["why"])
    java_line = [line for line in lines if "thread java-gc" in line]
    assert java_line and "GcCaller.collect:4" in java_line[0] and "through Java java.lang.Runtime.gc" in java_line[0]
    for cause in analysis.header["why"]["caused_by_python"]:
        if cause["thread"] in line_of:
            assert cause["stops"] == sum(1 for c in calls if c["thread"] == cause["thread"])
    assert not any(cause["jpype_gc_link"] for cause in analysis.header["why"]["caused_by_python"]
                   if cause["thread"] in line_of)


def _inference_tables(jvm_pid: int, main_state: str | None, main_from: int = 0):
    """A System.gc() collection (B+100 to B+200, B = 100 ms) of JVM JVM_PID that JFR names no
    requester for; Python process 7: the churner (tid 2) holds the GIL through it, the main
    thread (tid 1) is in MAIN_STATE from MAIN_FROM through it (None: it holds the GIL too).
    The pauses table and the gil table."""
    import pandas as pd

    from test_join_witness import gil_frame, pauses_frame

    b = 100_000_000
    pauses = pauses_frame([(b + 100, b + 200)]).assign(kind="gc", name="G1Full", cause="System.gc()", jvm_pid=jvm_pid)
    rows = [(7, 2, "released", 0, b + 50), (7, 2, "released", b + 250, b + 260)]  # the churner: holding
    rows += [(7, 1, "released", b + 270, b + 280)]
    if main_state is not None:
        rows.append((7, 1, main_state, main_from, b + 240))
    else:
        rows.append((7, 1, "released", 0, b + 40))
    gil = gil_frame(rows).assign(function=pd.array(["f"] * len(rows), dtype="string"),
                                 file=pd.array(["prog.py"] * len(rows), dtype="string"),
                                 line=pd.array(list(range(len(rows))), dtype="Int64"))
    return pauses, gil


def _inference_case(jvm_pid: int, main_state: str | None, main_from: int = 0):
    """_inference_tables correlated: the collection's pause_impact row."""
    from engine.analysis import correlate

    return correlate(*_inference_tables(jvm_pid, main_state, main_from)).pause_impact.iloc[0]


def test_tandem_analyze_keeping_the_pause_columns_it_reads_finds_the_causes_of_the_whole_table(tmp_path, monkeypatch):
    """`tandem analyze` writes the pauses table as it starts and keeps only the columns the
    analysis reads (engine.analysis.stream.ANALYSIS_PAUSE_COLUMNS); the notebook's correlate keeps
    the whole table. Their results are the same, causes included: an inferred requester (cause,
    jvm_pid), a named one, tandem's own pause, a System.gc() call's frames."""
    import pandas as pd

    from engine.analysis import correlate, load_results
    from engine.analysis import stream
    from engine.analysis.stream import analyze_streamed
    from engine.ingest.gil_parquet import ParquetGil
    from engine.session import MEMORY_THREAD_NAME
    from engine.store import write_table

    pauses, gil = _inference_tables(7, "released")
    b = 100_000_000
    # tandem's own thread (tid 3) holds the GIL through the collection too: never its requester.
    # The gil table names its threads; the streamed drive reads no name with the blocks.
    own = gil.iloc[[0, 1]].assign(tid=3, start_ns=[0, b + 255], end_ns=[b + 45, b + 265])
    gil = pd.concat([gil, own], ignore_index=True)
    gil["thread_name"] = pd.array(gil["tid"].map({1: "MainThread", 2: "churner", 3: MEMORY_THREAD_NAME}), dtype="string")
    more = pauses.iloc[[0, 0, 0]].assign(pause_id=[101, 102, 103], start_ns=[b + 205, b + 215, b + 225],
                                         end_ns=[b + 210, b + 220, b + 230], kind="safepoint", name="op")
    pauses = pd.concat([pauses, more], ignore_index=True)
    pauses["cause"] = pd.array(["System.gc()", None, None, None], dtype="string")
    pauses["requester_os_thread_id"] = pd.array([None, 1, 2, None], dtype="Int64")
    pauses["asked_by_tandem"] = [False, False, True, False]
    pauses["system_gc_os_thread_id"] = pd.array([None, None, None, 1], dtype="Int64")
    pauses["system_gc_frames"] = pd.array([None, None, None, "java.lang.Runtime.gc; java.lang.System.gc; org.x.Y.z"],
                                          dtype="string")
    pauses["source"] = pd.array(["recording.jfr"] * 4, dtype="string")  # (columns no stage reads)
    pauses["total_threads"] = pd.array([10, 11, 12, 13], dtype="Int64")
    write_table(gil, tmp_path / "g.parquet", {"source": "test"})
    monkeypatch.setattr(stream, "IMPACT_BATCH_ROWS", 1)  # (causes and the summary's why added up a pause at a time)
    analyze_streamed(tmp_path / "out", pauses, ParquetGil(tmp_path / "g.parquet"))
    whole = correlate(pauses, gil)
    streamed = load_results(tmp_path / "out")
    impact = whole.pause_impact.set_index("pause_id")
    assert impact.loc[100, "cause_inferred"] and impact.loc[100, "cause_thread"] == "churner"
    assert impact.loc[101, "cause_tid"] == 1 and impact.loc[101, "cause_thread"] == "MainThread"
    assert not impact.loc[102, "caused_by_python"] and impact.loc[103, "cause_java_frames"].endswith("org.x.Y.z")
    for name in ("pause_impact", "pauses", "overlaps", "stops", "summary"):
        pd.testing.assert_frame_equal(streamed.tables()[name], whole.tables()[name], check_dtype=False, obj=name)
    assert streamed.header["why"] == whole.header["why"]


def test_a_requester_jfr_does_not_name_is_inferred_from_the_one_thread_holding_the_gil():
    row = _inference_case(7, "released")
    assert row["caused_by_python"] and row["cause_inferred"] and row["cause_tid"] == 2
    assert row["cause_held_gil"] and row["cause_state"] == "holding" and row["cause_line"] == 1  # its next release
    assert not row["jpype_gc_link"]  # (never, inferred: see engine/analysis/causes.py)
    # two holders; a JVM outside the process; a thread that went into a Java call just before
    # the stop and was still in it (JPype releases the GIL for calls: it may have asked)
    for jvm_pid, main_state, main_from in ((7, None, 0), (8, "released", 0), (7, "released", 100_000_099)):
        row = _inference_case(jvm_pid, main_state, main_from)
        assert not row["caused_by_python"] and not row["cause_inferred"] and row.isna()["cause_tid"]


def test_tandems_own_thread_holding_through_a_pause_is_never_its_inferred_requester():
    """The probe's memory sampler (a thread of the service's process) may run through a
    collection; it asks for none, so it neither is inferred nor keeps the one holder from being."""
    import pandas as pd

    from engine.analysis import correlate
    from test_join_witness import gil_frame

    b = 100_000_000
    pauses, gil = _inference_tables(7, "released")
    sampler = gil_frame([(7, 3, "released", 0, b + 40), (7, 3, "released", b + 270, b + 280)]).assign(
        function=pd.array(["sample"] * 2, dtype="string"), file=pd.array(["memory.py"] * 2, dtype="string"),
        line=pd.array([1, 2], dtype="Int64"))
    gil = pd.concat([gil, sampler], ignore_index=True)
    gil["thread_name"] = pd.array(gil["tid"].map({1: "MainThread", 2: "churner", 3: "tandem-memory"}), dtype="string")
    row = correlate(pauses, gil).pause_impact.iloc[0]
    assert row["cause_inferred"] and row["cause_tid"] == 2 and row["cause_thread"] == "churner"
    # the sampler the only thread holding: nothing is inferred
    churner_waits = gil_frame([(7, 2, "waiting", b + 50, b + 250)]).assign(thread_name=pd.array(["churner"], dtype="string"))
    row = correlate(pauses, pd.concat([gil, churner_waits], ignore_index=True)).pause_impact.iloc[0]
    assert not row["cause_inferred"] and row.isna()["cause_tid"]


def test_code_hits_added_up_by_code_equal_code_hits_of_every_part():
    """CodeHits (what a streamed analysis keeps: totals per carried code, fed part by part as
    the core makes overlaps rows) against code_hits of each part's text, added up: the same
    table, whatever the parts, with codes whose text is alike and codes without any."""
    import numpy as np
    import pyarrow as pa

    import pyarrow.compute as pc

    from engine.analysis.causes import CodeHits, add_code_hits

    def code_hits(table, leaders):  # the witness: grouped by the text of each exact row
        exact = table.filter(pc.invert(table["near_miss"]))
        if leaders is not None:
            exact = exact.filter(pc.is_in(exact["pause_id"], pa.array(leaders, pa.int64())))
        keyed = pa.table({"function": pc.fill_null(exact["function"], "<not recorded>"),
                          "file": pc.fill_null(exact["file"], ""), "line": pc.fill_null(exact["line"], -1),
                          "overlap_ns": exact["overlap_ns"]})
        hits = keyed.group_by(["function", "file", "line"], use_threads=False).aggregate(
            [("overlap_ns", "sum"), ("overlap_ns", "count")])
        return hits.rename_columns(["function", "file", "line", "sum", "size"])

    rng = np.random.default_rng(5)
    carried = pa.table({"function": pa.array(["f", "g", None, "f", "h", "g"], pa.string()),
                        "file": pa.array(["a.py", "a.py", None, "a.py", "b.py", "c.py"], pa.string()),
                        "line": pa.array([1, 2, None, 1, 3, 2], pa.int64())})  # codes 0 and 3: one text
    for trial in range(20):
        n = int(rng.integers(0, 400))
        rows = {"pause_id": rng.integers(0, 30, n), "overlap_ns": rng.integers(0, 10**12, n),
                "near_miss": rng.random(n) < 0.3, "code": rng.integers(0, len(carried), n)}
        leaders = rng.choice(30, 20, replace=False) if trial % 3 else None
        cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 6))))
        hits, parts = CodeHits(leaders), []
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n]):
            part = {k: v[lo:hi] for k, v in rows.items()}
            hits.add(part["pause_id"], part["overlap_ns"], part["near_miss"], part["code"])
            if hi > lo:
                table = pa.table({"pause_id": part["pause_id"], "overlap_ns": part["overlap_ns"],
                                  "near_miss": part["near_miss"]})
                for name in carried.column_names:
                    table = table.append_column(name, carried.column(name).take(pa.array(part["code"])))
                parts.append(code_hits(table, leaders))
        got = hits.table(carried)
        if not parts:
            assert got is None
            continue
        expected = add_code_hits(parts)
        assert got.equals(expected), (trial, got.to_pydict(), expected.to_pydict())


def _causes_witness(pauses, stop, gil, overlaps):
    """CAUSE_COLUMNS per pause the plain way, pause by pause over the whole gil table (the
    definitions of engine/analysis/causes.py, written out; the witness of Causes)."""
    import numpy as np
    import pandas as pd

    from engine.analysis.causes import (CALL_WINDOW_NS, CAUSE_COLUMNS, SITE_WINDOW_NS, _caller_outside_jpype,
                                        _system_gc_pauses, inference_candidates, requester_tids)
    from engine.ingest.gil_stream import thread_lifetimes

    n = len(pauses)
    starts, ends = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    stop_start = pd.Series(starts).groupby(stop).transform("min").to_numpy(np.int64)
    lifetimes = thread_lifetimes(gil)
    exact = overlaps[~overlaps["near_miss"].astype(bool) & (overlaps["overlap_ns"] > 0)]
    requester = requester_tids(pauses).to_numpy(object, na_value=None)
    inferred = [None] * n
    for i in np.flatnonzero(inference_candidates(pauses, stop)):
        pid = int(pauses["jvm_pid"].iloc[i])
        alive = lifetimes[(lifetimes.pid == pid) & (lifetimes.start_ns <= starts[i]) & (lifetimes.end_ns >= ends[i])]
        holders = set(alive.tid) - set(exact.loc[exact.pause_id == pauses["pause_id"].iloc[i], "tid"])
        called = gil[(gil.pid == pid) & (gil.state == "released") & (gil.start_ns <= stop_start[i])
                     & (gil.start_ns >= stop_start[i] - CALL_WINDOW_NS) & (gil.end_ns >= ends[i])]
        if len(holders) == 1 and not len(called):
            inferred[i] = holders.pop()
    frames = pauses["system_gc_frames"].astype("string")
    rows_out = []
    for i in range(n):
        row = dict.fromkeys(CAUSE_COLUMNS)
        row.update(caused_by_python=False, cause_inferred=False, jpype_gc_link=False)
        tid = requester[i] if requester[i] is not None else inferred[i]
        mine = gil[gil.tid == tid].sort_values("start_ns", kind="stable") if tid is not None else gil.iloc[:0]
        if len(mine) and mine.start_ns.iloc[0] <= starts[i] <= mine.end_ns.iloc[-1]:
            inside = mine[(mine.start_ns <= starts[i]) & (mine.end_ns > starts[i])]
            after = mine[mine.start_ns >= starts[i]]
            at = inside.iloc[0] if len(inside) else (
                after.iloc[0] if len(after) and after.start_ns.iloc[0] - ends[i] <= SITE_WINDOW_NS else None)
            held = not ((mine.start_ns < ends[i]) & (mine.end_ns > starts[i])).any()
            row.update(caused_by_python=True, cause_pid=mine.pid.iloc[0], cause_tid=tid, cause_thread=mine.thread_name.iloc[0],
                       cause_state=inside.state.iloc[0] if len(inside) else "holding", cause_held_gil=held,
                       cause_java_frames=frames.iloc[i], cause_inferred=requester[i] is None)
            if at is not None:
                row.update(cause_function=at["function"], cause_file=at["file"], cause_line=at["line"])
            row["jpype_gc_link"] = bool(held and _system_gc_pauses(pauses)[i] and not _caller_outside_jpype(frames)[i]
                                        and (requester[i] is not None or pd.notna(frames.iloc[i])))
        rows_out.append(row)
    out = pd.DataFrame(rows_out, columns=list(CAUSE_COLUMNS))
    types = {"cause_pid": "Int64", "cause_tid": "Int64", "cause_line": "Int64", "cause_held_gil": "boolean",
             **{c: "string" for c in ("cause_thread", "cause_state", "cause_function", "cause_file", "cause_java_frames")},
             **{c: bool for c in ("caused_by_python", "cause_inferred", "jpype_gc_link")}}
    return out.astype(types)


def _random_causes_case(seed: int):
    """Pauses of a JVM inside Python process 7 (threads 71-73) and other pauses, some asking
    threads named by JFR (Python threads, a Java thread, none), System.gc() among them; the
    GIL rows of processes 7 and 8, with empty intervals, ties, holding gaps and code."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    ms = 1_000_000
    rows = []
    for pid, tids in ((7, (71, 72, 73)), (8, (81, 82))):
        for tid in tids:
            t = 10**12 + int(rng.integers(0, 200 * ms))
            for _ in range(int(rng.integers(0, 60))):
                t += int(rng.choice([0, 1, 40 * ms, 300 * ms]) * rng.random())
                length = int(rng.choice([0, 5 * ms, 60 * ms]) * rng.random())
                rows.append((pid, tid, rng.choice(["released", "waiting"], p=[0.8, 0.2]), t, t + length,
                             f"f{tid % 3}", None if rng.random() < 0.2 else "p.py", int(rng.integers(1, 9))))
                t += length
    gil = pd.DataFrame(rows, columns=["pid", "tid", "state", "start_ns", "end_ns", "function", "file", "line"]).astype(
        {"state": "string", "function": "string", "file": "string", "line": "Int64"})
    gil["thread_name"] = pd.array([None if t == 73 else f"t{t}" for t in gil.tid], dtype="string")
    n = 80
    start = 10**12 + rng.integers(0, 4000 * ms, n)
    kinds = rng.choice(["safepoint", "gc_pause", "gc", "vm_operation"], n)
    pauses = pd.DataFrame({
        "pause_id": np.arange(n, dtype=np.int64), "kind": pd.array(kinds, dtype="string"),
        "name": pd.array([f"{k}-name" for k in kinds], dtype="string"),
        "start_ns": start, "end_ns": start + rng.choice([0, 1, 30 * ms], n) * rng.random(n) // 1,
        "cause": pd.array(rng.choice(["System.gc()", "G1 Evacuation Pause", None], n, p=[0.6, 0.3, 0.1]), dtype="string"),
        "requester_os_thread_id": pd.array(rng.choice([None, None, None, 71, 72, 81, 999], n), dtype="Int64"),
        "system_gc_os_thread_id": pd.array(rng.choice([None, None, None, 72], n), dtype="Int64"),
        "system_gc_frames": pd.array(rng.choice([None, "java.lang.Runtime.gc; java.lang.System.gc",
                                                 "java.lang.Runtime.gc; java.lang.System.gc; org.jpype.ref.JPypeReferenceNative.wake",
                                                 "java.lang.Runtime.gc; java.lang.System.gc; GcCaller.collect:4"], n), dtype="string"),
        "jvm_pid": pd.array(rng.choice([7, 7, 7, 9, None], n), dtype="Int64"),
        "at_safepoint": pd.array(rng.random(n) < 0.7, dtype="boolean"),
    })
    pauses["end_ns"] = pauses["end_ns"].astype(np.int64)
    return pauses, gil


@pytest.mark.parametrize("seed", range(8))
def test_causes_fed_in_many_blocks_equal_one_block_and_the_plain_definitions(seed):
    """Causes (the streamed stage) fed the GIL rows in many small blocks, each thread's rows out
    of order within a block, with the watermark between them, and the overlaps in parts, gives
    what it gives fed the whole table as one block (the in-memory analysis), and both what the
    definitions give pause by pause over the whole table."""
    import numpy as np
    import pandas as pd

    from engine.analysis import correlate
    from engine.analysis.causes import Causes
    from engine.correlate import END
    from dataclasses import replace

    from engine.correlate.core import carried_key
    from engine.correlate.inputs import gil_rows_from_frame
    from engine.correlate.stops import stop_ids
    from engine.ingest.gil_stream import thread_lifetimes
    from engine.correlate.tables import check_gil, check_pauses

    pauses, gil = _random_causes_case(seed)
    if seed % 4 >= 2:  # thread ids too large for Causes' lookup array (it searches instead)
        big = 1 << 24  # (Linux caps them at 2^22; the keys pack a tid in 32 bits)
        gil["tid"] += big
        for column in ("requester_os_thread_id", "system_gc_os_thread_id"):
            pauses[column] = pauses[column] + big
    pauses, gil = check_pauses(pauses), check_gil(gil)[0]
    analysis = correlate(pauses, gil)
    stop = stop_ids(pauses)
    expected = _causes_witness(pauses, stop, gil, analysis.overlaps)
    whole = analysis.pause_impact.set_index("pause_id").loc[pauses["pause_id"], list(expected.columns)]
    pd.testing.assert_frame_equal(whole.reset_index(drop=True), expected)

    rng = np.random.default_rng(seed)
    by_start = gil.sort_values("start_ns", kind="stable", ignore_index=True)
    cuts = np.unique(np.r_[0, np.sort(rng.integers(0, len(by_start) + 1, 15)), len(by_start)])
    causes = Causes(pauses, stop, thread_lifetimes(gil))
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        block = by_start.iloc[lo:hi]
        # any order inside a block, but rows starting together keep theirs (the first is the one taken)
        shuffled = pd.Series(rng.random(hi - lo)).groupby(block["start_ns"].to_numpy()).transform("first")
        block = block.iloc[np.argsort(shuffled.to_numpy(), kind="stable")].reset_index(drop=True)
        watermark = int(by_start["start_ns"].iloc[hi]) if hi < len(by_start) else END
        rows = gil_rows_from_frame(block)
        if seed % 2:  # rows numbering their code, as a streamed Parquet table's: one row of each code is read
            rows = replace(rows, carried_key=carried_key(rows.carried))
        causes.push(rows, watermark, lambda mask, block=block: block[mask])
    pd.testing.assert_frame_equal(causes.table().frame(), expected)
    assert expected["caused_by_python"].any() or seed % 4, "too few caused pauses to tell"


def test_causes_keep_little_per_pause_however_many_threads_and_pauses():
    """A long session's worth of System.gc() pauses with no requester named, in a JPype process
    of many sleeping threads: Causes closes each pause's queries once the watermark is past its
    site window, keeping the holder's record only (at most HOLDERS_KEPT where events were lost,
    and then nothing is inferred); fed in many blocks it gives what one block gives."""
    import numpy as np
    import pandas as pd

    from engine.analysis.causes import SITE_WINDOW_NS, Causes
    from engine.correlate import END
    from engine.correlate.inputs import gil_rows_from_frame
    from engine.correlate.stops import stop_ids
    from engine.correlate.tables import check_gil, check_pauses
    from engine.ingest.gil_stream import thread_lifetimes

    ms, t0, n = 1_000_000, 10**12, 300
    start = t0 + np.arange(n, dtype=np.int64) * 1000 * ms + 50 * ms
    end = start + 5 * ms
    pauses = check_pauses(pd.DataFrame({
        "pause_id": np.arange(n, dtype=np.int64), "kind": pd.array(["gc"] * n, dtype="string"),
        "name": pd.array(["G1Full"] * n, dtype="string"), "start_ns": start, "end_ns": end,
        "cause": pd.array(["System.gc()"] * n, dtype="string"), "jvm_pid": pd.array([7] * n, dtype="Int64")}))
    rows = []
    for tid in range(100, 120):  # sleeping: back-to-back releases, the GIL taken back for 10 us between them
        at = np.arange(t0, t0 + n * 1000 * ms, 100 * ms)
        rows += [(tid, a, a + 100 * ms - 10_000) for a in at.tolist()]
    # the holder (71): released but around each pause; six threads (90-95) whose events were lost
    # around the odd pauses: seven possible holders there, so nothing is inferred
    gaps = {71: np.arange(n), **{tid: np.arange(1, n, 2) for tid in range(90, 96)}}
    for tid, around in gaps.items():
        edges = np.r_[t0, np.ravel(np.c_[start[around] - ms, end[around] + ms]), t0 + n * 1000 * ms]
        rows += [(tid, a, b) for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist())]
    gil = pd.DataFrame(rows, columns=["tid", "start_ns", "end_ns"]).assign(pid=7, state="released")
    gil = check_gil(gil.sort_values("start_ns", kind="stable", ignore_index=True))[0]
    stop = stop_ids(pauses)

    whole = Causes(pauses, stop, thread_lifetimes(gil), every_thread=True)
    whole.push(gil_rows_from_frame(gil), END, lambda mask: gil[mask])
    expected = whole.table().frame()
    assert expected["cause_tid"].tolist() == [71 if i % 2 == 0 else pd.NA for i in range(n)]
    assert expected["cause_inferred"].sum() == n // 2 and expected["cause_held_gil"].sum() == n // 2

    causes = Causes(pauses, stop, thread_lifetimes(gil), every_thread=True)
    cuts = np.searchsorted(gil["start_ns"].to_numpy(), t0 + np.arange(1, n) * 1000 * ms)
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(gil)]):
        block = gil.iloc[lo:hi].reset_index(drop=True)
        watermark = int(gil["start_ns"].iloc[hi]) if hi < len(gil) else END
        causes.push(gil_rows_from_frame(block), watermark, lambda mask, block=block: block[mask])
        # open: the queries of the pauses the rows have reached and the site window not passed
        # (27 threads each); closed: the holders' records
        assert causes.open["pause"].size <= 2 * 27
        closed = sum(part["pause"].size for part in causes.closed)
        assert closed <= 3 * np.count_nonzero(end + SITE_WINDOW_NS < watermark)  # (HOLDERS_KEPT)
    pd.testing.assert_frame_equal(causes.table().frame(), expected)


def test_stops_of_jpypes_reference_queue_thread_are_set_off_by_the_collection_before_them():
    """JPype's reference-queue thread (a Java thread) runs Python's collection when a Java
    collection clears its sentinel: the summary names, per such stop, the last collection of the
    same JVM that ended before it (not another JVM's, not one ending after its start), and says
    no one Python thread's code asked; a stop with no collection before it is counted apart."""
    import numpy as np
    import pandas as pd

    from engine.analysis.causes import _collections_before
    from engine.report.summary import why_lines

    pauses = pd.DataFrame({
        "pause_id": np.arange(6, dtype=np.int64),
        "kind": ["gc", "gc", "gc", "safepoint", "gc", "safepoint"],
        "name": ["G1New", "G1Old", "G1New", "G1CollectFull", "G1New", "G1CollectFull"],
        "cause": ["G1 Evacuation Pause", "G1 Preventive Collection", "G1 Evacuation Pause", None, "Other JVM", None],
        "start_ns": np.array([0, 100, 400, 500, 450, 50], np.int64),
        "end_ns": np.array([10, 120, 510, 600, 460, 60], np.int64),
        "jvm_pid": pd.array([7, 7, 7, 7, 8, 7], dtype="Int64"),
    })
    # stop 3 (starts at 500): G1New 2 ends after it starts, G1New 4 is another JVM's: G1Old 1 is its
    # own; stop 5 (starts at 50): G1New 0 ended at 10
    found = _collections_before(np.array([3, 5], np.int64), pauses)
    assert sorted(found, key=lambda c: c["collector"]) == [
        {"collector": "G1New", "cause": "G1 Evacuation Pause", "stops": 1},
        {"collector": "G1Old", "cause": "G1 Preventive Collection", "stops": 1}]
    assert _collections_before(np.array([5], np.int64), pauses.drop(index=0)) == [
        {"collector": None, "cause": None, "stops": 1}]
    cause = {"thread": "4225", "function": "<no Python frame>", "file": "", "line": None, "stops": 2,
             "java_frames": "java.lang.System.gc; org.jpype.ref.JPypeReferenceNative.wake", "duration_ns": 40_000_000,
             "held_gil": 2, "jpype_gc_link": 2, "inferred": 0, "set_off_by": found}
    line, = [line for line in why_lines({"caused_by_python": [cause]}) if "reference-queue" in line]
    assert line.startswith("caused by JPype's reference-queue thread (thread 4225") and "caused by Python" not in line
    assert "G1Old (G1 Preventive Collection) before 1" in line and "no one Python thread's code asked" in line


@pytest.mark.parametrize("next_release_after_ns, site", [(3_000_000, "f"), (100_000_000, "f"), (100_000_001, None)])
def test_a_holding_thread_is_placed_at_its_next_release_only_when_it_came_at_once(next_release_after_ns, site):
    """A requester holding the GIL through its pause is placed at the code of its next release
    when that began within SITE_WINDOW_NS (100 ms) of the pause's end; later, its site is unknown
    (null code; the summary says `<site unknown>`), never code from long after."""
    import pandas as pd

    from engine.analysis import correlate
    from engine.report.summary import why_lines
    from test_join_witness import gil_frame, pauses_frame

    b = 100_000_000
    pauses = pauses_frame([(b + 100, b + 200)]).assign(kind="safepoint", name="RedefineClasses",
                                                       requester_os_thread_id=pd.array([2], dtype="Int64"))
    end = b + 200
    rows = [(7, 2, "released", 0, b), (7, 2, "released", end + next_release_after_ns, end + next_release_after_ns + 5)]
    gil = gil_frame(rows).assign(function=pd.array(["g", "f"], dtype="string"), file=pd.array(["p.py"] * 2, dtype="string"),
                                 line=pd.array([1, 2], dtype="Int64"))
    analysis = correlate(pauses, gil)
    row = analysis.pause_impact.iloc[0]
    assert row["caused_by_python"] and row["cause_state"] == "holding" and row["cause_held_gil"]
    assert (row["cause_function"] if pd.notna(row["cause_function"]) else None) == site
    line, = [line for line in why_lines(analysis.header["why"]) if line.startswith("caused by Python")]
    assert ("at f (p.py:2)" in line) if site else ("at <site unknown>" in line), line


def test_live_causes_come_when_due_and_equal_offline(monkeypatch):
    """tandem live's causes (engine/live/causes.py): a pause no Python thread asked for reads no
    GIL row and is due as soon as it is final; one a Python thread asked for waits until the
    watermark is the site window past its end (its holder is placed at its next release). Each
    row, when due, equals `tandem analyze`'s of the same rows."""
    import numpy as np
    import pandas as pd

    import engine.live.causes as live_causes
    from engine.analysis import correlate
    from engine.analysis.causes import CAUSE_COLUMNS, SITE_WINDOW_NS
    from test_join_witness import gil_frame, pauses_frame

    monkeypatch.setattr(live_causes, "DUE_EVERY_S", 0.0)
    b = 100_000_000
    pauses = pauses_frame([(b + 100, b + 200), (b + 300, b + 400)], kinds=["safepoint"] * 2).assign(
        requester_os_thread_id=pd.array([None, 2], dtype="Int64"), jvm_pid=pd.array([9, 9], dtype="Int64"))
    end = b + 400
    rows = [(7, 2, "released", 0, b), (7, 3, "released", b + 50, end + 10), (7, 2, "released", end + 30_000_000, end + 30_000_005)]
    gil = gil_frame(rows).assign(code=np.array([1, 0, 2], np.uint64), thread_name=pd.array(["main", "w", "main"], dtype="string"))
    names = pd.DataFrame({"function": pd.array(["g", "f"], dtype="string"), "file": pd.array(["p.py"] * 2, dtype="string"),
                          "line": pd.array([1, 2], dtype="Int64")}, index=[1, 2])
    code_names = lambda pid, codes: names.reindex(codes.astype(np.int64)).reset_index(drop=True)  # noqa: E731
    offline = correlate(pauses, gil.drop(columns="code").assign(
        function=pd.array(["g", None, "f"], dtype="string"), file=pd.array(["p.py", None, "p.py"], dtype="string"),
        line=pd.array([1, None, 2], dtype="Int64"))).pause_impact.set_index("pause_id")
    assert offline.loc[101, "caused_by_python"] and offline.loc[101, "cause_function"] == "f"

    no_open = lambda: (live_causes.GilRows.empty(), np.zeros(0, np.uint64))  # noqa: E731
    live = live_causes.LiveCauses(30_000_000_000, code_names, lambda pid, tid: True)
    impact = pauses[["pause_id", "kind", "name", "start_ns", "end_ns"]]
    live.add(pauses, gil.iloc[:2], None, impact)  # both final; thread 2's next release not read yet
    first = live.due(end + 1, no_open)
    assert first["pause_id"].tolist() == [100]
    assert live.next_due_ns() == end + SITE_WINDOW_NS
    assert live.due(end + SITE_WINDOW_NS - 1, no_open) is None
    live.add(None, gil.iloc[2:], None, None)
    second = live.due(end + SITE_WINDOW_NS, no_open)
    assert second["pause_id"].tolist() == [101]
    # The same, thread 2's next release still open when the row is due: its DROP's code names the site.
    again = live_causes.LiveCauses(30_000_000_000, code_names, lambda pid, tid: True)
    again.add(pauses, gil.iloc[:2], None, impact)
    assert again.due(end + 1, no_open)["pause_id"].tolist() == [100]
    release = live_causes.GilRows(np.array([7]), np.array([2]), np.array([0], np.int8), np.array([end + 30_000_000]),
                                  np.array([end + 30_000_000]))
    open_second = again.due(end + SITE_WINDOW_NS, lambda: (release, np.array([2], np.uint64)))
    assert open_second["pause_id"].tolist() == [101]
    for row in (first, second, open_second):
        got = row.set_index("pause_id")[list(CAUSE_COLUMNS)]
        pd.testing.assert_frame_equal(got, offline.loc[got.index, list(CAUSE_COLUMNS)], check_dtype=False)


def test_live_causes_keep_the_gil_rows_of_their_window_and_each_threads_last(monkeypatch):
    """tandem live's causes keep the GIL rows of the last retain_ns behind the watermark (made
    one chunk again once the oldest has passed it: up to twice that) and each thread's last row
    (its name, that it was there), however long the run: 20 s of rows in 0.1 s polls, a pause
    each, retained 1 s."""
    import numpy as np
    import pandas as pd

    import engine.live.causes as live_causes
    from test_join_witness import gil_frame, pauses_frame

    monkeypatch.setattr(live_causes, "DUE_EVERY_S", 0.0)
    no_open = lambda: (live_causes.GilRows.empty(), np.zeros(0, np.uint64))  # noqa: E731
    retain, step = 1_000_000_000, 100_000_000
    live = live_causes.LiveCauses(retain, lambda pid, codes: None, lambda pid, tid: True)
    for i in range(200):
        t = i * step
        threads = (2, 3) if i >= 5 else (2, 3, 4)  # thread 4 releases the GIL in the first polls only
        gil = gil_frame([(7, tid, "released", t + tid, t + step // 2) for tid in threads]).assign(
            code=np.zeros(len(threads), np.uint64), thread_name=pd.array([f"t{tid}" for tid in threads], dtype="string"))
        pause = pauses_frame([(t + 10, t + 20)], kinds=["safepoint"]).assign(pause_id=np.int64(i), jvm_pid=pd.array([9], dtype="Int64"))
        live.add(pause, gil, None, pause[["pause_id", "kind", "name", "start_ns", "end_ns"]])
        due = live.due(t + step, no_open)
        assert due is not None and due["pause_id"].tolist() == [i]
    kept = {name: np.concatenate([chunk[name] for chunk in live.gil]) for name in ("tid", "end_ns")}
    watermark = 200 * step
    recent = kept["end_ns"] >= watermark - 2 * retain
    assert recent.sum() <= 2 * (2 * retain // step) and set(kept["tid"][recent].tolist()) == {2, 3}
    assert kept["tid"][~recent].tolist() == [4] and kept["end_ns"][~recent].tolist() == [4 * step + step // 2]


def test_pause_rows_find_each_pause_once_and_refuse_unknown_or_repeated_ids():
    """with_causes completes pause_impact a batch at a time from PauseRows (the ids sorted once):
    each row found where it is in the table, in any order; an id the table lacks, or a table
    naming a pause twice, is refused."""
    import numpy as np
    import pandas as pd

    from engine.analysis.causes import PauseRows

    rows = PauseRows(pd.DataFrame({"pause_id": [30, 10, 20]}))
    assert rows.of(np.array([20, 30, 10, 20])).tolist() == [2, 0, 1, 2]
    assert rows.of(np.zeros(0, np.int64)).tolist() == []
    with pytest.raises(ValueError):
        rows.of(np.array([15]))
    with pytest.raises(ValueError):
        PauseRows(pd.DataFrame({"pause_id": [10, 20, 10]})).of(np.array([20]))
    with pytest.raises(ValueError):
        PauseRows(pd.DataFrame({"pause_id": pd.Series([], dtype=np.int64)})).of(np.array([1]))
