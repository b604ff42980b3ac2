"""Readers of ring files (live tailing) and drained events files (docs/ring.md).

Both decode records as numpy structured arrays in a few whole-array operations: no
Python loop runs per record (at most one per lane per poll, or per run of one lane's
records in an events file chunk, and those are vectorised too).

Order (format v2): records come lane by lane, each lane's in production order. A thread
produces into one lane, so each thread's records are in its program order; across lanes
nothing is ordered. Sort by time where a global order is needed: `by_time(records)`. Both check the file before trusting any of it and raise a
one-line `TandemError` naming the file for anything corrupt, truncated or hostile.
"""
from __future__ import annotations

import mmap
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import TandemError, TandemWarning
from engine.ring.layout import (CALIB_SLOTS, CALIB_WORDS, CLOCK_TSC, FILE_KIND_EVENTS, FILE_KIND_RING, HEADER_SIZE, LANE_DTYPE,
                                LOST_MARKER, MAX_POSITION, OFFSET_CALIB_SEQ, OFFSET_CALIB_TABLE, OFFSET_STATE, STATE_CLOSED,
                                RingHeader, parse_header, records_offset_of)


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
    """The header page and the lane table after it, validated."""
    page = os.pread(fd, HEADER_SIZE, 0) if size else b""
    end = records_offset_of(page)
    if end > len(page):
        page += os.pread(fd, end - len(page), len(page))
    return parse_header(page, path, expected_kind)


def _opaque(record_dtype: np.dtype) -> np.dtype:
    """A dtype of the same size without fields, for bulk copies at memcpy speed."""
    return np.dtype((np.void, record_dtype.itemsize))


def _sum_u64(values: np.ndarray) -> int:
    """Exact sum of u64 values (a hostile file could make a plain u64 sum wrap)."""
    high = int((values >> np.uint64(32)).sum(dtype=np.uint64))
    low = int((values & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64))
    return (high << 32) + low


# ---- Order -------------------------------------------------------------------------------


def by_time(records: np.ndarray) -> np.ndarray:
    """RECORDS in time order: stable sort on the time field (`mono_ns`, or `start_ns` for
    pause records), so records of equal time keep their lane order, and each thread's
    records (which share a lane) keep their production order."""
    key = "mono_ns" if "mono_ns" in records.dtype.names else "start_ns"
    return records[np.argsort(records[key], kind="stable")]


# ---- Drained events files -----------------------------------------------------------------


@dataclass
class EventsFile:
    """A drained events file: its header and its records, each lane's in production order.

    Lanes interleave (the drain appends one batch per lane per pass): use `by_time` for a
    global order."""

    header: RingHeader
    records: np.ndarray       # structured array (header.record_dtype), LOST markers removed
    lost: int                 # events producers dropped (lane full), summed from LOST markers
    trailing_bytes: int       # bytes of a record cut short (SIGKILL mid-write): ignored
    closed: bool              # the producer closed the file (its final counters were checked)
    lane_records: tuple[int, ...] = ()  # records per lane
    lane_lost: tuple[int, ...] = ()     # LOST-marker totals per lane

    @property
    def produced(self) -> int:
        """Events the producers emitted up to the last drain: recorded + lost."""
        return len(self.records) + self.lost + self.header.drain_lost

    def by_time(self) -> np.ndarray:
        """The records in time order (see `by_time`)."""
        return by_time(self.records)


# Records are read and checked one chunk at a time, so the checks run on data still in
# cache and reading costs about one pass over memory, like np.fromfile.
CHUNK_BYTES = 1 << 20
WHOLE_FILE = 1 << 62  # (EventsBlocks' block_records: one block)
SPAN_RECORDS = 256  # (the first and the last records EventsBlocks.span reads: a drain pass's batches of a few lanes)


def time_span(records: np.ndarray) -> tuple[int, int]:
    """(earliest, latest) mono_ns of RECORDS' events, LOST markers left out; (0, 0) for none."""
    times = records["mono_ns"][records["seq"] != 0]
    return (int(times.min()), int(times.max())) if times.size else (0, 0)


