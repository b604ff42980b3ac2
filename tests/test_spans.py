"""Spans (engine.spans): the OTLP JSON reader against the protocol's own classes, the clock
from a session's pairs, and the per-span figures against a per-span model written apart."""
from __future__ import annotations

import base64
import json
import os
import threading

import numpy as np
import pandas as pd
import pytest

from engine.errors import TandemError
from engine.spans.clock import MAX_SLEW_PPM, UNRECORDED_PAIR_ERROR_NS, spans_on_monotonic
from engine.spans.figures import IntervalSet, SpanFigures
from engine.spans.source import read_spans


def _sdk_spans_file(path, count=50):
    """COUNT request spans with children, made by the real SDK and written by tandem's exporter."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    from engine.probe.spans import OtlpJsonFileExporter, add_thread_of_span

    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "process.pid": os.getpid(),
                                                        "host.name": "h1"}))
    add_thread_of_span(provider)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(path)))
    tracer = provider.get_tracer("test")

    def work(n):
        for i in range(n):
            with tracer.start_as_current_span("GET /items/{id}", kind=SpanKind.SERVER,
                                              attributes={"http.route": "/items/{id}", "n": i}):
                with tracer.start_as_current_span("load", attributes={"ok": True, "ratio": 0.5}):
                    pass

    thread = threading.Thread(target=work, args=(count // 2,), name="worker")
    thread.start()
    work(count - count // 2)
    thread.join()
    provider.shutdown()
    return threading.get_native_id(), thread.native_id


def _with_protocol_classes(path) -> pd.DataFrame:
    """The witness: every line parsed by protobuf's JSON parser into opentelemetry-proto's classes."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rows = []
    for line in open(path):
        document = json.loads(line)
        for resource in document["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):  # OTLP JSON's hex ids, protobuf JSON's base64
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        request = json_format.ParseDict(document, ExportTraceServiceRequest())
        for resource in request.resource_spans:
            res = {a.key: a.value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attrs = {a.key: a.value for a in span.attributes}
                    rows.append({"trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                 "parent_span_id": span.parent_span_id.hex() or None, "name": span.name,
                                 "kind": span.kind, "start_wall_ns": span.start_time_unix_nano,
                                 "end_wall_ns": span.end_time_unix_nano, "service_name": res["service.name"].string_value,
                                 "pid": res["process.pid"].int_value, "thread_id": attrs["thread.id"].int_value,
                                 "thread_name": attrs["thread.name"].string_value,
                                 "endpoint": attrs["http.route"].string_value if "http.route" in attrs else span.name})
    return pd.DataFrame(rows)


def test_reader_equals_the_protocol_classes_on_sdk_spans(tmp_path):
    path = tmp_path / "spans.jsonl"
    main_tid, worker_tid = _sdk_spans_file(path)
    spans = read_spans([path])
    witness = _with_protocol_classes(path).sort_values(["start_wall_ns", "span_id"], ignore_index=True)
    assert len(spans) == len(witness) == 100
    for column in ("trace_id", "span_id", "name", "start_wall_ns", "end_wall_ns", "service_name", "pid", "thread_id",
                   "thread_name", "endpoint"):
        assert spans[column].tolist() == witness[column].tolist(), column
    assert spans["parent_span_id"].isna().tolist() == witness["parent_span_id"].isna().tolist()
    assert (spans["parent_span_id"].dropna() == witness["parent_span_id"].dropna().to_numpy()).all()
    assert set(spans["kind"]) == {"server", "internal"} and set(witness["kind"]) == {2, 1}
    assert set(spans["thread_id"]) == {main_tid, worker_tid}
    assert set(spans["host_name"]) == {"h1"}
    assert spans["start_wall_ns"].is_monotonic_increasing


def test_proto_field_names_and_numeric_enums_are_read(tmp_path):
    span = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "B7AD6B7169203331", "name": "x", "kind": 3,
            "start_time_unix_nano": 1000, "end_time_unix_nano": "2000",
            "attributes": [{"key": "thread.id", "value": {"int_value": "42"}}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"resource_spans": [{"scope_spans": [{"spans": [span]}]}]}) + "\n")
    row = read_spans([path]).iloc[0]
    assert (row["span_id"], row["kind"], row["start_wall_ns"], row["end_wall_ns"], row["thread_id"]) == \
        ("b7ad6b7169203331", "client", 1000, 2000, 42)
    assert pd.isna(row["pid"]) and row["endpoint"] == "x"


@pytest.mark.parametrize("line, reason", [
    ("{not json", "Expecting property name"),
    ('{"resourceSpans": {"a": 1}}', "resourceSpans is not a list"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}', "traceId"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", '
     '"spanId": "b7ad6b7169203331", "startTimeUnixNano": "9", "endTimeUnixNano": "3"}]}]}]}', "ends before it starts"),
])
def test_a_malformed_file_is_one_line_naming_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(TandemError, match=rf"bad.jsonl:2: not an OTLP JSON trace request \(.*{reason}"):
        read_spans([path])


