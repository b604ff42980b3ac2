"""`tandem live --metrics-port PORT` / `--otlp URL`: the live results as metrics (docs/metrics.md).

Both read the same measurements, taken from the rows the live run makes final (the rows its
Parquet parts get: `RollingWriter` observers) and, at each scrape or export, from its state
(watermark, probe losses). Prometheus: `prometheus_client` serves /metrics. OpenTelemetry: the
SDK's MeterProvider pushes with the OTLP/HTTP exporter. Neither is imported unless asked for.

Labels are bounded: process id, the user's service name, pause kind (and a GC's collector name
and action); never a thread id or a pause name (deoptimization names are method names).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from engine.memory.series import JVM_POOLS
from engine.memory.table import BUCKETS


@dataclass(frozen=True)
class Metric:
    prometheus: str  # the exposed name (counters: without `_total`, which prometheus_client adds)
    otel: str
    kind: str  # "counter", "histogram", "gauge", "observed_counter" (a cumulative count read from state)
    unit: str  # UCUM, for OpenTelemetry
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()  # histograms


# One table for both exporters. Names without a standard follow Prometheus' rules (base units,
# _seconds, _total, one tandem_ prefix); GC pauses follow OpenTelemetry's jvm.gc.duration.
# OpenTelemetry's semantic conventions recommend these boundaries for jvm.gc.duration.
GC_BUCKETS = (0.01, 0.1, 1.0, 10.0)
GC_DURATION = Metric("jvm_gc_duration_seconds", "jvm.gc.duration", "histogram", "s", ("pid", "jvm_gc_name", "jvm_gc_action"),
                     "Duration of JVM garbage collection actions (JFR jdk.GarbageCollection).", GC_BUCKETS)
PAUSES = Metric("tandem_pauses", "tandem.pauses", "counter", "{pause}", ("pid", "kind"), "JVM pauses finalized by tandem live.")
PAUSES_HIT = Metric("tandem_pauses_hit_python", "tandem.pauses.hit_python", "counter", "{pause}", ("pid", "kind"),
                    "JVM pauses during which a Python thread was released or waiting for the GIL.")
OVERLAP = Metric("tandem_pause_python_overlap_seconds", "tandem.pause.python_overlap.time", "counter", "s", ("pid", "kind"),
                 "Time of JVM pauses during which at least one Python thread was released or waiting (pause_impact overlap_ns).")
AMPLIFIED = Metric("tandem_pauses_amplified", "tandem.pauses.amplified", "counter", "{pause}", ("pid", "kind"),
                   "JVM pauses that stopped a thread holding the GIL (pause_impact amplified).")
# Pauses caused by Python: the live pause_impact rows' cause column (engine/live/causes.py).
CAUSED = Metric("tandem_pauses_caused_by_python", "tandem.pauses.caused_by_python", "counter", "{pause}", ("pid", "kind"),
                "JVM pauses attributed to Python code.")
GIL_RELEASE = Metric("tandem_gil_release_seconds", "tandem.gil.release.time", "counter", "s", ("pid",),
                     "Thread-seconds Python threads spent with the GIL released (closed intervals).")
GIL_WAIT = Metric("tandem_gil_wait_seconds", "tandem.gil.wait.time", "counter", "s", ("pid",),
                  "Thread-seconds Python threads spent waiting for the GIL (closed intervals).")
DROPPED = Metric("tandem_probe_events_dropped", "tandem.probe.events.dropped", "observed_counter", "{event}", ("pid",),
                 "GIL probe events lost in the producer (ring lane full) or overwritten before tandem live read them.")
LAG = Metric("tandem_watermark_lag_seconds", "tandem.watermark.lag", "gauge", "s", (),
             "How far the correlation's watermark trails CLOCK_MONOTONIC now: rows younger than that are not final yet.")
# Memory (engine/memory/follow.py: the session's memory samples, once a second), with
# OpenTelemetry's names where it has them (process.memory.usage, jvm.memory.used/committed).
PROCESS_MEMORY = Metric("process_memory_usage_bytes", "process.memory.usage", "gauge", "By", ("pid",),
                        "The amount of physical memory in use: the process's RSS (/proc/PID/status VmRSS).")
JVM_MEMORY_USED = Metric("jvm_memory_used_bytes", "jvm.memory.used", "gauge", "By", ("pid", "jvm_memory_type", "jvm_memory_pool_name"),
                         "Measure of memory used (JFR: the heap at the latest GC, metaspace, code cache).")
JVM_MEMORY_COMMITTED = Metric("jvm_memory_committed_bytes", "jvm.memory.committed", "gauge", "By",
                              ("pid", "jvm_memory_type", "jvm_memory_pool_name"), "Measure of memory committed (JFR).")
MEMORY_SPLIT = Metric("tandem_memory_bytes", "tandem.memory.usage", "gauge", "By", ("pid", "bucket"),
                      "The process's RSS split by who accounts for it: jvm_heap, jvm_native, python, native_other, "
                      "unexplained (memory.parquet's buckets, docs/results.md).")
MEMORY_TREND = Metric("tandem_memory_trend_bytes_per_second", "tandem.memory.trend", "gauge", "By/s", ("pid", "bucket"),
                      "Steady growth over the latest minutes (who grew: the lower envelope's slope), of the RSS "
                      "(bucket rss) and of each bucket.")
MEMORY_LEAK = Metric("tandem_memory_leak_bytes_per_second", "tandem.memory.leak.rate", "gauge", "By/s", ("pid", "bucket"),
                     "A leak-like growth named by who grew: its bucket and rate (absent while there is none).")
MEMORY_METRICS = (PROCESS_MEMORY, JVM_MEMORY_USED, JVM_MEMORY_COMMITTED, MEMORY_SPLIT, MEMORY_TREND, MEMORY_LEAK)
# Lost time of a request: from a millisecond (a young collection) to seconds (a full one, a long GIL wait).
LOST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
REQUEST_LOST = Metric("tandem_request_lost_seconds", "tandem.request.lost.time", "histogram", "s", ("endpoint",),
                      "Per request (a span tandem live figured): its time in JVM stops of the world or waiting "
                      "for the GIL (spans.parquet lost_ns).", LOST_BUCKETS)
METRICS = (GC_DURATION, PAUSES, PAUSES_HIT, OVERLAP, AMPLIFIED, CAUSED, GIL_RELEASE, GIL_WAIT, DROPPED, LAG, REQUEST_LOST,
           *MEMORY_METRICS)
# Endpoints are http.route templates or span names; past this many, the rest share one label value.
MAX_ENDPOINTS = 200
OTHER_ENDPOINTS = "(other)"
OTEL_ATTRIBUTE = {"pid": "process.pid", "kind": "tandem.pause.kind", "jvm_gc_name": "jvm.gc.name", "jvm_gc_action": "jvm.gc.action",
                  "jvm_memory_type": "jvm.memory.type", "jvm_memory_pool_name": "jvm.memory.pool.name",
                  "bucket": "tandem.memory.bucket", "endpoint": "tandem.endpoint"}

# jvm.gc.action from JFR's collector names (jdk.GarbageCollection `name`); others: "end of GC".
_MINOR = {"G1New", "ParallelScavenge", "DefNew", "ShenandoahYoung", "ZGC Minor", "ZGC Minor Collection", "ZGC Young"}
_MAJOR = {"G1Old", "G1Full", "ParallelOld", "SerialOld", "PSMarkSweep", "ZGC Major", "ZGC Major Collection", "Z", "Shenandoah"}


def memory_values(snapshot) -> list[tuple[Metric, dict, float]]:
    """The memory gauges of a MemorySnapshot (engine/memory/follow.py): (metric, labels, value)."""
    if snapshot is None:
        return []
    out = []
    for pid, row in sorted(snapshot.latest.items()):
        labels = {"pid": str(pid)}
        if "rss" in row:
            out.append((PROCESS_MEMORY, labels, float(row["rss"])))
        for kind, pool, used, committed in JVM_POOLS:
            pool_labels = {**labels, "jvm_memory_type": kind, "jvm_memory_pool_name": pool}
            if used in row:
                out.append((JVM_MEMORY_USED, pool_labels, float(row[used])))
            if committed in row:
                out.append((JVM_MEMORY_COMMITTED, pool_labels, float(row[committed])))
        has_jvm = any(c.startswith("jvm_") and c not in BUCKETS for c in row)
        for bucket in BUCKETS:
            if bucket in row and (has_jvm or not bucket.startswith("jvm_")):  # (no JVM buckets without a JVM)
                out.append((MEMORY_SPLIT, {**labels, "bucket": bucket}, float(row[bucket])))
    for g in snapshot.growth:
        labels = {"pid": str(g.pid)}
        out.append((MEMORY_TREND, {**labels, "bucket": "rss"}, float(g.rss_rate)))
        out.extend((MEMORY_TREND, {**labels, "bucket": b}, float(rate)) for b, rate in g.rates.items())
        if g.leak:
            out.append((MEMORY_LEAK, {**labels, "bucket": g.leak}, float(g.leak_rate)))
    return out


def gc_action(name: str) -> str:
    return "end of minor GC" if name in _MINOR else "end of major GC" if name in _MAJOR else "end of GC"


class _Prometheus:
    def __init__(self, port: int, addr: str, service: str, state: Callable[[], dict]):
        import prometheus_client
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        prometheus_client.disable_created_metrics()
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self.service = service
        self.scrapes = 0
        self.collect_cpu_s = 0.0  # CPU of the scrapes: collecting and formatting (not the HTTP exchange)
        self._state = state
        self.instruments = {}
        for m in METRICS:
            labels = ["service", *m.labels]
            if m.kind == "counter":
                self.instruments[m] = prometheus_client.Counter(m.prometheus, m.help, labels, registry=self.registry)
            elif m.kind == "histogram":
                self.instruments[m] = prometheus_client.Histogram(m.prometheus, m.help, labels, buckets=m.buckets, registry=self.registry)
        outer = self

        class FromState:
            def describe(self):
                return []

            def collect(self):
                state = outer._state()
                outer.scrapes += 1
                dropped = CounterMetricFamily(DROPPED.prometheus, DROPPED.help, labels=["service", "pid"])
                for pid, count in sorted(state["dropped"].items()):
                    dropped.add_metric([outer.service, str(pid)], count)
                yield dropped
                lag = GaugeMetricFamily(LAG.prometheus, LAG.help, labels=["service"])
                if state["lag_s"] is not None:
                    lag.add_metric([outer.service], state["lag_s"])
                yield lag
                families = {m: GaugeMetricFamily(m.prometheus, m.help, labels=["service", *m.labels]) for m in MEMORY_METRICS}
                for metric, labels, value in memory_values(state.get("memory")):
                    families[metric].add_metric([outer.service, *(labels[k] for k in metric.labels)], value)
                yield from families.values()

        self.registry.register(FromState())

        class Timed:
            """The registry as the server sees it, timing each scrape: the CPU of this (the
            server's) thread from the first family collected to the last one formatted."""

            def collect(self):
                began = time.thread_time()
                try:
                    yield from outer.registry.collect()
                finally:
                    outer.collect_cpu_s += time.thread_time() - began

            def restricted_registry(self, names):
                return outer.registry.restricted_registry(names)

        self.server, self.thread = prometheus_client.start_http_server(port, addr, registry=Timed())

    @property
    def port(self) -> int:
        return self.server.server_port

    def add(self, metric: Metric, value: float, labels: dict) -> None:
        self.instruments[metric].labels(service=self.service, **labels).inc(value)

    def record(self, metric: Metric, values, labels: dict) -> None:
        child = self.instruments[metric].labels(service=self.service, **labels)
        for value in values:
            child.observe(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Otlp:
    def __init__(self, url: str, service: str, interval_s: float, state: Callable[[], dict]):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        _quiet_exporter_logs(url)
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=url), export_interval_millis=interval_s * 1000)
        self.provider = MeterProvider(resource=Resource.create({"service.name": service or "tandem"}), metric_readers=[reader])
        meter = self.provider.get_meter("tandem")
        self.instruments = {}

        def dropped(_options):
            return [Observation(count, {"process.pid": int(pid)}) for pid, count in sorted(state()["dropped"].items())]

        def lag(_options):
            value = state()["lag_s"]
            return [] if value is None else [Observation(value)]

        for m in METRICS:
            if m.kind == "counter":
                self.instruments[m] = meter.create_counter(m.otel, unit=m.unit, description=m.help)
            elif m.kind == "histogram":
                self.instruments[m] = meter.create_histogram(m.otel, unit=m.unit, description=m.help,
                                                             explicit_bucket_boundaries_advisory=list(m.buckets))

        def memory_of(metric: Metric):
            def observe(_options):
                return [Observation(value, self._attributes(labels))
                        for m, labels, value in memory_values(state().get("memory")) if m is metric]
            return observe

        for m in MEMORY_METRICS:
            meter.create_observable_gauge(m.otel, [memory_of(m)], unit=m.unit, description=m.help)
        meter.create_observable_counter(DROPPED.otel, [dropped], unit=DROPPED.unit, description=DROPPED.help)
        meter.create_observable_gauge(LAG.otel, [lag], unit=LAG.unit, description=LAG.help)

    @staticmethod
    def _attributes(labels: dict) -> dict:
        return {OTEL_ATTRIBUTE[k]: (int(v) if k == "pid" else v) for k, v in labels.items()}

    def add(self, metric: Metric, value: float, labels: dict) -> None:
        self.instruments[metric].add(value, self._attributes(labels))

    def record(self, metric: Metric, values, labels: dict) -> None:
        attributes = self._attributes(labels)
        for value in values:
            self.instruments[metric].record(value, attributes)

    def close(self) -> None:
        self.provider.shutdown()  # exports what is left, once


