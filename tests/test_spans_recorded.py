"""The bar for spans: a service of known requests (tests/spans_program.py: real JPype JVM, real
OpenTelemetry SDK, System.gc() inside requests and at known times, sleeps that release the
GIL, a thread that holds it) recorded with `tandem record` and analyzed with `tandem analyze
--spans`: every request is matched to its span by thread and time, and its lost time equals
the ground truth (the request's own CLOCK_MONOTONIC bracket against the recorded pauses and
GIL intervals, computed by DuckDB) within the stated clock error plus 50 us."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow
TANDEM = [sys.executable, "-m", "engine"]
PROGRAM = Path(__file__).with_name("spans_program.py")
TOLERANCE_NS = 50_000


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("spans")
    session, out, spans, markers = root / "session", root / "out", root / "spans.jsonl", root / "markers.json"
    subprocess.run([*TANDEM, "record", "-o", str(session), "--", sys.executable, str(PROGRAM), str(spans), str(markers)],
                   check=True, capture_output=True, text=True, timeout=300)
    analyzed = subprocess.run([*TANDEM, "analyze", str(session), "-o", str(out), "--spans", str(spans)],
                              check=True, capture_output=True, text=True, timeout=300)
    description = json.loads((session / "session.json").read_text())
    return (json.loads(markers.read_text()), pd.read_parquet(out / "spans.parquet"),
            pd.read_parquet(out / "requests.parquet"), out, description["pid"], analyzed.stdout)


def test_every_request_is_matched_to_its_span_by_thread_and_time(recorded):
    markers, spans, _, _, _, _ = recorded
    requests = pd.DataFrame(markers["requests"])
    assert len(requests) == 60 and len(spans) == 60
    for request in requests.itertuples():
        slack = spans["clock_error_ns"] + request.bracket_ns
        mine = spans[(spans["thread_id"] == request.tid)
                     & ((spans["start_ns"] - request.before_ns).abs() <= slack)
                     & ((spans["end_ns"] - request.after_ns).abs() <= slack)]
        assert mine["span_id"].tolist() == [request.span_id]  # one span, and it is this request's
    assert spans["span_id"].str.fullmatch("[0-9a-f]{16}").all() and spans["trace_id"].str.fullmatch("[0-9a-f]{32}").all()
    assert (spans["figures_of"] == "thread").all() and (spans["pause_scope"] == "process").all()
    assert spans["clock_error_ns"].max() < 200_000  # the pairs of one short session on one host


def _truth(markers, out: Path, pid: int) -> pd.DataFrame:
    """Per request: its time in the JVM's stops of the world, waiting for the GIL, and in either,
    from its bracket and OUT's pauses.parquet and gil.parquet (DuckDB)."""
    requests = pd.DataFrame(markers["requests"])
    con = duckdb.connect()
    con.register("requests", requests)
    stops = con.execute(f"""
        select start_ns, end_ns from '{out}/pauses.parquet'
        where (kind in ('safepoint', 'gc_pause') or coalesce(at_safepoint, false)) and jvm_pid = {pid}
        order by start_ns""").fetchall()
    waits = con.execute(f"""
        select r.span_id, greatest(g.start_ns, r.before_ns) as s, least(g.end_ns, r.after_ns) as e
        from requests r join '{out}/gil.parquet' g
          on g.pid = {pid} and g.tid = r.tid and g.state = 'waiting' and g.start_ns < r.after_ns and g.end_ns > r.before_ns
        """).df()
    rows = []
    for request in requests.itertuples():
        a, b = request.before_ns, request.after_ns
        mine = [(max(s, a), min(e, b)) for s, e in stops if s < b and e > a]
        theirs = [(s, e) for s, e in zip(*(waits[waits["span_id"] == request.span_id][c] for c in ("s", "e")))]
        rows.append({"span_id": request.span_id, "route": request.route, "pause_ns": _measure(mine),
                     "gil_wait_ns": _measure(theirs), "lost_ns": _measure(mine + theirs)})
    return pd.DataFrame(rows)