# ---------------------------------------------------------------- clock


def _session(tmp_path, **facts):
    session = tmp_path / "session"
    session.mkdir()
    (session / "session.json").write_text(json.dumps({"hostname": "h1", "boot_id": None, **facts}))
    return session


def test_clock_interpolates_between_pairs_and_bounds_by_their_drift(tmp_path):
    # The wall clock runs 30 us ahead over 10 s (slewed): offsets 1e18 and 1e18 + 30 us.
    base = 10**18
    session = _session(tmp_path, start_monotonic_ns=5_000_000_000, start_wall_ns=base + 5_000_000_000,
                       end_monotonic_ns=15_000_000_000, end_wall_ns=base + 15_000_030_000)
    wall = np.array([base + 5_000_000_000, base + 10_000_015_000, base + 15_000_030_000, base + 25_000_030_000])
    spans = pd.DataFrame({"start_wall_ns": wall, "end_wall_ns": wall, "host_name": ["h1"] * 4})
    out, meta = spans_on_monotonic(spans, session)
    assert out["start_ns"].tolist() == [5_000_000_000, 10_000_000_000, 15_000_000_000, 25_000_000_000]
    inside = UNRECORDED_PAIR_ERROR_NS + 30_000
    assert out["clock_error_ns"].tolist()[:3] == [inside] * 3
    assert out["clock_error_ns"].iloc[3] == UNRECORDED_PAIR_ERROR_NS + 10_000_000_000 * MAX_SLEW_PPM // 1_000_000
    assert [p["source"] for p in meta["pairs"]] == ["session.json start", "session.json end"]


def test_clock_takes_recorded_errors_and_leaves_out_a_preempted_pair(tmp_path):
    """session.json's and jvm.json's pairs carry their own error (half the tightest bracket of
    their tries). A pair read across a preemption (a 6 ms bracket: error 3 ms, its offset 2 ms
    off) between two tight ones is left out: the tight pairs bound the offset better at its
    time; kept, it would move every span's bound by milliseconds."""
    base = 10**18
    session = _session(tmp_path, start_monotonic_ns=5_000_000_000, start_wall_ns=base + 5_000_000_000,
                       start_clock_error_ns=400, end_monotonic_ns=15_000_000_000, end_wall_ns=base + 15_000_001_000,
                       end_clock_error_ns=700)
    (session / "jvm-42").mkdir()
    (session / "jvm-42" / "jvm.json").write_text(json.dumps({
        "start_monotonic_ns": 6_000_000_000, "start_wall_ns": base + 6_002_000_000, "start_clock_error_ns": 3_000_001}))
    wall = np.array([base + 5_500_000_000, base + 10_000_000_500])
    spans = pd.DataFrame({"start_wall_ns": wall, "end_wall_ns": wall, "host_name": ["h1"] * 2})
    out, meta = spans_on_monotonic(spans, session)
    assert [p["source"] for p in meta["pairs"]] == ["session.json start", "session.json end"]
    assert [p["error_ns"] for p in meta["pairs"]] == [400, 700]
    assert out["clock_error_ns"].tolist() == [700 + 1_000] * 2
    assert out["start_ns"].tolist() == [5_500_000_000 - 50, 10_000_000_000]


def test_clock_refuses_what_it_cannot_bound(tmp_path):
    spans = pd.DataFrame({"start_wall_ns": [10**18], "end_wall_ns": [10**18], "host_name": ["h1"]})
    with pytest.raises(TandemError, match="no wall/monotonic clock pair of the session's boot"):
        spans_on_monotonic(spans, _session(tmp_path))
    session = tmp_path / "other"
    session.mkdir()
    (session / "session.json").write_text(json.dumps({"hostname": "h2", "start_monotonic_ns": 1,
                                                       "start_wall_ns": 10**18}))
    with pytest.raises(TandemError, match="spans of host h1, the session was recorded on h2"):
        spans_on_monotonic(spans, session)
    late = spans.assign(start_wall_ns=10**18 + 3600 * 10**9, end_wall_ns=10**18 + 3600 * 10**9, host_name=None)
    with pytest.raises(TandemError, match="lie outside the session"):
        spans_on_monotonic(late, session)


# ---------------------------------------------------------------- figures against a per-span model


def _union(intervals):
    merged = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _inside(intervals, a, b):
    return sum(max(0, min(e, b) - max(s, a)) for s, e in intervals)


def _intersect(x, y):
    return [(max(s, t), min(e, u)) for s, e in x for t, u in y if min(e, u) > max(s, t)]


