"""OTLP JSON files, as the OpenTelemetry Collector's file exporter writes them, into a spans table.

One `ExportTraceServiceRequest` JSON object per line (resourceSpans -> scopeSpans -> spans),
in OTLP's JSON encoding (OTLP specification, "JSON Protobuf Encoding"): protobuf's JSON
mapping (field names in lowerCamelCase, the proto names accepted too; 64-bit integers as text
or numbers; enums as names or numbers) except that trace and span ids are hex text.

Read with the standard json module and a walk of the few fields used here, not with the
protocol's generated classes and protobuf's JSON parser: that parser is pure Python, far
too slow for a busy service's minute of spans. tests/test_spans.py
holds this reader to the protocol's own classes (opentelemetry-proto and protobuf's
json_format) on the same files.

The table (SPAN_COLUMNS; times are the spans' own wall clock, ns since the epoch):
trace_id, span_id, parent_span_id (lowercase hex, parent null for a root), name, kind
(`server`, `client`, `internal`, `producer`, `consumer`, `unspecified`), start_wall_ns,
end_wall_ns, service_name and host_name (resource attributes `service.name`, `host.name`),
pid (resource attribute `process.pid`), thread_id, thread_name (span attributes `thread.id`,
`thread.name` of the semantic conventions), endpoint (`http.route`, else the span's name).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.errors import TandemError

SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_wall_ns", "end_wall_ns",
                "service_name", "host_name", "pid", "thread_id", "thread_name", "endpoint")
BINPB_SUFFIX = ".binpb"  # OTLP protobuf requests, length-prefixed (read_binpb_file); any other name: OTLP JSON lines
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_KIND_NAMES = {f"SPAN_KIND_{name.upper()}": name for name in _KINDS.values()}
_SCALARS = ("stringValue", "intValue", "boolValue", "doubleValue", "string_value", "int_value", "bool_value",
            "double_value")


class _Malformed(Exception):
    pass


def _field(message: dict, camel: str, proto: str, default=None):
    """A field in either of the spellings protobuf's JSON mapping accepts."""
    value = message.get(camel)
    if value is None:
        value = message.get(proto, default)
    return default if value is None else value


def _list(message: dict, camel: str, proto: str) -> list:
    value = _field(message, camel, proto, [])
    if not isinstance(value, list):
        raise _Malformed(f"{camel} is not a list")
    return value


def _attributes(pairs: list) -> dict:
    """An attribute list ({key, value: AnyValue}) as {key: scalar}; arrays and maps are skipped."""
    out = {}
    for pair in pairs:
        if not isinstance(pair, dict) or not isinstance(pair.get("key"), str):
            raise _Malformed("an attribute without a key")
        value = pair.get("value") or {}
        for name in _SCALARS:
            if name in value:
                out[pair["key"]] = value[name]
                break
    return out