def _measure(intervals) -> int:
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def test_lost_time_equals_the_ground_truth_within_the_clock_error(recorded):
    markers, spans, _, out, pid, _ = recorded
    truth = _truth(markers, out, pid).merge(spans, on="span_id", suffixes=("_truth", ""))
    assert len(truth) == 60
    bound = truth["clock_error_ns"] + TOLERANCE_NS
    for column in ("pause_ns", "gil_wait_ns", "lost_ns"):
        error = (truth[column].astype(np.int64) - truth[f"{column}_truth"]).abs()
        assert (error <= bound).all(), (column, truth.loc[error > bound, ["span_id", column, f"{column}_truth"]])
    # The known part: a request that called System.gc() lost at least that collection's stop.
    # (Which thread asked is pause_impact's cause, named where JFR names the requester: with
    # three threads calling System.gc() at once, not for every stop.)
    gc = truth[truth["route"] == "/gc"]
    assert (gc["pause_ns"] > 0).all()
    assert all(any("(System.gc())" in cause for cause in causes) for causes in gc["stop_causes"])
    assert any(f"caused by Python thread {tid} " in cause for tid, causes in zip(gc["thread_id"], gc["stop_causes"])
               for cause in causes)
    # Sleeps release the GIL: a stop that fell in a request's sleep found its thread released.
    assert (truth["stop_released_ns"] > 0).sum() >= 20
    assert (truth["gil_wait_ns_truth"] > 0).sum() >= 20  # the hog thread made requests wait


def test_requests_table_and_summary(recorded):
    _, spans, requests, _, _, stdout = recorded
    assert sorted(requests["endpoint"]) == ["/gc", "/sleep"]
    for row in requests.itertuples():
        mine = spans[spans["endpoint"] == row.endpoint]
        assert row.spans == len(mine)
        assert row.p99_latency_ms == pytest.approx(np.percentile(mine["duration_ns"], 99) / 1e6)
        assert row.p99_lost_share == pytest.approx(np.percentile(mine["lost_share"], 99))
    assert "requests hurt" in stdout and "/gc:" in stdout


def test_live_receiver_and_offline_file_agree(tmp_path):
    """tandem live --otlp-receiver: the program's SDK, pointed at the receiver by the
    environment tandem sets, exports the same spans it writes to its own file; analyzed with
    either, spans.parquet is the same, and tandem live's own figures of them agree."""
    session, spans = tmp_path / "session", tmp_path / "spans.jsonl"
    live = subprocess.run([*TANDEM, "live", "--session", str(session), "--roll", "2s", "--otlp-receiver", "0", "--",
                           sys.executable, str(PROGRAM), str(spans), str(tmp_path / "markers.json")],
                          capture_output=True, text=True, timeout=300)
    assert live.returncode == 0, live.stderr
    assert "60 span(s) received into" in live.stderr
    results = {}
    for name, given in (("offline", spans), ("live", session / "spans.binpb")):
        subprocess.run([*TANDEM, "analyze", str(session), "-o", str(tmp_path / name), "--spans", str(given)],
                       check=True, capture_output=True, text=True, timeout=300)
        results[name] = pd.read_parquet(tmp_path / name / "spans.parquet")
    assert len(results["live"]) == 60
    pd.testing.assert_frame_equal(results["live"], results["offline"])
    # The same spans figured by tandem live as it ran (its parts' spans.parquet, its own clock pairs).
    _live_agrees_with_offline(session, results["offline"])
    assert (results["offline"]["pause_ns"] > 0).sum() >= 20 and (results["offline"]["gil_wait_ns"] > 0).sum() >= 20
    assert "requests hurt" in live.stderr and "/gc:" in live.stderr


def _live_agrees_with_offline(session: Path, offline: pd.DataFrame) -> None:
    """tandem live's spans (the parts of SESSION/live) against offline's spans.parquet: the same
    spans, each time within both clock errors, each figure within both clock errors plus
    TOLERANCE_NS (the issue's bar; live's GIL times also differ from offline's by the TSC
    conversion, docs/live.md)."""
    from engine.results import Results

    during = Results(session / "live").table("spans").sort_values("span_id", ignore_index=True)
    offline = offline.sort_values("span_id", ignore_index=True)
    assert during["span_id"].tolist() == offline["span_id"].tolist()
    error = during["clock_error_ns"] + offline["clock_error_ns"]
    for column in ("start_ns", "end_ns"):
        assert ((during[column] - offline[column]).abs() <= error).all(), column
    for column in ("pause_ns", "gil_wait_ns", "stop_released_ns", "stop_waiting_ns", "stop_holding_ns", "lost_ns"):
        difference = (during[column].astype(np.int64) - offline[column].astype(np.int64)).abs()
        assert (difference <= error + TOLERANCE_NS).all(), column
    assert (during["figures_of"] == offline["figures_of"]).all() and (during["pid"] == offline["pid"]).all()