def _model(spans, pauses, gil):
    """Per span, one at a time: the figures as docs/spans.md defines them."""
    whole = pauses[pauses["kind"].isin(["safepoint", "gc_pause"]) | pauses["at_safepoint"]]
    jvms = set(whole["jvm_pid"])
    rows = []
    for span in spans.itertuples():
        mine = whole[whole["jvm_pid"] == span.pid] if span.pid in jvms else whole
        stops = _union(zip(mine["start_ns"], mine["end_ns"]))
        a, b = span.start_ns, span.end_ns
        row = {"pause_ns": _inside(stops, a, b)}
        thread = gil[(gil["pid"] == span.pid) & (gil["tid"] == span.thread_id)]
        process = gil[gil["pid"] == span.pid]
        rows_of = thread if len(thread) else process
        if len(rows_of):
            waits = _union(zip(*(rows_of[rows_of["state"] == "waiting"][c] for c in ("start_ns", "end_ns"))))
            row["gil_wait_ns"] = _inside(waits, a, b)
            row["stop_waiting_ns"] = _inside(_intersect(waits, stops), a, b)
            row["figures_of"] = "thread" if len(thread) else "process"
        else:
            row.update(gil_wait_ns=None, stop_waiting_ns=None, figures_of="none")
        if len(thread):
            releases = list(zip(*(thread[thread["state"] == "released"][c] for c in ("start_ns", "end_ns"))))
            row["stop_released_ns"] = _inside(_intersect(releases, stops), a, b)
            row["stop_holding_ns"] = row["pause_ns"] - row["stop_released_ns"] - row["stop_waiting_ns"]
        else:
            row.update(stop_released_ns=None, stop_holding_ns=None)
        row["lost_ns"] = row["pause_ns"] + (row["gil_wait_ns"] or 0) - (row["stop_waiting_ns"] or 0)
        row["stop_ids"] = sorted(int(i) for i, s, e in zip(mine["pause_id"], mine["start_ns"], mine["end_ns"])
                                 if s < b and e > a and i in set(whole["stop_id"]))
        rows.append(row)
    return pd.DataFrame(rows)