def read_events(path: str | os.PathLike) -> EventsFile:
    """Read a drained events file (whole records only: a file cut by SIGKILL is fine): its
    blocks (EventsBlocks) as one."""
    blocks = EventsBlocks(path, block_records=WHOLE_FILE)
    parts = list(blocks)
    records = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, blocks.header.record_dtype)
    return EventsFile(header=blocks.header, records=records, lost=blocks.lost, trailing_bytes=blocks.trailing_bytes,
                      closed=blocks.closed, lane_records=blocks.lane_records, lane_lost=blocks.lane_lost)


def _check_complete(path: Path, header: RingHeader, check: "_EventsCheck", slots: int):
    """After every record was read: (records per lane, lost per lane, lost, closed), the
    counters of a closed file checked against what was read. SLOTS: the records and markers
    the file holds room for (fewer than its header claims records: it was cut short)."""
    lane_records = tuple(int(n) for n in check.records)
    lane_lost = list(check.lost)
    closed = header.closed
    if closed:
        # A cleanly closed file says what it should hold, lane by lane: every position the
        # lane's producers claimed, minus those the drain could not write after a write error
        # (drain_lost), and every drop (markers after such an error were not written either).
        lanes = header.lanes
        if sum(int(v) for v in lanes["drain_lost"]) != header.drain_lost:
            raise TandemError(f"{path}: closed events file: lane drain_lost counters do not add up to the header's {header.drain_lost} (corrupt file)")
        complete = header.drain_lost == 0
        claimed = sum(int(h) - int(b) - int(u) for h, b, u in zip(lanes["head"], lanes["base_head"], lanes["drain_lost"]))
        missing = 0
        for lane in range(header.lane_count):
            # (a segment after the first counts from its lane's bases: docs/ring.md, "Segments")
            head = int(lanes["head"][lane]) - int(lanes["base_head"][lane])
            dropped = int(lanes["dropped"][lane]) - int(lanes["base_dropped"][lane])
            unwritten = int(lanes["drain_lost"][lane])
            got, got_lost = lane_records[lane], lane_lost[lane]
            if got + unwritten < head and got_lost <= dropped and slots < claimed:  # (no seq gap: the rest was at the end)
                lane_lost[lane] = dropped + head - unwritten - got  # (cut off: lost, as a drop's events are)
                missing += head - unwritten - got
            elif got + unwritten != head or (got_lost != dropped if complete else got_lost > dropped):
                raise TandemError(
                    f"{path}: closed events file holds {got} records and {got_lost} lost in lane {lane}, "
                    f"its header says {head} claimed, {unwritten} unwritten, {dropped} dropped (corrupt file)"
                )
        if missing:
            # A closed file that lost its end (a copy cut short): what it holds is whole, every
            # record checked; the rest is counted lost, as a full lane's drops are.
            warnings.warn(f"{path}: closed events file cut short: {missing} of its {claimed} events missing "
                          "at its end; reading what it holds, the rest counted lost", TandemWarning, stacklevel=2)
    return lane_records, tuple(lane_lost), sum(lane_lost), closed


