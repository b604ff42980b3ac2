"""Perfetto export: the trace obeys the trace-event format's rules and says what the analysis says."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.analysis import correlate
from engine.report.perfetto import export_perfetto

MS = 1_000_000


def _tables():
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 2_000 * MS, 40))
    pauses = pd.DataFrame({
        "pause_id": np.arange(40, dtype=np.int64),
        "kind": ["safepoint", "gc_pause", "gc", "vm_operation"] * 10,
        "name": ["G1CollectForAllocation", "Pause Young (Normal)", "G1New", "HandshakeAllThreads"] * 10,
        "start_ns": starts,
        "end_ns": starts + rng.integers(1, 30 * MS, 40),
        "time_to_safepoint_ns": pd.array([50_000, None, None, None] * 10, dtype="Int64"),
        "operation": ["G1CollectForAllocation", None, None, None] * 10,
        "jvm_pid": 4242,
    })
    rows = []
    for tid in (101, 102, 103):
        t = int(rng.integers(0, 5 * MS))
        while t < 2_000 * MS:
            length = int(rng.integers(1, 20 * MS))
            rows.append((77, tid, f"worker-{tid}", str(rng.choice(["released", "waiting"])), t, t + length))
            t += length + int(rng.integers(1, 10 * MS))
    gil = pd.DataFrame(rows, columns=["pid", "tid", "thread_name", "state", "start_ns", "end_ns"])
    return pauses, gil


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    pauses, gil = _tables()
    analysis = correlate(pauses, gil)
    analysis.write(out)
    path = export_perfetto(out, out / "trace.json")
    return analysis, json.loads(path.read_text())


def test_every_track_is_named_and_nests(trace):
    analysis, doc = trace
    events = doc["traceEvents"]
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    named_procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            assert (e["pid"], e["tid"]) in named_threads, e
            assert e["pid"] in named_procs
            by_track[(e["pid"], e["tid"])].append(e)
    for track, slices in by_track.items():
        stamps = [e["ts"] for e in slices]
        assert stamps == sorted(stamps), f"timestamps go back on {track}"
        stack: list[float] = []  # end times of open slices: complete events must nest properly
        for e in slices:
            while stack and stack[-1] <= e["ts"] + 1e-9:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-6, f"slice {e['name']} at {e['ts']} crosses its parent on {track}"
            stack.append(end)


def test_flows_are_paired_and_overlaps_are_marked(trace):
    analysis, doc = trace
    events = doc["traceEvents"]
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert starts == finishes
    hits = analysis.overlaps[~analysis.overlaps["near_miss"] & (analysis.overlaps["overlap_ns"] > 0)]
    assert len(hits) > 0
    marked = [e for e in events if e["ph"] == "X" and e["name"].startswith("JVM pause: ")]
    # Every hit's pause is named by a mark on its thread that covers the hit.
    for hit in hits.itertuples():
        covering = [e for e in marked if e["tid"] == hit.tid and hit.pause_id in e["args"]["pause_ids"]
                    and e["ts"] <= hit.start_ns / 1000 + 1e-3 and hit.end_ns / 1000 <= e["ts"] + e["dur"] + 1e-3]
        assert len(covering) == 1, hit
    # Marked time per thread is the union of that thread's overlaps (computed here by brute force).
    for tid, of_thread in hits.groupby("tid"):
        covered = set()
        for hit in of_thread.itertuples():
            covered.update(range(hit.start_ns // 1000, hit.end_ns // 1000))
        drawn = sum(e["dur"] for e in marked if e["tid"] == tid)
        assert drawn == pytest.approx(len(covered), rel=1e-3, abs=len(of_thread) + 1)
    assert len(starts) >= len(hits) - sum(1 for pid in hits["pause_id"] if pid not in set(analysis.pauses["pause_id"]))


def test_every_pause_and_state_is_drawn(trace):
    analysis, doc = trace
    events = doc["traceEvents"]
    jvm_slices = [e for e in events if e["ph"] == "X" and e["cat"] == "jvm" and "pause_id" in e.get("args", {})]
    assert sorted(e["args"]["pause_id"] for e in jvm_slices) == sorted(analysis.pauses["pause_id"].tolist())
    gil_slices = [e for e in events if e["ph"] == "X" and e["cat"] == "gil" and e["name"] in ("released", "waiting")]
    assert len(gil_slices) == int((analysis.gil["end_ns"] > analysis.gil["start_ns"]).sum())
    assert any(e["name"] == "held" for e in events if e["ph"] == "X")


def test_cli_refuses_a_directory_without_results(tmp_path):
    tandem = Path(sys.executable).parent / "tandem"
    proc = subprocess.run([str(tandem), "export", "perfetto", str(tmp_path), "-o", str(tmp_path / "t.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pauses.parquet: missing" in proc.stderr


def test_embedded_jvm_shares_one_process_with_python():
    from engine.report.perfetto import perfetto_trace

    pauses, gil = _tables()
    pauses["jvm_pid"] = 77  # JPype: the JVM lives in the Python process
    analysis = correlate(pauses, gil)
    events = perfetto_trace(analysis.pauses, analysis.gil, analysis.overlaps)["traceEvents"]
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["JVM + Python 77"]
    assert sum(1 for e in events if e["ph"] == "M" and e["name"] == "process_sort_index") == 1