def _nanos(span: dict, camel: str, proto: str) -> int:
    value = _field(span, camel, proto, 0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Malformed(f"{camel} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise _Malformed(f"{camel} {value!r} is not an integer") from None


def _hex_id(span: dict, camel: str, proto: str, size: int) -> str | None:
    value = _field(span, camel, proto, "")
    if not value:
        return None
    if not isinstance(value, str) or len(value) != 2 * size:
        raise _Malformed(f"{camel} {value!r} is not {size} bytes of hex text")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise _Malformed(f"{camel} {value!r} is not hex text") from None
    return value.lower()


def _hex_id_fields_as_base64(request: dict) -> dict:
    """A decoded OTLP JSON request with its span and link ids as protobuf JSON's base64, in
    place, for protobuf's JSON parser (json_format.ParseDict)."""
    import base64

    def convert(message: dict) -> None:
        for key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
            if isinstance(message.get(key), str) and message[key]:
                message[key] = base64.b64encode(bytes.fromhex(message[key])).decode("ascii")
        for link in message.get("links") or ():
            convert(link)

    for resource_spans in _list(request, "resourceSpans", "resource_spans"):
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans", "spans"):
                convert(span)
    return request


def _kind(span: dict) -> str:
    value = _field(span, "kind", "kind", 0)
    if isinstance(value, str):
        if value not in _KIND_NAMES:
            raise _Malformed(f"kind {value!r} is not a SpanKind")
        return _KIND_NAMES[value]
    return _KINDS.get(value, "unspecified")


def _int_or_none(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def read_span_file(path: str | Path) -> pd.DataFrame:
    """One OTLP JSON file's spans as a table (SPAN_COLUMNS), in file order."""
    path = Path(path)
    rows: dict[str, list] = {column: [] for column in SPAN_COLUMNS}
    try:
        lines = path.open("r", encoding="utf-8")
    except OSError as err:
        raise TandemError(f"{path}: cannot read the spans file ({err.strerror})") from None
    with lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                _read_request(json.loads(line), rows)
            except (ValueError, _Malformed, AttributeError, TypeError) as err:
                raise TandemError(f"{path}:{number}: not an OTLP JSON trace request ({err})") from None
    return _frame(rows)


def _read_request(request: dict, rows: dict[str, list]) -> None:
    """Appends the spans of one ExportTraceServiceRequest (a decoded JSON object) to ROWS."""
    if not isinstance(request, dict):
        raise _Malformed("a line is not a JSON object")
    for resource_spans in _list(request, "resourceSpans", "resource_spans"):
        resource = _attributes(_list(_field(resource_spans, "resource", "resource", {}), "attributes", "attributes"))
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans", "spans"):
                trace_id, span_id = _hex_id(span, "traceId", "trace_id", 16), _hex_id(span, "spanId", "span_id", 8)
                if trace_id is None or span_id is None:
                    raise _Malformed("a span without a traceId or spanId")
                start, end = _nanos(span, "startTimeUnixNano", "start_time_unix_nano"), _nanos(span, "endTimeUnixNano", "end_time_unix_nano")
                if end < start:
                    raise _Malformed(f"span {span_id} ends before it starts")
                _append(rows, trace_id, span_id, _hex_id(span, "parentSpanId", "parent_span_id", 8),
                        str(_field(span, "name", "name", "")), _kind(span), start, end, resource,
                        _attributes(_list(span, "attributes", "attributes")))


def _append(rows: dict[str, list], trace_id: str, span_id: str, parent: str | None, name: str, kind: str, start: int,
            end: int, resource: dict, attributes: dict) -> None:
    """One span's row (SPAN_COLUMNS) from its fields and its resource's and own attributes."""
    rows["trace_id"].append(trace_id)
    rows["span_id"].append(span_id)
    rows["parent_span_id"].append(parent)
    rows["name"].append(name)
    rows["kind"].append(kind)
    rows["start_wall_ns"].append(start)
    rows["end_wall_ns"].append(end)
    rows["service_name"].append(resource.get("service.name"))
    rows["host_name"].append(resource.get("host.name"))
    rows["pid"].append(_int_or_none(resource.get("process.pid")))
    rows["thread_id"].append(_int_or_none(attributes.get("thread.id")))
    thread_name = attributes.get("thread.name")
    rows["thread_name"].append(str(thread_name) if thread_name is not None else None)
    route = attributes.get("http.route")
    rows["endpoint"].append(str(route) if route else name)


def spans_of_message(request) -> pd.DataFrame:
    """The spans of one ExportTraceServiceRequest as opentelemetry-proto's message (OTLP's
    protobuf encoding, as an OTLP/HTTP or gRPC receiver gets it), as a table (SPAN_COLUMNS)."""
    columns = {column: [] for column in SPAN_COLUMNS}
    # (The append methods bound once: this loop is the receiver's cost per span.)
    trace_ids, span_ids, parents = columns["trace_id"].append, columns["span_id"].append, columns["parent_span_id"].append
    names, kinds, starts, ends = (columns[c].append for c in ("name", "kind", "start_wall_ns", "end_wall_ns"))
    thread_ids, thread_names, endpoints = (columns[c].append for c in ("thread_id", "thread_name", "endpoint"))
    counts = []
    for resource_spans in request.resource_spans:
        resource = {pair.key: pair.value for pair in resource_spans.resource.attributes}
        facts = (_text_value(resource.get("service.name")), _text_value(resource.get("host.name")),
                 _int_value(resource.get("process.pid")))
        count = 0
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    raise TandemError(f"span {span.name!r}: trace id of {len(trace_id)} bytes and span id of "
                                      f"{len(span_id)} (OTLP: 16 and 8)")
                thread_id = thread_name = route = None
                for pair in span.attributes:
                    key = pair.key
                    if key == "thread.id":
                        thread_id = _int_value(pair.value)
                    elif key == "thread.name":
                        thread_name = _text_value(pair.value)
                    elif key == "http.route":
                        route = _text_value(pair.value)
                name, start = span.name, span.start_time_unix_nano
                trace_ids(trace_id.hex())
                span_ids(span_id.hex())
                parents(span.parent_span_id.hex() or None)
                names(name)
                kinds(_KINDS.get(span.kind, "unspecified"))
                starts(start)
                ends(max(span.end_time_unix_nano, start))
                thread_ids(thread_id)
                thread_names(thread_name)
                endpoints(route or name)
                count += 1
        counts.append((facts, count))
    for column, position in (("service_name", 0), ("host_name", 1), ("pid", 2)):
        columns[column] = [facts[position] for facts, count in counts for _ in range(count)]
    return _frame(columns)


def _text_value(value) -> str | None:
    """An AnyValue message as text (None when absent or empty)."""
    if value is None:
        return None
    which = value.WhichOneof("value")
    return str(getattr(value, which)) if which in ("string_value", "int_value", "bool_value", "double_value") else None


def _int_value(value) -> int | None:
    if value is None:
        return None
    which = value.WhichOneof("value")
    return _int_or_none(getattr(value, which)) if which in ("int_value", "string_value", "double_value") else None


def _frame(rows: dict[str, list]) -> pd.DataFrame:
    """Lists of SPAN_COLUMNS values as the spans table (through Arrow: a third of pandas' own
    conversion of lists of text)."""
    table = pa.table({column: pa.array(values, _ARROW_TYPES[column]) for column, values in rows.items()})
    frame = table.to_pandas(types_mapper={pa.string(): pd.StringDtype(), pa.int64(): pd.Int64Dtype()}.get)
    for column in ("start_wall_ns", "end_wall_ns"):
        frame[column] = frame[column].to_numpy(np.int64)
    return frame


_ARROW_TYPES = {column: pa.int64() if column in ("start_wall_ns", "end_wall_ns", "pid", "thread_id") else pa.string()
                for column in SPAN_COLUMNS}


def read_binpb_file(path: str | Path) -> pd.DataFrame:
    """One file of OTLP protobuf requests (BINPB_SUFFIX: each ExportTraceServiceRequest's bytes
    after their length as a 4-byte big-endian integer, as tandem's receiver keeps them)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TandemError(f"{path}: cannot read the spans file ({err.strerror})") from None
    frames, offset, number = [], 0, 0
    while offset < len(data):
        number += 1
        size = int.from_bytes(data[offset:offset + 4], "big")
        body = data[offset + 4:offset + 4 + size]
        if offset + 4 > len(data) or len(body) != size:
            raise TandemError(f"{path}: request {number} at byte {offset} is cut short (an unfinished write)")
        try:
            frames.append(spans_of_message(ExportTraceServiceRequest.FromString(body)))
        except DecodeError as err:
            raise TandemError(f"{path}: request {number} at byte {offset} is not an OTLP trace request ({err})") from None
        offset += 4 + size
    return pd.concat(frames, ignore_index=True) if frames else _frame({column: [] for column in SPAN_COLUMNS})


class BinpbTail:
    """A file of OTLP protobuf requests (BINPB_SUFFIX) being written by a receiver (`tandem
    record`'s): each poll returns the spans of the requests completed since the last, or None."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0

    def poll(self) -> pd.DataFrame | None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return None  # (not there yet)
        frames, at = [], 0
        while at + 4 <= len(data):
            size = int.from_bytes(data[at:at + 4], "big")
            if at + 4 + size > len(data):
                break  # a request still being written
            frames.append(spans_of_message(ExportTraceServiceRequest.FromString(data[at + 4:at + 4 + size])))
            at += 4 + size
        self.offset += at
        return pd.concat(frames, ignore_index=True) if frames else None


def read_spans(paths) -> pd.DataFrame:
    """Every span of the OTLP JSON files PATHS (and .binpb files of protobuf requests), sorted by start (then span id); a span
    exported twice (same trace and span id) is kept once."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise TandemError("no spans file given")
    frames = [read_binpb_file(p) if p.name.endswith(BINPB_SUFFIX) else read_span_file(p) for p in paths]
    spans = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    spans = spans.drop_duplicates(subset=["trace_id", "span_id"], keep="first")
    return spans.sort_values(["start_wall_ns", "span_id"], kind="stable", ignore_index=True)
