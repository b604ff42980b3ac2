"""The fault matrix: real processes, real signals, real full and vanishing disks.

In each case: the service is never harmed (it finishes its work and writes its marker), the
exit code `tandem record` returns is the service's, nothing already written is lost or left
half-written under a name a reader takes for whole, every loss is counted and reported
once, in one line, and a re-run (`tandem analyze`) completes.

Cases elsewhere: a recorded JVM killed with SIGKILL (tests/test_ingest_killed.py: the
unfinished chunk read to its last flush, the loss bounded and said in one warning).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import default_java_home
from test_record_helpers import compile_workload, jdk_env, read_json, tandem_argv, wait_for

# A Python service: with JVM=1 the demo's hybrid service (JPype JVM, request threads) for
# SECONDS, else THREADS threads handing the GIL over often; then a marker, then exit EXIT.
SERVICE = """
import pathlib, sys, threading, time
seconds, marker, code, threads, with_jvm = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
def work():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0)
        sum(range(200))
if with_jvm:
    from engine.demo import workload
    workload.main(["--seconds", str(seconds), "--gc-period", "0.5"])
else:
    ts = [threading.Thread(target=work) for _ in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
print("served", flush=True)
pathlib.Path(marker).write_text("done")
sys.exit(code)
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("service") / "service.py"
    path.write_text(SERVICE)
    return path


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


def env() -> dict[str, str]:
    return jdk_env(default_java_home())


def service_argv(service: Path, marker: Path, seconds: float, code: int = 0, threads: int = 2, jvm: bool = True) -> list[str]:
    return [sys.executable, str(service), str(seconds), str(marker), str(code), str(threads), "1" if jvm else "0"]


def jfr_flushed(session: Path) -> bool:
    """The JVM's repository chunk was flushed at least once (header generation >= 2): a JVM
    killed before that has no readable event, which test_ingest_killed covers."""
    from engine.clock.chunks import FILE_STATE_OFFSET, FILE_STATE_UPDATING

    for chunk in session.glob("jvm-*/repository/*/*.jfr"):
        head = chunk.read_bytes()[:FILE_STATE_OFFSET + 1]
        if len(head) > FILE_STATE_OFFSET and FILE_STATE_UPDATING > head[FILE_STATE_OFFSET] >= 2:
            return True
    return False


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


def analyze(session: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    run = subprocess.run(tandem_argv("analyze", str(session), "-o", str(out), *options), env=env(), capture_output=True,
                         text=True, timeout=240)
    no_traceback(run.stderr)
    return run


def readable_results(out: Path) -> list[str]:
    """Every .parquet name under OUT reads whole; returns the names."""
    names = []
    for path in sorted(out.rglob("*.parquet")):
        pq.read_table(path)  # raises on a half-written file
        names.append(path.name)
    return names


@contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of `size` at `path` (root only)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


# ---------------------------------------------------------------- SIGKILL


def test_sigkill_of_tandem_record_leaves_the_service_running(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 3)),
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(session.glob("py-*/gil.events")), 30, "the probe's events file")
    time.sleep(random.Random(1).uniform(0.2, 1.0))
    tandem.kill()
    tandem.wait()
    wait_for(marker.exists, 60, "the service to finish its work")  # the service ran on, to its end
    py_dir = next(session.glob("py-*"))
    wait_for(lambda: not Path(f"/proc/{py_dir.name[3:]}").exists(), 30, "the service to exit")
    description = read_json(session / "session.json")  # whole (written by rename), without an end
    assert "exit_code" not in description
    out = tmp_path / "out"
    run = analyze(session, out, "--reference-gil")
    assert run.returncode == 0, run.stderr
    assert {"pauses.parquet", "overlaps.parquet"} <= set(readable_results(out))
    from engine.analysis import load_results

    assert len(load_results(out).gil) > 0  # (read from the session's events file, which the results name)
    assert not (out / "gil.parquet").exists()  # (the service closed its events file: it can be named)
    assert "dropped events 0" in run.stdout + run.stderr


def test_sigkill_of_the_recorded_python_is_its_exit_code_and_its_ring_is_read(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 30)),
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(session.glob("py-*/gil.events")) and jfr_flushed(session), 60, "the probe and a JFR flush")
    time.sleep(random.Random(2).uniform(0.3, 1.5))
    pid = int(next(session.glob("py-*")).name[3:])
    os.kill(pid, signal.SIGKILL)
    _, err = tandem.communicate(timeout=60)
    no_traceback(err)
    assert tandem.returncode == 128 + signal.SIGKILL
    assert read_json(session / "session.json")["exit_code"] == 128 + signal.SIGKILL
    out = tmp_path / "out"
    run = analyze(session, out, "--reference-gil")
    assert run.returncode == 0, run.stderr
    from engine.analysis import load_results

    assert len(load_results(out).gil) > 0
    assert (out / "gil.parquet").exists()  # its events file never closed (it could grow): copied, not named


