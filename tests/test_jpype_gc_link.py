"""JPype's GC link, recorded with `tandem record` from a JPype program with no
tandem-specific code (tests/jpype_gc_link_program.py: Python garbage in cycles, collected
while the process grows): JPype calls System.gc() through JNI holding the GIL after such a
collection (jpype native/common/jp_gc.cpp). tandem reports those pauses as caused by
Python, by the thread JFR names as the operation's caller, with the GIL held throughout
(amplification with its cause), and names the link in the summary with advice, as one figure
(stops of the world, each counted once).

The same link fires on whichever thread ran Python's collection: the main thread inside
JPype's native class-wrapper code at start-up, or JPype's reference-queue thread (a Java
thread that takes the GIL) inside its native `wake`; a JPype frame sits under System.gc()
then, and JPype's Java code never calls it, so those are the link too.

JDK 17's JFR names no thread attached through JNI (the Python thread that runs the link):
its jdk.SystemGC events carry the call's frames but no thread, and the operation's caller is
N/A. There the requester is inferred (the one Python thread of the JVM's process holding the
GIL through the pause: the churner), flagged so, and called the link when the frames show no
caller outside JPype. JDK 25 names the thread."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.analysis import analyze_session

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).with_name("jpype_gc_link_program.py")
JDK25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64")
SYSTEM_GC_ONLY = ["java.lang.Runtime.gc", "java.lang.System.gc"]


def _methods(frames: str) -> list[str]:
    return [frame.split(":", 1)[0] for frame in frames.split("; ")]


def _caller_outside_jpype(frames: str) -> bool:
    callers = [m for m in _methods(frames) if m not in SYSTEM_GC_ONLY]
    return bool(callers) and not callers[0].startswith("org.jpype.")


@pytest.mark.parametrize("jdk", ["17", "25"])
def test_jpype_gc_link_is_caused_by_python_and_named(tmp_path, jdk):
    env = dict(os.environ)
    if jdk == "25":
        if not JDK25.is_dir():
            pytest.skip(f"{JDK25} is not installed")
        env["JAVA_HOME"] = str(JDK25)  # (the JVM JPype starts)
    session = tmp_path / "session"
    subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(session), "--", sys.executable, str(PROGRAM)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    analysis = analyze_session(session)
    impact, pauses = analysis.pause_impact, analysis.pauses
    system_gc = pauses[(pauses["kind"] == "gc") & (pauses["cause"] == "System.gc()")]
    assert len(system_gc) >= 3  # the link fired (no System.gc() in the program itself)
    link = impact[impact["jpype_gc_link"]]
    # never a call with a Java caller outside JPype; every call from JPype's native code (none
    # or a JPype frame under System.gc()) by a thread holding the GIL through it is the link
    caused = impact[impact["caused_by_python"] & impact["cause_java_frames"].notna()]
    for pause in caused.itertuples():
        from_jpype = not _caller_outside_jpype(pause.cause_java_frames)
        assert pause.jpype_gc_link == (from_jpype and pause.cause_held_gil), pause
    if jdk == "25":
        assert len(link) >= 1, impact[impact["caused_by_python"]]
        assert not impact["cause_inferred"].any()  # JFR named every requester
    else:
        # inferred: the System.gc() collections JFR names no requester for once the churner runs
        # are the link's: each is inferred as the churner's (it held the GIL through it) and
        # flagged, or left unnamed, never given to another thread; the collections before it
        # (JPype's start-up) are not given to it, nor those JFR names a thread for (JPype's
        # reference-queue thread, a Java thread)
        from engine.analysis.causes import requester_tids

        gil = analysis.gil
        churner_from = gil.loc[gil["thread_name"] == "churner", "start_ns"].min()
        stop_of = impact.set_index("pause_id")["stop_id"]
        named_stops = set(stop_of[pauses.loc[requester_tids(pauses).notna().to_numpy(bool), "pause_id"]])
        unnamed = system_gc[(system_gc["start_ns"] >= churner_from).to_numpy(bool)
                            & ~stop_of[system_gc["pause_id"]].isin(named_stops).to_numpy(bool)]
        churned = unnamed.merge(impact.drop(columns=["kind", "start_ns"]), on="pause_id")
        # (one the main thread may have asked for, in a Java call when the stop began, is left
        # unnamed: see CALL_WINDOW_NS in engine/analysis/causes.py)
        assert not (churned["caused_by_python"] & ~churned["cause_inferred"]).any(), churned
        churned = churned[churned["cause_inferred"]]
        assert len(churned) >= 3
        assert not impact.loc[impact["pause_id"].isin(pauses.loc[requester_tids(pauses).notna(), "pause_id"]),
                              "cause_inferred"].any()
        assert (churned["cause_thread"] == "churner").all(), churned
        assert churned["cause_held_gil"].all()
        assert (churned["jpype_gc_link"] == churned["cause_java_frames"].notna()).all()  # (the frames tell it)
        assert (churned["cause_file"] == str(PROGRAM)).all()
        before = impact[impact["pause_id"].isin(system_gc.loc[system_gc["start_ns"] < churner_from, "pause_id"])]
        assert not (before["cause_thread"] == "churner").any()
    python_tids = set(analysis.gil["tid"])
    merged = link.merge(pauses[["pause_id", "requester_os_thread_id", "system_gc_os_thread_id"]], on="pause_id")
    for pause in merged.itertuples():
        assert pause.caused_by_python and pause.cause_held_gil and pause.cause_tid in python_tids
        requester = pause.requester_os_thread_id if pd_notna(pause.requester_os_thread_id) else pause.system_gc_os_thread_id
        if pause.cause_inferred:  # (JFR named nobody: see the JDK 17 case above)
            assert not pd_notna(requester)
        else:
            assert requester == pause.cause_tid
        # the churner's: the Python code it was in is where its collection ran (an allocation
        # in the program), and no Java frame sits under the call (JNI from Python's GC callback)
        if str(pause.cause_thread) == "churner":
            assert pause.cause_file == str(PROGRAM)
            assert _methods(pause.cause_java_frames) == SYSTEM_GC_ONLY
        else:  # JPype's own (start-up, its reference queue): from its native code
            assert not _caller_outside_jpype(pause.cause_java_frames), pause
    if jdk == "25":
        assert (merged["cause_thread"] == "churner").any()  # (JDK 17: `churned` above)
    # the other direction of the same link is not mistaken for it: no pause asked for by a
    # thread that had released the GIL is called the link
    assert not (impact["jpype_gc_link"] & (impact["cause_state"] != "holding")).any()
    # one figure: the summary counts stops of the world (a safepoint, its GC pause and its
    # collection are one System.gc()), the same in every line that gives it
    why = analysis.header["why"]
    assert why["jpype_gc_link_stops"] == link["stop_id"].nunique()
    listed = sum(c["jpype_gc_link"] for c in why["caused_by_python"])  # (the top 5 causes are listed)
    assert why["jpype_gc_link_stops"] == listed if len(why["caused_by_python"]) < 5 else why["jpype_gc_link_stops"] >= listed
    # a stop JPype's reference-queue thread asked for is set off by the Java collection before it
    for cause in why["caused_by_python"]:
        worker = "org.jpype.ref.JPypeReferenceNative.wake" in (cause["java_frames"] or "")
        assert ("set_off_by" in cause) == worker, cause
        if worker:
            assert sum(c["stops"] for c in cause["set_off_by"]) == cause["stops"], cause
    from engine.report.summary import why_lines

    lines = why_lines(why)
    if len(link):
        assert any(f"JPype's GC link, {why['jpype_gc_link_stops']} stop(s)" in line for line in lines), lines
        churner = [c for c in why["caused_by_python"] if c["thread"] == "churner"]
        assert churner and all(c["jpype_gc_link"] == c["stops"] for c in churner)
    else:
        assert not any("JPype's GC link" in line for line in lines), lines
    # tandem's JFR settings record jdk.SystemGC with its stack trace (witness: jfr print): the
    # link's calls come through JNI, so no Java frame sits above System.gc()
    recording = next(session.glob("jvm-*/recording.jfr"))
    jfr = str(JDK25 / "bin" / "jfr") if jdk == "25" else "jfr"
    printed = subprocess.run([jfr, "print", "--json", "--events", "jdk.SystemGC", str(recording)], check=True,
                             capture_output=True, text=True).stdout
    events = json.loads(printed)["recording"]["events"]
    frames = [[f["method"]["name"] for f in e["values"]["stackTrace"]["frames"]] for e in events]
    assert all(f[:2] == ["gc", "gc"] for f in frames), frames
    if jdk == "25":
        assert len(events) >= len(system_gc)
        # the link's calls, from the churner thread: no Java frame above System.gc()
        churner = [f for e, f in zip(events, frames) if e["values"]["eventThread"]["javaName"] != "main" and len(f) == 2]
        by_churner = (link["cause_thread"] == "churner").fillna(False).to_numpy(bool)
        assert len(churner) >= link.loc[by_churner, "stop_id"].nunique()
        # JPype's own calls (start-up, its reference queue): a JPype native method under System.gc()
        own = [f for f in frames if len(f) > 2 and f[2] in ("newWrapper", "wake")]
        assert len(own) >= link.loc[~by_churner, "stop_id"].nunique()
    _tandem_start_is_not_the_service(session, analysis, jfr, lines)


def _tandem_start_is_not_the_service(session, analysis, jfr: str, lines: list[str]) -> None:
    """The VM operations JFR runs as tandem's agent starts its recording are asked for by the
    thread that created the JVM: in JPype, the Python main thread (tid = pid). They are
    tandem's own (asked_by_tandem), never caused by Python, and the summary says so. Witness:
    jfr print's jdk.ExecuteVMOperation events of that caller."""
    described = json.loads(next(session.glob("jvm-*/jvm.json")).read_text())
    starter = described["agent_start_os_thread_id"]
    assert starter == described["pid"] and starter in set(analysis.gil["tid"])  # JPype's main thread
    pauses, impact = analysis.pauses, analysis.pause_impact
    own = pauses[pauses["asked_by_tandem"]]
    assert len(own) >= 1 and (own["requester_os_thread_id"] == starter).all(), own
    assert (own["start_ns"] >= described["agent_start_from_monotonic_ns"]).all()
    assert (own["start_ns"] <= described["agent_start_to_monotonic_ns"]).all()
    assert not impact.loc[impact["pause_id"].isin(own["pause_id"]), "caused_by_python"].any()
    printed = subprocess.run([jfr, "print", "--json", "--events", "jdk.ExecuteVMOperation", str(next(
        session.glob("jvm-*/recording.jfr")))], check=True, capture_output=True, text=True).stdout
    asked = {e["values"]["operation"] for e in json.loads(printed)["recording"]["events"]
             if (e["values"].get("caller") or {}).get("osThreadId") == starter}
    assert set(own["name"]) <= asked, (set(own["name"]), asked)
    stops = analysis.pause_impact.set_index("pause_id").loc[own["pause_id"], "stop_id"].nunique()
    assert any(line.startswith(f"tandem's own: {stops} stop(s)") for line in lines), lines


def pd_notna(value) -> bool:
    import pandas as pd

    return bool(pd.notna(value))
