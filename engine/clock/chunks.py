"""JFR file and chunk headers, read in Python before any Java sees the file.

A JFR file is a sequence of chunks, each with its own 68-byte big-endian header
(docs/pauses.md, "Chunks"). Reading the headers here lets ingest refuse what jdk.jfr
cannot read (not JFR, format 1.0) with a clear message, find the complete chunks of a
truncated file, find the flushed part of an unfinished chunk (a killed JVM's last
repository chunk), and convert each chunk's raw ticks with that chunk's own clock pair.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import TandemError

MAGIC = b"FLR\0"
HEADER_SIZE = 68
# magic, major, minor, chunkSize, constantPoolOffset, metadataOffset, startNanos,
# durationNanos, startTicks, ticksPerSecond, fileState (byte 64: 0 = finished)
_HEADER = struct.Struct(">4sHHqqqqqqqB")
# Byte 64 of a chunk header: HotSpot's chunk "generation". 0 once the chunk is closed;
# while it is open, 1..254, bumped at every flush (about once a second, JDK 14+), when the
# header's size, constant-pool and metadata offsets and duration are rewritten to describe
# the data flushed so far; 255 while that rewrite is under way (the other fields still
# describe the previous flush then: the guard byte is written first, the fields after).
FILE_STATE_OFFSET = 64
FILE_STATE_FINISHED = 0
FILE_STATE_UPDATING = 255

# The JVM writes its own description as plain text into the recording; format 1.0 files
# cannot be parsed by jdk.jfr, but this string still tells the user which JDK made them.
_VM_VERSION = re.compile(rb"([\w(). -]*?VM) \(([0-9][\w.+-]*)\) for ([\w-]+)")


@dataclass(frozen=True)
class Chunk:
    """One chunk's header: where it is in the file and its tick/wall-clock pair."""

    index: int
    offset: int
    size: int
    start_nanos: int       # wall clock (ns since the epoch) at start_ticks
    duration_nanos: int
    start_ticks: int
    ticks_per_second: int
    major: int
    minor: int
    # False: the JVM never closed this chunk (killed, or still recording). Its header then
    # describes the last flush: `size` ends there, `duration_nanos` is the time up to it.
    finished: bool = True
    file_state: int = FILE_STATE_FINISHED
    # The header's bytes as scanned (unfinished chunks only): a live JVM rewrites the header
    # at its next flush, so a copy of the chunk must carry the header that matches its size.
    header: bytes = field(default=b"", repr=False, compare=False)

    @property
    def end_ticks(self) -> int:
        return self.start_ticks + self.duration_nanos * self.ticks_per_second // 1_000_000_000


@dataclass(frozen=True)
class ChunkScan:
    """The complete chunks of a file and how much of the file could not be used."""

    path: Path
    file_size: int
    chunks: list[Chunk]
    lost_bytes: int          # bytes after the last usable chunk data (truncated, or written after the last flush)

    @property
    def complete_bytes(self) -> int:
        return self.file_size - self.lost_bytes

    @property
    def unfinished(self) -> Chunk | None:
        """The last chunk, if the JVM never closed it: read up to its last flush."""
        return self.chunks[-1] if self.chunks and not self.chunks[-1].finished else None

    @property
    def format_version(self) -> str:
        first = self.chunks[0]
        return f"{first.major}.{first.minor}"


def scan_chunks(path: str | Path) -> ChunkScan:
    """Reads every chunk header of `path`; raises TandemError for files jdk.jfr cannot read."""
    path = Path(path)
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            return _scan(path, f, file_size)
    except OSError as err:
        raise TandemError(f"{path}: cannot read: {err.strerror or err}") from None


