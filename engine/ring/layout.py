"""The binary layout of ring and events files (docs/ring.md), and header validation.

Nothing here trusts a file: `parse_header` checks every field a reader relies on and
raises a one-line `TandemError` naming the file otherwise.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import TandemError

MAGIC = b"TNDMRING"
VERSION = 1
HEADER_SIZE = 4096
MIN_CAPACITY = 2
MAX_CAPACITY = 1 << 26
CLOCK_MONOTONIC = 1
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
# Events files only: `aux` events were dropped by producers since the previous marker.
LOST_MARKER = 0xFF01

# Every record starts with the same 32 bytes; a pause record extends them to 64.
GIL_RECORD_DTYPE = np.dtype(
    {
        "names": ["seq", "mono_ns", "tid", "kind", "flags", "aux"],
        "formats": ["<u8", "<u8", "<u4", "<u2", "<u2", "<u8"],
        "offsets": [0, 8, 16, 20, 22, 24],
        "itemsize": 32,
    }
)
PAUSE_RECORD_DTYPE = np.dtype(
    {
        "names": ["seq", "start_ns", "tid", "kind", "flags", "aux", "end_ns", "id", "name_code"],
        "formats": ["<u8", "<u8", "<u4", "<u2", "<u2", "<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 8, 16, 20, 22, 24, 32, 40, 48],
        "itemsize": 64,
    }
)
RECORD_DTYPES = {RECORD_TYPE_GIL: GIL_RECORD_DTYPE, RECORD_TYPE_PAUSE: PAUSE_RECORD_DTYPE}

# Live counters (offsets are part of the format; each in its own 128-byte block).
OFFSET_HEAD = 1024
OFFSET_TAIL = 1152
OFFSET_DROPPED = 1280
OFFSET_STATE = 1408
OFFSET_DRAIN_LOST = 1416
# Name table for pause records: u32 bytes used at 2048, strings from 2112 to the page end.
OFFSET_NAMES_USED = 2048
OFFSET_NAMES = 2112

HEADER_DTYPE = np.dtype(
    {
        "names": [
            "magic", "version", "header_size", "file_kind", "record_type", "record_size", "capacity",
            "producer_pid", "clock_id", "sync_realtime_ns", "sync_monotonic_ns", "sync_uncertainty_ns",
            "boot_id", "runtime_version", "backend",
            "head", "tail", "dropped", "state", "drain_lost", "names_used",
        ],
        "formats": [
            "S8", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4",
            "<u4", "<u4", "<u8", "<u8", "<u8",
            "V40", "V32", "V32",
            "<u8", "<u8", "<u8", "<u4", "<u8", "<u4",
        ],
        "offsets": [
            0, 8, 12, 16, 20, 24, 28,
            32, 36, 40, 48, 56,
            64, 104, 136,
            OFFSET_HEAD, OFFSET_TAIL, OFFSET_DROPPED, OFFSET_STATE, OFFSET_DRAIN_LOST, OFFSET_NAMES_USED,
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
    capacity: int             # records in the ring (an events file keeps its ring's)
    producer_pid: int
    clock_id: int             # always 1 = CLOCK_MONOTONIC
    sync_realtime_ns: int     # CLOCK_REALTIME read between two CLOCK_MONOTONIC reads...
    sync_monotonic_ns: int    # ...whose midpoint this is,
    sync_uncertainty_ns: int  # ...and whose distance this is
    boot_id: str | None       # /proc/sys/kernel/random/boot_id of the producer's boot
    runtime_version: str      # Python (or JVM) version of the producer
    backend: str              # probe backend that produced the records
    head: int                 # positions claimed by producers (records ever committed or in flight)
    tail: int                 # positions consumed by the drain thread
    dropped: int              # events dropped by producers because the ring was full
    state: int                # STATE_* bits
    drain_lost: int           # records consumed but not written (events file write error)
    names: dict[int, str]     # name_code -> name, for pause records

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


def current_boot_id() -> str | None:
    """This machine's boot id (36-char text), or None where Linux does not provide it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


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


def parse_header(page: bytes, path: Path, expected_kind: int) -> RingHeader:
    """Validate the first HEADER_SIZE bytes of a ring or events file and decode them."""
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
    capacity = int(h["capacity"])
    if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY) or capacity & (capacity - 1):
        raise TandemError(f"{path}: capacity {capacity} is not a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}] (corrupt file)")
    if int(h["clock_id"]) != CLOCK_MONOTONIC:
        raise TandemError(f"{path}: clock id {int(h['clock_id'])}, expected {CLOCK_MONOTONIC} (CLOCK_MONOTONIC)")
    if int(h["producer_pid"]) == 0:
        raise TandemError(f"{path}: producer pid is 0 (corrupt file)")
    boot_id = _text(bytes(h["boot_id"]), path, "boot_id") or None
    if boot_id is not None and not _BOOT_ID_TEXT.fullmatch(boot_id):
        raise TandemError(f"{path}: boot id {boot_id!r} is not a UUID (corrupt file)")
    head, tail, dropped = int(h["head"]), int(h["tail"]), int(h["dropped"])
    for name, value in (("head", head), ("tail", tail), ("dropped", dropped), ("drain_lost", int(h["drain_lost"]))):
        if value >= MAX_POSITION:
            raise TandemError(f"{path}: counter {name} = {value} is out of range (corrupt file)")
    return RingHeader(
        path=path,
        file_kind=file_kind,
        record_type=record_type,
        record_size=record_size,
        capacity=capacity,
        producer_pid=int(h["producer_pid"]),
        clock_id=int(h["clock_id"]),
        sync_realtime_ns=int(h["sync_realtime_ns"]),
        sync_monotonic_ns=int(h["sync_monotonic_ns"]),
        sync_uncertainty_ns=int(h["sync_uncertainty_ns"]),
        boot_id=str(uuid.UUID(boot_id)) if boot_id else None,
        runtime_version=_text(bytes(h["runtime_version"]), path, "runtime_version"),
        backend=_text(bytes(h["backend"]), path, "backend"),
        head=head,
        tail=tail,
        dropped=dropped,
        state=int(h["state"]),
        drain_lost=int(h["drain_lost"]),
        names=_names(bytes(page[:HEADER_SIZE]), int(h["names_used"]), path),
    )
