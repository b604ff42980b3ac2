"""`tandem live -- python -m engine.demo.workload`: how late a JVM pause reaches tandem live's
rows, and what tandem live costs.

One run with the agent's pause ring (`tandem live` passes live=true) and one without (the
JFR repository re-read, as before), same workload, same machine, back to back.

- Latency: per pause of the kinds the ring carries (safepoint, gc_pause, gc), the part row's
  `arrived_ns` (CLOCK_MONOTONIC when tandem live had the row) minus the pause's end. Pauses
  the ring never had (JFR start-up, before the agent's stream) come in late from the
  repository by design and are counted apart, not in the percentiles.
- Anchor: the ring's own commit-to-reader latency in the same run, measured by a tailer in
  this process polling pauses.ring every 20 ms (JFR delivers at its flushes: about 1 s).
- Where the time goes: `polled_ns` (tandem live read the ring) and `arrived_ns` (the pause's
  rows were final: the correlation core emitted them), minus the pause end.
- Cost: tandem live's own RSS (VmRSS) and peak RSS (VmHWM) at 1/3, 2/3 and the end of the
  run; its CPU seconds (user + system); from /proc every 0.1 s (the last sample before exit).
- Soak: a longer run with the pause ring and a busy producer (`--gc-period 0.25`, four
  request threads): tandem live's RSS sampled every 0.1 s, printed as the median of each
  SOAK_PRINT_EVERY_S; the bar is the least-squares RSS slope over the last half of the soak
  (MiB/min, SOAK_SLOPE_BAR: docs/live.md, "Memory", says why that figure), and whether the
  live overlaps equal an offline `tandem analyze` of the same session (as
  tests/test_live.py compares them). The median of each third is printed too.

TANDEM_BENCH_LIVE_SECONDS (default 60) sets the latency runs' length,
TANDEM_BENCH_LIVE_SOAK_SECONDS (default 600: tandem live warms up for ~5 minutes, docs/live.md "Memory over a long run"; 0 skips it) the soak's,
TANDEM_BENCH_LIVE_BEFORE=0 skips the repository-only run.

- Metrics (`--metrics-port`, engine/live/metrics.py): TANDEM_BENCH_LIVE_METRICS_PAIRS (default
  3, 0 skips) pairs of runs of TANDEM_BENCH_LIVE_METRICS_SECONDS (default 60, as the latency
  run: in a shorter one the start-up pauses, read while the machine is busy starting the JVMs,
  weigh on the p99) with the pause ring, one without metrics and one serving /metrics scraped every second by a thread here
  (Prometheus' default is 15 s), back to back, the order alternating. Bar: tandem live's CPU
  with metrics at most 2% above without (the median of the pairs' ratios); the p99 of the
  runs with metrics stays within BAR_P99_S. The accounted figure beside it: the CPU tandem
  live itself measured in its metrics code (its last line), over its CPU.
- Spans (`--otlp-receiver`, engine/spans/live.py): TANDEM_BENCH_LIVE_SPANS_PER_MIN (default
  100000, 0 skips) spans a minute posted to tandem live's receiver by a feeder here, as an
  SDK's BatchSpanProcessor would (batches of up to 512 spans, OTLP/HTTP protobuf), each span
  just ended, on a thread of the workload (its py-<pid>/threads.jsonl), over a run of
  TANDEM_BENCH_LIVE_SPANS_SECONDS (default 60), paired with a run without a receiver, back to
  back. Bars: pause end -> live row p99 with spans <= BAR_P99_S; the CPU of span intake as
  tandem live accounts it (its receiver's request handlers and its figuring: decoding, the
  copy, clock, figures; its last line), over the run's wall time, <= SPANS_CPU_BAR of a core.
  Reported beside it: tandem live's CPU with spans minus without (noisy on a shared machine). Reported: span end -> its row in a part (arrived at its part's
  close, so this includes up to a roll), p50/p99 from the parts' spans.parquet and _done.json.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import Row
from engine.live import watermark as wm

SECONDS = float(os.environ.get("TANDEM_BENCH_LIVE_SECONDS", "60"))
SETTLED_AFTER_S = 10.0  # the latency rows "after start-up" leave out the pauses of the run's first seconds
SOAK_SECONDS = float(os.environ.get("TANDEM_BENCH_LIVE_SOAK_SECONDS", "600"))
BEFORE = os.environ.get("TANDEM_BENCH_LIVE_BEFORE", "1") != "0"
# MiB per minute, least-squares over the last half of the soak. What tandem live keeps by
# design grows ~32 bytes a pause (~0.1 MiB/min at the soak's ~52 pauses/s); the bar is ten
# times that, about what a 5-minute soak can resolve against the allocators' sawtooth.
SOAK_SLOPE_BAR = 1.0
KEPT_BYTES_PER_PAUSE = 32  # reconciliation indexes 24 + the summary's overlap of a pause that hit Python 8
SOAK_PRINT_EVERY_S = 30.0
METRICS_PAIRS = int(os.environ.get("TANDEM_BENCH_LIVE_METRICS_PAIRS", "3"))
METRICS_SECONDS = float(os.environ.get("TANDEM_BENCH_LIVE_METRICS_SECONDS", "60"))
METRICS_CPU_BAR = 1.02
BAR_P99_S = 1.3
SPANS_PER_MIN = int(os.environ.get("TANDEM_BENCH_LIVE_SPANS_PER_MIN", "100000"))
SPANS_SECONDS = float(os.environ.get("TANDEM_BENCH_LIVE_SPANS_SECONDS", "60"))
SPANS_CPU_BAR = 0.05  # of a core
SPANS_BATCH = 512  # the SDK's BatchSpanProcessor max_export_batch_size
RING_KINDS = ("safepoint", "gc_pause", "gc")


def _status_kib(pid: int, field: str = "VmHWM") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _hwm_kib(pid: int) -> int | None:
    return _status_kib(pid, "VmHWM")


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tail_ring(session: Path, stop: threading.Event, lat_ns: list[int]) -> None:
    """The anchor: the pause ring read every 20 ms; arrival minus pause end per record."""
    from engine.ring import RingTailer

    tailer = None
    while not stop.is_set():
        if tailer is None:
            rings = list(session.glob("jvm-*/pauses.ring"))
            if rings:
                try:
                    tailer = RingTailer(rings[0])
                except Exception:
                    tailer = None
        if tailer is not None:
            records = tailer.poll()
            now = time.monotonic_ns()
            keep = np.isin(records["kind"], (1, 2, 3))
            lat_ns.extend((now - records["end_ns"][keep].astype(np.int64)).tolist())
            if tailer.closed_by_producer:
                break
        stop.wait(0.02)


def _scrape(port: int, stop: threading.Event, every_s: float = 1.0) -> None:
    import urllib.request

    while not stop.wait(every_s):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                response.read()
        except OSError:
            pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _feed_spans(session: Path, port: int, per_min: int, stop: threading.Event, sent: list[int], until: float) -> None:
    """Post PER_MIN spans a minute to the receiver on PORT until STOP or the monotonic time
    UNTIL (the workload's end): a batch when SPANS_BATCH spans are due or 5 s passed (the SDK's
    defaults), each span just ended, on a thread of the session's first Python process."""
    import json
    import random
    import socket
    import urllib.request

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    threads = None
    while threads is None and not stop.wait(0.2):
        for path in sorted(session.glob("py-*/threads.jsonl")):
            tids = [json.loads(line)["tid"] for line in path.read_text().splitlines() if line.strip()]
            if tids:
                threads = (int(path.parent.name.split("-")[1]), tids)
    if threads is None:
        return
    pid, tids = threads
    rng = random.Random(7)
    host = socket.gethostname()
    interval = 60.0 / per_min
    due, last_post = time.monotonic(), time.monotonic()
    pending = 0
    while not stop.is_set() and time.monotonic() < until:
        now = time.monotonic()
        pending += int((now - due) / interval)
        due += int((now - due) / interval) * interval
        if pending >= SPANS_BATCH or (pending and now - last_post >= 5.0):
            count, pending = min(pending, SPANS_BATCH), pending - min(pending, SPANS_BATCH)
            request = ExportTraceServiceRequest()
            resource = request.resource_spans.add()
            for key, value in (("service.name", "bench"), ("host.name", host)):
                resource.resource.attributes.add(key=key).value.string_value = value
            resource.resource.attributes.add(key="process.pid").value.int_value = pid
            spans = resource.scope_spans.add().spans
            end = time.time_ns()
            for _ in range(count):
                span = spans.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name=f"GET /e{rng.randrange(5)}", kind=2,
                                 start_time_unix_nano=end - rng.randrange(1_000_000, 50_000_000), end_time_unix_nano=end)
                span.attributes.add(key="thread.id").value.int_value = rng.choice(tids)
            post = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=request.SerializeToString(), method="POST",
                                          headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(post, timeout=10) as response:
                    response.read()
                sent[0] += count
            except OSError:
                pass
            last_post = now
        stop.wait(0.05)


