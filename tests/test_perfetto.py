"""Perfetto export, both formats: the trace obeys its format's rules and says what the analysis says.

The protobuf trace is decoded with the `perfetto` package's own protos, as trace processor reads
it: per packet sequence its interned names, its defaults (track, clock) and its incremental
clock; begin/end events sorted by time (stably, file order at one instant) and matched per track.
"""
from __future__ import annotations

import json
import os
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
        # every fourth safepoint asked for by thread 101 (a Python thread: caused by Python)
        "requester_os_thread_id": pd.array([101 if i % 16 == 0 else None for i in range(40)], dtype="Int64"),
    })
    codes = [("fetch", "/srv/app/db.py", 88), ("Worker.run", "/srv/app/worker.py", 12), ("<no Python frame>", None, None)]
    rows = []
    for tid in (101, 102, 103):
        t = int(rng.integers(0, 5 * MS))
        while t < 2_000 * MS:
            length = int(rng.integers(1, 20 * MS))
            function, file, line = codes[int(rng.integers(0, len(codes)))]
            rows.append((77, tid, f"worker-{tid}", str(rng.choice(["released", "waiting"])), t, t + length, function, file, line))
            t += length + int(rng.integers(0, 10 * MS))  # 0: a state starts where the previous ends
    gil = pd.DataFrame(rows, columns=["pid", "tid", "thread_name", "state", "start_ns", "end_ns", "function", "file", "line"])
    gil["line"] = gil["line"].astype("Int64")
    return pauses, gil


def _slice_name(row) -> str:
    """What docs/perfetto.md says a GIL slice is called."""
    if pd.isna(row.function):
        return row.state
    if pd.isna(row.file):
        return f"{row.state}: {row.function}"
    return f"{row.state}: {row.function} ({Path(row.file).name}:{row.line})"


