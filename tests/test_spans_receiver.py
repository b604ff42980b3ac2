"""The OTLP/HTTP receiver (engine/spans/receiver.py) with the real SDK's OTLP/HTTP exporter:
the spans it receives equal those the same SDK wrote to an OTLP JSON file (live and offline
agree), and its copy reads back the same."""
from __future__ import annotations

import gzip
import os
import threading
import urllib.error
import urllib.request

import pandas as pd
import pytest

from engine.errors import TandemError
from engine.spans.receiver import OtlpHttpReceiver
from engine.spans.source import read_spans

KEY = ["start_wall_ns", "span_id"]


def _export(endpoint: str | None, file, count: int, compression=None) -> None:
    """COUNT spans from two threads through the real SDK: to ENDPOINT (OTLP/HTTP, protobuf) when
    given, and to FILE (tandem's OTLP JSON file exporter)."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from engine.probe.spans import OtlpJsonFileExporter, add_thread_of_span

    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "process.pid": os.getpid()}))
    add_thread_of_span(provider)
    if endpoint is not None:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=endpoint, compression=Compression.Gzip if compression else Compression.NoCompression)))
    provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter(file)))
    tracer = provider.get_tracer("test")

    def serve(n):
        for i in range(n):
            with tracer.start_as_current_span("GET /a", attributes={"http.route": "/a/{id}", "i": i}):
                with tracer.start_as_current_span("db"):
                    pass

    threads = [threading.Thread(target=serve, args=(count // 2,), name=f"w{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    provider.shutdown()


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_received_spans_equal_the_file_the_sdk_wrote(tmp_path, compression):
    received = []
    copy = tmp_path / "received.binpb"
    with OtlpHttpReceiver(0, received.append, copy_to=copy) as receiver:
        _export(receiver.endpoint, tmp_path / "file.jsonl", 600, compression)
        assert receiver.refused == 0 and receiver.spans == 1200
    live = pd.concat(received).sort_values(KEY, ignore_index=True)
    offline = read_spans([tmp_path / "file.jsonl"])
    assert len(live) == len(offline) == 1200
    pd.testing.assert_frame_equal(live, offline)
    pd.testing.assert_frame_equal(read_spans([copy]), offline)
    assert live["thread_name"].isin(["w0", "w1"]).all() and set(live["endpoint"]) == {"/a/{id}", "db"}


def test_bad_requests_are_refused_and_the_receiver_goes_on(tmp_path):
    received = []
    with OtlpHttpReceiver(0, received.append) as receiver:
        def post(body, kind="application/x-protobuf", path="/v1/traces", encoding=None):
            request = urllib.request.Request(receiver.endpoint.replace("/v1/traces", path), data=body, method="POST",
                                             headers={"Content-Type": kind, **({"Content-Encoding": encoding} if encoding else {})})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as err:
                return err.code

        assert post(b"\xff\xff\xff") == 400
        assert post(b"{not json", "application/json") == 400
        assert post(b"xx", encoding="gzip") == 400
        assert post(b"", "text/plain") == 415
        assert post(b"", path="/v1/metrics") == 404
        assert post(gzip.compress(b'{"resourceSpans": []}'), "application/json", encoding="gzip") == 200
        _export(receiver.endpoint, tmp_path / "f.jsonl", 10)
        assert receiver.refused == 3 and receiver.spans == 20
    with pytest.raises(TandemError, match=r"name the file \*\.binpb"):
        OtlpHttpReceiver(0, received.append, copy_to=tmp_path / "x.jsonl")


def test_a_json_body_is_kept_as_protobuf_and_reads_back_the_same(tmp_path):
    received = []
    line = (tmp_path / "f.jsonl")
    _export(None, line, 20)
    with OtlpHttpReceiver(0, received.append, copy_to=tmp_path / "kept.binpb") as receiver:
        for text in line.read_text().splitlines():
            request = urllib.request.Request(receiver.endpoint, data=text.encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
    offline = read_spans([line])
    pd.testing.assert_frame_equal(pd.concat(received).sort_values(KEY, ignore_index=True), offline)
    pd.testing.assert_frame_equal(read_spans([tmp_path / "kept.binpb"]), offline)


def test_a_cut_binpb_file_is_one_line(tmp_path):
    path = tmp_path / "cut.binpb"
    path.write_bytes((100).to_bytes(4, "big") + b"abc")
    with pytest.raises(TandemError, match="cut.binpb: request 1 at byte 0 is cut short"):
        read_spans([path])
