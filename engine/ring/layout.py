"""The binary layout of ring and events files (docs/ring.md), and header validation.

Nothing here trusts a file: `parse_header` checks every field a reader relies on and
raises a one-line `TandemError` naming the file otherwise.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import TandemError
from engine.session import current_boot_id  # noqa: F401  (engine.ring names it too)

MAGIC = b"TNDMRING"
VERSION = 2
HEADER_SIZE = 4096
MIN_CAPACITY = 2           # slots per lane
MAX_CAPACITY = 1 << 26     # slots in all lanes together
MAX_LANES = 64
LANE_STRIDE = 512          # bytes of one lane's counters in the lane table
PAGE = 4096
CLOCK_MONOTONIC = 1
# Ring files only: the time fields hold raw TSC ticks, mapped to CLOCK_MONOTONIC ns by the
# header's calibration table (docs/ring.md, "TSC time"). Readers return CLOCK_MONOTONIC ns.
CLOCK_TSC = 2
CLOCK_NAMES = {CLOCK_MONOTONIC: "CLOCK_MONOTONIC", CLOCK_TSC: "TSC"}
# Positions beyond this are not produced by any real producer (2^62 events at 1 GHz is
# 146 years) and would make position arithmetic wrap: treated as corruption.
MAX_POSITION = 1 << 62

FILE_KIND_RING = 1
FILE_KIND_EVENTS = 2
FILE_KIND_NAMES = {FILE_KIND_RING: "ring", FILE_KIND_EVENTS: "events"}

RECORD_TYPE_GIL = 1
RECORD_TYPE_PAUSE = 2

STATE_DRAINING = 1
STATE_CLOSED = 2

# GIL event kinds (engine/probe/ring.h, enum tandem_gil_event).
GIL_DROP = 1
GIL_TAKE_REQUEST = 2
GIL_TAKE_ACQUIRED = 3
GIL_SAMPLE_HELD = 4
GIL_SAMPLE_FREE = 5
# Events files only: `aux` events were dropped in lane `lane` since that lane's previous marker.
LOST_MARKER = 0xFF01

# Every record starts with the same 32 bytes; a pause record extends them to 64.
# `seq` is the record's position in its lane + 1; `lane` the lane it was produced into.
GIL_RECORD_DTYPE = np.dtype(
    {
        "names": ["seq", "mono_ns", "tid", "kind", "lane", "aux"],
        "formats": ["<u8", "<u8", "<u4", "<u2", "<u2", "<u8"],
        "offsets": [0, 8, 16, 20, 22, 24],
        "itemsize": 32,
    }
)
PAUSE_RECORD_DTYPE = np.dtype(
    {
        "names": ["seq", "start_ns", "tid", "kind", "lane", "aux", "end_ns", "id", "name_code", "requester", "cause_code"],
        "formats": ["<u8", "<u8", "<u4", "<u2", "<u2", "<u8", "<u8", "<u8", "<u4", "<u4", "<u4"],
        "offsets": [0, 8, 16, 20, 22, 24, 32, 40, 48, 52, 56],
        "itemsize": 64,
    }
)
RECORD_DTYPES = {RECORD_TYPE_GIL: GIL_RECORD_DTYPE, RECORD_TYPE_PAUSE: PAUSE_RECORD_DTYPE}

# Header fields new in version 2: the lane table follows the header page.
OFFSET_LANE_CAPACITY = 28
OFFSET_LANE_COUNT = 168
OFFSET_LANE_STRIDE = 172
OFFSET_RECORDS = 176
OFFSET_SEGMENT = 184  # events files: segment number (0: the first segment, or the only file)
OFFSET_STATE = 1408
OFFSET_DRAIN_LOST = 1416
# One lane's counters, at HEADER_SIZE + lane * LANE_STRIDE; each written word alone in a
# 128-byte block.
LANE_OFFSET_HEAD = 0
LANE_OFFSET_TAIL = 128
LANE_OFFSET_DROPPED = 256
LANE_OFFSET_OWNER = 384
LANE_OFFSET_DRAIN_LOST = 392
# Events files: the lane's positions and reported drops before this file (a segment after
# the first, docs/ring.md "Segments"); 0 in a file that holds the recording from its start.
LANE_OFFSET_BASE_HEAD = 400
LANE_OFFSET_BASE_DROPPED = 408
LANE_DTYPE = np.dtype(
    {
        "names": ["head", "tail", "dropped", "owner", "drain_lost", "base_head", "base_dropped"],
        "formats": ["<u8", "<u8", "<u8", "<u4", "<u8", "<u8", "<u8"],
        "offsets": [LANE_OFFSET_HEAD, LANE_OFFSET_TAIL, LANE_OFFSET_DROPPED, LANE_OFFSET_OWNER, LANE_OFFSET_DRAIN_LOST,
                    LANE_OFFSET_BASE_HEAD, LANE_OFFSET_BASE_DROPPED],
        "itemsize": LANE_STRIDE,
    }
)


def lane_offset(lane: int) -> int:
    """Byte offset of LANE's counters in a ring or events file."""
    return HEADER_SIZE + lane * LANE_STRIDE


