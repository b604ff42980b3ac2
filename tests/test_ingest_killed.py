"""A JVM killed with SIGKILL: ingest reads what its JFR disk repository already holds.

A real JVM runs under `tandem record` until its repository chunk has been flushed a few
times, then gets SIGKILL. Its last chunk is unfinished (the header's file state is not 0);
ingest must read it up to the last flush. The witness is JDK 17's own `jfr print --json`,
which reads an unfinished chunk up to the size its header gives (JDK 21+'s `jfr` refuses
it), for the JDK 25 chunk too.
"""
from __future__ import annotations

import os
import signal
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

from conftest import default_java_home, jdk_params
from engine.clock.chunks import FILE_STATE_OFFSET, FILE_STATE_UPDATING, scan_chunks
from engine.errors import TandemError, TandemWarning
from engine.ingest.jfr import read_pauses
from engine.session import Session
from engine.store import read_table
from test_ingest_witness import assert_matches_witness
from test_record_helpers import compile_workload, jdk_env, only_jvm_dir, read_json, tandem_argv, wait_for

pytestmark = pytest.mark.slow

JDK17 = default_java_home()  # its `jfr` reads unfinished chunks: the witness
# Seconds of recording, and JFR flushes (once a second, and after collections: docs/pauses.md,
# "Unflushed"), to wait for before the kill: the flushed part then holds several clock syncs.
FLUSHES = 3


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


def _file_state(chunk: Path) -> int:
    with open(chunk, "rb") as f:
        head = f.read(FILE_STATE_OFFSET + 1)
    return head[FILE_STATE_OFFSET] if len(head) > FILE_STATE_OFFSET else -1


def _flushed(session: Path, times: int) -> bool:
    """The repository chunk's header generation (1 at creation, +1 per flush) says it was
    flushed `times` times."""
    chunks = sorted(session.glob("jvm-*/repository/*/*.jfr"))
    return bool(chunks) and FILE_STATE_UPDATING > _file_state(chunks[-1]) >= 1 + times


