"""`tandem record` probes every CPython its command starts (issue 15): other versions and
prefixes through the sitecustomize start hook, probes pre-built or built on first use,
multiprocessing workers (spawn, fork, forkserver), and interpreters that cannot be probed
named once. Real interpreters, real sessions; the witness of each GIL interval is the
monotonic_ns() bracket the workload took around its own sleep.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import default_java_home, python_params
from engine.ingest.gil import read_gil
from engine.ring.reader import read_events
from test_probe import MS, assert_matches_sleeps
from test_record_helpers import jdk_env, read_json, run_tandem

# Fifty 10 ms sleeps in the main thread, bracketed; the witness goes to OUT/<pid>.json.
SLEEPER = r'''
import json, os, sys, threading, time

def sleeps(out):
    brackets = []
    for _ in range(50):
        before = time.monotonic_ns()
        time.sleep(0.010)
        brackets.append((before, time.monotonic_ns()))
    with open(os.path.join(out, "%d.json" % os.getpid()), "w") as f:
        json.dump({"tid": threading.get_native_id(), "brackets": brackets, "version": sys.version.split()[0],
                   "probe": "engine.probe" in sys.modules}, f)
'''


def witnesses(out: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}


def assert_each_process_recorded_its_sleeps(session: Path, found: dict[int, dict]) -> None:
    """Every witness process has its own py-<pid>/ whose released intervals match its sleeps."""
    for pid, witness in found.items():
        assert (session / f"py-{pid}").is_dir(), (pid, sorted(p.name for p in session.iterdir()))
        df = read_gil(session / f"py-{pid}")
        first, last = witness["brackets"][0][0], witness["brackets"][-1][1]
        mine = df[(df.tid == witness["tid"]) & (df.state == "released") & (df.start_ns >= first) & (df.end_ns <= last)]
        assert_matches_sleeps(mine, witness["brackets"])


def other_pythons() -> list[Path]:
    return [p.values[0] for p in python_params() if p.values[0] is not None and Path(p.values[0]).resolve() != Path(sys.executable).resolve()]


@pytest.mark.parametrize("python", python_params())
def test_every_version_records_under_tandem_record(python, tmp_path):
    """A service on 3.11, 3.12 or 3.13 (outside tandem's venv) started by a shell script records
    its sleeps into its own py-<pid>/ with no change to it."""
    if python is None:
        pytest.skip("interpreter missing")
    out = tmp_path / "out"
    out.mkdir()
    service = tmp_path / "service.py"
    service.write_text(SLEEPER + "sleeps(sys.argv[1])\n")
    script = tmp_path / "run-service.sh"
    script.write_text(f"#!/bin/sh\nexec {python} {service} {out}\n")
    script.chmod(0o755)
    run = run_tandem("record", "-o", str(tmp_path / "s"), "--python", str(python), "--", str(script),
                     env=jdk_env(default_java_home()), timeout=300)
    assert run.returncode == 0, run.stderr
    found = witnesses(out)
    assert len(found) == 1 and next(iter(found.values()))["probe"]
    assert_each_process_recorded_its_sleeps(tmp_path / "s", found)
    assert not (tmp_path / "s" / "unprobed").exists()


def test_an_interpreter_nobody_named_builds_its_probe_on_first_use(tmp_path):
    """With an empty cache and the interpreter neither tandem's nor on PATH nor --python, the
    first start builds its probe (once, for all its processes) and records; the next session
    finds it built."""
    pythons = other_pythons()
    if not pythons:
        pytest.skip("no interpreter other than tandem's here")
    python = pythons[-1]
    out = tmp_path / "out"
    out.mkdir()
    service = tmp_path / "service.py"
    service.write_text(SLEEPER + "import subprocess\n"
                       "if len(sys.argv) > 2:\n"
                       "    procs = [subprocess.Popen([sys.executable, __file__, sys.argv[1]]) for _ in range(2)]\n"
                       "    sys.exit(sum(p.wait() for p in procs))\n"
                       "sleeps(sys.argv[1])\n")
    env = jdk_env(default_java_home(), TANDEM_CACHE=str(tmp_path / "cache"))
    run = run_tandem("record", "-o", str(tmp_path / "s"), "--", str(python), str(service), str(out), "parent",
                     env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert_each_process_recorded_its_sleeps(tmp_path / "s", witnesses(out))
    assert len(witnesses(out)) == 2
    built = [p for p in (tmp_path / "cache" / "probe").iterdir() if p.is_dir() and p.name.startswith(f"py{witnesses(out).popitem()[1]['version']}")]
    assert len(built) == 1, built


def test_an_interpreter_that_cannot_be_probed_is_named_once_and_runs_on(tmp_path):
    """No compiler on the service's PATH and no probe built for its interpreter: its three
    processes run unharmed, exit code passed through, and the session names it once with the
    reason."""
    pythons = other_pythons()
    if not pythons:
        pytest.skip("no interpreter other than tandem's here")
    python = pythons[-1]
    code = ("import subprocess, sys\n"
            "for _ in range(3):\n"
            "    subprocess.run([sys.executable, '-c', 'print(\"worker ran\")'], check=True)\n"
            "sys.exit(7)\n")
    env = jdk_env(default_java_home(), TANDEM_CACHE=str(tmp_path / "cache"))
    env["PATH"] = str(tmp_path / "empty")  # no gcc
    run = run_tandem("record", "-o", str(tmp_path / "s"), "--", str(python), "-c", code, env=env, timeout=300)
    assert run.returncode == 7, run.stderr
    assert run.stdout.count("worker ran") == 3
    named = [json.loads(p.read_text()) for p in (tmp_path / "s" / "unprobed").glob("*.json")]
    assert len(named) == 1, named
    assert "no C compiler" in named[0]["reason"]
    assert run.stderr.count("no C compiler") == 2  # the process's own line, and the record summary's
    assert not list((tmp_path / "s").glob("py-*"))


MULTIPROCESSING = SLEEPER + r'''
import multiprocessing

if __name__ == "__main__":
    out, method = sys.argv[1], sys.argv[2]
    ctx = multiprocessing.get_context(method)
    workers = [ctx.Process(target=sleeps, args=(out,)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sys.exit(max(w.exitcode for w in workers))
'''


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_multiprocessing_workers_each_record(method, tmp_path):
    """Each multiprocessing worker (spawn, fork, forkserver) records into its own py-<pid>/.
    A fork worker ends with os._exit: its probe.json is still closed and counts every event,
    and its threads.jsonl names its own main thread, not its parent's."""
    pythons = other_pythons()
    python = pythons[-1] if pythons else Path(sys.executable)
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "mp.py"
    script.write_text(MULTIPROCESSING)
    session = tmp_path / "s"
    run = run_tandem("record", "-o", str(session), "--", str(python), str(script), str(out), method,
                     env=jdk_env(default_java_home()), timeout=300)
    assert run.returncode == 0, run.stderr
    found = witnesses(out)
    assert len(found) == 2
    assert_each_process_recorded_its_sleeps(session, found)
    for pid, witness in found.items():
        meta = read_json(session / f"py-{pid}" / "probe.json")
        assert meta["state"] == "closed" and meta["pid"] == pid
        events = read_events(session / f"py-{pid}" / "gil.events")
        assert events.closed and meta["events"] == events.produced > 0
        names = {json.loads(line)["tid"]: json.loads(line)["name"]
                 for line in (session / f"py-{pid}" / "threads.jsonl").read_text().splitlines()}
        assert names.get(witness["tid"]) == "MainThread", names
        other_processes = {int(p.name[3:]) for p in session.glob("py-*")} - {pid}
        assert not set(names) & other_processes, names


VENV_SITE = Path(sysconfig.get_paths()["purelib"])
JEP_JAR = next(iter(sorted((VENV_SITE / "jep").glob("jep-*.jar"))), None)


def run_jep_service(tmp_path: Path, kind: str) -> tuple[Path, dict]:
    """tests/jep_service/Service.java set up as Jep's users do (no change for tandem): the
    interpreter is the venv's base (another prefix: tandem's .pth is not read), found through
    LD_LIBRARY_PATH, Jep through java.library.path, packages through PYTHONPATH."""
    classes = tmp_path / "classes"
    subprocess.run(["javac", "--release", "17", "-cp", str(JEP_JAR), "-d", str(classes),
                    str(Path(__file__).parent / "jep_service" / "Service.java")], check=True)
    libdir = sysconfig.get_config_var("LIBDIR")
    script = tmp_path / "run-service.sh"
    script.write_text("#!/bin/sh\n"
                      f"export PYTHONPATH={VENV_SITE}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                      f"export LD_LIBRARY_PATH={libdir}\n"
                      f"exec java -Djava.library.path={VENV_SITE / 'jep'} -cp {JEP_JAR}:{classes} Service \"$@\"\n")
    script.chmod(0o755)
    session = tmp_path / "S"
    run = run_tandem("record", "-o", str(session), "--", str(script), kind, env=jdk_env(default_java_home()), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return session, json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(JEP_JAR is None or not sysconfig.get_config_var("Py_ENABLE_SHARED"),
                    reason="jep is not installed in the venv, or its Python has no libpython to embed")
@pytest.mark.parametrize("kind", ["shared", "sub"])
def test_jep_service_records_every_python_thread(kind, tmp_path):
    """Three Java threads run Python through Jep (SharedInterpreter / SubInterpreter), a Java
    timer forces GCs: every thread's fifty 10 ms sleeps are released intervals inside their own
    brackets, and every forced GC overlaps a Python thread that had released or was waiting
    for the GIL (tandem analyze's join)."""
    import engine

    session, out = run_jep_service(tmp_path, kind)
    assert len(out["workers"]) == 3
    pythons = list(session.glob("py-*"))
    assert len(pythons) == 1 and (session / f"jvm-{pythons[0].name[3:]}").is_dir()  # one process: the JVM
    analysis = engine.analyze(session)
    gil = analysis.gil
    for worker in out["workers"]:
        # Three threads share one GIL on two cores with the GC's workers: a sleeper may wait
        # for the GIL, or for a CPU, inside its bracket; time.sleep's deadline is taken before
        # it releases the GIL, so a thread preempted in between releases for less than 10 ms.
        # Each sleep is one long released interval inside its own bracket, ending at least
        # 10 ms after the bracket starts, 50 of 50.
        assert_one_release_per_sleep(gil, worker["tid"], worker["brackets"])
    assert_forced_gcs_overlap_python(analysis, out["workers"], out["gcs"])


def assert_one_release_per_sleep(gil, tid: int, brackets) -> None:
    """Each sleep is one long released interval of TID inside its own bracket, ending at
    least 10 ms after the bracket starts, for every sleep. Threads sharing one GIL on two
    cores may wait for the GIL, or for a CPU, inside a bracket; time.sleep's deadline is
    taken before it releases the GIL, so a thread preempted in between releases for less
    than 10 ms (assert_matches_sleeps is the stricter check for a thread alone)."""
    released = gil[(gil.tid == tid) & (gil.state == "released")]
    for before, after in brackets:
        inside = released[(released.start_ns >= before) & (released.end_ns <= after)]
        long = inside[(inside.end_ns - inside.start_ns) >= 5 * MS]
        assert len(long) == 1 and long.end_ns.iloc[0] - before >= 10 * MS, (before, after, inside)


def assert_forced_gcs_overlap_python(analysis, workers: list[dict], gcs) -> None:
    """Every System.gc() made while all WORKERS ran Python is one GC pause in its nanoTime
    bracket that overlaps a worker which had released or was waiting for the GIL."""
    pauses, overlaps = analysis.pauses, analysis.overlaps
    running = (max(w["brackets"][0][0] for w in workers), min(w["brackets"][-1][1] for w in workers))
    gcs = [(before, after) for before, after in gcs if running[0] <= before and after <= running[1]]
    assert len(gcs) >= 2, (running, gcs)
    for before, after in gcs:
        forced = pauses[(pauses.kind == "gc_pause") & (pauses.start_ns >= before) & (pauses.end_ns <= after)]
        assert len(forced) == 1, (before, after)
        hit = overlaps[(overlaps.pause_id == forced.pause_id.iloc[0]) & overlaps.state.isin(["released", "waiting"])
                       & (overlaps.overlap_ns > 0)]
        assert set(hit.tid) & {w["tid"] for w in workers}, forced


def test_pyspark_shaped_process_tree_records_every_forked_worker(tmp_path):
    """A JVM starts `python3 -m worker_daemon` (python3 on PATH: not tandem's venv), which
    forks a long-lived child per task, as PySpark's daemon does; the children end with
    os._exit. Every child has its own py-<pid>/ with its sleeps, closed and counted;
    `tandem analyze SESSION` correlates them with the JVM's forced GCs."""
    import engine

    shape = Path(__file__).parent / "pyspark_shape"
    classes = tmp_path / "classes"
    subprocess.run(["javac", "--release", "17", "-d", str(classes), str(shape / "Driver.java")], check=True)
    out = tmp_path / "out"
    out.mkdir()
    session = tmp_path / "S"
    env = jdk_env(default_java_home(), PYTHONPATH=str(shape))
    run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(classes), "Driver", "python3", str(out), "3",
                     env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    driver = json.loads(run.stdout.strip().splitlines()[-1])
    assert driver["daemon_exit"] == 0
    children = witnesses(out)
    assert len(children) == 3
    python_dirs = {int(p.name[3:]) for p in session.glob("py-*")}
    assert set(children) < python_dirs and len(python_dirs) == 4  # the daemon and its three children
    analysis = engine.analyze(session)
    for pid, child in children.items():
        meta = read_json(session / f"py-{pid}" / "probe.json")
        assert meta["state"] == "closed" and meta["events"] == read_events(session / f"py-{pid}" / "gil.events").produced
        assert_one_release_per_sleep(analysis.gil[analysis.gil.pid == pid], child["tid"], child["brackets"])
    assert_forced_gcs_overlap_python(analysis, list(children.values()), driver["gcs"])
    report = run_tandem("analyze", str(session), "-o", str(tmp_path / "OUT"), env=env, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]


def test_summary_reads_on_when_files_vanish(tmp_path):
    """What `tandem record` prints after the command: files that go away between listing and
    reading (a short-lived JVM's repository deleted at its exit) are named in one line, the
    rest is summed up, nothing raises."""
    from rich.console import Console

    from engine.record import summary

    session = tmp_path / "S"
    run = run_tandem("record", "-o", str(session), "--", "java", "-XX:StartFlightRecording:filename=" + str(tmp_path / "x.jfr"),
                     "-version", env=jdk_env(default_java_home()), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    run = run_tandem("record", "-o", str(tmp_path / "S2"), "--", sys.executable, "-c", "pass", env=jdk_env(default_java_home()))
    captures = summary.collect(session, None) + summary.collect(tmp_path / "S2", None)
    files = [f for c in captures for f in c.files]
    assert files
    for file in files[::2]:
        file.unlink()
    console = Console(record=True, width=300)
    summary.print_summary(console, session, [c for c in captures if c.directory.parent == session])
    summary.print_summary(console, tmp_path / "S2", [c for c in captures if c.directory.parent == tmp_path / "S2"])
    text = console.export_text()
    assert text.count("went away before they could be read") == 2, text
    assert all(f.name in text for f in files[::2])


def test_a_python_process_that_execs_python_keeps_both_recordings(tmp_path):
    """A pid comes round again in one session: here a Python process exec()s Python (the same
    pid; a long session's forked workers meet it as pids wrap). The second image records into
    py-<pid>.2/, not over the first's files: both images' fifty 10 ms sleeps are found, each in
    its own directory (the first, never closed, from its events file and ring)."""
    out = tmp_path / "out"
    out.mkdir()
    first = SLEEPER + (f"sleeps({str(out / 'first')!r})\n"
                       "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])\n")
    second = SLEEPER + f"sleeps({str(out)!r})\n"
    (out / "first").mkdir()
    session = tmp_path / "S"
    run = run_tandem("record", "-o", str(session), "--", sys.executable, "-c", first, second,
                     env=jdk_env(default_java_home()), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (pid, witness), = witnesses(out).items()
    (same_pid, earlier), = witnesses(out / "first").items()
    assert pid == same_pid and sorted(p.name for p in session.glob("py-*")) == [f"py-{pid}", f"py-{pid}.2"]
    for directory, seen in ((session / f"py-{pid}", earlier), (session / f"py-{pid}.2", witness)):
        df = read_gil(directory)
        first_at, last_at = seen["brackets"][0][0], seen["brackets"][-1][1]
        mine = df[(df.tid == seen["tid"]) & (df.state == "released") & (df.start_ns >= first_at) & (df.end_ns <= last_at)]
        assert_matches_sleeps(mine, seen["brackets"])


def test_summary_folds_many_python_processes_into_one_row(tmp_path):
    """A session of many Python processes (a Spark executor's workers) gets a row for each JVM
    and the PYTHON_ROWS largest Python processes, one row for the rest, and every problem
    still named."""
    from rich.console import Console

    from engine.record import summary

    captures = []
    for k in range(summary.PYTHON_ROWS + 10):
        directory = tmp_path / f"py-{1000 + k}"
        directory.mkdir()
        (directory / "gil.events").write_bytes(b"x" * (100 + k))
        captures.append(summary.ProcessCapture("python", directory, {}, [directory / "gil.events"],
                                               problem="exited without closing its ring" if k == 0 else None))
    console = Console(record=True, width=200)
    summary.print_summary(console, tmp_path, captures)
    text = console.export_text()
    rows = [line for line in text.splitlines() if line.startswith("│ py-")]
    assert len(rows) == summary.PYTHON_ROWS and "│ py-1029 " in text and "│ py-1000 " not in text
    assert "│ 10 more " in text and "10 files of 10 more Python processes (py-1000 ... py-1009)" in text
    assert "py-1000: exited without closing its ring" in text


def test_doctor_lists_the_interpreters_it_will_probe(tmp_path):
    """`tandem doctor` names each python3* on PATH with whether and how it will be probed:
    one with its probe built says so; one without a compiler to build it says why not."""
    pythons = other_pythons()
    if not pythons:
        pytest.skip("no interpreter other than tandem's here")
    python = Path(pythons[-1])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / python.name).symlink_to(python)
    env = jdk_env(default_java_home(), COLUMNS="400", TANDEM_CACHE=str(tmp_path / "cache"))
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(env['JAVA_HOME']) / 'bin'}"  # no gcc on PATH
    run = run_tandem("doctor", env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if str(bin_dir / python.name) in line)
    assert "not probed" in line and "no C compiler" in line, line
    from engine.probe.build import build_probe

    build_probe(python, tmp_path / "cache")
    run = run_tandem("doctor", env=env, timeout=120)
    line = next(line for line in run.stdout.splitlines() if str(bin_dir / python.name) in line)
    assert "probed: Python" in line and "probe built" in line, line
