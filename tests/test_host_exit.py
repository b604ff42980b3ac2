"""A JVM whose host process exits without shutting it down keeps its last pauses, and the
session reports the window it lost (docs/pauses.md, "Unflushed").

The hosts are real: a C program that creates the JVM through JNI and ends with exit()
without DestroyJavaVM (jpy's shape), CPython with JPype left by os._exit, and a JVM that
ends by Runtime.halt. None runs the JVM's shutdown hooks, so JFR never writes what it has
not flushed. Each host stops the JVM (System.gc(), or a thread dump) shortly before exiting
and prints CLOCK_MONOTONIC before and after the call: that bracket, taken by the host
itself, is the witness of when the pause happened.
"""
from __future__ import annotations

import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from conftest import default_java_home, jdk_params
from test_record_helpers import jdk_env, read_json, run_tandem

# How long each host lives after its System.gc() returns: less than JFR's own flush period
# (about a second), so only a flush soon after the collection keeps the pause.
EXIT_AFTER_MS = 300

JNI_HOST = r"""
#include <jni.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    JavaVM *vm;
    JNIEnv *env;
    JavaVMInitArgs args = {0};
    args.version = JNI_VERSION_1_8; /* JAVA_TOOL_OPTIONS (tandem's agent) is read by the JVM itself */
    if (JNI_CreateJavaVM(&vm, (void **)&env, &args) != JNI_OK)
        return 3;
    usleep(1200 * 1000);
    jclass system = (*env)->FindClass(env, "java/lang/System");
    jmethodID gc = (*env)->GetStaticMethodID(env, system, "gc", "()V");
    long long called = monotonic_ns();
    (*env)->CallStaticVoidMethod(env, system, gc);
    long long returned = monotonic_ns();
    printf("%lld %lld\n", called, returned);
    fflush(stdout);
    usleep(atoi(argv[1]) * 1000);
    exit(0); /* no DestroyJavaVM: no shutdown hook runs */
}
"""

# A JVM that ends by Runtime.halt (no shutdown hook runs either) after a stop that is not a
# collection: Thread.getAllStackTraces is a ThreadDump operation at a safepoint.
HALTING_JVM = """
public class Halt {
    public static void main(String[] args) throws Exception {
        Thread.sleep(1200);
        long called = System.nanoTime();
        Thread.getAllStackTraces();
        long returned = System.nanoTime();
        System.out.println(called + " " + returned);
        System.out.flush();
        Thread.sleep(Long.parseLong(args[0]));
        Runtime.getRuntime().halt(0);
    }
}
"""

JPYPE_HOST = """
import os, sys, time
import jpype
jpype.startJVM()
System = jpype.JClass("java.lang.System")
time.sleep(1.2)
called = time.monotonic_ns()
System.gc()
print(called, time.monotonic_ns(), flush=True)
time.sleep(int(sys.argv[1]) / 1000)
os._exit(0)  # without shutdownJVM: no shutdown hook runs
"""


def system_gc_in(pauses: pd.DataFrame, called: int, returned: int) -> pd.DataFrame:
    """The collections of System.gc() that lie within the host's bracket of its call (under
    JPype, its GC link may add one of its own: docs/results.md, `jpype_gc_link`)."""
    gc = pauses[(pauses["kind"] == "gc") & (pauses["cause"] == "System.gc()")]
    return gc[(gc["start_ns"] >= called) & (gc["end_ns"] <= returned)]


def check_the_window(session: Path, lost: dict) -> None:
    """The reported window is the host's end (session.json) minus the last JFR flush."""
    description = read_json(session / "session.json")
    assert lost["jvm_pid"] == description["pid"]
    assert lost["end_wall_ns"] == description["end_wall_ns"]
    assert lost["window_ns"] == description["end_wall_ns"] - lost["last_flush_wall_ns"] > 0
    assert lost["last_flush_ns"] == description["end_monotonic_ns"] - lost["window_ns"]
    flushed = datetime.fromtimestamp(lost["last_flush_wall_ns"] // 1000 / 1e6, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    assert lost["line"] == (f"JVM pid {lost['jvm_pid']}: its host exited without shutting the JVM down; pauses "
                            f"after {flushed} UTC (the last JFR flush) are not in the session "
                            f"(window {lost['window_ns'] / 1e6:.0f} ms)")