UNCHANGED = Path(__file__).with_name("spans_unchanged_program.py")


def test_record_receives_the_spans_of_an_unchanged_service(tmp_path):
    """tandem record points the SDK's own OTLP exporter at its receiver and its start hook puts
    thread.id on the spans (the program knows nothing of tandem; tandem imports nothing of
    OpenTelemetry into it); tandem analyze uses the spans with no --spans: each on the thread
    that made it."""
    session, out, markers = tmp_path / "session", tmp_path / "out", tmp_path / "markers.json"
    recorded = subprocess.run([*TANDEM, "record", "-o", str(session), "--", sys.executable, str(UNCHANGED), str(markers)],
                              capture_output=True, text=True, timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    assert "20 OpenTelemetry span(s) received into" in recorded.stderr
    made = json.loads(markers.read_text())
    assert made["loaded_before"] == [] and made["patched"]
    analyzed = subprocess.run([*TANDEM, "analyze", str(session), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert analyzed.returncode == 0, analyzed.stderr
    assert "requests hurt" in analyzed.stdout
    spans = pd.read_parquet(out / "spans.parquet").merge(pd.DataFrame(made["spans"]), on="span_id")
    assert len(spans) == 20
    assert (spans["thread_id"] == spans["tid"]).all() and spans["thread_name"].str.startswith("worker-").all()
    pid = json.loads((session / "session.json").read_text())["pid"]
    assert (spans["pid"] == pid).all()  # (the SDK's default resource has no process.pid: the thread's process)
    assert (spans["figures_of"] == "thread").all() and (spans["pause_scope"] == "process").all()
    assert (spans["pause_ns"] > 0).sum() >= 2  # the requests that called System.gc()


def test_record_leaves_a_users_own_trace_endpoint(tmp_path):
    """With OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, the spans go where the user said (with
    thread.id all the same), and the session has none."""
    import os

    from engine.spans.receiver import OtlpHttpReceiver

    received = []
    with OtlpHttpReceiver(0, received.append) as theirs:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": theirs.endpoint}
        recorded = subprocess.run([*TANDEM, "record", "-o", str(tmp_path / "s"), "--", sys.executable, str(UNCHANGED),
                                   str(tmp_path / "m.json")], capture_output=True, text=True, timeout=300, env=env)
    assert recorded.returncode == 0, recorded.stderr
    spans = pd.concat(received)
    assert len(spans) == 20 and spans["thread_id"].notna().all()
    assert "span(s) received" not in recorded.stderr and (tmp_path / "s" / "spans.binpb").stat().st_size == 0


def test_live_following_a_record_session_figures_its_spans(tmp_path):
    """`tandem live SESSION` beside `tandem record`: it follows the spans the recorder receives
    (SESSION/spans.binpb) and figures them as `tandem analyze` does."""
    session, out = tmp_path / "session", tmp_path / "out"
    record = subprocess.Popen([*TANDEM, "record", "-o", str(session), "--", sys.executable, str(UNCHANGED),
                               str(tmp_path / "markers.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (session / "session.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        live = subprocess.run([*TANDEM, "live", str(session), "--roll", "3s"], capture_output=True, text=True, timeout=240)
        _, record_err = record.communicate(timeout=240)
    finally:
        record.kill()
    assert record.returncode == 0 and live.returncode == 0, record_err + live.stderr
    assert "requests hurt" in live.stderr and "GET /unchanged: 20 spans" in live.stderr
    subprocess.run([*TANDEM, "analyze", str(session), "-o", str(out)], check=True, capture_output=True, text=True, timeout=300)
    _live_agrees_with_offline(session, pd.read_parquet(out / "spans.parquet"))