class EventsBlocks:
    """A drained events file read block by block, every record checked (memory: one block).
    Iterate for the records; afterwards `lost`, `closed`, `records_read`, `lane_records`,
    `lane_lost` and `next_seq` (per lane: the seq its next record would have) are known."""

    def __init__(self, path: str | os.PathLike, block_records: int = 1 << 20):
        self.path = Path(path)
        fd, st = _open_checked(self.path, "events")
        try:
            self.header = _read_header_page(fd, self.path, st.st_size, FILE_KIND_EVENTS)
        finally:
            os.close(fd)
        self.size = st.st_size
        self.block_records = max(1, int(block_records))
        self.lost = 0
        self.closed = self.header.closed
        self.records_read = 0
        self.next_seq = first_seq(self.header)
        self.lane_records: tuple[int, ...] = ()
        self.lane_lost: tuple[int, ...] = ()
        self.trailing_bytes = (self.size - self.header.records_offset) % self.header.record_size  # (cut by SIGKILL)

    def span(self) -> tuple[int, int] | None:
        """(start, end) of a closed file's recording, for sizing blocks: the earliest and latest
        events among its first and last records, records of one drain pass or two (not checked:
        an estimate); None when not known (a file still written to, no event there)."""
        header = self.header
        count = (self.size - header.records_offset) // header.record_size
        if not self.closed or not count or "mono_ns" not in header.record_dtype.names:
            return None
        spans = []
        fd, _ = _open_checked(self.path, "events")
        try:
            for first in (0, max(count - SPAN_RECORDS, 0)):
                raw = bytearray(min(count, SPAN_RECORDS) * header.record_size)
                _read_exactly(fd, memoryview(raw), header.records_offset + first * header.record_size, self.path)
                spans.append(time_span(np.frombuffer(raw, header.record_dtype)))
        finally:
            os.close(fd)
        (start, _), (_, end) = spans
        return (start, end) if 0 < start <= end else None

    def __iter__(self):
        """Blocks of records (LOST markers out). Use each block before asking for the next one
        (a file read, not mapped, reuses one buffer)."""
        header, path = self.header, self.path
        count = (self.size - header.records_offset) // header.record_size
        sub = max(1, min(CHUNK_BYTES // header.record_size, self.block_records))  # checked in cache-sized chunks (in cache)
        block = max(sub, min(self.block_records // sub, -(-count // sub)) * sub)  # (at most the file)
        check = _EventsCheck(path, header.record_dtype, header.lane_count, first_seq(header))
        fd, st = _open_checked(path, "events")
        try:
            # A closed file no longer changes: mapped, not copied out of the page cache. One that may
            # still be written to could shrink under a map (reading past its end kills the process),
            # and so could one that someone else may write to: read.
            mine = st.st_uid == os.geteuid() and not st.st_mode & 0o022
            blocks = self._mapped_blocks if self.closed and mine else self._read_blocks
            yield from blocks(fd, count, sub, block, check)
        finally:
            os.close(fd)
        self.lane_records, self.lane_lost, self.lost, self.closed = _check_complete(path, header, check, count)
        self.next_seq = check.next_seq.copy()

    def _read_blocks(self, fd: int, count: int, sub: int, block: int, check: "_EventsCheck"):
        header = self.header
        slots = np.empty(block, dtype=_opaque(header.record_dtype))
        raw = memoryview(slots.view(np.uint8))
        kept = 0
        for first in range(0, count, sub):
            n = min(count - first, sub)
            if kept + n > block:
                yield slots[:kept].view(header.record_dtype)
                kept = 0
            _read_exactly(fd, raw[kept * header.record_size:(kept + n) * header.record_size],
                          header.records_offset + first * header.record_size, self.path)
            got = check.chunk(slots[kept:kept + n], first)
            kept += got
            self.records_read += got
        if kept:
            yield slots[:kept].view(header.record_dtype)

    def _mapped_blocks(self, fd: int, count: int, sub: int, block: int, check: "_EventsCheck"):
        """Each block a private (copy-on-write) map of the file: only a block holding LOST markers
        is written to (its records moved up over them), and only those pages are copied."""
        header = self.header
        for first in range(0, count, block):
            n = min(count - first, block)
            start = header.records_offset + first * header.record_size
            aligned = start - start % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(fd, start - aligned + n * header.record_size, access=mmap.ACCESS_COPY, offset=aligned)
            slots = np.frombuffer(mapped, dtype=_opaque(header.record_dtype), count=n, offset=start - aligned)
            kept = 0
            for at in range(0, n, sub):
                got = check.chunk(slots[at:at + min(n - at, sub)], first + at)
                if got and kept != at:
                    slots[kept:kept + got] = slots[at:at + got]
                kept += got
                self.records_read += got
            if kept:
                yield slots[:kept].view(header.record_dtype)


def first_seq(header: RingHeader) -> np.ndarray:
    """Per lane, the seq of an events file's first record: 1, or for a segment after the
    first, one past its lane's base (docs/ring.md, "Segments")."""
    return header.lanes["base_head"].astype(np.uint64) + np.uint64(1)


def _read_exactly(fd: int, into: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(into):
        n = os.preadv(fd, [into[done:]], offset + done)
        if n <= 0:  # the file shrank while we read it
            raise TandemError(f"{path}: events file shrank while being read (corrupt or reused file)")
        done += n


class _EventsCheck:
    """Chunk-wise checks of an events file's records, squeezing out LOST markers.

    The drain writes every position of every lane from 0 in order (lanes interleaved in
    batches), so per lane the records' seq (= position in the lane + 1) count 1, 2, 3, ...
    (in a segment: from its lane's base + 1) with no gap; LOST markers (seq 0, kind
    LOST_MARKER) sit in between.
    """

    def __init__(self, path: Path, record_dtype: np.dtype, lane_count: int, next_seq: np.ndarray | None = None):
        self.path = path
        self.record_dtype = record_dtype
        self.lane_count = lane_count
        # per lane (a segment's lanes start past their base: first_seq)
        self.next_seq = np.ones(lane_count, dtype=np.uint64) if next_seq is None else next_seq.astype(np.uint64)
        self.records = np.zeros(lane_count, dtype=np.int64)    # per lane
        self.lost = [0] * lane_count                           # per lane, exact Python ints

    def chunk(self, slots: np.ndarray, first_row: int) -> int:
        """Check SLOTS (rows from FIRST_ROW); move the records to its front, markers out.
        Returns how many records it kept."""
        from engine.ring.seqcheck import records_continue  # lazy: numba (0.3 s) only once records are read

        records = slots.view(self.record_dtype)
        lane = records["lane"]
        # Fast path, almost every chunk: each record's seq runs on from its lane's previous one
        # with no gap (which also proves there is no marker: a marker's seq is 0).
        if records_continue(records["seq"], lane, self.lane_count, self.next_seq, self.records):
            return len(records)
        if (lane >= self.lane_count).any():
            at = int(np.argmax(lane >= self.lane_count))
            raise TandemError(f"{self.path}: record near row {first_row + at} names lane {int(lane[at])} of {self.lane_count} (corrupt file)")
        is_marker = records["seq"] == 0
        if is_marker.any():
            markers = records[is_marker]
            if (markers["kind"] != LOST_MARKER).any():
                raise TandemError(f"{self.path}: a record near row {first_row} has sequence 0 but is not a LOST marker (corrupt file)")
            if (markers["aux"] >= np.uint64(MAX_POSITION)).any():
                raise TandemError(f"{self.path}: a LOST marker near row {first_row} counts an impossible number of events (corrupt file)")
            for marker_lane in np.unique(markers["lane"]).tolist():
                self.lost[marker_lane] += _sum_u64(markers["aux"][markers["lane"] == marker_lane])
            survivors = slots[~is_marker]  # a copy: safe to write back over slots
            slots[:len(survivors)] = survivors
            records = slots[:len(survivors)].view(self.record_dtype)
        n = len(records)
        if n == 0:
            return 0
        seq, lane = records["seq"], records["lane"]
        # Runs of one lane's records; inside a run seq steps by exactly 1.
        new_run = np.empty(n, dtype=bool)
        new_run[0] = True
        np.not_equal(lane[1:], lane[:-1], out=new_run[1:])
        steps_ok = (seq[1:] - seq[:-1]) == np.uint64(1)
        bad = ~steps_ok & ~new_run[1:]
        if bad.any():
            at = int(np.argmax(bad)) + 1
            self._out_of_order(int(seq[at]), int(seq[at - 1]) + 1, first_row)
        starts = np.flatnonzero(new_run)
        run_lane = lane[starts].astype(np.int64)
        run_first = seq[starts]
        run_len = np.diff(np.append(starts, n)).astype(np.uint64)
        # Across runs of the same lane, each run starts where that lane's previous one ended
        # (or, for its first run in this chunk, where it ended in earlier chunks).
        order = np.argsort(run_lane, kind="stable")
        rl, rf, rn = run_lane[order], run_first[order], run_len[order]
        first_of_lane = np.empty(len(rl), dtype=bool)
        first_of_lane[0] = True
        np.not_equal(rl[1:], rl[:-1], out=first_of_lane[1:])
        expected = np.empty(len(rl), dtype=np.uint64)
        expected[first_of_lane] = self.next_seq[rl[first_of_lane]]
        expected[1:][~first_of_lane[1:]] = (rf[:-1] + rn[:-1])[~first_of_lane[1:]]
        if (rf != expected).any():
            at = int(np.argmax(rf != expected))
            self._out_of_order(int(rf[at]), int(expected[at]), first_row)
        last_of_lane = np.append(first_of_lane[1:], True)
        self.next_seq[rl[last_of_lane]] = rf[last_of_lane] + rn[last_of_lane]
        self.records += np.bincount(run_lane, weights=run_len, minlength=self.lane_count).astype(np.int64)
        return n

    def _out_of_order(self, found: int, expected: int, first_row: int) -> None:
        raise TandemError(
            f"{self.path}: record with sequence {found} where {expected} was expected in its lane, near row {first_row}: "
            "records are missing or out of order (corrupt file)"
        )


# ---- TSC time (clock_id 2 rings) -----------------------------------------------------------


def tsc_knots(block: np.ndarray, path: Path, skip_slot: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (tsc, mono_ns) knots of a ring's calibration block (CALIB_WORDS u64 from
    OFFSET_CALIB_SEQ, copied consistently), oldest first: the creation pair, then the table's
    pairs. Pairs that do not increase in both are skipped; fewer than two left is an error."""
    total = int(block[1])
    at = (OFFSET_CALIB_TABLE - OFFSET_CALIB_SEQ) // 8
    table = block[at:at + 2 * CALIB_SLOTS].reshape(CALIB_SLOTS, 2)
    kept = min(total, CALIB_SLOTS)
    slots = [(total - kept + i) % CALIB_SLOTS for i in range(kept)]
    pairs = [(int(block[2]), int(block[3]))] + [(int(table[i, 0]), int(table[i, 1])) for i in slots if i != skip_slot]
    knots = [pairs[0]]
    for t, mono in pairs[1:]:
        if t > knots[-1][0] and mono >= knots[-1][1]:
            knots.append((t, mono))
    if len(knots) < 2:
        raise TandemError(f"{path}: ring's TSC calibration table holds fewer than two usable (tsc, mono) pairs (corrupt file)")
    return np.array([k[0] for k in knots], dtype=np.uint64), np.array([k[1] for k in knots], dtype=np.uint64)


def tsc_to_mono(ticks: np.ndarray, knot_tsc: np.ndarray, knot_mono: np.ndarray) -> np.ndarray:
    """CLOCK_MONOTONIC ns of TSC values: piecewise linear between the knots, and beyond the
    first or last knot along the slope from the first to the last (as the drain thread
    converts, docs/ring.md "TSC time")."""
    ticks = np.asarray(ticks, dtype=np.uint64)
    n = len(knot_tsc)
    with np.errstate(all="ignore"):  # hostile values may overflow: garbage out, never a crash
        seg_slope = (knot_mono[1:] - knot_mono[:-1]).astype(np.float64) / (knot_tsc[1:] - knot_tsc[:-1]).astype(np.float64)
        overall = float(int(knot_mono[-1]) - int(knot_mono[0])) / float(int(knot_tsc[-1]) - int(knot_tsc[0]))
        i = np.searchsorted(knot_tsc, ticks, side="right") - 1
        inside = (i >= 0) & (i < n - 1)
        base = np.clip(i, 0, n - 1)
        slope = np.where(inside, seg_slope[np.clip(i, 0, n - 2)], overall)
        distance = (ticks - knot_tsc[base]).view(np.int64)  # signed: before the knot is negative
        step = np.rint(distance * slope).astype(np.int64).view(np.uint64)
        return knot_mono[base] + step


# ---- Live rings ---------------------------------------------------------------------------


class RingTailer:
    """Follow a live ring read-only: `poll()` returns the records committed since the last call.

    The tailer follows every lane on its own. It never writes to the ring, so it can never
    stall a producer; if it falls more than a lane's capacity behind in a lane, that lane's
    oldest records are overwritten and counted in `missed`.
    At any time, once a poll has caught up with every lane's head, per lane and in total:
        received + missed == head            (positions)
        received + missed + dropped == produced events
    Per-lane figures: `lane_received`, `lane_missed`, `lane_position`, `lane_head`,
    `lane_dropped` (lists indexed by lane); `received`, `missed`, ... are their sums.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        fd, st = _open_checked(self.path, "ring")
        try:
            self.header = _read_header_page(fd, self.path, st.st_size, FILE_KIND_RING)
            h = self.header
            expected = h.records_offset + h.capacity * h.record_size
            if st.st_size != expected:
                raise TandemError(f"{self.path}: ring file is {st.st_size} bytes, its header implies {expected} (truncated or corrupt)")
            self._map = mmap.mmap(fd, expected, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._size = expected
        # Slots as opaque fixed-size byte strings: numpy copies those with memcpy, while
        # copying a structured dtype goes field by field (5x slower here). Lane l's slots
        # are rows [l * lane_capacity, (l + 1) * lane_capacity).
        self._slots = np.frombuffer(self._map, dtype=_opaque(h.record_dtype), offset=h.records_offset, count=h.capacity)
        self._seq = self._slots.view(h.record_dtype)["seq"]  # strided view of every slot's commit word
        self._lanes = np.frombuffer(self._map, dtype=LANE_DTYPE, offset=HEADER_SIZE, count=h.lane_count)
        self._state = np.frombuffer(self._map, dtype="<u4", offset=OFFSET_STATE, count=1)
        # clock_id 2: times are TSC ticks; poll() converts them with the calibration table.
        self._calib = (np.frombuffer(self._map, dtype="<u8", offset=OFFSET_CALIB_SEQ, count=CALIB_WORDS)
                       if h.clock_id == CLOCK_TSC else None)
        self._chunk = max(1, min(h.lane_capacity, CHUNK_BYTES // h.record_size))
        self._seq_before = np.empty(self._chunk, dtype=np.uint64)  # per-chunk scratch, reused
        self._seq_after = np.empty(self._chunk, dtype=np.uint64)
        self._scratch = np.empty(self._chunk, dtype=np.uint64)
        self._one_to_chunk = np.arange(1, self._chunk + 1, dtype=np.uint64)
        n = h.lane_count
        self.lane_position = [0] * n   # next position to read, per lane
        self.lane_received = [0] * n   # records returned by poll()
        self.lane_missed = [0] * n     # positions overwritten before this tailer read them
        self.lane_dropped = [0] * n    # producers' drop counter, as of the last poll
        self.lane_head = [0] * n       # producers' claim counter, as of the last poll

    position = property(lambda self: sum(self.lane_position), doc="positions consumed, all lanes")
    received = property(lambda self: sum(self.lane_received), doc="records returned by poll(), all lanes")
    missed = property(lambda self: sum(self.lane_missed), doc="positions overwritten before being read, all lanes")
    dropped = property(lambda self: sum(self.lane_dropped), doc="events dropped by producers (lanes full), as of the last poll")
    head = property(lambda self: sum(self.lane_head), doc="positions claimed by producers, as of the last poll")

    # The tailer owns an fd and a mapping: a context manager closes them deterministically.
    def __enter__(self) -> "RingTailer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmap and close (the arrays returned by poll() are copies and stay valid)."""
        if self._fd >= 0:
            self._slots = self._seq = self._lanes = self._state = self._calib = None
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

    def _read_heads(self) -> np.ndarray:
        """Every lane's head (one vectorised read), checked: heads only grow."""
        heads = self._lanes["head"].copy()
        previous = np.array(self.lane_head, dtype=np.uint64)
        wrong = (heads < previous) | (heads >= np.uint64(MAX_POSITION))
        if wrong.any():
            lane = int(np.argmax(wrong))
            raise TandemError(f"{self.path}: ring lane {lane} head went from {self.lane_head[lane]} to {int(heads[lane])} (corrupt or reused file)")
        return heads

    def _slot_ranges(self, lane: int, first: int, count: int) -> list[slice]:
        """Slot slices covering LANE's positions [first, first + count), count <= lane capacity."""
        capacity = self.header.lane_capacity
        base = lane * capacity
        start = first & (capacity - 1)
        end = start + count
        if end <= capacity:
            return [slice(base + start, base + end)]
        return [slice(base + start, base + capacity), slice(base, base + end - capacity)]

    def poll(self, max_records: int | None = None, *, producer_gone: bool = False) -> np.ndarray:
        """Records committed since the last poll (a copy), at most MAX_RECORDS: lane by lane,
        each lane's in position order (use `by_time` for a global order).

        PRODUCER_GONE: the producing process has exited (e.g. SIGKILL), so a position
        claimed but never committed never will be: count it as missed instead of waiting.
        """
        if self._fd < 0:
            raise TandemError(f"{self.path}: ring tailer is closed")
        if os.fstat(self._fd).st_size < self._size:
            # Reading a mapping past the end of a shrunken file would raise SIGBUS.
            raise TandemError(f"{self.path}: ring file shrank while mapped (corrupt or reused file)")
        capacity = self.header.lane_capacity
        limit = self.header.capacity if max_records is None else max(0, min(int(max_records), self.header.capacity))
        heads = self._read_heads()
        dropped = self._lanes["dropped"].copy()
        self.lane_head = [int(v) for v in heads]
        self.lane_dropped = [int(v) for v in dropped]
        todo = []  # (lane, positions to read), lanes whose head moved
        for lane in np.flatnonzero(heads > np.array(self.lane_position, dtype=np.uint64)).tolist():
            head = self.lane_head[lane]
            if head - self.lane_position[lane] > capacity:
                # Slots of these positions were reused by later ones: gone for this tailer.
                self.lane_missed[lane] += head - capacity - self.lane_position[lane]
                self.lane_position[lane] = head - capacity
            count = min(head - self.lane_position[lane], limit)
            if count > 0:
                todo.append((lane, count))
                limit -= count
        # One result array for every lane, filled in cache-sized chunks (like read_events),
        # each lane stopping at its first record not yet committed.
        out = np.empty(sum(count for _, count in todo), dtype=self._slots.dtype)
        kept = 0
        for lane, count in todo:
            consumed = 0
            while consumed < count:
                n = min(self._chunk, count - consumed)
                got, complete = self._read_committed(lane, out[kept:kept + n], producer_gone)
                kept += got
                consumed += n
                if not complete:
                    break
        records = out[:kept].view(self.header.record_dtype)
        if self._calib is not None and kept:
            knot_tsc, knot_mono = self._read_calibration(producer_gone)
            for name in ("mono_ns",) if "mono_ns" in records.dtype.names else ("start_ns", "end_ns"):
                records[name] = tsc_to_mono(records[name], knot_tsc, knot_mono)
        return records

    def _read_calibration(self, producer_gone: bool) -> tuple[np.ndarray, np.ndarray]:
        """The calibration knots, read as a seqlock reader (after the records: the drain's
        newest pair is then at least as new as their stamps, but for the few stamped since)."""
        for _ in range(1000):
            before = int(self._calib[0])
            block = self._calib.copy()
            after = int(self._calib[0])
            if before == after and before % 2 == 0:
                return tsc_knots(block, self.path)
            if producer_gone and before == after:
                # The producer died inside an update: every pair but the one being written
                # (slot total % CALIB_SLOTS) is whole.
                return tsc_knots(block, self.path, skip_slot=int(block[1]) % CALIB_SLOTS)
        raise TandemError(f"{self.path}: ring's TSC calibration table never stopped changing (corrupt file or stalled writer)")

    def _read_committed(self, lane: int, dest: np.ndarray, producer_gone: bool) -> tuple[int, bool]:
        """Copy the intact records among LANE's next len(DEST) positions into DEST, up to the
        first one not yet committed; advance the lane's position and counters.
        Returns (records copied, whether all len(DEST) positions were consumed)."""
        count = len(dest)
        position = self.lane_position[lane]
        ranges = self._slot_ranges(lane, position, count)
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
        np.subtract(seq_before, np.uint64(position), out=self._scratch[:count])
        intact = self._scratch[:count] == self._one_to_chunk[:count]
        intact &= seq_before == seq_after
        if intact.all():
            stop = kept = count
        else:
            # A slot whose position + capacity was claimed may be mid-overwrite: lost to us.
            # Any other slot not intact is not committed yet: stop there, retry next poll.
            head_after = int(self._read_heads()[lane])
            positions = np.arange(position, position + count, dtype=np.uint64)
            # Lane 0 (shared) counts claims in head: q's slot is reused once q + capacity is
            # claimed. A private lane's head counts commits: its producer rewrites q's slot
            # while head == q + capacity.
            reuse_at = np.uint64(head_after + (0 if lane == 0 else 1))
            overwritten = positions + np.uint64(self.header.lane_capacity) < reuse_at
            pending = ~intact & ~overwritten
            stop = int(np.argmax(pending)) if pending.any() and not producer_gone else count
            survivors = dest[:stop][intact[:stop]]  # a copy: safe to write back over dest
            kept = len(survivors)
            dest[:kept] = survivors
        self.lane_missed[lane] += stop - kept
        self.lane_received[lane] += kept
        self.lane_position[lane] = position + stop
        return kept, stop == count


def read_ring(path: str | os.PathLike) -> tuple[RingHeader, np.ndarray, int]:
    """Everything the ring of an exited producer still holds: (header, records, missed
    positions), where records + missed == header.head (summed over lanes; records lane by
    lane, each lane's in position order)."""
    with RingTailer(path) as tailer:
        records = tailer.poll(producer_gone=True)
        return tailer.header, records, tailer.missed
