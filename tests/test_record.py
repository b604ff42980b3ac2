"""`tandem record` and `tandem attach` with real processes: Java, Python, embedded JVMs."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import default_java_home, jdk_params
from test_record_helpers import (
    compile_workload, default_sigint, jdk_env, jfr_event_counts, kill_session_processes, only_jvm_dir, read_json, run_tandem,
    tandem_argv,
)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


def test_exit_code_passes_through_and_system_exit_closes_the_recording(workload, tmp_path):
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload", "alloc", "0.5", "3",
                     env=jdk_env(default_java_home()))
    assert run.returncode == 3, run.stderr
    assert read_json(session / "session.json")["exit_code"] == 3
    jvm_dir = only_jvm_dir(session)
    assert read_json(jvm_dir / "jvm.json")["state"] == "closed"
    assert (jvm_dir / "recording.jfr").stat().st_size > 0
    assert "exited with 3" in run.stderr


def test_stdin_and_stdout_pass_through_untouched(tmp_path):
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", sys.executable, "-c",
                     "import sys; sys.stdout.write(sys.stdin.read().upper())",
                     input="hello tandem\n", env=jdk_env(default_java_home()))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "HELLO TANDEM\n"  # tandem's own report goes to stderr
    description = read_json(session / "session.json")
    assert description["argv"][0] == sys.executable and description["exit_code"] == 0


def test_session_variable_and_java_tool_options_reach_the_command(workload, tmp_path):
    """An existing JAVA_TOOL_OPTIONS is kept; a session path with a space is quoted."""
    session = tmp_path / "my session"
    env = jdk_env(default_java_home(), JAVA_TOOL_OPTIONS="-Dtandem.test.property=kept")
    run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload", "sleep", "1", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "kept"
    assert read_json(only_jvm_dir(session) / "jvm.json")["state"] == "closed"
    run = run_tandem("record", "-o", str(tmp_path / "py"), "--", sys.executable, "-c",
                     "import os; print(os.environ['TANDEM_SESSION'])", env=env)
    assert run.stdout.strip() == str(tmp_path / "py")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_tandem_reaches_the_command_and_the_recording_closes(workload, tmp_path, signum):
    session = tmp_path / "s"
    env = jdk_env(default_java_home())
    # A new session: no terminal, so SIGINT is forwarded like SIGTERM (see launch.py).
    tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload", "wait"),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                              preexec_fn=default_sigint)
    try:
        assert tandem.stdout.readline().strip() == "ready"
        tandem.send_signal(signum)
        out, err = tandem.communicate(timeout=60)
    finally:
        tandem.kill()
        kill_session_processes(session)
    assert tandem.returncode == 128 + signum, err  # the JVM exits 128+N on SIGTERM/SIGINT
    jvm_dir = only_jvm_dir(session)
    assert read_json(jvm_dir / "jvm.json")["state"] == "closed", err
    counts = jfr_event_counts(default_java_home(), jvm_dir / "recording.jfr")
    assert counts.get("tandem.ClockSync", 0) >= 2


EMBEDDED_JVM_PROGRAM = """
import jpype
jpype.startJVM()
jpype.java.lang.System.gc()
print("embedded jvm ok")
"""


def test_python_program_with_an_embedded_jvm_is_captured_without_change(tmp_path):
    session = tmp_path / "s"
    program = tmp_path / "embedded.py"
    program.write_text(EMBEDDED_JVM_PROGRAM)
    env = jdk_env(default_java_home())
    run = run_tandem("record", "-o", str(session), "--", sys.executable, str(program), env=env)
    assert run.returncode == 0, run.stderr
    assert "embedded jvm ok" in run.stdout
    python_pid = read_json(session / "session.json")["pid"]
    jvm_dir = session / f"jvm-{python_pid}"  # the JVM lives inside the Python process
    assert read_json(jvm_dir / "jvm.json")["state"] == "closed", run.stderr
    counts = jfr_event_counts(default_java_home(), jvm_dir / "recording.jfr")
    assert counts.get("jdk.SafepointEnd", 0) > 0  # System.gc() is one
    assert counts.get("tandem.ClockSync", 0) >= 2


SLEEPER_PROGRAM = """
import threading, time

def sleeper():
    for _ in range(20):
        time.sleep(0.010)

