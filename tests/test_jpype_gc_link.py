"""JPype's GC link, recorded with `tandem record` from a JPype program with no
tandem-specific code (tests/jpype_gc_link_program.py: Python garbage in cycles, collected
while the process grows): JPype calls System.gc() through JNI holding the GIL after such a
collection (jpype native/common/jp_gc.cpp). tandem reports those pauses as caused by
Python, by the thread JFR names as the operation's caller, with the GIL held throughout
(amplification with its cause), and names the link in the summary with advice."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.analysis import analyze_session

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).with_name("jpype_gc_link_program.py")


def test_jpype_gc_link_is_caused_by_python_and_named(tmp_path):
    session = tmp_path / "session"
    subprocess.run([sys.executable, "-m", "engine", "record", "-o", str(session), "--", sys.executable, str(PROGRAM)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    analysis = analyze_session(session)
    impact, pauses = analysis.pause_impact, analysis.pauses
    system_gc = pauses[(pauses["kind"] == "gc") & (pauses["cause"] == "System.gc()")]
    assert len(system_gc) >= 3  # the link fired (no System.gc() in the program itself)
    link = impact[impact["jpype_gc_link"]]
    assert len(link) >= 1, impact[impact["caused_by_python"]]
    python_tids = set(analysis.gil["tid"])
    for pause in link.itertuples():
        assert pause.caused_by_python and pause.cause_held_gil and pause.cause_tid in python_tids
        requester = pauses.loc[pauses["pause_id"] == pause.pause_id, "requester_os_thread_id"].iloc[0]
        assert requester == pause.cause_tid
    # the other direction of the same link is not mistaken for it: no pause asked for by a
    # thread that had released the GIL is called the link
    assert not (impact["jpype_gc_link"] & (impact["cause_state"] != "holding")).any()
    why = analysis.header["why"]
    assert why["jpype_gc_link_pauses"] == len(link)
    from engine.report.summary import why_lines

    assert any("JPype's GC link" in line for line in why_lines(why))
    # tandem's JFR settings record jdk.SystemGC with its stack trace (witness: jfr print):
    # the link's calls come through JNI, so no Java frame sits above System.gc()
    recording = next(session.glob("jvm-*/recording.jfr"))
    printed = subprocess.run(["jfr", "print", "--json", "--events", "jdk.SystemGC", str(recording)], check=True,
                             capture_output=True, text=True).stdout
    events = json.loads(printed)["recording"]["events"]
    assert len(events) >= len(system_gc)
    frames = [[f["method"]["name"] for f in e["values"]["stackTrace"]["frames"]] for e in events]
    assert all(f[:2] == ["gc", "gc"] for f in frames), frames
    assert any(len(f) == 2 for f in frames), frames  # System.gc() called from native code (JNI)
