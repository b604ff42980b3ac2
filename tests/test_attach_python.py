"""`tandem attach PID` on a running CPython: the probe injected by pyinjector (gdb when it
cannot), started into a session, stopped after --duration; the target's output and exit code
are unchanged and no thread of ours is left in it. Refused clearly where ptrace is not allowed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import default_java_home, python_params
from engine.ingest.gil import read_gil
from engine.record.attach_python import gdb_call_problem
from test_record_helpers import jdk_env, run_tandem

# Sleeps in brackets for SECONDS, then the witness to OUT; prints two lines, exits 3.
TARGET = r'''
import json, sys, threading, time
out, seconds = sys.argv[1], float(sys.argv[2])
print("target started", flush=True)
brackets, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    before = time.monotonic_ns()
    time.sleep(0.010)
    brackets.append((before, time.monotonic_ns()))
    sum(range(1000))
json.dump({"tid": threading.get_native_id(), "brackets": brackets}, open(out, "w"))
print("target done", flush=True)
sys.exit(3)
'''


def task_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            pass
    return names


@pytest.mark.parametrize("python", python_params())
def test_attach_records_a_running_cpython_and_leaves_it_unharmed(python, tmp_path):
    if python is None:
        pytest.skip("interpreter missing")
    script, witness = tmp_path / "target.py", tmp_path / "witness.json"
    script.write_text(TARGET)
    target = subprocess.Popen([str(python), str(script), str(witness), "25"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline() == "target started\n"
        before = sorted(task_names(target.pid))
        session = tmp_path / "S"
        run = run_tandem("attach", str(target.pid), "-o", str(session), "--duration", "3",
                         env=jdk_env(default_java_home()), timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        # the target sleeps in clock_nanosleep: a safe point for pyinjector, no gdb needed
        assert "probe injected through pyinjector, in thread" in " ".join(run.stderr.split()), run.stderr
        assert target.poll() is None  # still running
        time.sleep(0.5)  # the injected thread that ran stop() ends right after it
        assert sorted(task_names(target.pid)) == before, (before, task_names(target.pid))
        out, err = target.communicate(timeout=60)
    finally:
        target.kill()
    assert target.returncode == 3 and out == "target done\n", (out, err)
    assert "Traceback" not in err and "tandem" not in err, err
    meta = json.loads((session / f"py-{target.pid}" / "probe.json").read_text())
    assert meta["state"] == "closed" and meta["pid"] == target.pid
    assert not list(session.glob(".attach-*"))  # the two injected copies (start, stop) are gone
    df = read_gil(session / f"py-{target.pid}")
    first, last = df.start_ns.min(), df.end_ns.max()
    found = json.loads(witness.read_text())
    during = [(b, a) for b, a in found["brackets"] if first <= b and a <= last]
    assert len(during) >= 50, len(during)
    released = df[(df.tid == found["tid"]) & (df.state == "released")]
    for b, a in during:  # each sleep after the attach: one released interval inside its bracket
        inside = released[(released.start_ns >= b) & (released.end_ns <= a)]
        assert len(inside[(inside.end_ns - inside.start_ns) >= 5_000_000]) == 1, (b, a, inside)


# Never waits in a system call (one thread, computing until the file ARGV[1] exists): pyinjector finds no safe point.
BUSY_TARGET = r'''
import os, sys
print("busy started", flush=True)
while not os.path.exists(sys.argv[1]):
    [str(i) for i in range(100)]
print("busy done", flush=True)
sys.exit(4)
'''


def test_attach_falls_back_to_gdb_where_no_thread_waits_in_a_system_call(tmp_path):
    """A CPU-bound single-threaded CPython: pyinjector has no safe point, so tandem says so and
    injects through gdb at an allocator's entry; the probe records and the target is unharmed."""
    problem = gdb_call_problem()
    if problem:
        pytest.skip(f"gdb's inferior calls fail here: {problem}")
    script = tmp_path / "busy.py"
    script.write_text(BUSY_TARGET)
    done = tmp_path / "done"
    target = subprocess.Popen([sys.executable, str(script), str(done)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert target.stdout.readline() == "busy started\n"
        session = tmp_path / "S"
        run = run_tandem("attach", str(target.pid), "-o", str(session), "--duration", "1",
                         env=jdk_env(default_java_home()), timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        said = " ".join(run.stderr.split())
        assert f"probe injected through gdb, as no thread of pid {target.pid} waited in a system call" in said, said
        assert "Traceback" not in run.stderr
        assert target.poll() is None
        done.touch()
        out, err = target.communicate(timeout=60)
    finally:
        target.kill()
    assert target.returncode == 4 and out == "busy done\n" and err == "", (target.returncode, out, err)
    meta = json.loads((session / f"py-{target.pid}" / "probe.json").read_text())
    assert meta["state"] == "closed" and meta["pid"] == target.pid
    df = read_gil(session / f"py-{target.pid}")
    assert (df.tid == target.pid).any()  # the computing main thread, seen by the probe
    assert not list(session.glob(".attach-*"))  # the injected copies are gone


def _python_as_nobody() -> subprocess.Popen:
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-S",
                             "-c", code], stdout=subprocess.PIPE, text=True, cwd="/")
    assert proc.stdout.readline() == "up\n"
    return proc


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv")
                    or not Path("/usr/bin/python3").exists(),
                    reason="needs root, setpriv and /usr/bin/python3 to make a process tandem may not trace")
def test_attach_refuses_where_ptrace_is_not_permitted(tmp_path):
    """Another user's CPython, tandem running as root without CAP_SYS_PTRACE (as in a
    container): the kernel denies ptrace, tandem says so in one line naming the fix, no
    traceback, the target unharmed."""
    target = _python_as_nobody()
    try:
        env = jdk_env(default_java_home())
        tandem = [str(Path(sys.executable).parent / "tandem"), "attach", str(target.pid), "--duration", "1"]
        denied = subprocess.run(["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", *tandem, "-o",
                                 str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=120)
        assert denied.returncode != 0
        assert "ptrace is not permitted here" in denied.stderr and "SYS_PTRACE" in denied.stderr, denied.stderr
        assert "Traceback" not in denied.stderr
        assert target.poll() is None
    finally:
        target.kill()


def test_doctor_says_whether_attaching_to_a_running_cpython_works(tmp_path):
    """One line each: ptrace, the injector, gdb's inferior calls, the interpreter's symbols, and the verdict
    (here pyinjector is installed and root may ptrace, as the attach tests above show by doing it)."""
    run = run_tandem("doctor", env=dict(jdk_env(default_java_home()), COLUMNS="250"), timeout=180)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in run.stdout.splitlines()
            if line.count("│") == 3}
    assert rows["attach: pyinjector"].startswith("importable")
    assert rows["attach: interpreter symbols"].startswith("exported")
    problem = gdb_call_problem()
    assert rows["attach: gdb"].startswith("present, inferior calls work") if problem is None else problem in rows["attach: gdb"]
    if os.geteuid() == 0:
        assert rows["attach: ptrace"].startswith("allowed")
        assert rows["attach to a running CPython"] == "works here (through pyinjector)"
