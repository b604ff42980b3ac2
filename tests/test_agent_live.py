"""The agent's live output (`live=true`): JVM pauses in a shared-memory ring (docs/ring.md,
record type 2) while the JVM runs, in real JVMs, read with engine.ring's own reader.

Witness: the session's disk recording (recording.jfr), read independently by
engine.read_pauses, must hold the same pauses as the ring over the time the ring covers.
Latency (pause end to ring arrival) is printed, never asserted.
"""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine import read_pauses
from engine.ring import RingTailer, read_ring

from conftest import default_java_home, jdk_params
from test_record_helpers import AGENT_JAR, compile_workload, jdk_env, read_json, wait_for

pytestmark = pytest.mark.slow

# Pause record kinds written by the agent (docs/ring.md, "Records") and aux bits.
KINDS = {1: "safepoint", 2: "gc_pause", 3: "gc", 4: "vm_operation"}
SYSTEM_GC_CALL = 5  # a System.gc() call's record: not a pause
AUX_UNMATCHED = 1


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    return compile_workload(tmp_path_factory.mktemp("workload"))


def _start_jvm(java_home: Path, workload: Path, session: Path, *args: str, jvm_flags: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [str(java_home / "bin" / "java"), f"-javaagent:{AGENT_JAR}=session={session},live=true", "-Xmx256m", *jvm_flags,
         "-cp", str(workload), "Workload", *args],
        env=jdk_env(java_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _check_header(header, pid: int, java_home: Path) -> None:
    assert header.record_type == 2 and header.record_size == 64
    assert header.lane_count == 1 and header.lane_capacity >= 1024
    assert header.producer_pid == pid
    assert header.same_boot()
    assert header.backend == "jfr-stream"
    release = (java_home / "release").read_text()
    assert f'JAVA_VERSION="{header.runtime_version}"' in release
    assert abs(header.sync_realtime_ns - time.time_ns()) < 600e9
    assert 0 < header.sync_monotonic_ns < time.monotonic_ns()
    assert header.sync_uncertainty_ns < 10_000_000


def _check_records(records: np.ndarray, names: dict[int, str]) -> None:
    """Whole, committed records only: consecutive positions, known kinds, names resolved."""
    assert (records["seq"] == np.arange(1, len(records) + 1, dtype=np.uint64)).all()
    assert set(np.unique(records["kind"]).tolist()) <= {*KINDS, SYSTEM_GC_CALL}
    assert (records["lane"] == 0).all()
    assert (records["start_ns"] <= records["end_ns"]).all()
    assert (records["start_ns"] > 0).all()
    codes = set(np.unique(records["name_code"]).tolist())
    assert codes <= set(names), codes - set(names)


def _ring_table(records: np.ndarray, names: dict[int, str]) -> list[dict]:
    return [dict(kind=KINDS[int(r["kind"])], start=int(r["start_ns"]), end=int(r["end_ns"]), id=int(r["id"]),
                 name=names.get(int(r["name_code"])), unmatched=bool(int(r["aux"]) & AUX_UNMATCHED), tid=int(r["tid"]),
                 requester=int(r["requester"]), cause=names.get(int(r["cause_code"])))
            for r in records if int(r["kind"]) in KINDS]


def _recording_table(pauses) -> list[dict]:
    rows = []
    for row in pauses.itertuples():
        if row.kind not in KINDS.values() or (row.kind == "vm_operation" and row.at_safepoint is True):
            continue
        ident = row.safepoint_id if row.kind in ("safepoint", "vm_operation") else row.gc_id
        rows.append(dict(kind=row.kind, start=int(row.start_ns), end=int(row.end_ns), id=int(ident), name=row.name,
                         unmatched=bool(row.unmatched), tid=0 if row.os_thread_id is pd.NA else int(row.os_thread_id),
                         requester=0 if row.requester_os_thread_id is pd.NA else int(row.requester_os_thread_id),
                         cause=None if row.kind != "gc" or row.cause is pd.NA else row.cause))
    return rows


def _compare(ring: list[dict], recording: list[dict], tolerance_ns: int) -> dict[str, tuple[int, int]]:
    """Per kind, the recording's pauses inside the span the ring covers equal the ring's:
    same count, and pause by pause (grouped by id, in start order) same id and name, start
    and end within TOLERANCE_NS. A ring safepoint flushed unmatched at close ends at the
    end of its Begin: its end is only a lower bound; and when its ExecuteVMOperation was
    committed after the stream's last flush too (JFR's own checkpoint at exit), the ring can
    only call it "safepoint" while the recording names the operation."""
    matched = [p for p in ring if not p["unmatched"]]
    lo = min(p["start"] for p in ring) - tolerance_ns
    hi = max(p["end"] for p in matched) + tolerance_ns
    counts, worst = {}, 0
    for kind in KINDS.values():
        mine = sorted((p for p in ring if p["kind"] == kind), key=lambda p: (p["id"], p["start"]))
        theirs = sorted((p for p in recording if p["kind"] == kind and lo <= p["start"] and p["end"] <= hi),
                        key=lambda p: (p["id"], p["start"]))
        # An unmatched ring safepoint may have its End after hi in the recording. At exit JFR's
        # hook may stop the disk recording while the stream still runs: a safepoint begun after
        # the recording's last pause can be the stream's alone.
        extra = [p for p in mine if p["unmatched"] and not any(q["id"] == p["id"] for q in theirs)]
        last_start = max(q["start"] for q in recording)
        for p in extra:
            same = [q for q in recording if q["kind"] == kind and q["id"] == p["id"]]
            if not same and p["start"] >= last_start:
                mine.remove(p)
                continue
            assert len(same) == 1, (f"ring {kind} {p} flushed unmatched; the recording's rows of id {p['id']}: "
                                    f"{[q for q in recording if q['id'] == p['id']]}, its last: {recording[-3:]}")
            theirs.append(same[0])
        theirs.sort(key=lambda p: (p["id"], p["start"]))
        if len(mine) != len(theirs):
            ids = {p["id"] for p in mine} ^ {p["id"] for p in theirs}
            where = [(p["id"], p["name"], "ring" if p in mine else "recording", f"start-lo {(p['start'] - lo) / 1e6:.1f} ms",
                      f"hi-end {(hi - p['end']) / 1e6:.1f} ms") for p in mine + theirs if p["id"] in ids]
            raise AssertionError(f"{kind}: {len(mine)} in the ring, {len(theirs)} in the recording; differing: {where}")
        for a, b in zip(mine, theirs):
            name = b["name"] if a["unmatched"] and a["name"] == "safepoint" else a["name"]
            assert (a["id"], name, a["tid"]) == (b["id"], b["name"], b["tid"]), (kind, a, b)
            # who asked (the operation's caller; unknown for an unmatched one named at close), the collection's cause
            assert a["cause"] == b["cause"] and (a["requester"] == b["requester"] or a["unmatched"]), (kind, a, b)
            assert abs(a["start"] - b["start"]) <= tolerance_ns, (kind, a, b)
            if a["unmatched"]:
                assert a["end"] <= b["end"] + tolerance_ns, (kind, a, b)
            else:
                assert abs(a["end"] - b["end"]) <= tolerance_ns, (kind, a, b)
                worst = max(worst, abs(a["start"] - b["start"]), abs(a["end"] - b["end"]))
        counts[kind] = (len(mine), sum(1 for p in recording if p["kind"] == kind))
    counts["worst_difference_ns"] = worst
    return counts


@pytest.mark.parametrize("java_home", jdk_params())
def test_live_ring_holds_the_recordings_pauses(java_home, workload, tmp_path):
    session = tmp_path / "s"
    jvm = _start_jvm(java_home, workload, session, "alloc", "4")
    ring_path = session / f"jvm-{jvm.pid}" / "pauses.ring"
    wait_for(lambda: ring_path.exists() or jvm.poll() is not None, 60, "pauses.ring")
    assert ring_path.exists(), jvm.communicate()
    assert ring_path.stat().st_mode & 0o777 == 0o600

    batches, arrivals = [], []
    with RingTailer(ring_path) as tail:
        _check_header(tail.header, jvm.pid, java_home)
        while True:
            gone = jvm.poll() is not None
            batch = tail.poll(producer_gone=gone)
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if len(batch):
                batches.append(batch)
                arrivals.append(np.full(len(batch), now, dtype=np.int64))
            if gone:
                break
            time.sleep(0.01)
        closed = tail.closed_by_producer
        received, missed, dropped = tail.received, tail.missed, tail.dropped
    out, err = jvm.communicate()
    assert jvm.returncode == 0 and "done" in out, err
    assert "tandem-agent:" not in err, err
    assert closed, "the agent marks the ring closed at exit"
    assert missed == 0 and dropped == 0

    header, records, after_missed = read_ring(ring_path)  # the ring as the exited JVM left it
    assert after_missed == 0 and header.closed
    live = np.concatenate(batches)
    assert received == len(live) == len(records) == header.head
    for name in records.dtype.names:  # field by field: numpy does not copy a structured dtype's padding
        assert (live[name] == records[name]).all(), f"{name}: what the tailer saw live is what the ring holds"
    _check_records(records, header.names)

    jvm_dir = session / f"jvm-{jvm.pid}"
    about = read_json(jvm_dir / "jvm.json")["live"]
    assert about["written"] == len(records) and about["dropped"] == 0 and about["error"] is None
    # JFR's own flush (1 s, clamped) is not what bounds the ring's latency: the agent's flusher is.
    assert about["flush_interval_ms"] == 200 and about["flush_interval_problem"] is None, about
    pauses = read_pauses(jvm_dir / "recording.jfr")
    assert pauses.attrs["clock_method"] == "clock_sync"
    (run,) = pauses.attrs["sources"][0]["runs"]
    tolerance = int(run["clock"]["error_ns"]) + int(about["clock_error_ns"]) + 1_000
    ring_table = _ring_table(records, header.names)
    try:
        figures = _compare(ring_table, _recording_table(pauses), tolerance)
    except AssertionError as e:
        raise AssertionError(f"{e}; agent's live summary {about}") from None
    for kind in ("safepoint", "gc_pause", "gc"):
        assert figures[kind][0] > 0, figures

    gc = np.flatnonzero(live["kind"] == 2)
    latency_ms = (np.concatenate(arrivals)[gc] - live["end_ns"][gc].astype(np.int64)) / 1e6
    print(f"\n{java_home.name}: ring vs recording (ring, whole recording) {figures}; tolerance {tolerance} ns; "
          f"unmatched {about['unmatched_safepoints']}, orphan ends {about['orphan_safepoint_ends']}; "
          f"ring clock error {about['clock_error_ns']} ns, recording clock error {run['clock']['error_ns']} ns; "
          f"GC pause end -> ring arrival over {len(gc)} pauses: p50 {np.percentile(latency_ms, 50):.0f} ms, "
          f"p99 {np.percentile(latency_ms, 99):.0f} ms, max {latency_ms.max():.0f} ms")
    # With JFR's 1 s flush the median is ~500 ms; with the agent's 200 ms flusher ~100 ms.
    assert np.percentile(latency_ms, 50) < 450


def test_a_small_ring_wraps_and_the_reader_counts_what_it_missed(workload, tmp_path):
    """No drain runs in the JVM: the writer retires the oldest record itself, never stops
    writing; a reader behind by more than the capacity counts the overwritten ones."""
    java_home = default_java_home()
    session = tmp_path / "s"
    jvm = _start_jvm(java_home, workload, session, "alloc", "3", jvm_flags=("-Dtandem.live.capacity=8",))
    ring_path = session / f"jvm-{jvm.pid}" / "pauses.ring"
    wait_for(lambda: ring_path.exists() or jvm.poll() is not None, 60, "pauses.ring")
    batches = []
    with RingTailer(ring_path) as tail:
        assert tail.header.lane_capacity == 8
        while True:
            gone = jvm.poll() is not None
            batches.append(tail.poll(producer_gone=gone))
            if gone:
                break
            time.sleep(0.2)  # slower than the ring: JFR hands over a second of pauses at once
        received, missed, head, dropped = tail.received, tail.missed, tail.head, tail.dropped
    out, err = jvm.communicate()
    assert jvm.returncode == 0, err
    header, records, _ = read_ring(ring_path)
    about = read_json(session / f"jvm-{jvm.pid}" / "jvm.json")["live"]
    assert header.closed and dropped == 0, about
    assert head > 8 and missed > 0 and received + missed == head == header.head
    # The ring holds the last 8 positions; the tail the writer retired is consistent with it.
    assert records["seq"].tolist() == list(range(head - 7, head + 1))
    assert int(header.lanes["tail"][0]) == head - 8
    live = np.concatenate(batches)
    assert (np.diff(live["seq"].astype(np.int64)) > 0).all()
    seen = {(int(r["kind"]), int(r["id"]), int(r["start_ns"])) for r in live}
    assert {(int(r["kind"]), int(r["id"]), int(r["start_ns"])) for r in records} & seen


def test_sigkill_leaves_a_readable_ring(workload, tmp_path):
    java_home = default_java_home()
    session = tmp_path / "s"
    jvm = _start_jvm(java_home, workload, session, "wait")
    assert jvm.stdout.readline().strip() == "ready"
    ring_path = session / f"jvm-{jvm.pid}" / "pauses.ring"
    wait_for(ring_path.exists, 60, "pauses.ring")
    with RingTailer(ring_path) as tail:
        wait_for(lambda: len(tail.poll()) > 0 or tail.received > 0, 60, "a first pause in the ring")
    jvm.send_signal(signal.SIGKILL)
    jvm.wait(timeout=30)

    header, records, missed = read_ring(ring_path)
    assert not header.closed
    assert missed == 0 and len(records) == header.head > 0
    _check_header(header, jvm.pid, java_home)
    _check_records(records, header.names)
    assert not list(ring_path.parent.glob("*.building-*"))


def test_bad_live_value_costs_one_line(workload, tmp_path):
    jvm = subprocess.Popen([str(default_java_home() / "bin" / "java"), f"-javaagent:{AGENT_JAR}=session={tmp_path}/s,live=maybe",
                            "-cp", str(workload), "Workload", "sleep", "1"],
                           env=jdk_env(default_java_home()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = jvm.communicate(timeout=60)
    assert jvm.returncode == 0 and out.strip() == "unset"
    assert [line for line in err.splitlines() if line.startswith("tandem-agent:")] == [
        "tandem-agent: not recording: live=maybe is not true or false"]


def test_flush_ms_option_zero_keeps_jfrs_flush_and_bad_values_cost_one_line(workload, tmp_path):
    java = str(default_java_home() / "bin" / "java")
    session = tmp_path / "s"
    jvm = subprocess.run([java, f"-javaagent:{AGENT_JAR}=session={session},live=true,flush_ms=0", "-cp", str(workload),
                          "Workload", "sleep", "1"], env=jdk_env(default_java_home()), capture_output=True, text=True, timeout=60)
    assert jvm.returncode == 0 and "tandem-agent:" not in jvm.stderr, jvm.stderr
    about = read_json(next(session.glob("jvm-*/jvm.json")))["live"]
    assert about["flush_interval_ms"] is None and about["flush_interval_problem"] is None
    bad = subprocess.run([java, f"-javaagent:{AGENT_JAR}=session={tmp_path}/b,live=true,flush_ms=soon", "-cp", str(workload),
                          "Workload", "sleep", "1"], env=jdk_env(default_java_home()), capture_output=True, text=True, timeout=60)
    assert [line for line in bad.stderr.splitlines() if line.startswith("tandem-agent:")] == [
        "tandem-agent: not recording: flush_ms=soon is not a whole number of milliseconds"]