def run_once(ring: bool, seconds: float, workdir: Path, workload: tuple[str, ...] = (), name: str | None = None,
             metrics_port: int | None = None, spans_per_min: int = 0) -> dict:
    import pandas as pd

    session = workdir / (name or ("ring" if ring else "repository"))
    metrics = ("--metrics-port", str(metrics_port), "--metrics-addr", "127.0.0.1") if metrics_port is not None else ()
    otlp_port = _free_port() if spans_per_min else None
    receiver = ("--otlp-receiver", str(otlp_port)) if otlp_port is not None else ()
    argv = [sys.executable, "-c", "from engine.commands import main; main()", "live", "--session", str(session),
            "--pause-ring" if ring else "--no-pause-ring", "--roll", "10s", *metrics, *receiver, "--",
            sys.executable, "-m", "engine.demo.workload", "--seconds", f"{seconds:g}", *workload]
    stop, anchor = threading.Event(), []
    tail = threading.Thread(target=_tail_ring, args=(session, stop, anchor), daemon=True)
    tail.start()
    if metrics_port is not None:
        threading.Thread(target=_scrape, args=(metrics_port, stop), daemon=True).start()
    sent = [0]
    if otlp_port is not None:
        threading.Thread(target=_feed_spans, args=(session, otlp_port, spans_per_min, stop, sent, time.monotonic() + seconds),
                         daemon=True).start()
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # tandem live's own figures (not its children's: the workload and the JVM), sampled
    # every 0.1 s from /proc until it exits; the last sample stands for the end.
    hwm, rss, marks, last = [], [], [seconds / 3, 2 * seconds / 3], (None, 0.0, None)
    trace = []  # (seconds since start, VmRSS MiB)
    err_chunks = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        peak, cpu, now_rss = _hwm_kib(proc.pid), _cpu_s(proc.pid), _status_kib(proc.pid, "VmRSS")
        if peak is not None:
            last = (peak, cpu if cpu is not None else last[1], now_rss)
            trace.append((time.monotonic() - began, now_rss / 1024 if now_rss else float("nan")))
        if marks and time.monotonic() - began >= marks[0]:
            marks.pop(0)
            hwm.append(last[0])
            rss.append(last[2])
        time.sleep(0.1)
    hwm += [None] * (2 - len(hwm)) + [last[0]]
    rss += [None] * (2 - len(rss)) + [last[2]]
    reader.join(5)
    err = "".join(err_chunks)
    stop.set()
    tail.join(5)
    if proc.returncode != 0:
        raise RuntimeError(f"tandem live exited {proc.returncode}: {err[-2000:]}")
    parts = sorted((session / "live").glob("part-*/pauses*.parquet"))
    pauses = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    pauses = pauses[pauses["kind"].astype(str).isin(RING_KINDS)]
    lat = (pauses["arrived_ns"].astype("int64") - pauses["end_ns"].astype("int64")).to_numpy() / 1e9
    polled = (pauses["polled_ns"].astype("int64") - pauses["end_ns"].astype("int64")).to_numpy() / 1e9 \
        if "polled_ns" in pauses.columns else lat
    # With the ring: rows the ring never had (start-up) come from the repository, late; they
    # are the ones carrying the repository's clock_offset_ns.
    start_up = np.zeros(len(lat), dtype=bool)
    if ring and "clock_offset_ns" in pauses.columns:
        start_up = pauses["clock_offset_ns"].notna().to_numpy()
    # When each pause was final (its pause_impact row handed to a part): the watermark's lag.
    impact = pd.concat([pd.read_parquet(p.with_name("pause_impact.parquet")) for p in parts], ignore_index=True)
    final_at = impact.set_index("pause_id")["arrived_ns"].astype("int64")
    final = (pauses["pause_id"].map(final_at).to_numpy(np.float64) - pauses["end_ns"].to_numpy(np.float64)) / 1e9
    # The first seconds: the JVM, the service and tandem live start together on the same cores.
    settled = (pauses["end_ns"].to_numpy(np.int64) - int(pauses["end_ns"].min()) > SETTLED_AFTER_S * 1e9) if len(pauses) else start_up
    return {
        "lat": lat[~start_up], "polled": polled[~start_up], "final": final[~start_up], "late_start_up": int(start_up.sum()),
        "lat_settled": lat[~start_up & settled], "final_settled": final[~start_up & settled],
        "anchor": np.array(anchor) / 1e9, "session": session, "trace": trace,
        "rss_mib": [None if r is None else r / 1024 for r in rss],
        "hwm_mib": [None if r is None else r / 1024 for r in hwm], "cpu_s": last[1],
        "wall_s": time.monotonic() - began, "pauses": len(pauses),
        # tandem live's last headline (engine/live/view.py): late rows, and late pauses older
        # than the join's GIL archive, which may miss pairs.
        "headline": next((line for line in reversed(err.splitlines()) if line.startswith("tandem live: ")), ""),
        # the most a GIL event was committed after the poll that could have read it (the GIL margin covers it)
        "commit_lag": (re.findall(r"GIL commit lag ([0-9.]+ \S+)", " ".join(err.split())) or ["?"])[-1],
        # tandem live's last words on its metrics' cost (the console may have wrapped the line)
        "metrics_cost": " ".join(err.split()).rpartition("tandem: metrics: ")[2].split("tandem:")[0],
        "spans_sent": sent[0], "span_lat": _span_latency(session) if otlp_port is not None else np.zeros(0),
        # tandem live's own account of its span intake's CPU (receiver handlers + figuring)
        "spans_cpu_s": float(re.search(r"span intake took ([0-9.]+) s CPU", " ".join(err.split())).group(1))
        if otlp_port is not None else None,
    }


