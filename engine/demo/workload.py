"""A small "inference server" in the shape of the services tandem is for.

Python request threads do numpy work (GIL released inside BLAS), some pure-Python work
(GIL held) and call into an embedded JVM through JPype (GIL released for the call); Java
threads allocate so that the collector runs; a "gc-trigger" thread calls System.gc() at
known moments and writes the monotonic bracket of each call to a markers file, which is
the ground truth the end-to-end tests check the analysis against. With --spans FILE each
request is an OpenTelemetry span (the SDK, tandem's thread.id processor and OTLP JSON file
exporter: engine/probe/spans.py), for `tandem analyze --spans FILE`; with --otlp-spans they go
to the SDK's OTLP/HTTP exporter, configured by the environment only (under `tandem record` or
`tandem live --otlp-receiver`: to tandem's receiver).

The JVM is started with plain `jpype.startJVM`, like any user program: under
`tandem record` the agent arrives through JAVA_TOOL_OPTIONS, with no change to this file.

    python -m engine.demo.workload --seconds 20 --markers markers.json [--spans spans.jsonl] [--otlp-spans]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from pathlib import Path


def _request_loop(stop: threading.Event, score, rng_seed: int, counts: list[int], slot: int, tracer=None) -> None:
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    weights = rng.standard_normal((256, 256))
    while not stop.is_set():
        with _span(tracer, "POST /score", {"http.route": "/score"}):
            batch = rng.standard_normal((64, 256))
            hidden = np.tanh(batch @ weights)  # numpy: GIL released inside the matrix product
            features = [float(x) for x in hidden[0, :64]]  # pure Python: GIL held
            with _span(tracer, "Allocator.score"):
                score(features)  # JPype call into Java: GIL released for the call
            time.sleep(0.002)  # waiting on "I/O"
        counts[slot] += 1


def _span(tracer, name: str, attributes: dict | None = None):
    return tracer.start_as_current_span(name, attributes=attributes) if tracer is not None else contextlib.nullcontext()


def _tracer_provider(spans_path: Path | None, otlp: bool):
    """The OTel SDK writing this process's spans to SPANS_PATH as OTLP JSON and/or (OTLP) with
    the SDK's OTLP/HTTP exporter; thread.id on each. None when neither."""
    if spans_path is None and not otlp:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from engine.probe.spans import OtlpJsonFileExporter, add_thread_of_span

    provider = TracerProvider(resource=Resource.create({"service.name": "tandem-demo", "process.pid": os.getpid()}))
    add_thread_of_span(provider)
    if spans_path is not None:
        provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter(spans_path), max_queue_size=1 << 16))
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=1 << 16))
    return provider


def _gc_trigger_loop(stop: threading.Event, system, period_s: float, markers: list[dict]) -> None:
    while not stop.wait(period_s):
        before = time.monotonic_ns()
        system.gc()
        after = time.monotonic_ns()
        markers.append({"tid": threading.get_native_id(), "before_ns": before, "after_ns": after})


def _detached_at_end(target):
    """A thread target that detaches its thread from the JVM when it ends. JPype attaches a
    Python thread on its first call into Java and never detaches it by itself: the JVM then
    keeps a Java thread whose OS thread is gone, and a later thread dump (jcmd Thread.print,
    JFR's jdk.ThreadDump) crashes the JVM in Threads::print_on. A service should do this
    too; the demo does it as an example."""

    def run(*args) -> None:
        import jpype

        try:
            target(*args)
        finally:
            jpype.java.lang.Thread.detach()

    return run


def run(seconds: float, request_threads: int, gc_period_s: float, markers_path: Path | None,
        spans_path: Path | None = None, otlp_spans: bool = False) -> dict:
    import jpype

    from engine.jvm import agent_jar

    jpype.startJVM(classpath=[str(agent_jar())], convertStrings=False)
    allocator = jpype.JClass("tandem.demo.Allocator")
    system = jpype.JClass("java.lang.System")
    score = allocator.score
    allocator.start(2, 200)

    provider = _tracer_provider(spans_path, otlp_spans)
    tracer = provider.get_tracer("engine.demo.workload") if provider is not None else None
    stop = threading.Event()
    counts = [0] * request_threads
    markers: list[dict] = []
    threads = [
        threading.Thread(target=_detached_at_end(_request_loop), args=(stop, lambda f: score(jpype.JArray(jpype.JDouble)(f)), i, counts, i, tracer),
                         name=f"request-{i}")
        for i in range(request_threads)
    ]
    threads.append(threading.Thread(target=_detached_at_end(_gc_trigger_loop), args=(stop, system, gc_period_s, markers), name="gc-trigger"))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    allocator.stop()
    if provider is not None:
        provider.shutdown()  # (exports the spans still queued)
    result = {"requests": sum(counts), "gc_markers": markers, "allocated_bytes": int(allocator.allocatedBytes())}
    if markers_path is not None:
        markers_path.write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--request-threads", type=int, default=3)
    parser.add_argument("--gc-period", type=float, default=2.0, help="seconds between System.gc() calls")
    parser.add_argument("--markers", type=Path, default=None, help="write System.gc() brackets and counts here (JSON)")
    parser.add_argument("--spans", type=Path, default=None, help="write each request's OpenTelemetry spans here (OTLP JSON)")
    parser.add_argument("--otlp-spans", action="store_true", help="send each request's spans with the SDK's OTLP/HTTP exporter "
                        "(where the environment says: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.request_threads, args.gc_period, args.markers, args.spans, args.otlp_spans)
    print(f"demo workload: {result['requests']} requests, {len(result['gc_markers'])} System.gc() calls, "
          f"{result['allocated_bytes'] / 2**20:.0f} MiB allocated by Java")


if __name__ == "__main__":
    main()