def _scan(path: Path, f, file_size: int) -> ChunkScan:
    head = f.read(HEADER_SIZE)
    if head[:4] != MAGIC:
        raise TandemError(f"{path}: not a JFR recording (no 'FLR' magic at the start of the file)")
    if len(head) < 8:
        raise TandemError(f"{path}: truncated JFR recording: the file ends inside the first chunk header ({file_size} bytes)")
    major, minor = struct.unpack(">HH", head[4:8])
    if major != 2:
        raise TandemError(_unsupported_version_message(path, f, major, minor))

    chunks: list[Chunk] = []
    offset = 0
    never_flushed = False
    while offset + HEADER_SIZE <= file_size:
        f.seek(offset)
        raw = f.read(HEADER_SIZE)
        fields = _HEADER.unpack(raw[: _HEADER.size])
        magic, major, minor, size, _cp, metadata, start_nanos, duration, start_ticks, tps, state = fields
        if magic != MAGIC or major != 2:
            if not chunks:
                raise TandemError(f"{path}: not a JFR recording (bad chunk header at byte 0)")
            break  # garbage after the last chunk: counted as lost below
        # A closed chunk (state 0), or an open one that was flushed at least once (metadata
        # written): either way its declared size must fit in the file.
        usable = size >= HEADER_SIZE and offset + size <= file_size and metadata > 0
        if not usable or tps <= 0:
            never_flushed = state != FILE_STATE_FINISHED and metadata <= 0
            break
        finished = state == FILE_STATE_FINISHED
        chunks.append(Chunk(len(chunks), offset, size, start_nanos, duration, start_ticks, tps, major, minor,
                            finished, state, b"" if finished else raw))
        offset += size
        if not finished:
            break  # JFR writes one chunk at a time: what follows an open chunk's last flush is its unflushed tail
    if not chunks:
        if never_flushed:
            raise TandemError(
                f"{path}: unfinished JFR chunk that was never flushed (the JVM stopped or was killed within "
                f"about a second of starting to record): no event in its {file_size} bytes can be read"
            )
        raise TandemError(
            f"{path}: truncated or unfinished JFR recording: not one complete chunk in {file_size} bytes"
        )
    return ChunkScan(path, file_size, chunks, file_size - offset)


def _unsupported_version_message(path: Path, f, major: int, minor: int) -> str:
    f.seek(0)
    match = _VM_VERSION.search(f.read(4 << 20))
    if match:
        vm, version, platform = (g.decode("ascii", "replace").strip() for g in match.groups())
        writer = f"written by {vm} {version} on {platform}"
    else:
        writer = "written by an unknown JVM"
    era = {0: "Oracle JDK 7/8", 1: "JDK 9 or 10"}.get(major, "an unknown JDK")
    return (
        f"{path}: JFR format {major}.{minor} ({era}; {writer}) is not supported: "
        "jdk.jfr reads format 2.x only (JDK 11+, 8u262+); record again with one of those"
    )


def split_runs(chunks: list[Chunk]) -> list[list[Chunk]]:
    """Groups consecutive chunks written by one JVM run (one tick base).

    Chunks of one run follow each other on both clocks: same ticks per second, a chunk
    starting in the second half of the previous one or later (a header's duration is
    wall-clock time, so its end on the tick axis is only approximate), and the tick gap
    agreeing with the wall-clock gap within a second. A file made by concatenating
    recordings of several JVMs (or one recording twice) breaks one of these.
    """
    runs: list[list[Chunk]] = [[chunks[0]]]
    for prev, chunk in zip(chunks, chunks[1:]):
        tick_gap_ns = (chunk.start_ticks - prev.start_ticks) * 1_000_000_000 // chunk.ticks_per_second
        wall_gap_ns = chunk.start_nanos - prev.start_nanos
        previous_middle = prev.start_ticks + (prev.end_ticks - prev.start_ticks) // 2
        same_run = (
            chunk.ticks_per_second == prev.ticks_per_second
            and chunk.start_ticks > previous_middle
            and abs(tick_gap_ns - wall_gap_ns) < 1_000_000_000
        )
        if same_run:
            runs[-1].append(chunk)
        else:
            runs.append([chunk])
    return runs


def copy_chunks(path: Path, run: list[Chunk], dest: Path) -> Path:
    """Copies the bytes of `run`'s chunks to `dest`; an unfinished chunk ends at its last flush.

    An unfinished chunk (file state != 0: a killed JVM's last repository chunk) is a valid
    chunk up to the size its header gives, which HotSpot rewrites at every flush together
    with the constant-pool and metadata offsets. Left unfinished, jdk.jfr's EventStream waits
    forever for the JVM to write more (and JDK 21+'s RecordingFile refuses it), so the copy's
    file state is set to 0 ("finished"): jdk.jfr then reads it as a closed chunk of that size.
    """
    start, end = run[0].offset, run[-1].offset + run[-1].size
    with open(path, "rb") as src, open(dest, "wb") as out:
        src.seek(start)
        remaining = end - start
        while remaining:
            block = src.read(min(remaining, 8 << 20))
            if not block:
                break
            out.write(block)
            remaining -= len(block)
        if remaining:
            raise TandemError(f"{path}: the file shrank while being read")
        for chunk in run:
            if not chunk.finished:
                # The header as scanned (a live JVM may have flushed again since), marked finished.
                header = bytearray(chunk.header)
                header[FILE_STATE_OFFSET] = FILE_STATE_FINISHED
                out.seek(chunk.offset - start)
                out.write(header)
    return dest