def _span_latency(session: Path) -> np.ndarray:
    """Per span figured: its part's close (CLOCK_MONOTONIC) minus the span's end, s."""
    import json

    import pandas as pd

    out = []
    for part in sorted((session / "live").glob("part-*")):
        if (part / "spans.parquet").exists() and (part / "_done.json").exists():
            closed = json.loads((part / "_done.json").read_text())["closed_monotonic_ns"]
            ends = pd.read_parquet(part / "spans.parquet", columns=["end_ns"])["end_ns"].to_numpy(np.int64)
            out.append((closed - ends) / 1e9)
    return np.concatenate(out) if out else np.zeros(0)


def _spans_case(console, workdir: Path, p) -> list[Row]:
    """A run with SPANS_PER_MIN spans a minute into the receiver and one without, back to back."""
    without = run_once(True, SPANS_SECONDS, workdir, name="spans-0")
    with_spans = run_once(True, SPANS_SECONDS, workdir, name="spans-1", spans_per_min=SPANS_PER_MIN)
    intake = (with_spans["cpu_s"] - without["cpu_s"]) / with_spans["wall_s"]
    # CPU a span, at SPANS_PER_MIN: the share of a core intake takes at that rate
    accounted = with_spans["spans_cpu_s"] / max(with_spans["spans_sent"], 1) * SPANS_PER_MIN / 60
    figured = len(with_spans["span_lat"])
    console.print(f"spans: {with_spans['spans_sent']} sent, {figured} figured in parts; tandem live CPU {without['cpu_s']:.2f} s "
                  f"without, {with_spans['cpu_s']:.2f} s with ({100 * intake:.2f}% of a core over {with_spans['wall_s']:.1f} s); "
                  f"span intake by its own account {with_spans['spans_cpu_s']:.2f} s ({100 * accounted:.2f}% of a core at "
                  f"{SPANS_PER_MIN} spans/min); "
                  f"pause end -> row p99 without {p(without['lat'], 99):.3f} s, with {p(with_spans['lat'], 99):.3f} s; "
                  f"span end -> its part closed p50 {p(with_spans['span_lat'], 50):.2f} s p99 {p(with_spans['span_lat'], 99):.2f} s; "
                  f"RSS end MiB without {without['rss_mib'][-1]:.0f}, with {with_spans['rss_mib'][-1]:.0f}; "
                  f"load {open('/proc/loadavg').read().split()[0]}")
    return [
        Row("live", f"pause end -> live row p99 with {SPANS_PER_MIN} spans/min into --otlp-receiver ({SPANS_SECONDS:g} s) "
            "vs without", p(with_spans["lat"], 99), p(without["lat"], 99), "s", f"<= {BAR_P99_S} s",
            p(with_spans["lat"], 99) <= BAR_P99_S),
        Row("live", f"span intake CPU at {SPANS_PER_MIN} spans/min (accounted in tandem live: receiver handlers + "
            "figuring, per span times the rate) vs bar", accounted, SPANS_CPU_BAR, "cores", f"<= {SPANS_CPU_BAR} core",
            accounted <= SPANS_CPU_BAR),
        Row("live", "tandem live CPU with spans minus without, over wall time (noisy on a shared machine)", intake,
            SPANS_CPU_BAR, "cores", "report", None),
        Row("live", "spans figured in parts vs sent", figured, with_spans["spans_sent"], "spans", "equal",
            figured == with_spans["spans_sent"]),
    ]


