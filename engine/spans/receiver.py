"""An OTLP/HTTP trace receiver: a service's exporter points at it, spans arrive as tables.

`OtlpHttpReceiver(port, on_spans)` serves `POST /v1/traces` (OTLP/HTTP: the body an
`ExportTraceServiceRequest`, `application/x-protobuf` or `application/json`, optionally
gzip-encoded) and answers as the protocol says (an `ExportTraceServiceResponse` in the
request's encoding; 400 for a body that does not parse, 404 elsewhere, 415 for another
content type). Protobuf bodies are parsed by opentelemetry-proto's classes (protobuf's C
parser), JSON bodies by engine.spans.source's reader. Each request's spans go to ON_SPANS
as one table (engine.spans.source.SPAN_COLUMNS) and, with COPY_TO (a name ending in `.binpb`),
every request is kept as its protobuf bytes after their length (4 bytes, big-endian; a JSON
body is re-encoded), which `tandem analyze --spans` reads: live and offline see the same spans.

A service's OTel SDK exports here with no code change:
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:PORT/v1/traces OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd

from engine.errors import TandemError
from engine.probe.span_hook import ENVIRONMENT
from engine.spans.source import (BINPB_SUFFIX, SPAN_COLUMNS, _frame, _hex_id_fields_as_base64, _Malformed, _read_request,
                                 spans_of_message)


TRACES_PATH = "/v1/traces"
SESSION_SPANS = "spans.binpb"  # what `tandem live --otlp-receiver` keeps in the session
PROTOBUF, JSON = "application/x-protobuf", "application/json"
MAX_BODY = 64 << 20


def exporter_environment(receiver: "OtlpHttpReceiver", env: dict) -> dict:
    """The environment variables that point an OpenTelemetry SDK's OTLP trace exporter at RECEIVER,
    and TANDEM_SPANS (the start hook puts thread.id on the spans, engine/probe/span_hook.py).
    A user who set where traces go (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_EXPORTER_OTLP_ENDPOINT
    for every signal) keeps it: then tandem receives nothing. Only the traces' variables: the
    SDK's metrics and logs exporters are not pointed at a receiver that takes traces only."""
    if "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in env or "OTEL_EXPORTER_OTLP_ENDPOINT" in env:
        return {ENVIRONMENT: "1"}
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            ENVIRONMENT: "1"}


class OtlpHttpReceiver:
    """OTLP/HTTP traces on HOST:PORT (PORT 0: any free port, see `.port`) until `close()`."""

    def __init__(self, port: int, on_spans, *, host: str = "127.0.0.1", copy_to: str | Path | None = None):
        self.on_spans = on_spans
        self.requests = self.spans = self.refused = 0
        self.cpu_s = 0.0  # CPU of the request handlers from the body read to the reply (decoding, the copy, on_spans)
        self._lock = threading.Lock()
        if copy_to is not None and not str(copy_to).endswith(BINPB_SUFFIX):
            raise TandemError(f"{copy_to}: the receiver keeps protobuf requests: name the file *{BINPB_SUFFIX}")
        self._copy = open(copy_to, "ab") if copy_to is not None else None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                receiver._handle(self)

            def log_message(self, *args):  # (the service's exports are not tandem's log)
                pass

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as err:
            raise TandemError(f"cannot receive OTLP on {host}:{port} ({err.strerror})") from None
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}{TRACES_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            if self._copy is not None:
                self._copy.close()

    def __enter__(self) -> "OtlpHttpReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handle(self, http: BaseHTTPRequestHandler) -> None:
        began = time.thread_time()
        try:
            self._answer(http)
        finally:
            spent = time.thread_time() - began
            with self._lock:
                self.cpu_s += spent

    def _answer(self, http: BaseHTTPRequestHandler) -> None:
        from google.protobuf.json_format import ParseError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        kind = (http.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        length = int(http.headers.get("Content-Length") or 0)
        body = http.rfile.read(min(length, MAX_BODY + 1))
        if http.path.split("?")[0] != TRACES_PATH:
            return self._reply(http, 404, "text/plain", b"only POST /v1/traces")
        if kind not in (PROTOBUF, JSON):
            return self._reply(http, 415, "text/plain", b"application/x-protobuf or application/json")
        try:
            if length > MAX_BODY:
                raise ValueError(f"body over {MAX_BODY} bytes")
            if (http.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            spans, kept = self._decode(kind, body)
        except (ValueError, OSError, EOFError, _Malformed, TandemError, AttributeError, TypeError, ParseError) as err:
            with self._lock:
                self.refused += 1
            return self._reply(http, 400, "text/plain", f"not an OTLP trace request: {err}".encode())
        with self._lock:
            self.requests += 1
            self.spans += len(spans)
            if self._copy is not None:
                self._copy.write(len(kept).to_bytes(4, "big") + kept)
                self._copy.flush()
            self.on_spans(spans)
        response = ExportTraceServiceResponse()
        if kind == PROTOBUF:
            self._reply(http, 200, PROTOBUF, response.SerializeToString())
        else:
            self._reply(http, 200, JSON, b"{}")

    @staticmethod
    def _decode(kind: str, body: bytes) -> tuple[pd.DataFrame, bytes]:
        """(spans table, the request's protobuf bytes)."""
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        if kind == JSON:
            from google.protobuf.json_format import ParseDict


            document = json.loads(body)
            rows: dict[str, list] = {column: [] for column in SPAN_COLUMNS}
            _read_request(document, rows)
            return _frame(rows), ParseDict(_hex_id_fields_as_base64(document), ExportTraceServiceRequest()).SerializeToString()
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except DecodeError as err:
            raise ValueError(str(err) or "protobuf decode error") from None
        return spans_of_message(request), body

    @staticmethod
    def _reply(http: BaseHTTPRequestHandler, status: int, kind: str, body: bytes) -> None:
        http.send_response(status)
        http.send_header("Content-Type", kind)
        http.send_header("Content-Length", str(len(body)))
        http.end_headers()
        http.wfile.write(body)