def decode_json(path: Path) -> tuple[dict, list[dict]]:
    """tracks {key: {name, process}}, slices [{track, name, cat, start, end, args, flows_out, flows_in}]."""
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    tracks = {(e["pid"], e["tid"]): {"name": e["args"]["name"], "process": processes.get(e["pid"])}
              for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    ns = lambda us: int(round(us * 1000))  # noqa: E731
    starts = {(e["pid"], e["tid"], e["id"]): e for e in events if e["ph"] == "s"}
    slices = []
    for e in events:
        if e["ph"] == "X":
            slices.append({"track": (e["pid"], e["tid"]), "name": e["name"], "cat": e["cat"], "start": ns(e["ts"]),
                           "end": ns(e["ts"]) + ns(e["dur"]), "args": e.get("args", {}), "flows_out": [], "flows_in": []})
    # A flow leaves the slice enclosing its start and ends at the slice enclosing its finish (bp=e).
    by_track = defaultdict(list)
    for s in slices:
        by_track[s["track"]].append(s)

    def innermost(track, at, pause=False):
        inside = [(s["end"] - s["start"], -i, s) for i, s in enumerate(by_track[track]) if s["start"] <= at < s["end"]]
        if pause and any("pause_id" in s["args"] for *_, s in inside):
            inside = [x for x in inside if "pause_id" in x[2]["args"]]
        return min(inside, key=lambda x: x[:2])[2]  # the shortest; of equal ones, the child (written after its parent)

    jvm_tracks = {track for s in slices if "pause_id" in s["args"] for track in [s["track"]]}
    for e in events:
        if e["ph"] == "s":  # (inside a safepoint it binds to its synchronize or operation part, within the pause)
            track = (e["pid"], e["tid"])
            innermost(track, ns(e["ts"]), pause=track in jvm_tracks)["flows_out"].append(e["id"])
        elif e["ph"] == "f":  # (a cause flow ends at a pause: it binds to the pause or the part of it there)
            track = (e["pid"], e["tid"])
            innermost(track, ns(e["ts"]), pause=track in jvm_tracks)["flows_in"].append(e["id"])
    assert {i for (_, _, i) in starts} == {e["id"] for e in events if e["ph"] == "f"}
    return tracks, slices


def _annotation(a):
    if a.array_values:
        return [_annotation(v) for v in a.array_values]
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind else None


def decode_proto(path: Path) -> tuple[dict, list[dict]]:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    state: dict[int, dict] = {}
    descriptors, events = {}, []
    for order, packet in enumerate(trace.packet):
        seq = state.setdefault(packet.trusted_packet_sequence_id, {"names": {}, "args": {}, "clock": None, "defaults": None})
        if packet.incremental_state_cleared:
            seq.update(names={}, args={}, clock=None)
        if packet.HasField("trace_packet_defaults"):
            seq["defaults"] = packet.trace_packet_defaults
        for n in packet.interned_data.event_names:
            seq["names"][n.iid] = n.name
        for n in packet.interned_data.debug_annotation_names:
            seq["args"][n.iid] = n.name
        if packet.HasField("track_descriptor"):
            descriptors[packet.track_descriptor.uuid] = packet.track_descriptor
        if packet.HasField("clock_snapshot"):
            for clock in packet.clock_snapshot.clocks:
                if clock.is_incremental:
                    seq["clock"] = clock.timestamp
        if packet.HasField("track_event"):
            event = packet.track_event
            if event.type == event.TYPE_COUNTER:  # (memory counters: decode_counters)
                continue
            defaults = seq["defaults"]
            assert not packet.HasField("timestamp_clock_id") and defaults.timestamp_clock_id >= 64
            seq["clock"] += packet.timestamp  # the sequence's incremental clock
            track = event.track_uuid if event.HasField("track_uuid") else defaults.track_event_defaults.track_uuid
            events.append((seq["clock"], order, track, event, seq))
    tracks = {}
    for uuid, d in descriptors.items():
        if d.HasField("process"):
            continue
        parent = descriptors[d.parent_uuid]
        tracks[uuid] = {"name": d.thread.thread_name if d.HasField("thread") else d.name, "process": parent.process.process_name,
                        "pid": parent.process.pid, "tid": d.thread.tid if d.HasField("thread") else None}
    open_slices: dict[int, list[dict]] = defaultdict(list)
    slices = []
    for ts, _, track, event, seq in sorted(events, key=lambda e: (e[0], e[1])):
        if event.type == event.TYPE_SLICE_BEGIN:
            s = {"track": track, "name": seq["names"][event.name_iid], "start": ts, "end": None,
                 "args": {seq["args"][a.name_iid]: _annotation(a) for a in event.debug_annotations},
                 "flows_out": list(event.flow_ids), "flows_in": list(event.terminating_flow_ids)}
            open_slices[track].append(s)
            slices.append(s)
        else:
            assert event.type == event.TYPE_SLICE_END and open_slices[track], "an end without a begin"
            open_slices[track].pop()["end"] = ts
    assert not any(open_slices.values()), "slices left open"
    for s in slices:
        s["cat"] = "overlap" if s["name"].startswith("JVM pause: ") else "gil" if tracks[s["track"]]["tid"] is not None else "jvm"
    return tracks, slices


def decode_counters(path: Path, fmt: str) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """{(pid, counter name): [(t_ns, value)]}: proto, each counter track's TYPE_COUNTER events on
    its sequence's incremental clock, the track's process from its parent descriptor; JSON, the
    `ph: C` events (a counter belongs to its process)."""
    counters = defaultdict(list)
    if fmt == "json":
        for e in json.loads(path.read_text())["traceEvents"]:
            if e["ph"] == "C":
                counters[(e["pid"], e["name"])].append((int(round(e["ts"] * 1000)), e["args"]["bytes"]))
        return dict(counters)
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    descriptors, clock, defaults = {}, {}, {}
    for packet in trace.packet:
        seq = packet.trusted_packet_sequence_id
        if packet.HasField("track_descriptor"):
            descriptors[packet.track_descriptor.uuid] = packet.track_descriptor
        if packet.HasField("trace_packet_defaults"):
            defaults[seq] = packet.trace_packet_defaults.track_event_defaults.track_uuid
        for c in packet.clock_snapshot.clocks:
            if c.is_incremental:
                clock[seq] = c.timestamp
        if packet.HasField("track_event") and packet.track_event.type == packet.track_event.TYPE_COUNTER:
            clock[seq] += packet.timestamp
            track = descriptors[defaults[seq]]
            assert track.counter.unit == pb.CounterDescriptor.Unit.UNIT_SIZE_BYTES
            counters[(descriptors[track.parent_uuid].process.pid, track.name)].append((clock[seq], packet.track_event.counter_value))
    return dict(counters)


@pytest.fixture(scope="module")
def memory_session(tmp_path_factory):
    """A real session's memory samples: `tandem record` of a CPython keeping 60 MB of small
    objects, a step every 0.6 s after 2 s of none, all of it held 2 s at the end (the recorder's
    /proc samples, once a second from a moment of their own and late on a busy machine, are the
    rows: the first and last must fall before and after the steps; the probe's pymalloc samples
    are interpolated at their times)."""
    session = tmp_path_factory.mktemp("memory") / "session"
    program = ("import time\ntime.sleep(2)\nkept = []\nfor _ in range(4):\n    kept += ['%0300d' % i for i in range(50_000)]\n"
               "    time.sleep(0.6)\ntime.sleep(2)\n")
    tandem = Path(sys.executable).parent / "tandem"
    run = subprocess.run([str(tandem), "record", "-o", str(session), "--", sys.executable, "-c", program],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return session


@pytest.fixture(scope="module")
def analysis(tmp_path_factory, memory_session):
    from engine.memory import write_memory

    out = tmp_path_factory.mktemp("results")
    pauses, gil = _tables()
    analysis = correlate(pauses, gil)
    analysis.write(out)
    write_memory(memory_session, out)
    return analysis, out


@pytest.fixture(scope="module", params=["proto", "json"])
def trace(request, analysis):
    result, out = analysis
    path = export_perfetto(out, out / f"trace.{request.param}", fmt=request.param)
    return result, request.param, (decode_proto if request.param == "proto" else decode_json)(path)


def test_every_track_is_named_and_nests(trace):
    analysis, fmt, (tracks, slices) = trace
    for s in slices:
        assert s["end"] >= s["start"]
        assert tracks[s["track"]]["name"] and tracks[s["track"]]["process"], s
    _nests(slices)


def test_flows_are_paired_and_overlaps_are_marked(trace):
    analysis, fmt, (tracks, slices) = trace
    out = [f for s in slices for f in s["flows_out"]]
    into = [f for s in slices for f in s["flows_in"]]
    assert sorted(out) == sorted(into) and len(set(out)) == len(out)
    # Each flow leaves the pause it names and ends at a mark naming it, or (caused by Python)
    # leaves a Python slice and ends at the pause.
    leaves = {f: s for s in slices for f in s["flows_out"]}
    for s in slices:
        for f in s["flows_in"]:
            if "pause_id" in s["args"]:
                assert "pause_id" not in leaves[f]["args"]
                continue
            assert s["name"].startswith("JVM pause: ")
            assert leaves[f]["args"]["pause_id"] in s["args"]["pause_ids"]
    hits = analysis.overlaps[~analysis.overlaps["near_miss"] & (analysis.overlaps["overlap_ns"] > 0)]
    assert len(hits) > 0
    marks = [s for s in slices if s["name"].startswith("JVM pause: ")]
    tid_of = lambda s: tracks[s["track"]]["tid"] if fmt == "proto" else s["track"][1]  # noqa: E731
    # Every hit's pause is named by a mark on its thread that covers the hit.
    for hit in hits.itertuples():
        covering = [m for m in marks if tid_of(m) == hit.tid and hit.pause_id in m["args"]["pause_ids"]
                    and m["start"] <= hit.start_ns and hit.end_ns <= m["end"]]
        assert len(covering) == 1, hit
    # Marked time per thread is the union of that thread's overlaps (computed here by brute force, in us).
    for tid, of_thread in hits.groupby("tid"):
        covered = set()
        for hit in of_thread.itertuples():
            covered.update(range(hit.start_ns // 1000, hit.end_ns // 1000))
        drawn = sum(m["end"] - m["start"] for m in marks if tid_of(m) == tid) / 1000
        assert drawn == pytest.approx(len(covered), rel=1e-3, abs=len(of_thread) + 1)
    caused = int(analysis.pause_impact["caused_by_python"].sum())
    assert len(out) == len(hits) + caused  # every (pause, thread interval) hit has its arrow, every caused stop one


def test_every_pause_and_state_is_drawn(trace):
    analysis, fmt, (tracks, slices) = trace
    pauses = sorted((s["args"]["pause_id"], s["start"], s["end"]) for s in slices if s["cat"] == "jvm" and "pause_id" in s["args"])
    expected = analysis.pauses
    assert pauses == sorted(zip(expected["pause_id"].tolist(), expected["start_ns"].tolist(), expected["end_ns"].tolist()))
    states = sorted((s["name"], s["start"], s["end"]) for s in slices if s["cat"] == "gil" and s["name"] != "held")
    gil = analysis.gil[analysis.gil["end_ns"] > analysis.gil["start_ns"]]
    assert states == sorted((_slice_name(row), row.start_ns, row.end_ns) for row in gil.itertuples())
    # held: the gaps between a thread's released/waiting intervals (within its lifetime), both formats
    tid_of = lambda s: tracks[s["track"]]["tid"] if fmt == "proto" else s["track"][1]  # noqa: E731
    held = sorted((tid_of(s), s["start"], s["end"]) for s in slices if s["name"] == "held")
    expected_held = []
    for tid, rows in gil.sort_values("start_ns").groupby("tid"):
        ends, starts = rows["end_ns"].to_numpy()[:-1], rows["start_ns"].to_numpy()[1:]
        expected_held += [(tid, int(a), int(b)) for a, b in zip(ends, starts) if b > a]
    assert held == sorted(expected_held) and held
    names = {t["name"] for t in tracks.values()}
    assert {"worker-101 (101)", "safepoints", "GC pauses"} <= names


def test_a_caused_pause_is_linked_to_the_python_slice_that_asked(trace):
    """A pause whose requester is a Python thread (pause_impact's causes) has a flow from that
    thread's slice containing the pause's start (released, waiting or held) to the pause."""
    analysis, fmt, (tracks, slices) = trace
    tid_of = lambda s: tracks[s["track"]]["tid"] if fmt == "proto" else s["track"][1]  # noqa: E731
    caused = analysis.pause_impact[analysis.pause_impact["caused_by_python"]]
    assert len(caused) >= 2
    leaves = {f: s for s in slices for f in s["flows_out"]}
    for stop in caused.itertuples():
        pause = next(s for s in slices if s["args"].get("pause_id") == stop.pause_id and s["start"] == stop.start_ns)
        origins = [leaves[f] for f in pause["flows_in"] if "pause_id" not in leaves[f]["args"]]
        assert len(origins) == 1
        origin = origins[0]
        assert tid_of(origin) == stop.cause_tid == 101 and origin["start"] <= stop.start_ns < origin["end"]
        if origin["cat"] == "overlap":  # JSON: a flow leaves the innermost slice there, maybe a mark
            origin = next(s for s in slices if s["track"] == origin["track"] and s["cat"] == "gil"
                          and s["start"] <= stop.start_ns < s["end"])
        state = "held" if stop.cause_state == "holding" else stop.cause_state
        assert origin["name"].split(":")[0] == state


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_a_window_draws_what_reaches_into_it(tmp_path, analysis, fmt):
    """`--window FROM..TO` (offsets into the results' span) and `--worst`: exactly the pauses and
    GIL states that reach into the window are drawn, whole; the CLI says a bad window in one line."""
    from engine.report.perfetto import WORST

    result, out = analysis
    decode = decode_proto if fmt == "proto" else decode_json
    span_start = int(result.header["span_start_ns"])
    for window, (t0, t1) in [((500 * MS, 900 * MS), (span_start + 500 * MS, span_start + 900 * MS)),
                             (WORST, result.worst_window())]:
        _, slices = decode(export_perfetto(out, tmp_path / f"window.{fmt}", fmt=fmt, window=window))
        pauses = result.pauses[(result.pauses["end_ns"] >= t0) & (result.pauses["start_ns"] <= t1)]
        drawn = sorted((s["args"]["pause_id"], s["start"], s["end"]) for s in slices if s["cat"] == "jvm" and "pause_id" in s["args"])
        assert drawn == sorted(zip(pauses["pause_id"].tolist(), pauses["start_ns"].tolist(), pauses["end_ns"].tolist()))
        assert 0 < len(drawn) < len(result.pauses)
        gil = result.gil[(result.gil["end_ns"] > result.gil["start_ns"]) & (result.gil["end_ns"] >= t0) & (result.gil["start_ns"] <= t1)]
        states = sorted((s["name"], s["start"], s["end"]) for s in slices if s["cat"] == "gil" and s["name"] != "held")
        assert states == sorted((_slice_name(row), row.start_ns, row.end_ns) for row in gil.itertuples()) and states
    tandem = Path(sys.executable).parent / "tandem"
    for args, said in [(["--window", "2s..1s"], "--window: it ends before it starts"),
                       (["--window", "1h.."], "--window: outside the results (the results span"),
                       (["--window", "1s"], "--window '1s': expected FROM..TO"),
                       (["--window", "0..1s", "--worst"], "--window and --worst: give one")]:
        run = subprocess.run([str(tandem), "export", "perfetto", str(out), "-o", str(tmp_path / "bad.pftrace"), *args],
                             capture_output=True, text=True)
        assert run.returncode == 2 and said in run.stderr and "Traceback" not in run.stderr, run.stderr
        assert not (tmp_path / "bad.pftrace").exists()
    run = subprocess.run([str(tandem), "export", "perfetto", str(out), "-o", str(tmp_path / "last.pftrace"), "--window", "-1s.."],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_a_signal_another_thread_receives_waits_for_the_claim_to_end():
    """The export's scratch file is made and claimed with SIGINT and SIGTERM held: a SIGTERM the
    kernel hands to another thread (the process has several) raises nothing inside the block,
    and is raised once it ends."""
    import signal
    import threading
    import time

    from engine.report.perfetto import _signals_held

    class Raised(BaseException):
        pass

    def handler(_signum, _frame):
        raise Raised()

    old, inside = signal.signal(signal.SIGTERM, handler), False
    try:
        with pytest.raises(Raised):
            with _signals_held():
                sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
                sender.start()
                sender.join()
                for _ in range(100):  # (bytecodes, calls and sleeps: where a pending handler would run)
                    time.sleep(0.001)
                inside = True
            assert False, "not raised at the block's end"
        assert inside, "raised inside the block"
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_mid_export_leaves_nothing_behind(tmp_path):
    """SIGTERM (a `timeout`, a service manager) ends an export as Ctrl-C does: exit 128 + 15,
    and neither its spill directory nor a half-written trace is left beside the output."""
    import signal
    import time

    n = 2_000_000  # (GIL rows: the export is still at work when the signal comes)
    start = np.arange(n, dtype=np.int64) * 10_000
    gil = pd.DataFrame({"pid": 77, "tid": 100 + np.arange(n) % 4, "state": np.where(np.arange(n) % 3, "released", "waiting"),
                        "start_ns": start, "end_ns": start + 6_000})
    pauses = pd.DataFrame({"pause_id": np.arange(3, dtype=np.int64), "kind": "gc_pause", "name": "G1New",
                           "start_ns": np.array([1, 2, 3], np.int64) * 5_000_000_000, "end_ns": np.array([1, 2, 3]) * 5_000_000_000 + 9_000_000})
    results = tmp_path / "results"
    correlate(pauses, gil).write(results)
    target = tmp_path / "trace"
    target.mkdir()
    tandem = Path(sys.executable).parent / "tandem"
    export = subprocess.Popen([str(tandem), "export", "perfetto", str(results), "-o", str(target / "t.pftrace")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(target.iterdir()) and export.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert export.poll() is None, "the export ended before the signal"
    export.send_signal(signal.SIGTERM)
    _, err = export.communicate(timeout=60)
    assert export.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and list(target.iterdir()) == []


def test_an_export_running_keeps_its_scratch_files_and_a_killed_ones_are_taken_over(tmp_path):
    """Two exports to one output: while one holds its scratch file (locked), another is refused
    in one line and touches neither that file nor the spill directory; once nobody holds them,
    what a killed export left is taken over and nothing but the trace is left."""
    import fcntl

    pauses, gil = _tables()
    results = tmp_path / "results"
    correlate(pauses, gil).write(results)
    target = tmp_path / "trace"
    target.mkdir()
    scratch, spill = target / ".t.pftrace.tmp", target / ".t.pftrace.spill"
    scratch.write_bytes(b"half a trace")
    spill.mkdir()
    (spill / "thread").write_bytes(b"rows")
    tandem = Path(sys.executable).parent / "tandem"
    export = [str(tandem), "export", "perfetto", str(results), "-o", str(target / "t.pftrace")]
    with open(scratch, "rb") as running:  # (an export at work holds this lock)
        fcntl.flock(running, fcntl.LOCK_EX)
        refused = subprocess.run(export, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "another tandem export is writing it now" in refused.stderr and "t.pftrace" in refused.stderr
    assert scratch.read_bytes() == b"half a trace" and (spill / "thread").read_bytes() == b"rows"
    assert not (target / "t.pftrace").exists()
    done = subprocess.run(export, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["t.pftrace"]
    decode_proto(target / "t.pftrace")


def test_plain_packets_are_the_protos_own_bytes():
    """The bulk encoder of plain slice begins and ends writes exactly what the `perfetto`
    package's protos serialize for the same packets: varint edges (0, 127, 128, 2^14, 2^35,
    2^62), sequence ids of one to three bytes, begins and ends mixed."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    from engine.report.perfetto import plain_packets

    rng = np.random.default_rng(3)
    deltas = np.r_[0, 1, 127, 128, 16_383, 16_384, 1 << 35, 1 << 62, rng.integers(0, 1 << 40, 2_000)].astype(np.int64)
    is_end = rng.random(len(deltas)) < 0.5
    iids = rng.integers(1, 1 << 20, len(deltas))
    iids[:5] = (1, 127, 128, 300, 1 << 33)
    for sequence in (2, 127, 128, 70_000):
        data, offsets = plain_packets(deltas, is_end, iids, sequence)
        trace = pb.Trace()
        for delta, end, iid in zip(deltas.tolist(), is_end.tolist(), iids.tolist()):
            event = trace.packet.add(timestamp=delta, trusted_packet_sequence_id=sequence).track_event
            event.type = pb.TrackEvent.TYPE_SLICE_END if end else pb.TrackEvent.TYPE_SLICE_BEGIN
            if not end:
                event.name_iid = iid
        assert data == trace.SerializeToString()
        assert offsets[0] == 0 and offsets[-1] == len(data)
        one = pb.Trace()  # (each packet starts at its offset)
        one.ParseFromString(data[offsets[7]:offsets[8]])
        assert one.packet[0].timestamp == deltas[7]


def test_cli_refuses_a_directory_without_results(tmp_path):
    tandem = Path(sys.executable).parent / "tandem"
    proc = subprocess.run([str(tandem), "export", "perfetto", str(tmp_path), "-o", str(tmp_path / "t.pftrace")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pauses.parquet: missing" in proc.stderr


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_embedded_jvm_shares_one_process_with_python(tmp_path, fmt):
    pauses, gil = _tables()
    pauses["jvm_pid"] = 77  # JPype: the JVM lives in the Python process
    correlate(pauses, gil).write(tmp_path)
    path = export_perfetto(tmp_path, tmp_path / "t", fmt=fmt)
    tracks, _ = (decode_proto if fmt == "proto" else decode_json)(path)
    assert {t["process"] for t in tracks.values()} == {"JVM + Python 77"}


def test_live_parts_export_like_one_results_directory(tmp_path, analysis):
    """`tandem live` writes the same tables in parts: the trace of the parts is the trace of their union."""
    result, out = analysis
    memory = pd.read_parquet(out / "memory.parquet")
    for name, table in (("pauses", result.pauses), ("gil", result.gil), ("overlaps", result.overlaps), ("memory", memory)):
        for part, rows in enumerate(np.array_split(np.arange(len(table)), 3), 1):
            directory = tmp_path / "live" / f"part-{part:06d}"
            directory.mkdir(parents=True, exist_ok=True)
            table.iloc[rows].to_parquet(directory / f"{name}.parquet")
    whole = decode_proto(export_perfetto(out, tmp_path / "whole.pftrace"))
    parts = decode_proto(export_perfetto(tmp_path / "live", tmp_path / "parts.pftrace"))
    key = lambda s: (s["name"], s["start"], s["end"])  # noqa: E731
    assert sorted(map(key, whole[1])) == sorted(map(key, parts[1]))
    counters = decode_counters(tmp_path / "parts.pftrace", "proto")
    assert counters and counters == decode_counters(tmp_path / "whole.pftrace", "proto")
    # a window of the parts (whose tables carry no analysis header: their span is the rows') too
    window = (500 * MS, 900 * MS)
    of_whole = decode_proto(export_perfetto(out, tmp_path / "whole-window.pftrace", window=window))
    of_parts = decode_proto(export_perfetto(tmp_path / "live", tmp_path / "parts-window.pftrace", window=window))
    assert sorted(map(key, of_whole[1])) == sorted(map(key, of_parts[1]))
    assert 0 < len(of_parts[1]) < len(parts[1])


@pytest.mark.parametrize("fmt", ["proto", "json"])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_a_thread_drawn_in_chunks_is_the_thread_drawn_at_once(tmp_path, analysis, monkeypatch, fmt, order):
    """Long threads are read and drawn a chunk of states at a time (rows in start order, as
    tandem writes them) or loaded whole and sorted (any other order): small chunks give the
    same trace."""
    from engine.report import perfetto

    result, out = analysis
    if order == "shuffled":
        for name in ("pauses", "overlaps"):
            (tmp_path / "in").mkdir(exist_ok=True)
            (tmp_path / "in" / f"{name}.parquet").write_bytes((out / f"{name}.parquet").read_bytes())
        result.gil.sample(frac=1, random_state=1).to_parquet(tmp_path / "in" / "gil.parquet")
        out = tmp_path / "in"
    decode = decode_proto if fmt == "proto" else decode_json
    whole = decode(export_perfetto(out, tmp_path / "whole", fmt=fmt))
    monkeypatch.setattr(perfetto, "_CHUNK_ROWS", 7)
    chunked = decode(export_perfetto(out, tmp_path / "chunked", fmt=fmt))
    key = lambda s: (s["name"], s["start"], s["end"], len(s["flows_in"]), len(s["flows_out"]))  # noqa: E731
    assert sorted(map(key, whole[1])) == sorted(map(key, chunked[1]))
    assert len(whole[1]) > 7 * 20


def _memory_session_state(session: Path, memory: pd.DataFrame) -> str:
    """What a failure needs said: the session's files and each process's series."""
    files = sorted(str(p.relative_to(session)) for p in session.rglob("*") if p.is_file())
    series = {int(pid): sorted(c for c in rows.columns if rows[c].notna().any()) for pid, rows in memory.groupby("pid")}
    return f"session files {files}; series per pid {series}"


def test_memory_series_are_counter_tracks_under_their_process(trace, analysis, memory_session):
    """Every memory series of memory.parquet is a counter track (bytes) under its process,
    sample for sample; the RSS split's counters add up to the RSS counter at every sample."""
    from engine.memory.series import columns_of, label

    _, out = analysis
    _, fmt, _ = trace
    counters = decode_counters(out / f"trace.{fmt}", fmt)
    memory = pd.read_parquet(out / "memory.parquet")
    expected = {}
    for pid, rows in memory.groupby("pid"):
        for column in columns_of(rows):
            present = rows[rows[column].notna()].sort_values("t_ns")
            expected[(int(pid), f"memory: {label(column)}")] = list(zip(
                present["t_ns"].tolist(), np.rint(present[column].to_numpy(np.float64)).astype(np.int64).tolist()))
    assert counters == expected
    service = json.loads((memory_session / "session.json").read_text())["pid"]  # the command's process
    names = {name for pid, name in counters if pid == service}
    assert {"memory: RSS", "memory: RSS: Python objects", "memory: Python allocated (pymalloc blocks)",
            "memory: malloc in use", "memory: RSS: unexplained"} <= names, _memory_session_state(memory_session, memory)
    rss = dict(counters[(service, "memory: RSS")])
    buckets = ("JVM heap", "JVM native", "Python objects", "native (malloc) outside JVM and Python", "unexplained")
    split = defaultdict(int)
    for bucket in buckets:
        for t, value in counters.get((service, f"memory: RSS: {bucket}"), []):
            split[t] += value
    assert all(abs(split[t] - value) <= len(buckets) for t, value in rss.items() if t in split)  # (rounding)
    # The kept objects show: pymalloc's allocated bytes grow by at least the 60 MB kept.
    allocated = [v for _, v in counters[(service, "memory: Python allocated (pymalloc blocks)")]]
    assert max(allocated) - allocated[0] >= 50e6


def _spans(rng) -> pd.DataFrame:
    """Spans of process 77: nested ones on thread 101, one crossing its parent; some without a
    thread, some of a thread the GIL table does not know."""
    rows = []

    def span(tid, start, end, name, parent=None):
        span_id = f"{len(rows) + 1:016x}"
        rows.append({"trace_id": f"{len(rows) // 3 + 1:032x}", "span_id": span_id, "parent_span_id": parent, "name": name,
                     "kind": "server" if parent is None else "internal", "endpoint": name, "service_name": "svc", "pid": 77,
                     "thread_id": tid, "thread_name": None, "start_ns": start, "end_ns": end, "start_wall_ns": start + 10**18,
                     "end_wall_ns": end + 10**18, "clock_error_ns": 1_000})
        return span_id

    for k in range(20):
        a = k * 90 * MS + int(rng.integers(0, 10 * MS))
        root = span(101, a, a + 60 * MS, "GET /score")
        child = span(101, a + 5 * MS, a + 30 * MS, "db", root)
        span(101, a + 10 * MS, a + 20 * MS, "fetch", child)
        if k % 5 == 0:
            span(101, a + 50 * MS, a + 70 * MS, "crossing", root)  # starts inside its parent, ends after it
        span(None, a, a + 40 * MS, "no thread")
        span(4711, a + MS, a + 2 * MS, "thread not in the GIL table")
    frame = pd.DataFrame(rows)
    for column in ("pid", "thread_id"):
        frame[column] = frame[column].astype("Int64")
    return frame


def _nests(slices) -> None:
    by_track = defaultdict(list)
    for s in slices:
        by_track[s["track"]].append(s)
    for track, of_track in by_track.items():
        stack: list[int] = []  # end times of open slices: slices must nest properly
        for s in sorted(of_track, key=lambda s: (s["start"], -s["end"])):
            while stack and stack[-1] <= s["start"] and not (s["end"] == s["start"] == stack[-1]):
                stack.pop()
            assert not stack or s["end"] <= stack[-1], f"slice {s['name']} at {s['start']} crosses its parent on {track}"
            stack.append(s["end"])


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_spans_are_slices_above_their_threads(tmp_path, analysis, fmt):
    """spans.parquet (engine/spans/outputs.py's, figured on the analysis' own tables): every span
    is one slice with its times and ids, on a track of its thread's process named for the
    thread (protobuf: ordered just above the thread's GIL states), or on the process's spans
    track; every track still nests."""
    import shutil

    from engine.spans.outputs import span_results, write_span_results

    result, out = analysis
    for name in ("pauses", "gil", "overlaps", "pause_impact", "summary"):
        shutil.copy(out / f"{name}.parquet", tmp_path / f"{name}.parquet")
    spans, requests = span_results(_spans(np.random.default_rng(5)), result.pauses, result.pause_impact, result.gil)
    write_span_results(tmp_path, spans, requests, {})
    path = export_perfetto(tmp_path, tmp_path / f"trace.{fmt}", fmt=fmt)
    tracks, slices = (decode_proto if fmt == "proto" else decode_json)(path)
    _nests(slices)
    drawn = {s["args"]["span_id"]: s for s in slices if "span_id" in s["args"]}
    assert sorted(drawn) == sorted(spans["span_id"])
    for row in spans.itertuples():
        s = drawn[row.span_id]
        assert (s["name"], s["start"], s["end"], s["args"]["lost_ns"]) == (row.name, row.start_ns, row.end_ns, row.lost_ns)
        track = tracks[s["track"]]
        assert track["process"] == "Python 77"
        expected = "spans: worker-101 (101)" if row.thread_id is not pd.NA and row.thread_id == 101 else "spans (no Python thread)"
        assert track["name"] in (expected, f"{expected} (2)"), (row.name, track["name"])
    assert spans.loc[spans["thread_id"] == 101, "lost_ns"].sum() > 0  # the figures drawn are not all zero
    crossing = [s for s in drawn.values() if s["name"] == "crossing"]
    assert crossing and all(tracks[s["track"]]["name"] == "spans: worker-101 (101) (2)" for s in crossing)
    if fmt == "proto":
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        trace = pb.Trace()
        trace.ParseFromString(path.read_bytes())
        rank = {p.track_descriptor.thread.thread_name or p.track_descriptor.name: p.track_descriptor.sibling_order_rank
                for p in trace.packet if p.HasField("track_descriptor")}
        assert rank["spans: worker-101 (101)"] < rank["worker-101 (101)"] < rank["worker-102 (102)"]
