"""Readers of ring files (live tailing) and drained events files (docs/ring.md).

Both decode records as numpy structured arrays in a few whole-array operations: no
Python loop runs per record. Both check the file before trusting any of it and raise a
one-line `TandemError` naming the file for anything corrupt, truncated or hostile.
"""
from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import TandemError
from engine.ring.layout import (
    FILE_KIND_EVENTS,
    FILE_KIND_RING,
    HEADER_SIZE,
    LOST_MARKER,
    MAX_POSITION,
    OFFSET_DROPPED,
    OFFSET_HEAD,
    OFFSET_STATE,
    STATE_CLOSED,
    RingHeader,
    parse_header,
)


def _open_checked(path: Path, what: str) -> tuple[int, os.stat_result]:
    """Open PATH read-only; refuse anything but a regular file that others cannot modify."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise TandemError(f"{path}: cannot open {what}: {e.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif what == "ring" and st.st_uid != os.geteuid():
        # Someone else could shrink a file we have mapped: every later read would SIGBUS.
        problem = f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()}); refusing to map it"
    elif what == "ring" and st.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); refusing to map it"
    if problem:
        os.close(fd)
        raise TandemError(f"{path}: {what} file {problem}")
    return fd, st


def _read_header_page(fd: int, path: Path, size: int, expected_kind: int) -> RingHeader:
    page = os.pread(fd, HEADER_SIZE, 0) if size else b""
    return parse_header(page, path, expected_kind)


def _opaque(record_dtype: np.dtype) -> np.dtype:
    """A dtype of the same size without fields, for bulk copies at memcpy speed."""
    return np.dtype((np.void, record_dtype.itemsize))


def _sum_u64(values: np.ndarray) -> int:
    """Exact sum of u64 values (a hostile file could make a plain u64 sum wrap)."""
    high = int((values >> np.uint64(32)).sum(dtype=np.uint64))
    low = int((values & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64))
    return (high << 32) + low


# ---- Drained events files -----------------------------------------------------------------


@dataclass
class EventsFile:
    """A drained events file: its header and its records, in production order."""

    header: RingHeader
    records: np.ndarray       # structured array (header.record_dtype), LOST markers removed
    lost: int                 # events producers dropped (ring full), summed from LOST markers
    trailing_bytes: int       # bytes of a record cut short (SIGKILL mid-write): ignored
    closed: bool              # the producer closed the file (its final counters were checked)

    @property
    def produced(self) -> int:
        """Events the producers emitted up to the last drain: recorded + lost."""
        return len(self.records) + self.lost + self.header.drain_lost


# Records are read and checked one chunk at a time, so the checks run on data still in
# cache and reading costs about one pass over memory, like np.fromfile.
CHUNK_BYTES = 1 << 20


def read_events(path: str | os.PathLike) -> EventsFile:
    """Read a drained events file (whole records only: a file cut by SIGKILL is fine)."""
    path = Path(path)
    fd, st = _open_checked(path, "events")
    try:
        header = _read_header_page(fd, path, st.st_size, FILE_KIND_EVENTS)
        count, trailing = divmod(st.st_size - HEADER_SIZE, header.record_size)
        # Read into opaque slots (memcpy-speed copies), checked and viewed as records at the end.
        slots = np.empty(count, dtype=_opaque(header.record_dtype))
        raw = memoryview(slots.view(np.uint8))
        chunk = max(1, CHUNK_BYTES // header.record_size)
        check = _EventsCheck(path, header.record_dtype, chunk)
        kept = 0  # records kept so far; LOST markers are squeezed out as we go
        for first in range(0, count, chunk):
            n = min(count - first, chunk)
            into = raw[kept * header.record_size:(kept + n) * header.record_size]
            _read_exactly(fd, into, HEADER_SIZE + first * header.record_size, path)
            kept += check.chunk(slots[kept:kept + n], first)
    finally:
        os.close(fd)
    records, lost = slots[:kept].view(header.record_dtype), check.lost
    closed = header.closed
    if closed:
        # A cleanly closed file says what it should hold: every claimed position, minus those
        # the drain could not write after a write error (drain_lost), and every drop (markers
        # after such an error were not written either).
        complete = header.drain_lost == 0
        if len(records) + header.drain_lost != header.head or (lost != header.dropped if complete else lost > header.dropped):
            raise TandemError(
                f"{path}: closed events file holds {len(records)} records and {lost} lost, "
                f"its header says {header.head} claimed, {header.drain_lost} unwritten, {header.dropped} dropped (corrupt file)"
            )
    return EventsFile(header=header, records=records, lost=lost, trailing_bytes=trailing, closed=closed)


def _read_exactly(fd: int, into: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(into):
        n = os.preadv(fd, [into[done:]], offset + done)
        if n <= 0:  # the file shrank while we read it
            raise TandemError(f"{path}: events file shrank while being read (corrupt or reused file)")
        done += n


class _EventsCheck:
    """Chunk-wise checks of an events file's records, squeezing out LOST markers.

    The drain writes every position from 0 in order, so the records' seq (= position + 1)
    count 1, 2, 3, ... with no gap; LOST markers (seq 0, kind LOST_MARKER) sit in between.
    """

    def __init__(self, path: Path, record_dtype: np.dtype, chunk_records: int):
        self.path = path
        self.record_dtype = record_dtype
        self.next_seq = 1
        self.lost = 0
        # Reused per chunk: seq - next_seq must equal 0, 1, 2, ... (no allocation per chunk).
        self._offsets = np.arange(chunk_records, dtype=np.uint64)
        self._relative = np.empty(chunk_records, dtype=np.uint64)
        self._wrong = np.empty(chunk_records, dtype=bool)

    def chunk(self, slots: np.ndarray, first_row: int) -> int:
        """Check SLOTS (rows from FIRST_ROW); move the records to its front, markers out.
        Returns how many records it kept."""
        records = slots.view(self.record_dtype)
        # Fast path, almost every chunk: seq runs on from the previous chunk with no gap.
        # That also proves there is no marker in it (a marker's seq 0 cannot match).
        if self._consecutive(records["seq"]):
            self.next_seq += len(records)
            return len(records)
        is_marker = records["seq"] == 0
        if is_marker.any():
            markers = records[is_marker]
            if (markers["kind"] != LOST_MARKER).any():
                raise TandemError(f"{self.path}: a record near row {first_row} has sequence 0 but is not a LOST marker (corrupt file)")
            if (markers["aux"] >= np.uint64(MAX_POSITION)).any():
                raise TandemError(f"{self.path}: a LOST marker near row {first_row} counts an impossible number of events (corrupt file)")
            self.lost += _sum_u64(markers["aux"])
            survivors = slots[~is_marker]  # a copy: safe to write back over slots
            slots[:len(survivors)] = survivors
            records = slots[:len(survivors)].view(self.record_dtype)
        seq = records["seq"]
        if not self._consecutive(seq):
            at = int(np.argmax(self._wrong[:len(seq)]))
            raise TandemError(
                f"{self.path}: record with sequence {int(seq[at])} where {self.next_seq + at} was expected, near row {first_row}: "
                "records are missing or out of order (corrupt file)"
            )
        self.next_seq += len(seq)
        return len(seq)

    def _consecutive(self, seq: np.ndarray) -> bool:
        """Whether SEQ is next_seq, next_seq + 1, ... (leaves the mismatches in _wrong)."""
        n = len(seq)
        np.subtract(seq, np.uint64(self.next_seq), out=self._relative[:n])
        np.not_equal(self._relative[:n], self._offsets[:n], out=self._wrong[:n])
        return not self._wrong[:n].any()


# ---- Live rings ---------------------------------------------------------------------------


class RingTailer:
    """Follow a live ring read-only: `poll()` returns the records committed since the last call.

    The tailer never writes to the ring, so it can never stall a producer; if it falls more
    than `capacity` records behind, the oldest are overwritten and counted in `missed`.
    At any time, once a poll has caught up with `head`:
        received + missed == head            (positions)
        received + missed + dropped == produced events
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        fd, st = _open_checked(self.path, "ring")
        try:
            self.header = _read_header_page(fd, self.path, st.st_size, FILE_KIND_RING)
            expected = HEADER_SIZE + self.header.capacity * self.header.record_size
            if st.st_size != expected:
                raise TandemError(f"{self.path}: ring file is {st.st_size} bytes, its header implies {expected} (truncated or corrupt)")
            self._map = mmap.mmap(fd, expected, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._size = expected
        h = self.header
        # Slots as opaque fixed-size byte strings: numpy copies those with memcpy, while
        # copying a structured dtype goes field by field (5x slower here).
        self._slots = np.frombuffer(self._map, dtype=_opaque(h.record_dtype), offset=HEADER_SIZE, count=h.capacity)
        self._seq = self._slots.view(h.record_dtype)["seq"]  # strided view of every slot's commit word
        self._head = np.frombuffer(self._map, dtype="<u8", offset=OFFSET_HEAD, count=1)
        self._dropped = np.frombuffer(self._map, dtype="<u8", offset=OFFSET_DROPPED, count=1)
        self._state = np.frombuffer(self._map, dtype="<u4", offset=OFFSET_STATE, count=1)
        self._chunk = max(1, min(h.capacity, CHUNK_BYTES // h.record_size))
        self._seq_before = np.empty(self._chunk, dtype=np.uint64)  # per-chunk scratch, reused
        self._seq_after = np.empty(self._chunk, dtype=np.uint64)
        self._scratch = np.empty(self._chunk, dtype=np.uint64)
        self._one_to_chunk = np.arange(1, self._chunk + 1, dtype=np.uint64)
        self.position = 0   # next position to read
        self.received = 0   # records returned by poll()
        self.missed = 0     # positions overwritten before this tailer read them
        self.dropped = 0    # producers' drop counter, as of the last poll
        self.head = 0       # producers' claim counter, as of the last poll

    # The tailer owns an fd and a mapping: a context manager closes them deterministically.
    def __enter__(self) -> "RingTailer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmap and close (the arrays returned by poll() are copies and stay valid)."""
        if self._fd >= 0:
            self._slots = self._seq = self._head = self._dropped = self._state = None
            try:
                self._map.close()
            except BufferError:
                # A view still exists (e.g. in the traceback of an error being raised through
                # a `with` block): the mapping goes away with the last view instead.
                pass
            os.close(self._fd)
            self._fd = -1

    @property
    def closed_by_producer(self) -> bool:
        """The producer closed the ring: after one more poll there is nothing left to read."""
        return bool(int(self._state[0]) & STATE_CLOSED)

    def _read_head(self) -> int:
        head = int(self._head[0])
        if head < self.head or head >= MAX_POSITION:
            raise TandemError(f"{self.path}: ring head went from {self.head} to {head} (corrupt or reused file)")
        return head

    def _slot_ranges(self, first: int, count: int) -> list[slice]:
        """Slot slices covering positions [first, first + count), count <= capacity."""
        start = first & (self.header.capacity - 1)
        end = start + count
        if end <= self.header.capacity:
            return [slice(start, end)]
        return [slice(start, self.header.capacity), slice(0, end - self.header.capacity)]

    def poll(self, max_records: int | None = None, *, producer_gone: bool = False) -> np.ndarray:
        """Records committed since the last poll, in position order (a copy), at most MAX_RECORDS.

        PRODUCER_GONE: the producing process has exited (e.g. SIGKILL), so a position
        claimed but never committed never will be: count it as missed instead of waiting.
        """
        if self._fd < 0:
            raise TandemError(f"{self.path}: ring tailer is closed")
        if os.fstat(self._fd).st_size < self._size:
            # Reading a mapping past the end of a shrunken file would raise SIGBUS.
            raise TandemError(f"{self.path}: ring file shrank while mapped (corrupt or reused file)")
        capacity = self.header.capacity
        limit = capacity if max_records is None else max(0, min(int(max_records), capacity))
        head = self._read_head()
        self.head = head
        self.dropped = int(self._dropped[0])
        if head - self.position > capacity:
            # Slots of these positions were reused by later ones: gone for this tailer.
            self.missed += head - capacity - self.position
            self.position = head - capacity
        count = min(head - self.position, limit)
        if count <= 0:
            return np.empty(0, dtype=self.header.record_dtype)
        # In cache-sized chunks (like read_events), straight into the result, stopping at the
        # first record not yet committed.
        out = np.empty(count, dtype=self._slots.dtype)
        kept = consumed = 0
        while consumed < count:
            n = min(self._chunk, count - consumed)
            got, complete = self._read_committed(out[kept:kept + n], producer_gone)
            kept += got
            consumed += n
            if not complete:
                break
        return out[:kept].view(self.header.record_dtype)

    def _read_committed(self, dest: np.ndarray, producer_gone: bool) -> tuple[int, bool]:
        """Copy the intact records among the next len(DEST) positions into DEST, up to the
        first one not yet committed; advance position and counters.
        Returns (records copied, whether all len(DEST) positions were consumed)."""
        count = len(dest)
        ranges = self._slot_ranges(self.position, count)
        seq_before, seq_after = self._seq_before[:count], self._seq_after[:count]
        # Seqlock reader, slot by slot but as whole arrays: commit words, then records, then
        # commit words again, each a separate copy so the loads happen in that order (x86-64
        # keeps loads in program order; see docs/ring.md for other architectures).
        for into, source in ((seq_before, self._seq), (dest, self._slots), (seq_after, self._seq)):
            at = 0
            for r in ranges:
                into[at:at + r.stop - r.start] = source[r]
                at += r.stop - r.start
        # Intact: committed for this very position (seq = position + 1) before and after the
        # copy. (The copied record's own seq lies between the two reads: no need to check it.)
        np.subtract(seq_before, np.uint64(self.position), out=self._scratch[:count])
        intact = self._scratch[:count] == self._one_to_chunk[:count]
        intact &= seq_before == seq_after
        if intact.all():
            stop = kept = count
        else:
            # A slot whose position + capacity was claimed may be mid-overwrite: lost to us.
            # Any other slot not intact is not committed yet: stop there, retry next poll.
            head_after = self._read_head()
            positions = np.arange(self.position, self.position + count, dtype=np.uint64)
            overwritten = positions + np.uint64(self.header.capacity) < np.uint64(head_after)
            pending = ~intact & ~overwritten
            stop = int(np.argmax(pending)) if pending.any() and not producer_gone else count
            survivors = dest[:stop][intact[:stop]]  # a copy: safe to write back over dest
            kept = len(survivors)
            dest[:kept] = survivors
        self.missed += stop - kept
        self.received += kept
        self.position += stop
        return kept, stop == count


def read_ring(path: str | os.PathLike) -> tuple[RingHeader, np.ndarray, int]:
    """Everything the ring of an exited producer still holds: (header, records, missed
    positions), where records + missed == header.head."""
    with RingTailer(path) as tailer:
        records = tailer.poll(producer_gone=True)
        return tailer.header, records, tailer.missed
