"""A service of known requests, traced with the OpenTelemetry SDK: the ground truth of tests/test_spans_recorded.py.

Two request threads serve requests; each request is an SDK span (exported by
engine.probe.spans.OtlpJsonFileExporter through a BatchSpanProcessor, with thread.id set by
ThreadOfSpan): pure-Python work (GIL held), a sleep (GIL released), and every third request a
java.lang.System.gc() through JPype (a stop of the world inside the request). The request
reads CLOCK_MONOTONIC and the wall clock back to back at its start and end (the tightest of a
few tries) and gives the SDK those wall-clock times as the span's, so the span and the
ground-truth bracket are the same instants: what the test checks is tandem's clock and
arithmetic, not the SDK's delay in stamping a span. A third thread
spins in Python (so the request threads wait for the GIL) and a fourth calls System.gc() at
known moments. Under `tandem live --otlp-receiver` the spans also go to tandem's receiver
through the SDK's OTLP/HTTP exporter, configured by the environment. argv: spans file, markers file (JSON: per request its span id, thread and
bracket; per System.gc() call its bracket).
"""
import json
import os
import sys
import threading
import time

import jpype
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import use_span

from engine.probe.spans import OtlpJsonFileExporter, add_thread_of_span

spans_path, markers_path = sys.argv[1], sys.argv[2]
REQUESTS_PER_THREAD = 30

jpype.startJVM()
System = jpype.JClass("java.lang.System")
provider = TracerProvider(resource=Resource.create({"service.name": "known-requests", "process.pid": os.getpid()}))
add_thread_of_span(provider)
provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter(spans_path), schedule_delay_millis=200))
if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):  # (under tandem live --otlp-receiver: to it as well)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
tracer = provider.get_tracer("tests.spans_program")
requests, gc_calls = [], []
done = threading.Event()


def spin(seconds):
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += sum(range(200))
    return total


def clock_pair():
    """(CLOCK_MONOTONIC, wall clock) read back to back, the tightest of up to 50 tries, and its bracket."""
    best = None
    for _ in range(50):
        before, wall, after = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        if best is None or after - before < best[2]:
            best = (before + (after - before) // 2, wall, after - before)
        if after - before < 2_000:
            break
    return best


def serve(slot):
    for i in range(REQUESTS_PER_THREAD):
        route = "/gc" if i % 3 == 0 else "/sleep"
        before, start_wall, start_bracket = clock_pair()
        span = tracer.start_span(f"GET {route}", attributes={"http.route": route}, start_time=start_wall)
        with use_span(span, end_on_exit=False):
            spin(0.002)
            time.sleep(0.01)
            if route == "/gc":
                System.gc()
        after, end_wall, end_bracket = clock_pair()
        span.end(end_time=end_wall)
        requests.append({"span_id": format(span.get_span_context().span_id, "016x"), "route": route,
                         "tid": threading.get_native_id(), "before_ns": before, "after_ns": after,
                         "bracket_ns": max(start_bracket, end_bracket)})
        time.sleep(0.005)
    jpype.java.lang.Thread.detach()


def hog():
    while not done.is_set():
        spin(0.02)
        time.sleep(0.001)


def collector():
    while not done.wait(0.15):
        before = time.monotonic_ns()
        System.gc()
        gc_calls.append({"tid": threading.get_native_id(), "before_ns": before, "after_ns": time.monotonic_ns()})
    jpype.java.lang.Thread.detach()


servers = [threading.Thread(target=serve, args=(slot,), name=f"request-{slot}") for slot in range(2)]
others = [threading.Thread(target=hog, name="hog"), threading.Thread(target=collector, name="gc-at-known-times")]
for thread in servers + others:
    thread.start()
for thread in servers:
    thread.join()
done.set()
for thread in others:
    thread.join()
provider.shutdown()
with open(markers_path, "w") as out:
    json.dump({"requests": requests, "gc_calls": gc_calls}, out)