def _quiet_exporter_logs(url: str, every_s: float = 60.0) -> None:
    """The exporter logs each failed attempt (a collector down: one per retry); say it in one
    line naming the URL, at most once a minute. The exporter goes on retrying."""
    import logging
    import sys

    class OneLine(logging.Handler):
        last = -every_s

        def emit(self, record):
            now = time.monotonic()
            if now - self.last >= every_s:
                type(self).last = now
                reason = record.getMessage().split(" encountered while")[0]
                print(f"tandem: --otlp {url}: push failed: {reason[:200]} (retrying; said at most once a minute)", file=sys.stderr)

    for name in ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "opentelemetry.sdk.metrics._internal.export",
                 "opentelemetry.exporter.otlp.proto.http"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [OneLine()]
        logger.propagate = False


def _text(column: pd.Series) -> np.ndarray:
    """A text column as a numpy array of str (missing: ""), without pandas' per-call casts."""
    return column.to_numpy(dtype=object, na_value="")


class LiveMetrics:
    """Measurements of a live run, handed to Prometheus and/or OpenTelemetry.

    `rows(tables)` is called with every batch of final rows (the tables of a part: pauses,
    gil, pause_impact, ...); `bind(state)` gives a function returning the run's state now
    ({"lag_s": ..., "dropped": {pid: n}})."""

    def __init__(self, *, port: int | None = None, addr: str = "0.0.0.0", otlp_url: str | None = None, service: str = "",
                 otlp_interval_s: float = 10.0):
        self._state: Callable[[], dict] = lambda: {"lag_s": None, "dropped": {}, "memory": None}
        state = lambda: self._state()  # noqa: E731  (bound later, read at each scrape/export)
        self.sinks: list = []
        self.prometheus = _Prometheus(port, addr, service, state) if port is not None else None
        if self.prometheus is not None:
            self.sinks.append(self.prometheus)
        if otlp_url:
            self.sinks.append(_Otlp(otlp_url, service, otlp_interval_s, state))
        self._jvm_of_pause: dict[int, int] = {}
        self._endpoints: set[str] = set()
        self._lock = threading.Lock()
        self.rows_cpu_s = 0.0  # CPU spent on the loop's thread counting rows

    def cost(self) -> str:
        """One line: what serving the metrics cost (said at the end of a run)."""
        line = f"metrics: counting rows took {self.rows_cpu_s:.3f} s CPU"
        if self.prometheus is not None:
            line += f"; {self.prometheus.scrapes} scrapes took {self.prometheus.collect_cpu_s:.3f} s CPU"
        return line

    def bind(self, state: Callable[[], dict]) -> None:
        self._state = state

    def _emit(self, metric: Metric, value: float, labels: dict) -> None:
        for sink in self.sinks:
            sink.add(metric, value, labels)

    def rows(self, tables: dict[str, pd.DataFrame]) -> None:
        began = time.thread_time()
        try:
            self._rows(tables)
        finally:
            self.rows_cpu_s += time.thread_time() - began

    def _rows(self, tables: dict[str, pd.DataFrame]) -> None:
        with self._lock:
            pauses = tables.get("pauses")
            if pauses is not None and len(pauses):
                self._pauses(pauses)
            impact = tables.get("pause_impact")
            if impact is not None and len(impact):
                self._impact(impact)
            gil = tables.get("gil")
            if gil is not None and len(gil):
                self._gil(gil)
            spans = tables.get("spans")
            if spans is not None and len(spans):
                self._spans(spans)

    def _pauses(self, pauses: pd.DataFrame) -> None:
        ids = pauses["pause_id"].to_numpy(np.int64)
        jvm = (pauses["jvm_pid"].to_numpy(np.int64, na_value=0) if "jvm_pid" in pauses
               else np.zeros(len(ids), np.int64))
        self._jvm_of_pause.update(zip(ids.tolist(), jvm.tolist()))
        kinds = _text(pauses["kind"])
        gc = np.flatnonzero(kinds == "gc")
        if len(gc):
            names = _text(pauses["name"])[gc]
            seconds = (pauses["end_ns"].to_numpy(np.int64)[gc] - pauses["start_ns"].to_numpy(np.int64)[gc]) / 1e9
            for key in sorted(set(zip(jvm[gc].tolist(), names.tolist()))):
                chosen = (jvm[gc] == key[0]) & (names == key[1])
                labels = {"pid": str(key[0]), "jvm_gc_name": key[1], "jvm_gc_action": gc_action(key[1])}
                for sink in self.sinks:
                    sink.record(GC_DURATION, seconds[chosen].tolist(), labels)

    def _impact(self, impact: pd.DataFrame) -> None:
        ids = impact["pause_id"].to_numpy(np.int64).tolist()
        jvm = np.array([self._jvm_of_pause.pop(i, 0) for i in ids], np.int64)
        kinds = _text(impact["kind"])
        overlap = impact["overlap_ns"].to_numpy(np.int64)
        amplified = impact["amplified"].to_numpy(bool) if "amplified" in impact else np.zeros(len(ids), bool)
        caused = impact["caused_by_python"].to_numpy(bool, na_value=False) if "caused_by_python" in impact else None
        for pid, kind in sorted(set(zip(jvm.tolist(), kinds.tolist()))):
            chosen = (jvm == pid) & (kinds == kind)
            labels = {"pid": str(pid), "kind": kind}
            self._emit(PAUSES, int(chosen.sum()), labels)
            self._emit(PAUSES_HIT, int((chosen & (overlap > 0)).sum()), labels)
            self._emit(OVERLAP, int(overlap[chosen].sum()) / 1e9, labels)
            self._emit(AMPLIFIED, int((chosen & amplified).sum()), labels)
            if caused is not None:
                self._emit(CAUSED, int((chosen & caused).sum()), labels)

    def _gil(self, gil: pd.DataFrame) -> None:
        pids = gil["pid"].to_numpy(np.int64)
        lengths = gil["end_ns"].to_numpy(np.int64) - gil["start_ns"].to_numpy(np.int64)
        waiting = _text(gil["state"]) == "waiting"
        for pid in np.unique(pids).tolist():
            of_pid = pids == pid
            labels = {"pid": str(pid)}
            self._emit(GIL_WAIT, int(lengths[of_pid & waiting].sum()) / 1e9, labels)
            self._emit(GIL_RELEASE, int(lengths[of_pid & ~waiting].sum()) / 1e9, labels)

    def _spans(self, spans: pd.DataFrame) -> None:
        endpoints = _text(spans["endpoint"])
        seconds = spans["lost_ns"].to_numpy(np.int64) / 1e9
        for endpoint in sorted(set(endpoints.tolist())):
            chosen = endpoints == endpoint
            if endpoint not in self._endpoints and len(self._endpoints) >= MAX_ENDPOINTS:
                endpoint = OTHER_ENDPOINTS
            self._endpoints.add(endpoint)
            for sink in self.sinks:
                sink.record(REQUEST_LOST, seconds[chosen].tolist(), {"endpoint": endpoint})

    def close(self, linger_s: float = 0.0) -> None:
        """Stop serving and pushing. linger_s: first keep /metrics up until a scrape has read
        the last rows (a run's end would otherwise fall between two scrapes), at most that long."""
        if self.prometheus is not None and linger_s > 0:
            seen = self.prometheus.scrapes
            deadline = time.monotonic() + linger_s
            while self.prometheus.scrapes == seen and time.monotonic() < deadline:
                time.sleep(0.05)
        for sink in self.sinks:
            sink.close()


def run_state(run) -> Callable[[], dict]:
    """The state the metrics read from a LiveRun: watermark lag, probe losses per process, memory."""

    def state() -> dict:
        w = run.watermark_ns
        dropped = {}
        for source in list(run.watcher.gil.values()):
            status = source.status()
            dropped[source.pid] = int(status.get("dropped", 0)) + int(status.get("missed", 0))
        lag = None if w is None or w >= (1 << 61) else max(0.0, (time.monotonic_ns() - w) / 1e9)
        memory = run.memory.snapshot if run.memory is not None else None
        return {"lag_s": lag, "dropped": dropped, "memory": memory}

    return state