def _random_world(rng, spans_n=250):
    pauses = []
    for jvm in (100, 200):  # two JVMs; safepoints of one never overlap, each with a GC pause inside some
        t = int(rng.integers(0, 1000))
        for _ in range(30):
            t += int(rng.integers(100, 3000))
            length = int(rng.integers(1, 400))
            pauses.append(("safepoint", t, t + length, jvm, False))
            if rng.random() < 0.5:
                pauses.append(("gc_pause", t + length // 4, t + length // 2, jvm, True))
            pauses.append(("gc", t - 5, t + length + 900, jvm, False))  # concurrent: not a stop
            t += length
    pauses = pd.DataFrame(pauses, columns=["kind", "start_ns", "end_ns", "jvm_pid", "at_safepoint"])
    pauses.insert(0, "pause_id", np.arange(1, len(pauses) + 1))
    pauses["name"] = "x"
    gil = []
    for pid in (100, 300):  # process 100 runs JVM 100; process 300 runs none
        for tid in (1, 2, 3):
            t = 0
            while t < 60_000:
                t += int(rng.integers(1, 500))
                length = int(rng.integers(1, 800))
                gil.append((pid, pid * 10 + tid, "released" if rng.random() < 0.6 else "waiting", t, t + length))
                t += length
    gil = pd.DataFrame(gil, columns=["pid", "tid", "state", "start_ns", "end_ns"])
    start = rng.integers(0, 60_000, spans_n)
    spans = pd.DataFrame({"start_ns": start, "end_ns": start + rng.integers(0, 5_000, spans_n),
                          "pid": pd.array(rng.choice([100, 300, 400, -1], spans_n), dtype="Int64"),
                          "thread_id": pd.array(rng.choice([1, 2, 3, 9, -1], spans_n), dtype="Int64")})
    spans["thread_id"] = (spans["pid"] * 10 + spans["thread_id"]).where(spans["thread_id"] > 0)
    spans["pid"] = spans["pid"].where(spans["pid"] > 0)
    return spans.sort_values("start_ns", ignore_index=True), pauses, gil


@pytest.mark.parametrize("seed", range(4))
def test_figures_equal_a_per_span_model(seed):
    spans, pauses, gil = _random_world(np.random.default_rng(seed))
    from engine.correlate.stops import stop_ids

    pauses["stop_id"] = stop_ids(pauses)
    figures = SpanFigures(pauses)
    # Pushed in blocks, as a stream would: each block with the GIL rows of its time range only.
    blocks = []
    for block in np.array_split(np.arange(len(spans)), 5):
        part = spans.iloc[block]
        lo, hi = part["start_ns"].min(), part["end_ns"].max()
        blocks.append(figures(part, gil[(gil["end_ns"] > lo) & (gil["start_ns"] < hi)]))
    got = pd.concat(blocks)
    model = _model(spans.assign(pid=spans["pid"].fillna(-1), thread_id=spans["thread_id"].fillna(-1)), pauses, gil)
    for column in ("pause_ns", "gil_wait_ns", "stop_waiting_ns", "stop_released_ns", "stop_holding_ns", "lost_ns",
                   "figures_of"):
        assert got[column].astype(object).where(got[column].notna(), None).tolist() == \
            model[column].astype(object).where(model[column].notna(), None).tolist(), column
    assert [sorted(ids) for ids in got["stop_ids"]] == model["stop_ids"].tolist()
    assert (got["pause_scope"] == np.where(spans["pid"].fillna(-1) == 100, "process", "host")).all()


def test_interval_set_union_and_intersection():
    a = IntervalSet.union([5, 0, 20, 8], [10, 3, 30, 12])  # [0,3) [5,12) [20,30)
    assert a.starts.tolist() == [0, 5, 20] and a.ends.tolist() == [3, 12, 30]
    b = IntervalSet.union([2, 11], [6, 25])
    both = a.intersect(b)
    assert list(zip(both.starts.tolist(), both.ends.tolist())) == [(2, 3), (5, 6), (11, 12), (20, 25)]
    assert a.covered(np.array([0, 4, 11]), np.array([100, 6, 21])).tolist() == [20, 1, 2]


# ---------------------------------------------------------------- requests.parquet


def test_requests_table_equals_duckdb():
    import duckdb

    from engine.report.summary import requests_hurt_lines
    from engine.spans.outputs import requests_table

    rng = np.random.default_rng(7)
    n = 3000
    duration = rng.integers(1_000, 10_000_000, n)
    pause = (duration * rng.random(n) * (rng.random(n) < 0.3)).astype(np.int64)
    wait = (duration * rng.random(n) * 0.2).astype(np.int64)
    spans = pd.DataFrame({"service_name": rng.choice(["a", "b"], n), "endpoint": rng.choice(["/x", "/y", "/z"], n),
                          "duration_ns": duration, "pause_ns": pause, "gil_wait_ns": pd.array(wait, dtype="Int64"),
                          "lost_ns": np.minimum(duration, pause + wait)})
    spans["lost_share"] = spans["lost_ns"] / spans["duration_ns"]
    overlaps = pd.DataFrame({"span": [0, 1, 1], "stop_id": [5, 5, 6], "cause": ["safepoint: A", "safepoint: A", "safepoint: B"],
                             "overlap_ns": [1_000_000, 2_000_000, 4_000_000]})
    spans.loc[[0, 1], ["service_name", "endpoint"]] = ["a", "/x"]
    got = requests_table(spans, overlaps)
    witness = duckdb.sql("""
        with tail as (select service_name, endpoint, quantile_cont(duration_ns, 0.99) as p99 from spans group by all)
        select s.service_name, s.endpoint, count(*) as spans, quantile_cont(duration_ns, 0.5) / 1e6 as p50,
               quantile_cont(duration_ns, 0.99) / 1e6 as p99, quantile_cont(lost_share, 0.99) as p99_share,
               sum(lost_ns) filter (where duration_ns >= t.p99) / sum(duration_ns) filter (where duration_ns >= t.p99) as tail_lost
        from spans s join tail t using (service_name, endpoint) group by all""").df()
    both = got.merge(witness, on=["service_name", "endpoint"])
    assert len(both) == 6
    assert (both["spans_x"] == both["spans_y"]).all()
    for mine, theirs in (("p50_latency_ms", "p50"), ("p99_latency_ms", "p99"), ("p99_lost_share", "p99_share"),
                         ("tail_lost_share", "tail_lost")):
        assert np.allclose(both[mine], both[theirs]), mine
    assert got["tail_lost_share"].is_monotonic_decreasing
    row = got[(got["service_name"] == "a") & (got["endpoint"] == "/x")].iloc[0]
    assert row["top_stops"] == "safepoint: B (pause 6): 4 ms | safepoint: A (pause 5): 3 ms"
    assert got["top_stops"].notna().sum() == 1
    lines = requests_hurt_lines(got)
    assert lines[0].startswith("requests hurt") and len(lines) == 1 + 5 + sum(
        isinstance(t, str) for t in got.head(5)["top_stops"])


def test_cli_refuses_spans_without_a_session_before_analyzing(tmp_path):
    import subprocess
    import sys

    spans = tmp_path / "spans.jsonl"
    spans.write_text("")
    done = subprocess.run([sys.executable, "-m", "engine", "analyze", "--jfr", str(tmp_path / "missing.jfr"), "--gil",
                           str(tmp_path / "missing.gil"), "-o", str(tmp_path / "out"), "--spans", str(spans)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tandem: error: --spans needs a SESSION (its clock pairs put the spans on CLOCK_MONOTONIC) and -o OUT"]
