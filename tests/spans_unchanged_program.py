"""A service traced with the OpenTelemetry SDK as services are, knowing nothing of tandem: the
standard OTLP/HTTP exporter, configured by the environment only, and no thread.id on its spans.
Two threads serve ten requests each (a sleep: the GIL released; every fifth a System.gc() of
the JVM it embeds, JPype: a stop of the world inside the request). argv: markers file (JSON: per
span its id and the OS thread that made it; the OpenTelemetry modules loaded before this
program imported any, and whether the SDK's TracerProvider was patched by tandem's hook)."""
import json
import sys
import threading
import time

import jpype

loaded_before = sorted(name for name in sys.modules if name.startswith("opentelemetry"))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

jpype.startJVM()
System = jpype.JClass("java.lang.System")
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
tracer = provider.get_tracer("unchanged")
made = []


def serve():
    for i in range(10):
        with tracer.start_as_current_span("GET /unchanged") as span:
            time.sleep(0.01)
            if i % 5 == 0:
                System.gc()
        made.append({"span_id": format(span.get_span_context().span_id, "016x"), "tid": threading.get_native_id()})
    jpype.java.lang.Thread.detach()


threads = [threading.Thread(target=serve, name=f"worker-{k}") for k in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
provider.shutdown()
with open(sys.argv[1], "w") as out:
    json.dump({"spans": made, "loaded_before": loaded_before,
               "patched": bool(getattr(TracerProvider, "_tandem_patched", False))}, out)
