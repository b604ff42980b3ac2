"""Ground truth for the clock: JVM pauses, once ingested, fall inside the Python-side bracket.

A Python program (recorded through `tandem record`, JVM embedded with JPype) reads
time.monotonic_ns() right before and right after each System.gc(). After ingest
(engine.read_pauses, clock_sync method from the agent's tandem.ClockSync events), every
System.gc() collection must lie inside its bracket, and the estimated alignment error must
be at most 5 us.
"""
from __future__ import annotations

import json
import sys

import pytest

from conftest import jdk_params
from test_record_helpers import jdk_env, only_jvm_dir, run_tandem

BRACKETED_GC_PROGRAM = """
import json, sys, time
import jpype
jpype.startJVM()
System = jpype.JClass("java.lang.System")
brackets = []
for _ in range(10):
    before = time.monotonic_ns()
    System.gc()
    after = time.monotonic_ns()
    brackets.append([before, after])
    time.sleep(0.02)
with open(sys.argv[1], "w") as out:
    json.dump(brackets, out)
"""
MAX_ALIGNMENT_ERROR_NS = 5_000


@pytest.mark.parametrize("java_home", jdk_params())
def test_ingested_gc_lies_inside_the_python_bracket(java_home, tmp_path):
    import engine

    program = tmp_path / "bracketed_gc.py"
    program.write_text(BRACKETED_GC_PROGRAM)
    brackets_file = tmp_path / "brackets.json"
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", sys.executable, str(program), str(brackets_file),
                     env=jdk_env(java_home))
    assert run.returncode == 0, run.stderr
    brackets = json.loads(brackets_file.read_text())

    pauses = engine.read_pauses(only_jvm_dir(session) / "recording.jfr")
    clocks = [run["clock"] for source in pauses.attrs["sources"] for run in source["runs"]]
    assert pauses.attrs["clock_domain"] == "monotonic"
    assert all(clock["method"] == "clock_sync" for clock in clocks), clocks
    error_ns = max(clock["error_ns"] for clock in clocks)

    # JPype itself runs System.gc() too (at start and exit): those may lie outside every bracket.
    explicit = pauses[(pauses["kind"] == "gc") & (pauses["cause"] == "System.gc()")]
    margins = []
    for before, after in brackets:
        overlapping = explicit[(explicit["end_ns"] >= before) & (explicit["start_ns"] <= after)]
        assert len(overlapping) >= 1, f"no System.gc() collection overlaps the bracket [{before}, {after}]"
        for start, end in zip(overlapping["start_ns"], overlapping["end_ns"]):
            assert before <= start and end <= after, f"System.gc() [{start}, {end}] sticks out of [{before}, {after}]"
            margins += [start - before, after - end]
    print(f"{java_home.name}: alignment error {error_ns} ns ({clocks[0]['samples']} syncs); "
          f"smallest margin to a bracket edge {min(margins)} ns")
    assert error_ns <= MAX_ALIGNMENT_ERROR_NS