def _metrics_cpu(console, workdir: Path, p) -> list[Row]:
    """Paired runs without and with --metrics-port (scraped every second): CPU and latency."""
    import re
    import socket

    ratios, on_lat, accounted = [], [], []
    for pair in range(METRICS_PAIRS):
        runs = {}
        for on in ((False, True) if pair % 2 == 0 else (True, False)):
            port = None
            if on:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
            runs[on] = run_once(True, METRICS_SECONDS, workdir, name=f"metrics-{pair}-{int(on)}", metrics_port=port)
        off, on = runs[False], runs[True]
        ratios.append(on["cpu_s"] / off["cpu_s"])
        on_lat.append(on["lat"])
        spent = [float(x) for x in re.findall(r"([0-9.]+) s CPU", on["metrics_cost"])]
        assert len(spent) == 2, on["metrics_cost"]
        accounted.append(sum(spent) / on["cpu_s"])
        console.print(f"metrics pair {pair + 1}: tandem live CPU {off['cpu_s']:.2f} s without, {on['cpu_s']:.2f} s with "
                      f"(x{ratios[-1]:.3f}); p99 without {p(off['lat'], 99):.3f} s, with {p(on['lat'], 99):.3f} s; "
                      f"{on['metrics_cost'].strip()} ({100 * accounted[-1]:.2f}% of its CPU); load {open('/proc/loadavg').read().split()[0]}")
    lat = np.concatenate(on_lat)
    median = float(np.median(ratios))
    return [
        Row("live", f"tandem live CPU with /metrics scraped every 1 s vs without (median of {METRICS_PAIRS} pairs, "
            f"{METRICS_SECONDS:g} s runs)", median, 1.0, "x", f"<= {METRICS_CPU_BAR}x", median <= METRICS_CPU_BAR),
        Row("live", "metrics code's own CPU (accounted in tandem live) vs its whole CPU", float(np.median(accounted)), 1.0, "fraction",
            "report", None),
        Row("live", "pause end -> live row p99 with metrics served vs bar", p(lat, 99), BAR_P99_S, "s", f"<= {BAR_P99_S} s",
            p(lat, 99) <= BAR_P99_S),
    ]


