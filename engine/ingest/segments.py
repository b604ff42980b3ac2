"""GIL events kept as segments (the flight recorder): where they are, how they are packed, how
they are read. Every reader of a process's drained events (read_gil, the streamed analysis and
so Perfetto export and fleet, tandem dump) goes through `events_blocks`; nothing else knows the
packed encoding (engine/session.py names the files). tandem live follows the rings, not these.

A process that records with rotation (`engine.probe.start(..., segment_bytes=, segment_ms=)`)
writes `gil.events.000000`, `gil.events.000001`, ... (docs/ring.md, "Segments"): each a whole
events file once closed, the newest one still being written. The keeper of `tandem record`
packs each closed one into `gil.events.NNNNNN.packed` (docs/ring.md, "Packed segments") and
drops the oldest to stay within the session's bounds. A recording is read as its segments in
order: a lane's records continue from one segment to the next (each segment's lane table holds
the positions before it), so a reader keeps its pairing state across them, and the first kept
segment starts where rotation left off.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import TandemError
from engine.ring.layout import (
    FILE_KIND_EVENTS,
    GIL_RECORD_DTYPE,
    RECORD_TYPE_GIL,
    RingHeader,
    parse_header,
    records_offset_of,
)
from engine.ring.reader import EventsBlocks, _check_complete, _EventsCheck, _opaque, first_seq, time_span
from engine.session import PACKED_SUFFIX, Segment, gil_segments

PACKED_MAGIC = b"TNDMPACK"
PACKED_VERSION = 2  # written; version 1 (sessions packed before it) is still read
PACKED_PREFIX = 48  # magic, version, record size, rows, events file size, first and last time
# Version 2's columns after the lane column (docs/ring.md, "Packed segments"): (field, width in
# bytes), in lane order; those in LANE_DELTA as differences from the lane's previous row (a
# thread's tid and seq barely change). mono_ns follows as its lane deltas' bit lengths and the
# bits below each one's leading one (a thread's times are close: its deltas' low bits are all
# the information there is, so they are stored as bits, not bytes).
V2_COLUMNS = (("kind", 2), ("tid", 4), ("seq", 8), ("aux", 8))
# Version 1: every column in file order, (field, width), those in LANE_DELTA as lane deltas.
V1_COLUMNS = (("lane", 2), ("kind", 2), ("tid", 4), ("seq", 8), ("mono_ns", 8), ("aux", 8))
LANE_DELTA = ("tid", "seq", "mono_ns")
ZSTD_LEVEL = 3


# ---- packed encoding (docs/ring.md, "Packed segments") ----------------------------------------


def _lane_order(lane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by lane, in file order inside a lane; and which of those rows start a lane."""
    order = np.argsort(lane, kind="stable")
    first = np.empty(len(order), bool)
    if len(order):
        first[0] = True
        sorted_lane = lane[order]
        np.not_equal(sorted_lane[1:], sorted_lane[:-1], out=first[1:])
    return order, first


def _planes(values: np.ndarray, width: int) -> bytes:
    """VALUES (unsigned, WIDTH bytes each) as WIDTH byte planes: every row's byte 0, then byte 1..."""
    return np.ascontiguousarray(values.astype(f"<u{width}").view(np.uint8).reshape(-1, width).T).tobytes()


def _from_planes(raw: memoryview, rows: int, width: int) -> np.ndarray:
    planes = np.frombuffer(raw, np.uint8, count=rows * width).reshape(width, rows)
    return np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(rows)


def _lane_deltas(grouped: np.ndarray, first: np.ndarray, width: int) -> np.ndarray:
    """Each row's value less the previous row's of its lane, modulo 2^(8 WIDTH) (a lane's first
    row: its value); GROUPED in lane order."""
    values = grouped.astype(np.uint64)
    delta = np.empty_like(values)
    delta[1:] = values[1:] - values[:-1]  # (wraps modulo 2^64: the decoder's sum wraps back)
    delta[first] = values[first]
    return delta & np.uint64((1 << 8 * width) - 1)