def test_sigkill_of_tandem_analyze_mid_write_leaves_no_half_file(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    run = subprocess.run(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 2, threads=3)),
                         env=env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    reference = tmp_path / "reference"
    assert analyze(session, reference).returncode == 0
    expected = readable_results(reference)
    out = tmp_path / "out"
    rng = random.Random(3)
    for _ in range(4):
        proc = subprocess.Popen(tandem_argv("analyze", str(session), "-o", str(out)), env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 4.0))
        proc.kill()
        proc.wait()
        names = readable_results(out)  # what is there under a final name is whole
        assert set(names) <= set(expected)
        for leftover in out.glob("*"):
            assert leftover.suffix == ".parquet" or leftover.name.endswith(".tmp") or leftover.is_dir(), leftover
    rerun = analyze(session, out)
    assert rerun.returncode == 0, rerun.stderr
    assert readable_results(out) == expected
    assert not list(out.glob("*.tmp")) and not list(out.glob(".staging.*"))  # (the killed runs' files gone too)


@pytest.mark.slow
def test_sigkill_of_tandem_live_leaves_finished_parts_whole(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    live = subprocess.Popen(tandem_argv("live", "--session", str(session), "--roll", "1s", "--",
                                        *service_argv(service, marker, 6)),
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list(session.glob("live/part-*/_done.json"))) >= 2, 90, "two finished live parts")
    live.kill()
    live.wait()
    wait_for(marker.exists, 60, "the service to finish its work")
    for part in session.glob("live/part-*"):
        if (part / "_done.json").exists():
            json.loads((part / "_done.json").read_text())
            assert readable_results(part)
    pid = next(session.glob("py-*")).name[3:]
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "the service to exit")
    run = analyze(session, tmp_path / "out")
    assert run.returncode == 0, run.stderr


# SIGKILL of tandem at random moments of a service's life (start-up, the JVM starting, mid-run,
# the end): TANDEM_FAULT_MOMENTS per command (20 for the bar; the suite runs 1),
# TANDEM_FAULT_SEED to replay a failure.
FAULT_MOMENTS = int(os.environ.get("TANDEM_FAULT_MOMENTS", "1"))
FAULT_SEED = int(os.environ.get("TANDEM_FAULT_SEED", str(random.SystemRandom().randrange(1 << 30))))
FAULT_COMMANDS = {
    "record": ("record", "-o", "{session}"),
    "record-flight-recorder": ("record", "--max-size", "200M", "--max-age", "10m", "-o", "{session}"),
    "live": ("live", "--session", "{session}", "--roll", "1s"),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(FAULT_COMMANDS))
