"""The tandem Java agent, in real JVMs (JDK 17 and 25): what it records and what it leaves.

Witness: the JDK's `jfr` tool (summary / print --json), not tandem's ingest.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from engine import read_pauses
from engine.errors import TandemWarning
from engine.clock.pair import clock_pair

from conftest import default_java_home, jdk_params
from test_record_helpers import (
    AGENT_JAR, compile_workload, duration_ns, instant_ns, jdk_env, jfr_event_counts, jfr_events,
    only_jvm_dir, read_json, run_tandem, wait_for,
)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


@pytest.fixture(scope="module", params=jdk_params())
def recorded_java(request, workload, tmp_path_factory):
    """A Java program in its own process, recorded through `tandem record` (one per JDK)."""
    java_home = request.param
    session = tmp_path_factory.mktemp("session") / "s"
    run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload", "alloc", "3",
                     env=jdk_env(java_home))
    assert run.returncode == 0, run.stderr
    return java_home, session, run


def test_recording_holds_safepoints_gc_pauses_and_clock_syncs(recorded_java):
    java_home, session, run = recorded_java
    jvm_dir = only_jvm_dir(session)
    counts = jfr_event_counts(java_home, jvm_dir / "recording.jfr")
    # default.jfc alone records no SafepointEnd at all: these come from tandem's settings.
    assert counts.get("jdk.SafepointEnd", 0) > 0
    assert counts.get("jdk.SafepointStateSynchronization", 0) > 0
    assert counts.get("jdk.ExecuteVMOperation", 0) > 0
    assert counts.get("jdk.GCPhasePause", 0) > 0
    assert counts.get("jdk.CPUTimeStampCounter", 0) >= 1
    # start (beginChunk), ~3 from the 1 s thread, end (endChunk)
    assert counts.get("tandem.ClockSync", 0) >= 4
    assert "done" in run.stdout


def test_jvm_json_describes_the_jvm(recorded_java):
    java_home, session, _ = recorded_java
    jvm_dir = only_jvm_dir(session)
    description = read_json(jvm_dir / "jvm.json")
    assert jvm_dir.name == f"jvm-{description['pid']}"
    assert description["state"] == "closed"
    assert description["mode"] == "premain"
    assert description["options"] == f"session={session}"
    assert description["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert description["hostname"] == os.uname().nodename
    release = (java_home / "release").read_text()
    assert f'JAVA_VERSION="{description["java_version"]}"' in release
    # both clocks of the start, and the end after it
    assert 0 < description["start_monotonic_ns"] < description["end_monotonic_ns"] < time.monotonic_ns()
    assert abs(description["start_wall_ns"] - time.time_ns()) < 600e9
    # the pair's stated error holds against a pair read here, and session.json's (the wall clock
    # minus CLOCK_MONOTONIC moves by at most 500 ppm between them: NTP slewing)
    here_monotonic, here_wall, here_error = clock_pair()
    recorder = read_json(session / "session.json")
    for facts, prefix in ((description, "start"), (recorder, "start"), (recorder, "end")):
        error = facts[f"{prefix}_clock_error_ns"]
        assert 0 < error < 1e9, (prefix, error)
        moved = abs((facts[f"{prefix}_wall_ns"] - facts[f"{prefix}_monotonic_ns"]) - (here_wall - here_monotonic))
        assert moved <= error + here_error + (here_monotonic - facts[f"{prefix}_monotonic_ns"]) * 500e-6, (prefix, moved, error)
    assert not (jvm_dir / "recording.jfr.part").exists()
    assert not (jvm_dir / ".chunks").exists()  # the agent's links to JFR's chunks are gone once written


def test_clock_sync_pins_ticks_to_the_monotonic_clock(recorded_java):
    """monotonicNanos is read between begin() and commit(): one constant offset fits them all.

    jfr prints each start as chunk wall time + (ticks - chunk ticks) * 1e9 / ticksPerSecond;
    with OS ticks (1e9/s) the offset monotonicNanos - start lies, for every event, in
    [c, c + duration] for one constant c: all these intervals must share a point.
    """
    java_home, session, _ = recorded_java
    recording = only_jvm_dir(session) / "recording.jfr"
    (counter,) = jfr_events(java_home, recording, "jdk.CPUTimeStampCounter")
    if counter["values"]["fastTimeEnabled"]:
        pytest.skip("this JVM stamps with the TSC: ticks are not nanoseconds, the offset is a fit (ingest)")
    syncs = jfr_events(java_home, recording, "tandem.ClockSync")
    offsets = [e["values"]["monotonicNanos"] - instant_ns(e["values"]["startTime"]) for e in syncs]
    durations = [duration_ns(e["values"]["duration"]) for e in syncs]
    lowest_upper = min(offsets)
    highest_lower = max(o - d for o, d in zip(offsets, durations))
    spread = max(offsets) - min(offsets)
    print(f"{java_home.name}: {len(syncs)} clock syncs, offset spread {spread} ns, "
          f"durations {min(durations)}..{max(durations)} ns")
    assert highest_lower <= lowest_upper + 1, (offsets, durations)  # +1: jfr rounds to whole ns


def test_ingest_puts_the_pauses_on_the_monotonic_clock(recorded_java):
    """engine.read_pauses aligns with the agent's clock syncs; every pause falls inside the
    run of the command as tandem record saw it on CLOCK_MONOTONIC (session.json)."""
    import engine

    _, session, _ = recorded_java
    pauses = engine.read_pauses(only_jvm_dir(session) / "recording.jfr")
    assert pauses.attrs["clock_domain"] == "monotonic"
    assert pauses.attrs["clock_method"] == "clock_sync"
    safepoints = pauses[pauses["kind"] == "safepoint"]
    assert len(safepoints) > 0
    recorder = read_json(session / "session.json")
    assert recorder["start_monotonic_ns"] < pauses["start_ns"].min()
    assert pauses["end_ns"].max() < recorder["end_monotonic_ns"]


def _jvm_with_agent(java_home: Path, workload: Path, options: str, *args: str, **kwargs) -> subprocess.Popen:
    env = jdk_env(java_home)
    return subprocess.Popen([str(java_home / "bin" / "java"), f"-javaagent:{AGENT_JAR}={options}", "-cp", str(workload),
                             "Workload", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.parametrize("java_home", jdk_params())
def test_sigterm_closes_the_recording(java_home, workload, tmp_path):
    session = tmp_path / "s"
    jvm = _jvm_with_agent(java_home, workload, f"session={session}", "wait")
    assert jvm.stdout.readline().strip() == "ready"
    jvm.send_signal(signal.SIGTERM)
    assert jvm.wait(timeout=60) == 128 + signal.SIGTERM
    description = read_json(session / f"jvm-{jvm.pid}" / "jvm.json")
    assert description["state"] == "closed", jvm.stderr.read()
    assert jfr_event_counts(java_home, session / f"jvm-{jvm.pid}" / "recording.jfr").get("tandem.ClockSync", 0) >= 2


def test_sigkill_leaves_the_repository_chunks(workload, tmp_path):
    """A killed JVM runs no shutdown hook: what survives is the disk repository in the session."""
    java_home = default_java_home()
    session = tmp_path / "s"
    jvm = _jvm_with_agent(java_home, workload, f"session={session}", "wait")
    assert jvm.stdout.readline().strip() == "ready"
    time.sleep(3)  # JFR flushes the chunk about once a second
    jvm.send_signal(signal.SIGKILL)
    jvm.wait(timeout=30)
    jvm_dir = session / f"jvm-{jvm.pid}"
    assert read_json(jvm_dir / "jvm.json")["state"] == "recording"
    assert not (jvm_dir / "recording.jfr").exists()
    chunks = sorted((jvm_dir / "repository").rglob("*.jfr"))
    assert chunks, list(jvm_dir.rglob("*"))
    # What the repository holds is read by ingest up to the last flush (witnessed against
    # `jfr print` in tests/test_ingest_killed.py), clock-sync events included.
    with pytest.warns(TandemWarning):
        pauses = read_pauses(chunks)
    assert (pauses["kind"] == "safepoint").sum() > 0
    assert pauses.attrs["clock_method"] == "clock_sync"


@pytest.mark.parametrize("options, message", [
    ("bogus=1", "unknown option 'bogus'"),
    ("settings=/nonexistent/x.jfc", "no session=<directory>"),
    ("session=/proc/forbidden", "/proc/forbidden"),
    ("session={tmp}/s,settings=/nonexistent/x.jfc", "settings file /nonexistent/x.jfc not found"),
    ("memory=maybe", "memory=maybe is not true or false"),
])
def test_bad_options_cost_one_line_and_never_the_program(workload, tmp_path, options, message):
    jvm = _jvm_with_agent(default_java_home(), workload, options.format(tmp=tmp_path), "sleep", "1")
    out, err = jvm.communicate(timeout=60)
    assert jvm.returncode == 0
    assert out.strip() == "unset"
    agent_lines = [line for line in err.splitlines() if line.startswith("tandem-agent:")]
    assert len(agent_lines) == 1 and message in agent_lines[0], err
    if "{tmp}" in options:  # a session was named: the reason is left there too
        assert (tmp_path / "s" / f"jvm-{jvm.pid}" / "agent-error.txt").read_text().strip() == agent_lines[0]
        assert not (tmp_path / "s" / f"jvm-{jvm.pid}" / "jvm.json").exists()
    assert "Exception in" not in err and "\tat " not in err  # no stack trace


def test_user_events_and_settings_file(workload, tmp_path):
    """--settings replaces the base; tandem's pause events stay; --event adds (0ms -> 0 ms)."""
    java_home = default_java_home()
    jfc = tmp_path / "minimal.jfc"
    jfc.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<configuration version="2.0" label="minimal">\n'
                   '  <event name="jdk.JavaMonitorWait"><setting name="enabled">true</setting></event>\n'
                   '</configuration>\n')
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--settings", str(jfc), "--event", "jdk.ThreadSleep#threshold=0ms",
                     "--", "java", "-cp", str(workload), "Workload", "sleep", "30", env=jdk_env(java_home))
    assert run.returncode == 0, run.stderr
    jvm_dir = only_jvm_dir(session)
    counts = jfr_event_counts(java_home, jvm_dir / "recording.jfr")
    assert counts.get("jdk.ThreadSleep", 0) >= 30       # default threshold 20 ms would drop 1 ms sleeps
    assert counts.get("jdk.ExecutionSample", 0) == 0    # on in default.jfc, absent from minimal.jfc
    assert counts.get("tandem.ClockSync", 0) >= 2
    assert counts.get("jdk.SafepointBegin", 0) + counts.get("jdk.ExecuteVMOperation", 0) > 0
    description = read_json(jvm_dir / "jvm.json")
    assert description["settings"] == str(jfc)
    assert description["events"] == ["jdk.ThreadSleep#threshold=0ms"]