@pytest.mark.slow
@pytest.mark.parametrize("java_home", jdk_params())
def test_a_jni_host_that_exits_without_destroying_its_jvm_keeps_its_last_pause(java_home, tmp_path):
    from engine.ingest.inputs import pauses_from

    source, host = tmp_path / "host.c", tmp_path / "host"
    source.write_text(JNI_HOST)
    server = java_home / "lib" / "server"
    subprocess.run(["gcc", "-O1", "-o", str(host), str(source), f"-I{java_home / 'include'}",
                    f"-I{java_home / 'include' / 'linux'}", f"-L{server}", f"-Wl,-rpath,{server}", "-ljvm"], check=True)
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", str(host), str(EXIT_AFTER_MS), env=jdk_env(java_home))
    assert run.returncode == 0, run.stderr
    called, returned = map(int, run.stdout.split())
    jvm_dir = session / f"jvm-{read_json(session / 'session.json')['pid']}"
    assert read_json(jvm_dir / "jvm.json")["state"] == "recording"  # no hook ran: the case of this test
    assert read_json(jvm_dir / "jvm.json")["flush_after_pauses"] == {"poll_ms": 20, "min_gap_ms": 100}
    # `tandem record` says what was lost, in one line (rich may wrap it)
    assert "its host exited without shutting the JVM down; pauses after" in " ".join(run.stdout.split() + run.stderr.split())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pauses, _ = pauses_from(session)
    assert len(system_gc_in(pauses, called, returned)) == 1, pauses[pauses["kind"] == "gc"]
    lost = [s["unflushed"] for s in pauses.attrs["sources"] if s.get("unflushed")]
    assert len(lost) == 1
    check_the_window(session, lost[0])
    assert [str(w.message).split(": unfinished chunk: ")[1].split("; recovered")[0] for w in caught] == [lost[0]["line"]]


@pytest.mark.slow
@pytest.mark.parametrize("java_home", jdk_params())
def test_a_jvm_halted_keeps_its_last_safepoint_that_was_not_a_collection(java_home, tmp_path):
    from engine.ingest.inputs import pauses_from

    (tmp_path / "Halt.java").write_text(HALTING_JVM)
    subprocess.run([str(java_home / "bin" / "javac"), "-d", str(tmp_path), str(tmp_path / "Halt.java")], check=True)
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(tmp_path), "Halt", str(EXIT_AFTER_MS),
                     env=jdk_env(java_home))
    assert run.returncode == 0, run.stderr
    called, returned = map(int, run.stdout.split())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning's line: the JNI host's test)
        pauses, _ = pauses_from(session)
    inside = pauses[(pauses["start_ns"] >= called) & (pauses["end_ns"] <= returned)]
    assert list(zip(inside["kind"], inside["name"])) == [("safepoint", "ThreadDump")], pauses.tail(5)
    lost = [s["unflushed"] for s in pauses.attrs["sources"] if s.get("unflushed")]
    assert len(lost) == 1
    check_the_window(session, lost[0])


@pytest.mark.slow
def test_jpype_left_by_os_exit_keeps_its_last_pause_and_the_results_report_the_window(tmp_path):
    from engine.analysis import load_results

    program, session, out = tmp_path / "host.py", tmp_path / "s", tmp_path / "out"
    program.write_text(JPYPE_HOST)
    env = jdk_env(default_java_home())
    run = run_tandem("record", "-o", str(session), "--", sys.executable, str(program), str(EXIT_AFTER_MS), env=env)
    assert run.returncode == 0, run.stderr
    called, returned = map(int, run.stdout.split())
    analyzed = run_tandem("analyze", str(session), "-o", str(out), env=env)
    assert analyzed.returncode == 0, analyzed.stderr
    results = load_results(out)
    kept = system_gc_in(results.pauses, called, returned)
    assert len(kept) >= 1, results.pauses[results.pauses["kind"] == "gc"]
    lost = results.header["jvm_unflushed"]
    assert len(lost) == 1
    check_the_window(session, lost[0])
    assert int(kept["end_ns"].max()) < lost[0]["last_flush_ns"]  # flushed after the collection, before the exit
    warning_lines = [line for line in analyzed.stderr.splitlines() if line.startswith("tandem: warning:")]
    assert len(warning_lines) == 1 and lost[0]["line"] in warning_lines[0], analyzed.stderr
    # the host's main thread asked for one of them: jdk.SystemGC, committed when the call returns
    # (after the collection), made the flush after the stop too
    impact = results.pause_impact.set_index("pause_id").loc[kept["pause_id"]]
    assert (impact["caused_by_python"].astype(bool) & (impact["cause_thread"] == "MainThread")).any(), impact