def records_offset_for(lane_count: int) -> int:
    """Where records start: the header page, then the lane table rounded up to a page."""
    return HEADER_SIZE + -(-lane_count * LANE_STRIDE // PAGE) * PAGE
# TSC calibration (clock_id 2 rings): a seqlock word, the pairs written so far, the pair
# taken at creation, then CALIB_SLOTS (tsc, mono) pairs, pair i in slot i % CALIB_SLOTS.
OFFSET_CALIB_SEQ = 512
OFFSET_CALIB_TOTAL = 520
OFFSET_CALIB_FIRST = 528
OFFSET_CALIB_TABLE = 576
CALIB_SLOTS = 16
CALIB_WORDS = (OFFSET_CALIB_TABLE + CALIB_SLOTS * 16 - OFFSET_CALIB_SEQ) // 8
# Name table for pause records: u32 bytes used at 2048, strings from 2112 to the page end.
OFFSET_NAMES_USED = 2048
OFFSET_NAMES = 2112

HEADER_DTYPE = np.dtype(
    {
        "names": [
            "magic", "version", "header_size", "file_kind", "record_type", "record_size", "lane_capacity",
            "producer_pid", "clock_id", "sync_realtime_ns", "sync_monotonic_ns", "sync_uncertainty_ns",
            "boot_id", "runtime_version", "backend", "lane_count", "lane_stride", "records_offset",
            "segment", "state", "drain_lost", "names_used",
        ],
        "formats": [
            "S8", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4",
            "<u4", "<u4", "<u8", "<u8", "<u8",
            "V40", "V32", "V32", "<u4", "<u4", "<u8",
            "<u4", "<u4", "<u8", "<u4",
        ],
        "offsets": [
            0, 8, 12, 16, 20, 24, OFFSET_LANE_CAPACITY,
            32, 36, 40, 48, 56,
            64, 104, 136, OFFSET_LANE_COUNT, OFFSET_LANE_STRIDE, OFFSET_RECORDS,
            OFFSET_SEGMENT, OFFSET_STATE, OFFSET_DRAIN_LOST, OFFSET_NAMES_USED,
        ],
        "itemsize": HEADER_SIZE,
    }
)

_BOOT_ID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class RingHeader:
    """The identifying fields of a ring or events file, and its counters when read."""

    path: Path
    file_kind: int            # FILE_KIND_RING or FILE_KIND_EVENTS
    record_type: int          # RECORD_TYPE_GIL or RECORD_TYPE_PAUSE
    record_size: int
    lane_count: int           # lanes (lane 0 shared, 1.. private to one thread each)
    lane_capacity: int        # slots per lane (an events file keeps its ring's)
    records_offset: int       # where records start (after the header page and lane table)
    producer_pid: int
    clock_id: int             # 1 = CLOCK_MONOTONIC; 2 = TSC ticks (rings only; readers convert)
    sync_realtime_ns: int     # CLOCK_REALTIME read between two CLOCK_MONOTONIC reads...
    sync_monotonic_ns: int    # ...whose midpoint this is,
    sync_uncertainty_ns: int  # ...and whose distance this is
    boot_id: str | None       # /proc/sys/kernel/random/boot_id of the producer's boot
    runtime_version: str      # Python (or JVM) version of the producer
    backend: str              # probe backend that produced the records
    lanes: np.ndarray = field(compare=False)  # LANE_DTYPE per lane (head, tail, dropped, owner, drain_lost), as read
    head: int                 # sum of the lanes' heads: positions claimed (or committed)
    tail: int                 # sum of the lanes' tails: positions consumed by the drain thread
    dropped: int              # sum over the lanes: events dropped because their lane was full
    state: int                # STATE_* bits
    drain_lost: int           # records consumed but not written (events file write error)
    names: dict[int, str]     # name_code -> name, for pause records
    segment: int = 0          # events files: segment number (docs/ring.md, "Segments")

    @property
    def capacity(self) -> int:
        """Record slots in all lanes together."""
        return self.lane_count * self.lane_capacity

    @property
    def record_dtype(self) -> np.dtype:
        return RECORD_DTYPES[self.record_type]

    @property
    def closed(self) -> bool:
        """The producer closed the file cleanly (no SIGKILL, no crash)."""
        return bool(self.state & STATE_CLOSED)

    def same_boot(self, boot_id: str | None = None) -> bool:
        """Whether the records' CLOCK_MONOTONIC is this machine's current one (or BOOT_ID's).

        CLOCK_MONOTONIC restarts at every boot: timestamps from another boot cannot be put
        on the same clock as anything recorded now.
        """
        return self.boot_id is not None and self.boot_id == (boot_id or current_boot_id())


def _text(raw: bytes, path: Path, field: str) -> str:
    """A NUL-padded ASCII field; the producer always leaves at least one NUL."""
    end = raw.find(b"\0")
    if end < 0:
        raise TandemError(f"{path}: header field {field} is not NUL-terminated (corrupt file)")
    text = raw[:end]
    if any(b < 0x20 or b > 0x7E for b in text):
        raise TandemError(f"{path}: header field {field} is not printable ASCII (corrupt file)")
    if any(raw[end:]):
        raise TandemError(f"{path}: header field {field} has bytes after its terminating NUL (corrupt file)")
    return text.decode("ascii")


def _names(header_page: bytes, used: int, path: Path) -> dict[int, str]:
    """The pause-name table: NUL-terminated UTF-8 strings; a name's code is 1 + its offset."""
    room = HEADER_SIZE - OFFSET_NAMES
    if used > room:
        raise TandemError(f"{path}: name table claims {used} bytes, room for {room} (corrupt file)")
    table = header_page[OFFSET_NAMES:OFFSET_NAMES + used]
    if table and not table.endswith(b"\0"):
        raise TandemError(f"{path}: name table does not end with a NUL (corrupt file)")
    names: dict[int, str] = {}
    offset = 0
    for part in table.split(b"\0")[:-1]:
        try:
            names[1 + offset] = part.decode("utf-8")
        except UnicodeDecodeError:
            raise TandemError(f"{path}: name at table offset {offset} is not UTF-8 (corrupt file)") from None
        offset += len(part) + 1
    return names


def records_offset_of(page: bytes) -> int:
    """The records offset a header page claims (unchecked; parse_header checks it), so a
    reader knows how many bytes to hand to parse_header. 0 if the page is too short."""
    if len(page) < OFFSET_RECORDS + 8:
        return 0
    return min(int.from_bytes(page[OFFSET_RECORDS:OFFSET_RECORDS + 8], "little"), 1 << 20)


def parse_header(page: bytes, path: Path, expected_kind: int) -> RingHeader:
    """Validate the header page and lane table of a ring or events file and decode them.

    PAGE holds the file's first bytes: at least up to its records offset (header page +
    lane table), else the file is reported truncated."""
    path = Path(path)
    kind_name = FILE_KIND_NAMES[expected_kind]
    if len(page) < HEADER_SIZE:
        raise TandemError(f"{path}: {len(page)} bytes, shorter than the {HEADER_SIZE}-byte {kind_name} header (truncated or not a tandem file)")
    h = np.frombuffer(page, dtype=HEADER_DTYPE, count=1)[0]
    if bytes(h["magic"]) != MAGIC:
        raise TandemError(f"{path}: not a tandem {kind_name} file (magic {bytes(h['magic'])!r}, expected {MAGIC!r})")
    if int(h["version"]) != VERSION:
        raise TandemError(f"{path}: {kind_name} format version {int(h['version'])}, this tandem reads version {VERSION}")
    if int(h["header_size"]) != HEADER_SIZE:
        raise TandemError(f"{path}: header size {int(h['header_size'])}, expected {HEADER_SIZE} (corrupt file)")
    file_kind = int(h["file_kind"])
    if file_kind != expected_kind:
        found = FILE_KIND_NAMES.get(file_kind, f"unknown kind {file_kind}")
        raise TandemError(f"{path}: is a tandem {found} file, expected a {kind_name} file")
    record_type = int(h["record_type"])
    if record_type not in RECORD_DTYPES:
        raise TandemError(f"{path}: unknown record type {record_type} (known: 1 = GIL, 2 = JVM pause)")
    record_size = int(h["record_size"])
    if record_size != RECORD_DTYPES[record_type].itemsize:
        raise TandemError(f"{path}: record size {record_size} for record type {record_type}, expected {RECORD_DTYPES[record_type].itemsize} (corrupt file)")
    lane_capacity, lane_count = int(h["lane_capacity"]), int(h["lane_count"])
    if not (MIN_CAPACITY <= lane_capacity <= MAX_CAPACITY) or lane_capacity & (lane_capacity - 1):
        raise TandemError(f"{path}: lane capacity {lane_capacity} is not a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}] (corrupt file)")
    if not (1 <= lane_count <= MAX_LANES) or lane_count & (lane_count - 1):
        raise TandemError(f"{path}: lane count {lane_count} is not a power of two in [1, {MAX_LANES}] (corrupt file)")
    if lane_count * lane_capacity > MAX_CAPACITY:
        raise TandemError(f"{path}: {lane_count} lanes of {lane_capacity} slots exceed {MAX_CAPACITY} slots (corrupt file)")
    if int(h["lane_stride"]) != LANE_STRIDE:
        raise TandemError(f"{path}: lane stride {int(h['lane_stride'])}, expected {LANE_STRIDE} (corrupt file)")
    records_offset = records_offset_for(lane_count)
    if int(h["records_offset"]) != records_offset:
        raise TandemError(f"{path}: records offset {int(h['records_offset'])}, expected {records_offset} for {lane_count} lanes (corrupt file)")
    if len(page) < records_offset:
        raise TandemError(f"{path}: {len(page)} bytes, shorter than its {records_offset}-byte header and lane table (truncated)")
    clock_id = int(h["clock_id"])
    allowed = (CLOCK_MONOTONIC, CLOCK_TSC) if expected_kind == FILE_KIND_RING else (CLOCK_MONOTONIC,)
    if clock_id not in allowed:
        expected = " or ".join(f"{c} ({CLOCK_NAMES[c]})" for c in allowed)
        raise TandemError(f"{path}: clock id {clock_id}, expected {expected}")
    if int(h["producer_pid"]) == 0:
        raise TandemError(f"{path}: producer pid is 0 (corrupt file)")
    boot_id = _text(bytes(h["boot_id"]), path, "boot_id") or None
    if boot_id is not None and not _BOOT_ID_TEXT.fullmatch(boot_id):
        raise TandemError(f"{path}: boot id {boot_id!r} is not a UUID (corrupt file)")
    if int(h["drain_lost"]) >= MAX_POSITION:
        raise TandemError(f"{path}: counter drain_lost = {int(h['drain_lost'])} is out of range (corrupt file)")
    lanes = np.frombuffer(page, dtype=LANE_DTYPE, count=lane_count, offset=HEADER_SIZE).copy()
    for name in ("head", "tail", "dropped", "drain_lost", "base_head", "base_dropped"):
        bad = np.flatnonzero(lanes[name] >= np.uint64(MAX_POSITION))
        if len(bad):
            raise TandemError(f"{path}: lane {int(bad[0])} counter {name} = {int(lanes[name][bad[0]])} is out of range (corrupt file)")
    head, tail, dropped = (sum(int(v) for v in lanes[name]) for name in ("head", "tail", "dropped"))
    return RingHeader(
        path=path,
        file_kind=file_kind,
        record_type=record_type,
        record_size=record_size,
        lane_count=lane_count,
        lane_capacity=lane_capacity,
        records_offset=records_offset,
        producer_pid=int(h["producer_pid"]),
        clock_id=int(h["clock_id"]),
        sync_realtime_ns=int(h["sync_realtime_ns"]),
        sync_monotonic_ns=int(h["sync_monotonic_ns"]),
        sync_uncertainty_ns=int(h["sync_uncertainty_ns"]),
        boot_id=str(uuid.UUID(boot_id)) if boot_id else None,
        runtime_version=_text(bytes(h["runtime_version"]), path, "runtime_version"),
        backend=_text(bytes(h["backend"]), path, "backend"),
        lanes=lanes,
        head=head,
        tail=tail,
        dropped=dropped,
        state=int(h["state"]),
        drain_lost=int(h["drain_lost"]),
        names=_names(bytes(page[:HEADER_SIZE]), int(h["names_used"]), path),
        segment=int(h["segment"]) if file_kind == FILE_KIND_EVENTS else 0,
    )