def _trace_arrays(trace: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since start, RSS MiB) of a run's samples as two arrays."""
    return np.array([x for x, _ in trace]), np.array([y for _, y in trace])


def _thirds_mib(trace: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median RSS over each third of the run (robust to the allocator's sawtooth)."""
    t, m = _trace_arrays(trace)
    edges = [0, t.max() / 3, 2 * t.max() / 3, t.max() + 1]
    return tuple(float(np.nanmedian(m[(t >= a) & (t < b)])) for a, b in zip(edges, edges[1:]))


def _slope_mib_per_min(trace: list[tuple[float, float]], since: float = 0.5) -> float:
    """Least-squares RSS slope (MiB/min) from `since` (a fraction of the run) to its end."""
    t, m = _trace_arrays(trace)
    keep = (t >= since * t.max()) & np.isfinite(m)
    if keep.sum() < 3:
        return float("nan")
    return float(np.polyfit(t[keep] / 60.0, m[keep], 1)[0])


def _rss_curve(trace: list[tuple[float, float]], every_s: float) -> list[tuple[float, float]]:
    """(end of bucket s, median RSS MiB) per `every_s` of the run: the curve docs/live.md records."""
    t, m = _trace_arrays(trace)
    out = []
    for lo in np.arange(0.0, t.max(), every_s):
        inside = (t >= lo) & (t < lo + every_s) & np.isfinite(m)
        if inside.any():
            out.append((float(lo + every_s), float(np.median(m[inside]))))
    return out


def _equals_offline(session: Path) -> tuple[bool, int, int, int]:
    """Live overlaps == offline `analyze` of the same session (pairs matched as the tests do):
    (equal, offline pairs, pairs only live has, pairs only offline has)."""
    from engine.analysis import analyze_session
    from engine.results import Results

    # (the tests import their helpers from tests/, which pytest puts on the path)
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    from tests.test_live import _on_ring_alignment, _pause_keys

    live_pauses, live_overlaps = Results(session / "live").table("pauses"), Results(session / "live").table("overlaps")
    offline = analyze_session(session)
    rebased = _on_ring_alignment(offline.pauses, live_pauses)
    live_pairs, offline_pairs = _pause_keys(live_pauses, live_overlaps), _pause_keys(rebased, offline.overlaps)
    return live_pairs == offline_pairs, len(offline_pairs), len(live_pairs - offline_pairs), len(offline_pairs - live_pairs)


def main(console) -> list[Row]:
    seconds = SECONDS
    p = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
    rows = []
    tmp = tempfile.mkdtemp(prefix="tandem-bench-live-")
    keep = False  # a soak whose results differ from offline is kept for inspection
    try:
        if SPANS_PER_MIN > 0:
            rows.extend(_spans_case(console, Path(tmp), p))
        if METRICS_PAIRS > 0:
            rows.extend(_metrics_cpu(console, Path(tmp), p))
        before = run_once(False, seconds, Path(tmp)) if BEFORE else None
        after = run_once(True, seconds, Path(tmp))
        for label, r in (("before: JFR repository", before), ("after: pause ring", after)):
            if r is None:
                continue
            console.print(f"{label}: {r['pauses']} pauses ({r['late_start_up']} start-up ones joined late), "
                          f"latency p50 {p(r['lat'], 50):.3f} s p99 {p(r['lat'], 99):.3f} s max {p(r['lat'], 100):.3f} s "
                          f"(read from the ring: p50 {p(r['polled'], 50):.3f} s p99 {p(r['polled'], 99):.3f} s; "
                          f"final, pause_impact: p50 {p(r['final'], 50):.3f} s p99 {p(r['final'], 99):.3f} s, "
                          f"after the first {SETTLED_AFTER_S:g} s p99 {p(r['final_settled'], 99):.3f} s); "
                          f"ring commit-to-reader p50 {p(r['anchor'], 50):.3f} s p99 {p(r['anchor'], 99):.3f} s; "
                          f"RSS MiB at 1/3, 2/3, end {[None if x is None else round(x) for x in r['rss_mib']]} "
                          f"(max {[None if x is None else round(x) for x in r['hwm_mib']]}); "
                          f"CPU {r['cpu_s']:.2f} s over {r['wall_s']:.1f} s; load {open('/proc/loadavg').read().split()[0]}")
        a = after
        anchor99 = p(a["anchor"], 99) if len(a["anchor"]) else 1.0
        rows.append(Row("live", f"pause end -> live row p99, pause ring ({seconds:g} s run) vs ring commit p99",
                        p(a["lat"], 99), anchor99, "s", f"<= {BAR_P99_S} s", p(a["lat"], 99) <= BAR_P99_S))
        rows.append(Row("live", f"pause end -> live row p99 after the first {SETTLED_AFTER_S:g} s (start-up left out) vs ring commit p99",
                        p(a["lat_settled"], 99), anchor99, "s", "report", True))
        rows.append(Row("live", "pause end -> live row p50, pause ring vs ring commit p50",
                        p(a["lat"], 50), p(a["anchor"], 50), "s", "report", True))
        rows.append(Row("live", f"pause end -> pause_impact row (final, causes live) p99, pause ring vs the watermark's lag "
                                f"(GIL commit lag seen {a['commit_lag']})",
                        p(a["final"], 99), wm.LAG_NS / 1e9, "s", f"<= {BAR_P99_S} s", p(a["final"], 99) <= BAR_P99_S))
        rows.append(Row("live", f"pause end -> pause_impact row (final, causes live) p99 after the first {SETTLED_AFTER_S:g} s "
                                "(start-up left out) vs the watermark's lag",
                        p(a["final_settled"], 99), wm.LAG_NS / 1e9, "s", "report", True))
        if before is not None:
            rows.append(Row("live", "pause end -> live row p99, before (repository) vs JFR flush floor 1 s",
                            p(before["lat"], 99), 1.0, "s", f"<= {BAR_P99_S} s", p(before["lat"], 99) <= BAR_P99_S))
            rows.append(Row("live", "tandem live CPU seconds, pause ring vs repository", a["cpu_s"], before["cpu_s"], "s",
                            "report", True))
        if SOAK_SECONDS > 0:
            soak = run_once(True, SOAK_SECONDS, Path(tmp), ("--gc-period", "0.25", "--request-threads", "4"), name="soak")
            slope = _slope_mib_per_min(soak["trace"], since=0.5)
            thirds = _thirds_mib(soak["trace"])
            equal, pairs, live_only, offline_only = _equals_offline(soak["session"])
            keep = not equal
            console.print(f"soak {SOAK_SECONDS:g} s, tandem live's last headline: {soak['headline']}")
            if keep:
                console.print(f"soak: live and offline results differ; the session is kept in {soak['session']}")
            rss = soak["rss_mib"]
            curve = " ".join(f"{t:g}s:{m:.0f}" for t, m in _rss_curve(soak["trace"], SOAK_PRINT_EVERY_S))
            console.print(f"soak {SOAK_SECONDS:g} s: RSS MiB (median of each {SOAK_PRINT_EVERY_S:g} s) {curve}")
            console.print(f"soak {SOAK_SECONDS:g} s: {soak['pauses']} pauses; RSS MiB at 1/3, 2/3, end "
                          f"{[None if x is None else round(x, 1) for x in rss]}; median RSS per third "
                          f"{[round(x, 1) for x in thirds]}; least-squares slope over the last half {slope:+.2f} MiB/min "
                          f"(last 2/3: {_slope_mib_per_min(soak['trace'], since=1 / 3):+.2f}); "
                          f"latency p50 {p(soak['lat'], 50):.3f} s p99 {p(soak['lat'], 99):.3f} s; "
                          f"CPU {soak['cpu_s']:.1f} s; overlaps equal offline: {equal} ({pairs} pairs; "
                          f"{live_only} only live, {offline_only} only offline); "
                          f"load {open('/proc/loadavg').read().split()[0]}")
            # The anchor: what the structures kept by design grow at this run's pause rate.
            by_design = KEPT_BYTES_PER_PAUSE * soak["pauses"] / (SOAK_SECONDS / 60) / 2**20
            rows.append(Row("live", f"soak {SOAK_SECONDS:g} s: RSS slope over the last half of the soak "
                            f"(anchor: growth by design, {KEPT_BYTES_PER_PAUSE} bytes a pause)",
                            slope, by_design, "MiB/min", f"<= {SOAK_SLOPE_BAR:g} MiB/min, equal offline",
                            slope <= SOAK_SLOPE_BAR and equal))
            rows.append(Row("live", f"soak {SOAK_SECONDS:g} s: pause end -> live row p99 vs ring commit p99",
                            p(soak["lat"], 99), p(soak["anchor"], 99) if len(soak["anchor"]) else float("nan"), "s",
                            f"<= {BAR_P99_S} s", p(soak["lat"], 99) <= BAR_P99_S))
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return rows