def _lane_sums(deltas: np.ndarray, first: np.ndarray, width: int) -> np.ndarray:
    """The inverse of _lane_deltas."""
    rows = len(deltas)
    group_start = np.maximum.accumulate(np.where(first, np.arange(rows), 0)) if rows else np.zeros(0, np.intp)
    summed = np.cumsum(deltas.astype(np.uint64), dtype=np.uint64)
    before = np.where(group_start > 0, summed[group_start - 1], np.uint64(0))
    return (summed - before) & np.uint64((1 << 8 * width) - 1)


def _bit_lengths(values: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 value (0 for 0), exactly (no float rounding)."""
    length = np.zeros(len(values), np.int64)
    rest = values.astype(np.uint64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = (rest >> np.uint64(shift)) != 0
        rest = np.where(big, rest >> np.uint64(shift), rest)
        length += big * shift
    return length + (rest != 0)


def _pieces(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each value's bits below its leading one as two pieces of at most 32 bits (high, then low),
    so that a piece and its offset in its first byte fit in one 64-bit word: (bit offset of
    every piece, its width, and its shift in the value), high pieces first then low pieces."""
    widths = np.maximum(lengths - 1, 0)
    low = np.minimum(widths, 32)
    high = widths - low
    starts = np.cumsum(widths) - widths
    return (np.concatenate([starts, starts + high]), np.concatenate([high, low]),
            np.concatenate([low, np.zeros_like(low)]))


def _mantissa_bits(values: np.ndarray, lengths: np.ndarray) -> bytes:
    """Each value's bits below its leading one, most significant first, end to end, zero-padded
    to a byte."""
    offsets, widths, shifts = _pieces(lengths)
    values = np.concatenate([values, values]).astype(np.uint64)
    piece = (values >> shifts.astype(np.uint64)) & ((np.uint64(1) << widths.astype(np.uint64)) - np.uint64(1))
    # the piece placed in the 64-bit big-endian word that starts at its first byte
    word = np.where(widths > 0, piece << (64 - widths - (offsets & 7)).astype(np.uint64), np.uint64(0))
    size = _mantissa_bytes(lengths)
    first_byte = offsets >> 3
    out = np.zeros(size + 8, np.float64)
    for k in range(8):  # pieces' bits are disjoint: summing a byte's shares is OR-ing them (exact below 2^53)
        share = ((word >> np.uint64(56 - 8 * k)) & np.uint64(0xFF)).astype(np.float64)
        out += np.bincount(first_byte + k, weights=share, minlength=size + 8)[:size + 8]
    return out[:size].astype(np.uint8).tobytes()


def _from_mantissa_bits(raw: memoryview, lengths: np.ndarray) -> np.ndarray:
    offsets, widths, shifts = _pieces(lengths)
    padded = np.zeros(_mantissa_bytes(lengths) + 8, np.uint8)
    padded[:len(raw)] = np.frombuffer(raw, np.uint8)
    first_byte = offsets >> 3
    word = np.zeros(len(offsets), np.uint64)
    for k in range(8):
        word |= padded[first_byte + k].astype(np.uint64) << np.uint64(56 - 8 * k)
    piece = np.where(widths > 0, (word << (offsets & 7).astype(np.uint64)) >> (64 - np.maximum(widths, 1)).astype(np.uint64),
                     np.uint64(0))
    rows = len(lengths)
    mantissa = (piece[:rows] << shifts[:rows].astype(np.uint64)) | piece[rows:]
    leading = np.where(lengths > 0, np.uint64(1) << np.maximum(lengths - 1, 0).astype(np.uint64), np.uint64(0))
    return leading | mantissa


def _mantissa_bytes(lengths: np.ndarray) -> int:
    return (int(np.maximum(lengths - 1, 0).sum()) + 7) // 8


def pack(events_path: Path) -> bytes:
    """The packed form (version 2) of a closed events file (raises TandemError for any other)."""
    import zstandard

    events_path = Path(events_path)
    blocks = EventsBlocks(events_path)
    if not blocks.closed:
        raise TandemError(f"{events_path}: not closed: only a closed segment is packed")
    if blocks.header.record_type != RECORD_TYPE_GIL:
        raise TandemError(f"{events_path}: not a GIL events file")
    for _ in blocks:  # every record checked, as any reader would (counters of the closed file too)
        pass
    with open(events_path, "rb") as f:
        data = f.read()
    offset = blocks.header.records_offset
    rows = (len(data) - offset) // GIL_RECORD_DTYPE.itemsize
    records = np.frombuffer(data, GIL_RECORD_DTYPE, count=rows, offset=offset)
    return _prefix(records, rows, len(data)) + zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(
        encode(data[:offset], records))


def encode(head: bytes, records: np.ndarray) -> bytes:
    """Version 2's payload: HEAD (the header page and lane table), then RECORDS' columns."""
    order, first = _lane_order(records["lane"])
    grouped = records[order]
    parts = [head, _planes(records["lane"], 2)]
    for name, width in V2_COLUMNS:
        values = _lane_deltas(grouped[name], first, width) if name in LANE_DELTA else grouped[name]
        parts.append(_planes(values, width))
    times = _lane_deltas(grouped["mono_ns"], first, 8)
    lengths = _bit_lengths(times)
    parts += [lengths.astype(np.uint8).tobytes(), _mantissa_bits(times, lengths)]
    return b"".join(parts)


def decode(payload: memoryview, offset: int, rows: int) -> np.ndarray | None:
    """RECORDS from version 2's PAYLOAD (its columns from OFFSET on); None when its size is not
    what its columns need."""
    fixed = rows * (2 + sum(width for _, width in V2_COLUMNS) + 1)
    if len(payload) < offset + fixed:
        return None
    records = np.zeros(rows, GIL_RECORD_DTYPE)
    lane = _from_planes(payload[offset:offset + 2 * rows], rows, 2)
    records["lane"] = lane
    order, first = _lane_order(lane)
    grouped = np.zeros(rows, GIL_RECORD_DTYPE)
    at = offset + 2 * rows
    for name, width in V2_COLUMNS:
        values = _from_planes(payload[at:at + rows * width], rows, width)
        grouped[name] = _lane_sums(values, first, width) if name in LANE_DELTA else values
        at += rows * width
    lengths = np.frombuffer(payload[at:at + rows], np.uint8).astype(np.int64)
    at += rows
    if (lengths > 64).any() or len(payload) != at + _mantissa_bytes(lengths):
        return None
    grouped["mono_ns"] = _lane_sums(_from_mantissa_bits(payload[at:], lengths), first, 8)
    for name in ("kind", "tid", "seq", "mono_ns", "aux"):
        records[name][order] = grouped[name]
    return records


def _decode_v1(payload: memoryview, offset: int, rows: int) -> np.ndarray | None:
    """RECORDS from version 1's PAYLOAD: every column in file order, as byte planes."""
    if len(payload) != offset + rows * sum(width for _, width in V1_COLUMNS):
        return None
    at = offset
    columns = {}
    for name, width in V1_COLUMNS:
        columns[name] = _from_planes(payload[at:at + rows * width], rows, width)
        at += rows * width
    records = np.zeros(rows, GIL_RECORD_DTYPE)
    order, first = _lane_order(columns["lane"])
    for name, width in V1_COLUMNS:
        if name in LANE_DELTA:
            values = np.empty(rows, np.uint64)
            values[order] = _lane_sums(columns[name][order], first, width)
            records[name] = values
        else:
            records[name] = columns[name]
    return records


_DECODERS = {1: _decode_v1, 2: decode}


def _prefix(records: np.ndarray, rows: int, raw_size: int) -> bytes:
    first_ns, last_ns = time_span(records)
    return (PACKED_MAGIC + PACKED_VERSION.to_bytes(4, "little") + GIL_RECORD_DTYPE.itemsize.to_bytes(4, "little")
            + rows.to_bytes(8, "little") + raw_size.to_bytes(8, "little")
            + first_ns.to_bytes(8, "little") + last_ns.to_bytes(8, "little"))


def packed_span(path: Path) -> tuple[int, int]:
    """(earliest, latest) event time of a packed segment, from its prefix alone."""
    with open(path, "rb") as f:
        prefix = f.read(PACKED_PREFIX)
    if len(prefix) < PACKED_PREFIX or prefix[:8] != PACKED_MAGIC:
        raise TandemError(f"{path}: not a packed tandem segment")
    return int.from_bytes(prefix[32:40], "little"), int.from_bytes(prefix[40:48], "little")


def unpack(path: Path) -> tuple[bytes, np.ndarray]:
    """(the events file's header page and lane table, its rows in file order: records and LOST
    markers) of a packed segment."""
    try:
        import zstandard
    except ImportError:
        raise TandemError(f"{path}: reading packed GIL segments needs the zstandard package (pip install zstandard)") from None
    data = Path(path).read_bytes()
    if len(data) < PACKED_PREFIX or data[:8] != PACKED_MAGIC:
        raise TandemError(f"{path}: not a packed tandem segment (magic {data[:8]!r}, expected {PACKED_MAGIC!r})")
    version = int.from_bytes(data[8:12], "little")
    if version not in _DECODERS:
        raise TandemError(f"{path}: packed segment version {version}, this tandem reads versions "
                          f"{', '.join(map(str, _DECODERS))}")
    record_size, rows, raw_size = (int.from_bytes(data[a:b], "little") for a, b in ((12, 16), (16, 24), (24, 32)))
    if record_size != GIL_RECORD_DTYPE.itemsize or rows > (1 << 40):
        raise TandemError(f"{path}: packed segment of {rows} records of {record_size} bytes (corrupt file)")
    try:
        payload = zstandard.ZstdDecompressor().decompress(data[PACKED_PREFIX:], max_output_size=raw_size + (1 << 20))
    except zstandard.ZstdError as err:
        raise TandemError(f"{path}: packed segment does not decompress ({err}) (corrupt file)") from None
    offset = records_offset_of(payload)
    records = _DECODERS[version](memoryview(payload), offset, rows) if offset and raw_size == offset + rows * record_size else None
    if records is None:
        raise TandemError(f"{path}: packed segment holds {len(payload)} bytes, not what its {rows} records need (corrupt file)")
    return bytes(payload[:offset]), records


# ---- reading ---------------------------------------------------------------------------------


class PackedBlocks:
    """A packed segment read as EventsBlocks reads an events file (same checks, same attributes)."""

    def __init__(self, path: Path, block_records: int = 1 << 20):
        self.path = Path(path)
        self._head, self._rows = unpack(self.path)
        self.header = parse_header(self._head, self.path, FILE_KIND_EVENTS)
        self.block_records = max(1, int(block_records))
        self.lost = 0
        self.closed = self.header.closed
        self.records_read = 0
        self.next_seq = first_seq(self.header)
        self.lane_records: tuple[int, ...] = ()
        self.lane_lost: tuple[int, ...] = ()
        self.trailing_bytes = 0

    def span(self) -> tuple[int, int] | None:
        """(earliest, latest) event time (EventsBlocks.span)."""
        first, last = time_span(self._rows)
        return (first, last) if last else None

    def __iter__(self):
        header = self.header
        check = _EventsCheck(self.path, header.record_dtype, header.lane_count, first_seq(header))
        rows = self._rows.view(_opaque(header.record_dtype))
        for first in range(0, len(rows), self.block_records):
            block = rows[first:first + self.block_records].copy()
            got = check.chunk(block, first)
            self.records_read += got
            if got:
                yield block[:got].view(header.record_dtype)
        self.lane_records, self.lane_lost, self.lost, self.closed = _check_complete(self.path, header, check, len(rows))
        self.next_seq = check.next_seq.copy()


def open_segment(segment: Segment, block_records: int = 1 << 20):
    return PackedBlocks(segment.path, block_records) if segment.packed else EventsBlocks(segment.path, block_records)


class SegmentedBlocks:
    """A recording's kept segments read as one events file, block by block (EventsBlocks'
    interface: `header` (the first kept segment's), then after iterating `lost`, `closed` (the
    newest segment closed), `records_read`, `next_seq`, `lane_records`, `lane_lost`), plus
    `window` (what is kept and what was rotated out). Each lane's records must continue from
    one kept segment to the next; a segment that went while it was being listed is skipped
    as rotated out when it is the oldest."""

    def __init__(self, events_path: Path, block_records: int = 1 << 20):
        self.path = Path(events_path)
        self.block_records = block_records
        self.segments = gil_segments(self.path)
        if not self.segments:
            raise TandemError(f"{self.path}: no events file and no segments of it")
        self.header = self._first_header()
        self.lost = 0
        self.closed = False
        self.records_read = 0
        self.next_seq = first_seq(self.header)
        self.lane_records: tuple[int, ...] = ()
        self.lane_lost: tuple[int, ...] = ()
        self.trailing_bytes = 0
        self.drain_lost = 0
        self.window = SegmentWindow.of(self.header)

    def span(self) -> None:
        return None  # (segments rotate away as they are read: not known up front)

    def _first_header(self) -> RingHeader:
        while self.segments:
            try:
                return open_segment(self.segments[0], 1).header
            except (TandemError, FileNotFoundError):
                if len(self.segments) > 1 and not self.segments[0].path.exists():
                    self.segments.pop(0)  # rotated out meanwhile
                    continue
                raise
        raise TandemError(f"{self.path}: its segments were all rotated out while being read")

    def __iter__(self):
        lane_count = self.header.lane_count
        records = np.zeros(lane_count, np.int64)
        lost = np.zeros(lane_count, object)
        expected = None
        for segment in self.segments:
            try:
                reader = open_segment(segment, self.block_records)
            except FileNotFoundError:
                if expected is None:  # the oldest went meanwhile: the window starts later
                    continue
                raise TandemError(f"{segment.path}: a kept segment vanished while being read") from None
            if expected is None:  # (the first one read: what went before it was rotated out)
                self.window = SegmentWindow.of(reader.header)
            elif not np.array_equal(first_seq(reader.header), expected):
                raise TandemError(f"{segment.path}: its lanes do not continue the segment before it (a segment is missing)")
            if reader.header.lane_count != lane_count or reader.header.producer_pid != self.header.producer_pid:
                raise TandemError(f"{segment.path}: a segment of another recording")
            for block in reader:
                self.window.saw(block["mono_ns"])
                yield block
            records += np.asarray(reader.lane_records, np.int64)
            lost += np.asarray(reader.lane_lost, object)
            self.lost += reader.lost
            self.records_read += reader.records_read
            self.drain_lost += reader.header.drain_lost
            self.closed = reader.closed
            expected = reader.next_seq
            self.next_seq = reader.next_seq.copy()
            self.window.add(reader)
        self.lane_records = tuple(int(n) for n in records)
        self.lane_lost = tuple(int(n) for n in lost)


@dataclass
class SegmentWindow:
    """What a segmented recording keeps: the first kept segment's number, how many are kept, the
    events before the first (positions and drops of every lane: rotated out), and the earliest
    and latest event time read."""

    first_segment: int
    rotated_out_events: int  # records and drops before the first kept segment
    segments: int = 0
    first_ns: int | None = None
    last_ns: int | None = None

    @classmethod
    def of(cls, header: RingHeader) -> "SegmentWindow":
        before = int(header.lanes["base_head"].astype(object).sum() + header.lanes["base_dropped"].astype(object).sum())
        return cls(first_segment=header.segment, rotated_out_events=before)

    def add(self, reader) -> None:
        self.segments += 1

    def saw(self, mono_ns: np.ndarray) -> None:
        if mono_ns.size:
            low, high = int(mono_ns.min()), int(mono_ns.max())
            self.first_ns = low if self.first_ns is None else min(self.first_ns, low)
            self.last_ns = high if self.last_ns is None else max(self.last_ns, high)

    def as_dict(self) -> dict:
        return {"first_segment": self.first_segment, "segments": self.segments,
                "rotated_out_events": self.rotated_out_events, "first_ns": self.first_ns, "last_ns": self.last_ns}


def events_blocks(events_path: Path, block_records: int = 1 << 20):
    """The reader of a process's events: its events file, or its kept segments."""
    events_path = Path(events_path)
    if events_path.name.endswith(PACKED_SUFFIX):
        return PackedBlocks(events_path, block_records)
    if not events_path.exists() and gil_segments(events_path):
        return SegmentedBlocks(events_path, block_records)
    return EventsBlocks(events_path, block_records)
