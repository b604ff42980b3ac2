"""Inside a service with the OpenTelemetry SDK: the thread of every span, and spans to a file.

`ThreadOfSpan` is a span processor that puts the semantic conventions' `thread.id` and
`thread.name` on each span as it starts, so tandem can tell which thread a request ran on
(the Python SDK sets neither). `thread.id` is the OS thread id (threading.get_native_id), the
id the GIL probe records; the conventions' "managed" id would be `threading.get_ident`, a
pthread address nothing else names. tandem's start hook can add it to any TracerProvider of
a service that has the SDK: `add_thread_of_span(provider)`.

`OtlpJsonFileExporter` writes spans as the OpenTelemetry Collector's file exporter does: one
OTLP `ExportTraceServiceRequest` JSON object per line (ids as hex text), for `tandem analyze
--spans FILE`.

This module runs inside the recorded service: it imports only what the SDK already loaded
(the exporter's protobuf encoder on first export).
"""
from __future__ import annotations

import base64
import json
import os
import threading

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class ThreadOfSpan(SpanProcessor):
    """Sets thread.id (OS thread id) and thread.name on every span at its start."""

    def on_start(self, span, parent_context=None) -> None:
        span.set_attribute("thread.id", threading.get_native_id())
        span.set_attribute("thread.name", threading.current_thread().name)

    def on_end(self, span) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def add_thread_of_span(provider) -> None:
    """Make PROVIDER (an SDK TracerProvider) put thread.id and thread.name on its spans (once:
    the start hook may have added it already, engine/probe/span_hook.py)."""
    if getattr(provider, "_tandem_thread_of_span", False):
        return
    provider._tandem_thread_of_span = True
    provider.add_span_processor(ThreadOfSpan())


class OtlpJsonFileExporter(SpanExporter):
    """Appends each batch of spans to PATH as one OTLP JSON line (the Collector's file exporter format)."""

    def __init__(self, path: str | os.PathLike):
        self._path = os.fspath(path)
        self._lock = threading.Lock()
        self._file = open(self._path, "a", encoding="utf-8")

    def export(self, spans) -> SpanExportResult:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        document = MessageToDict(encode_spans(spans))
        for resource in document.get("resourceSpans", ()):
            for scope in resource.get("scopeSpans", ()):
                for span in scope.get("spans", ()):
                    _ids_as_hex(span)
        line = json.dumps(document, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _ids_as_hex(message: dict) -> None:
    """protobuf JSON's base64 ids as OTLP JSON's hex text, in place (a span and its links)."""
    for key in ("traceId", "spanId", "parentSpanId"):
        if message.get(key):
            message[key] = base64.b64decode(message[key]).hex()
    for link in message.get("links", ()):
        _ids_as_hex(link)