def test_sigkill_of_tandem_at_random_moments_harms_neither_the_service_nor_the_session(command, service, tmp_path):
    """For each moment: the service (the demo's hybrid service, JPype in CPython) runs to its own
    exit code with its own output, and the session as the kill left it is analyzable, or (killed
    before it was made) refused in one line."""
    rng = random.Random(f"{FAULT_SEED} {command}")
    for k in range(FAULT_MOMENTS):
        moment = rng.uniform(0.0, 7.0)
        where = f"{command} killed {moment:.2f} s after its start (TANDEM_FAULT_SEED={FAULT_SEED}, moment {k + 1})"
        session, marker = tmp_path / f"s{k}", tmp_path / f"done{k}"
        started, status = tmp_path / f"started{k}", tmp_path / f"status{k}"
        wrapped = ["sh", "-c", f'touch {started}; "$@"; echo $? > {status}', "sh", *service_argv(service, marker, 4, code=3)]
        argv = [a.format(session=session) for a in FAULT_COMMANDS[command]]
        tandem = subprocess.Popen(tandem_argv(*argv, "--", *wrapped), env=env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        time.sleep(moment)
        tandem.kill()
        tandem.wait()
        output = tandem.stdout.read()  # (the service writes to this pipe: its end comes when the service exits)
        if not started.exists():  # killed before it ran the command: no service to harm, no session to read
            assert not any(session.glob("py-*")), where
            continue
        wait_for(status.exists, 90, f"the service to exit: {where}")
        assert status.read_text().strip() == "3" and marker.exists(), where
        assert output.count("served") == 1, f"{where}: {output!r}"
        out = tmp_path / f"out{k}"
        run = analyze(session, out)
        if (session / "session.json").exists() and any(session.glob("py-*/probe.json")):
            assert run.returncode == 0, f"{where}: {run.stderr}"
            assert {"pauses.parquet", "overlaps.parquet"} <= set(readable_results(out)), where
        elif run.returncode != 0:  # (killed before the session had a probed interpreter)
            assert len(run.stderr.strip().splitlines()) == 1, f"{where}: {run.stderr}"


# ---------------------------------------------------------------- the session's disk


@needs_root
def test_full_disk_at_ring_creation_is_said_once_and_the_service_runs(service, tmp_path):
    with small_disk(tmp_path / "disk", "4m") as disk:
        session, marker = disk / "s", tmp_path / "done"
        run = subprocess.run(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 0.5, code=3, jvm=False)),
                             env=env(), capture_output=True, text=True, timeout=120)
        no_traceback(run.stderr)
        assert run.returncode == 3 and marker.exists()
        # The probe's one line (the service's stderr), repeated only in tandem's summary of that process.
        lines = run.stderr.splitlines()
        assert sum(line.startswith("tandem: GIL probe not started") for line in lines) == 1, run.stderr
        assert sum("No space left on device" in line for line in lines if line.startswith("tandem:")) == 1, run.stderr