def _killed_session(java_home: Path, workload: Path, session: Path) -> tuple[Path, pd.DataFrame]:
    """Records until a few flushes, reads the live chunk once (the JVM still writing it), kills."""
    env = jdk_env(java_home)
    # `wait` allocates 50 ms out of every 70 ms until killed: young GCs and safepoints.
    tandem = subprocess.Popen(
        tandem_argv("record", "-o", str(session), "--", "java", "-Xmx64m", "-cp", str(workload), "Workload", "wait"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert tandem.stdout.readline().strip() == "ready", tandem.stderr.read() if tandem.poll() is not None else ""
        ready = time.monotonic()
        wait_for(lambda: _flushed(session, FLUSHES) and time.monotonic() - ready > FLUSHES, timeout=60,
                 what=f"{FLUSHES} s and JFR flushes")
        # While the JVM still records: read up to the last flush, never wait for more.
        with pytest.warns(TandemWarning, match="unfinished chunk"):
            live = read_pauses(sorted(session.glob("jvm-*/repository/*/*.jfr")))
        pid = read_json(only_jvm_dir(session) / "jvm.json")["pid"]
        os.kill(pid, signal.SIGKILL)
        _, err = tandem.communicate(timeout=60)
    finally:
        try:  # the whole group: on a failure above, the JVM must not outlive the test
            os.killpg(tandem.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        tandem.wait()
    assert tandem.returncode == 128 + signal.SIGKILL, err
    return session, live


@pytest.fixture(scope="module")
def killed(workload, tmp_path_factory):
    """(session, table read while the JVM was alive) per JDK, recorded and killed once."""
    cache: dict[Path, tuple[Path, pd.DataFrame]] = {}

    def get(java_home: Path) -> tuple[Path, pd.DataFrame]:
        if java_home not in cache:
            cache[java_home] = _killed_session(java_home, workload, tmp_path_factory.mktemp("killed") / "s")
        return cache[java_home]

    return get


@pytest.mark.parametrize("java_home", jdk_params())
def test_killed_jvm_repository_chunk_is_read_up_to_its_last_flush(java_home, killed, tmp_path):
    session, live = killed(java_home)
    jvm = Session.open(session).jvms[0]
    assert not jvm.closed and read_json(jvm.directory / "jvm.json")["state"] == "recording"
    chunks = jvm.recordings
    assert chunks and _file_state(chunks[-1]) != 0  # really unfinished: what this test is about

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = read_pauses(chunks)
    messages = [str(w.message) for w in caught if issubclass(w.category, TandemWarning)]
    assert len(messages) == 1 and "unfinished chunk" in messages[0] and "\n" not in messages[0], messages
    scan = scan_chunks(chunks[-1])
    assert f"recovered {scan.unfinished.size} bytes" in messages[0]
    assert "are not in the session (window " in messages[0]  # the JVM was the command: its end bounds the loss

    # Everything the witness sees, kind by kind: counts, durations, operations, GC names,
    # start times up to one constant per chunk. JDK 17's `jfr` reads an unfinished chunk up
    # to its header's size but then takes any bytes after it for a next chunk ("Not a Flight
    # Recorder file"), so it is given the chunk cut there (header untouched, still unfinished).
    assert len(df) > 0
    for chunk in chunks:
        witness_file, ours = chunk, df
        chunk_scan = scan_chunks(chunk)
        if chunk_scan.lost_bytes:
            witness_file = tmp_path / f"witness-{chunk.name}"
            witness_file.write_bytes(chunk.read_bytes()[: chunk_scan.complete_bytes])
            ours = df.assign(source=df["source"].replace(str(chunk), str(witness_file)))
        expected = assert_matches_witness(ours, JDK17, witness_file)
    assert len(expected["safepoint"]) >= FLUSHES and len(expected["gc"]) >= 1
    # Clock method (1) works on the flushed part: the agent's ClockSync events are in it.
    run = df.attrs["sources"][-1]["runs"][0]
    assert df.attrs["clock_domain"] == "monotonic" and run["clock"]["method"] == "clock_sync", run["clock"]
    assert run["clock"]["samples"] >= 2
    assert df.attrs["sources"][-1]["lost_bytes"] == scan.lost_bytes
    # What the live read saw is a prefix of what the killed JVM left.
    assert 0 < len(live) <= len(df)
    assert set(live["safepoint_id"].dropna()) <= set(df["safepoint_id"].dropna())
    assert set(live["gc_id"].dropna()) <= set(df["gc_id"].dropna())

    # The CLI, with this JDK's own jdk.jfr as the reader (JDK 25 for the jdk25 case): exit 0,
    # one warning line, the same table.
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "engine", "pauses", *map(str, chunks), "-o", str(out)],
                          env=jdk_env(java_home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    warning_lines = [line for line in done.stderr.splitlines() if line.startswith("tandem: warning:")]
    assert len(warning_lines) == 1 and "unfinished chunk" in warning_lines[0], done.stderr
    assert "Traceback" not in done.stderr
    pd.testing.assert_frame_equal(read_table(out / "pauses.parquet"), df)

    # Killed in the middle of a header rewrite: HotSpot writes the guard state 255 first and
    # the new fields after it, so the fields still describe the previous flush. jdk.jfr spins
    # forever on 255; ingest reads the chunk as it stood at that flush.
    data = bytearray(chunks[-1].read_bytes())
    data[FILE_STATE_OFFSET] = FILE_STATE_UPDATING
    guarded = tmp_path / "guarded" / "guarded.jfr"  # (with the agent's jvm.json beside it, as in its session)
    guarded.parent.mkdir()
    guarded.write_bytes(bytes(data))
    shutil.copy(jvm.directory / "jvm.json", guarded.parent / "jvm.json")
    tail = f"lost the {scan.lost_bytes} bytes written after that flush" if scan.lost_bytes else "lost nothing on disk"
    with pytest.warns(TandemWarning, match=f"unfinished chunk .* {tail}"):
        again = read_pauses(guarded)
    last = df[df["source"] == str(chunks[-1])].reset_index(drop=True)
    pd.testing.assert_frame_equal(again.drop(columns=["pause_id", "source"]),
                                  last.drop(columns=["pause_id", "source"]))


def test_reading_guard_stops_jdk_jfr_waiting_on_an_unfinished_chunk(killed, monkeypatch):
    """Handed the raw unfinished chunk (as ingest never does), jdk.jfr's EventStream waits for
    the dead JVM forever; the guard closes the stream and says so in one line."""
    from engine.ingest import jfr

    session, _ = killed(JDK17)
    chunk = Session.open(session).jvms[0].recordings[-1]
    scan = scan_chunks(chunk)
    monkeypatch.setattr(jfr, "READ_TIMEOUT_BASE_S", 2.0)
    monkeypatch.setattr(jfr, "READ_TIMEOUT_MIN_BYTES_PER_S", 1 << 40)
    with pytest.raises(TandemError, match="did not finish reading") as err:
        jfr._run_java_reader(chunk, chunk, scan.chunks, jfr._Progress(None, 0))
    assert "\n" not in str(err.value)
    # The reader really stops (jdk.jfr notices the closed stream at its next poll).
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "tandem-jfr-reader"], timeout=60,
             what="the aborted reader thread to end")
