"""`tandem attach PID` on a running CPython (issue 15): the probe injected through gdb,
started into a session, stopped after --duration; the target's output and exit code are
unchanged and no thread of ours is left in it. Refused clearly where ptrace is not allowed."""
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
from test_record_helpers import jdk_env, run_tandem

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")

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
    df = read_gil(session / f"py-{target.pid}")
    first, last = df.start_ns.min(), df.end_ns.max()
    found = json.loads(witness.read_text())
    during = [(b, a) for b, a in found["brackets"] if first <= b and a <= last]
    assert len(during) >= 50, len(during)
    released = df[(df.tid == found["tid"]) & (df.state == "released")]
    for b, a in during:  # each sleep after the attach: one released interval inside its bracket
        inside = released[(released.start_ns >= b) & (released.end_ns <= a)]
        assert len(inside[(inside.end_ns - inside.start_ns) >= 5_000_000]) == 1, (b, a, inside)


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