@needs_root
@pytest.mark.slow
def test_full_disk_for_the_events_file_is_counted_and_reported(service, workload, tmp_path):
    """The ring (32 MiB) fits, the events file fills the rest: what the drain could not
    write is counted in the file (drain_lost) and reported by `tandem analyze` beside dropped."""
    from engine.ring.reader import read_events

    with small_disk(tmp_path / "disk", "33m") as disk:
        session, marker = disk / "s", tmp_path / "done"
        run = subprocess.run(tandem_argv("record", "-o", str(session), "--",
                                         *service_argv(service, marker, 6, code=0, threads=4, jvm=False)),
                             env=env(), capture_output=True, text=True, timeout=180)
        no_traceback(run.stderr)
        assert run.returncode == 0 and marker.exists(), run.stderr
        events = next(session.glob("py-*/gil.events"))
        header = read_events(events).header
        assert header.drain_lost > 0, "the disk did not fill: make the service busier"
        # Any JVM recording of this boot to join with (the service ran no JVM).
        jvm_session = tmp_path / "jvm"
        made = subprocess.run(tandem_argv("record", "-o", str(jvm_session), "--", "java", "-cp", str(workload), "Workload",
                                          "alloc", "0.5"), env=env(), capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        run = subprocess.run(tandem_argv("analyze", "--jfr", str(next(jvm_session.glob("jvm-*/recording.jfr"))),
                                         "--gil", str(events), "-o", str(tmp_path / "out")),
                             env=env(), capture_output=True, text=True, timeout=180)
        no_traceback(run.stderr)
        assert run.returncode == 0, run.stderr
        printed = run.stdout + run.stderr
        assert f"+{header.drain_lost} not written" in printed, printed
        assert printed.count("not written") == 1
        from engine.store import read_table

        analysis = read_table(tmp_path / "out" / "overlaps.parquet").attrs["analysis"]
        assert analysis["drain_lost_events"] == header.drain_lost


@needs_root
def test_full_disk_for_the_jfr_repository_never_stops_the_jvm(workload, tmp_path):
    """JFR stops the whole JVM when it cannot write a chunk ("An irrecoverable error in Jfr.
    Shutting down VM..."): the agent does not start on a disk with less than its reserve."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        session = disk / "s"
        run = subprocess.run(tandem_argv("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload",
                                         "alloc", "1", "5"),
                             env=env(), capture_output=True, text=True, timeout=180)
        no_traceback(run.stderr)
        assert run.returncode == 5, run.stderr  # the JVM ran to its own System.exit(5)
        # The agent's one line (the JVM's stderr), repeated only in the summary's row for that JVM.
        lines = run.stderr.splitlines()
        assert sum(line.startswith("tandem-agent: not recording: only") for line in lines) == 1, run.stderr
        assert "irrecoverable" not in run.stderr


@needs_root
@pytest.mark.slow
def test_disk_filling_up_during_a_recording_stops_it_not_the_jvm(workload, tmp_path):
    """The disk fills while the JVM records: the agent stops recording below its reserve (one
    line, jvm.json "stopped"); the JVM runs on to its own exit code; what was recorded reads."""
    with small_disk(tmp_path / "disk", "48m") as disk:
        session = disk / "s"
        tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload",
                                              "alloc", "6", "5"),
                                  env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: jfr_flushed(session), 60, "a JFR flush")
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(disk / "filler", "wb") as filler:  # leave 4 MiB
            filler.write(bytes(free - (4 << 20)))
        _, err = tandem.communicate(timeout=120)
        no_traceback(err)
        assert tandem.returncode == 5, err
        assert sum(line.startswith("tandem-agent: recording stopped: the session's disk is nearly full")
                   for line in err.splitlines()) == 1, err
        assert "irrecoverable" not in err
        jvm = read_json(next(session.glob("jvm-*/jvm.json")))
        assert jvm["state"] == "stopped" and "nearly full" in jvm["stop_reason"]
        (disk / "filler").unlink()
        from engine.ingest.jfr import read_pauses
        from engine.session import Session

        jvms = Session.open(session).jvms  # the chunks the agent kept (.chunks/), finished in place
        assert len(jvms) == 1 and all(p.parent.name == ".chunks" for p in jvms[0].recordings)
        assert len(read_pauses(jvms[0].recordings)) > 0


@needs_root
def test_full_disk_for_the_results_is_one_line_and_keeps_the_results_there(service, tmp_path):
    """`tandem analyze` into a disk that fills: one line naming OUT and the reason, exit 2, no
    temporary file left, and the results already in OUT (a run without the GIL copy) unchanged:
    none of the new run's files replaced one of them (they are published together)."""
    session, marker = tmp_path / "s", tmp_path / "done"
    run = subprocess.run(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 2, threads=3)),
                         env=env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    size = lambda out: sum(p.stat().st_size for p in out.iterdir())  # noqa: E731
    assert analyze(session, tmp_path / "lean", "--reference-gil").returncode == 0
    assert analyze(session, tmp_path / "full").returncode == 0
    lean, full = size(tmp_path / "lean"), size(tmp_path / "full")
    assert full > 192 << 10, "the results are too small to fill a disk reliably: make the service busier"
    # room for the results there and a third of a run's: the second run's files fill it
    with small_disk(tmp_path / "disk", str(lean + full // 3 + (64 << 10))) as disk:
        out = disk / "out"
        assert analyze(session, out, "--reference-gil").returncode == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        failed = analyze(session, out)
        assert failed.returncode == 2, failed.stderr
        errors = [line for line in failed.stderr.splitlines() if line.startswith("tandem: error:")]
        assert errors == [f"tandem: error: {out}: No space left on device (writing the results)"], failed.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing replaced, nothing left behind
        # The Perfetto export of those results onto what room is left: one line too, no half trace.
        stat = os.statvfs(disk)
        (disk / "filler").write_bytes(bytes(max(0, stat.f_bavail * stat.f_frsize - (16 << 10))))
        export = subprocess.run(tandem_argv("export", "perfetto", str(out), "-o", str(disk / "trace.pftrace")), env=env(),
                                capture_output=True, text=True, timeout=240)
        no_traceback(export.stderr)
        errors = [line for line in export.stderr.splitlines() if line.startswith("tandem: error:")]
        assert export.returncode == 2 and len(errors) == 1, export.stderr
        assert errors[0].startswith(f"tandem: error: {disk / 'trace.pftrace'}: "), export.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "out"]
        # `tandem pauses` of the session's recording onto it, filled to the last block: one line naming the table
        (disk / "p").mkdir()
        with open(disk / "filler", "ab", buffering=0) as filler, pytest.raises(OSError):
            while True:
                filler.write(bytes(4096))
        recording = next(session.glob("jvm-*/*.jfr"))
        pauses = subprocess.run(tandem_argv("pauses", str(recording), "-o", str(disk / "p")), env=env(),
                                capture_output=True, text=True, timeout=240)
        no_traceback(pauses.stderr)
        errors = [line for line in pauses.stderr.splitlines() if line.startswith("tandem: error:")]
        assert pauses.returncode == 2 and errors == [
            f"tandem: error: {disk / 'p' / 'pauses.parquet'}: No space left on device (writing the pauses table)"], pauses.stderr
        assert not any((disk / "p").iterdir())


@needs_root
def test_full_disk_for_the_live_parts_is_one_line_and_the_session_whole(service, tmp_path):
    """`tandem live -- COMMAND` whose parts' disk fills: the service runs to its end and its exit
    code is tandem's, one line says where and why the parts stopped, every part left is whole
    (none with some of its tables), and the session (on another disk) analyzes."""
    session, marker = tmp_path / "s", tmp_path / "done"
    with small_disk(tmp_path / "disk", "160k") as disk:
        parts = disk / "parts"
        run = subprocess.run(tandem_argv("live", "--session", str(session), "-o", str(parts), "--roll", "1s", "--",
                                         *service_argv(service, marker, 6, code=3)),
                             env=env(), capture_output=True, text=True, timeout=180)
        no_traceback(run.stderr)
        assert run.returncode == 3 and marker.exists(), run.stderr
        said = " ".join(run.stderr.split())  # (rich folds long lines)
        assert said.count("tandem: live parts stopped:") == 1, run.stderr
        assert f"live parts stopped: {parts}: No space left on device (writing the live parts)" in said, run.stderr
        for part in parts.glob("part-*"):
            assert (part / "_done.json").exists(), sorted(p.name for p in part.iterdir())
            assert readable_results(part)
    assert analyze(session, tmp_path / "out").returncode == 0


def test_a_python_write_onto_a_full_device_names_what_was_written(tmp_path):
    """Python's own writes to an open file (a JSON file of a part, say) fail on a full disk
    with no file named: the line names what was being written, as for Arrow's writers."""
    from engine.errors import TandemError, writing_into

    parts = tmp_path / "parts"
    with pytest.raises(TandemError) as caught:
        with writing_into(parts, "writing the live parts"):
            with open("/dev/full", "w") as full:  # (every write to it fails: ENOSPC)
                full.write("{}")
    assert str(caught.value) == f"{parts}: No space left on device (writing the live parts)"


# ---------------------------------------------------------------- the session directory


def test_deleted_session_directory_mid_run(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--",
                                          *service_argv(service, marker, 2, code=4, jvm=False)),
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(session.glob("py-*/probe.json")), 30, "the probe's start")
    # rm -rf races a probe that creates a file in the directory it is emptying ("Directory not
    # empty"); a user repeats it, so the test does.
    wait_for(lambda: subprocess.run(["rm", "-rf", str(session)], capture_output=True).returncode == 0,
             10, "the session directory's removal")
    _, err = tandem.communicate(timeout=60)
    no_traceback(err)
    assert tandem.returncode == 4 and marker.exists(), err
    assert err.count("session directory is gone") == 1, err