thread = threading.Thread(target=sleeper, name="sleeper")
thread.start()
thread.join()
"""


def test_a_session_of_one_runtime_is_analyzed_alone(workload, tmp_path):
    """A JVM with no CPython (or a CPython that started no JVM) is a session too: `tandem
    analyze` gives that side's results against an empty other side, and says which side is missing."""
    from engine import load_results

    env = jdk_env(default_java_home())
    jvm_session, py_session = tmp_path / "jvm", tmp_path / "py"
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER_PROGRAM)
    for session, command in ((jvm_session, ["java", "-cp", str(workload), "Workload", "alloc", "0.3"]),
                             (py_session, [sys.executable, str(program)])):
        run = run_tandem("record", "-o", str(session), "--", *command, env=env)
        assert run.returncode == 0, run.stderr
        run = run_tandem("analyze", str(session), "-o", str(tmp_path / f"{session.name}-out"), env=env)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr

    header = " ".join(run_tandem("analyze", str(jvm_session), "-o", str(tmp_path / "jvm-out"), env=env).stdout.split())
    assert "Python pids none (no CPython recorded)" in header
    jvm = load_results(tmp_path / "jvm-out")
    counts = jfr_event_counts(default_java_home(), only_jvm_dir(jvm_session) / "recording.jfr")  # (the witness: jfr summary)
    kinds = jvm.pauses["kind"].value_counts()
    assert kinds.get("gc_pause", 0) == counts["jdk.GCPhasePause"] > 0
    assert kinds.get("gc", 0) == counts["jdk.GarbageCollection"]
    assert jvm.gil.empty and jvm.overlaps.empty and len(jvm.pause_impact) == len(jvm.pauses)

    header = " ".join(run_tandem("analyze", str(py_session), "-o", str(tmp_path / "py-out"), env=env).stdout.split())
    assert "JVM pids none (no JVM recorded)" in header and "no JVM pause in these inputs" in header
    py = load_results(tmp_path / "py-out")
    assert py.pauses.empty and py.overlaps.empty
    gil = py.gil
    sleeps = gil[(gil["thread_name"] == "sleeper") & (gil["state"] == "released")]
    # (the known workload: each 10 ms sleep releases the GIL for at least 10 ms; the main thread
    # waits in join meanwhile. tandem's own memory thread runs in the process too and takes the
    # GIL now and then: inside the sleeps the GIL is free but for the other threads' holds, each
    # the gap between two of that thread's intervals)
    long = sleeps[(sleeps["end_ns"] - sleeps["start_ns"]) >= 10_000_000]
    assert len(long) >= 20
    within = (long["start_ns"].to_numpy(np.int64), long["end_ns"].to_numpy(np.int64))
    holds = [(t["end_ns"].to_numpy(np.int64)[:-1], t["start_ns"].to_numpy(np.int64)[1:])
             for _, t in gil[gil["thread_name"] != "sleeper"].sort_values("start_ns").groupby(["pid", "tid"])]
    held = _covered(np.concatenate([h[0] for h in holds]), np.concatenate([h[1] for h in holds]), *within)
    free = _covered(py.gil_free["start_ns"].to_numpy(np.int64), py.gil_free["end_ns"].to_numpy(np.int64), *within)
    assert held < 0.05 * int((within[1] - within[0]).sum())  # (a sampler's brief holds, not a holder)
    assert free == int((within[1] - within[0]).sum()) - held


def _covered(start, end, within_start, within_end) -> int:
    """How much of the intervals (start, end) lies inside the disjoint intervals WITHIN."""
    overlap = np.minimum(end[:, None], within_end[None, :]) - np.maximum(start[:, None], within_start[None, :])
    return int(overlap.clip(0).sum())


@pytest.mark.parametrize("java_home", jdk_params())
def test_attach_records_a_running_jvm_for_a_duration(java_home, workload, tmp_path):
    env = jdk_env(java_home)
    target = subprocess.Popen([str(java_home / "bin" / "java"), "-cp", str(workload), "Workload", "wait"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        session = tmp_path / "s"
        run = run_tandem("attach", str(target.pid), "-o", str(session), "--duration", "2.5", env=env)
        assert run.returncode == 0, run.stderr
        jvm_dir = session / f"jvm-{target.pid}"
        description = read_json(jvm_dir / "jvm.json")
        assert description["mode"] == "agentmain" and description["state"] == "closed"
        assert description["duration_s"] == 2.5
        counts = jfr_event_counts(java_home, jvm_dir / "recording.jfr")
        assert counts.get("jdk.SafepointEnd", 0) > 0
        assert counts.get("tandem.ClockSync", 0) >= 3
        assert target.poll() is None  # the JVM runs on after the recording ended

        # A second session in the same JVM, this one until the JVM exits.
        again = tmp_path / "again"
        run = run_tandem("attach", str(target.pid), "-o", str(again), env=env)
        assert run.returncode == 0, run.stderr
        assert read_json(again / f"jvm-{target.pid}" / "jvm.json")["state"] == "recording"
        # One session per JVM at a time: the agent's reason reaches the user from the session.
        third = run_tandem("attach", str(target.pid), "-o", str(tmp_path / "third"), env=env)
        assert third.returncode == 2 and f"already recording into {again}" in third.stderr, third.stderr
        target.send_signal(signal.SIGTERM)
        target.wait(timeout=60)
        assert read_json(again / f"jvm-{target.pid}" / "jvm.json")["state"] == "closed"
    finally:
        target.kill()
        target.wait()


@pytest.mark.parametrize("args, message", [
    (["record", "-o", "{tmp}/s", "--", "no-such-command-tandem"], "no-such-command-tandem: command not found"),
    (["record", "-o", "{tmp}/s", "--event", "jdk.X#threshold", "--", "true"], "--event 'jdk.X#threshold'"),
    (["record", "-o", "{tmp}/s", "--settings", "{tmp}/missing.jfc", "--", "true"], "missing.jfc: settings file not found"),
    (["record", "-o", "{tmp}/a,b", "--", "true"], "must not contain ,"),
    (["record", "-o", "{tmp}/full", "--", "true"], "already exists and is not an empty directory"),
    (["attach", "999999999", "-o", "{tmp}/s"], "pid 999999999: no such process"),
    (["attach", "{not_a_jvm}", "-o", "{tmp}/s"], "not a JVM (no libjvm.so loaded) nor a CPython"),
])
def test_user_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    not_a_jvm = subprocess.Popen(["sleep", "60"])  # the Attach API's SIGQUIT would kill it
    try:
        args = [a.format(tmp=tmp_path, not_a_jvm=not_a_jvm.pid) for a in args]
        run = run_tandem(*args, env=jdk_env(default_java_home()))
        assert not_a_jvm.poll() is None
    finally:
        not_a_jvm.kill()
        not_a_jvm.wait()
    # (a command that cannot start: a shell's 127, as the same script would see without tandem)
    assert run.returncode == (127 if "command not found" in message else 2), run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("tandem: error: ") and message in lines[-1], run.stderr
    assert "Traceback" not in run.stderr