@needs_root
def test_read_only_session_directory_mid_run(service, tmp_path):
    """Every directory of the session made immutable (chattr +i: not even root may create or
    rename a file in it) once recording runs: open files keep writing, nothing new appears."""
    session, marker = tmp_path / "s", tmp_path / "done"
    tandem = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 3, code=6)),
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen = []
    try:
        wait_for(lambda: any(session.glob("py-*/probe.json")) and jfr_flushed(session), 60, "the probe and a JFR flush")
        frozen = [session, *(p for p in session.rglob("*") if p.is_dir())]
        subprocess.run(["chattr", "+i", *map(str, frozen)], check=True)
        _, err = tandem.communicate(timeout=90)
    finally:
        if frozen:
            subprocess.run(["chattr", "-i", *map(str, frozen)], check=False)
        tandem.kill()
    no_traceback(err)
    assert tandem.returncode == 6 and marker.exists(), err
    assert err.count("cannot write session.json") == 1, err
    run = analyze(session, tmp_path / "out")  # what was written before still reads
    assert run.returncode == 0, run.stderr


def test_second_record_into_the_same_directory_is_refused_and_the_first_unharmed(service, tmp_path):
    session, marker = tmp_path / "s", tmp_path / "done"
    first = subprocess.Popen(tandem_argv("record", "-o", str(session), "--", *service_argv(service, marker, 2, code=0)),
                             env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (session / "session.json").exists(), 30, "the first session")
    second = subprocess.run(tandem_argv("record", "-o", str(session), "--", sys.executable, "-c", "pass"),
                            env=env(), capture_output=True, text=True, timeout=60)
    no_traceback(second.stderr)
    assert second.returncode == 2 and "already exists and is not an empty directory" in second.stderr
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0 and marker.exists(), err
    assert read_json(session / "session.json")["exit_code"] == 0
    run = analyze(session, tmp_path / "out")
    assert run.returncode == 0, run.stderr
