"""The flight recorder's keeper: `tandem record/attach --max-size/--max-age` keep a session within
both bounds for as long as the service runs (docs/session.md, "Flight recorder").

The recorded service only writes: its probe's drain closes a GIL segment every SEGMENT_BYTES or
SEGMENT_MS (engine/probe, docs/ring.md "Segments") and JFR keeps its own repository within the
`maxsize`/`maxage` the agent gives it. Everything else runs here, in tandem's own process, so
the service's CPU stays its own: each closed segment is packed (engine/ingest/segments.py,
docs/ring.md "Packed segments"), and the oldest packed segments are deleted, whole, while the
session is over --max-size (its whole disk use: rings, code tables, JFR's chunks included) or
hold events older than --max-age. Each finished JFR chunk is packed too (jvm-<pid>/packed/,
docs/session.md "Flight recorder"), and the packed chunks are kept within the same bounds.
"""
from __future__ import annotations

import errno
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.clock.chunks import FILE_STATE_FINISHED, FILE_STATE_OFFSET
from engine.clock.packed import packed_chunk_span, zstd_dictionary
from engine.errors import TandemError
from engine.ingest.segments import pack, packed_span
from engine.ring.layout import OFFSET_STATE, STATE_CLOSED
from engine.session import (GIL_EVENTS, JVM_DIRS, KEPT_CHUNKS, PACKED_CHUNK_SUFFIX, PACKED_CHUNKS, PACKED_DICTIONARY,
                            PACKED_SUFFIX, PYTHON_DIRS, gil_segments, packed_chunks)


# A segment is closed after this many bytes or this long (whichever first): small enough that
# the one being written, not yet packed, stays a small part of the budget.
SEGMENT_BYTES = 4 << 20
SEGMENT_MS = 5000
# JFR's share of --max-size (its maxsize option, per JVM): the GIL side takes what JFR leaves.
JFR_SHARE = 0.5
PERIOD_S = 0.25
# Room kept free under --max-size per Python process: its segment being written (up to
# SEGMENT_BYTES and one drain pass) and the one closed since the last round, not packed yet.
HEADROOM_BYTES = 2 * SEGMENT_BYTES
# A finished JFR chunk is packed once it is this old (JFR has moved on to the next). Level 19
# packs JFR chunks about a sixth smaller than level 3; JFR writes slowly enough that it costs
# about 1% of a core.
JFR_SETTLE_S = 1.0
JFR_ZSTD_LEVEL = 19
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_size(text: str, option: str = "--max-size") -> int:
    """'500M', '2G', '100MiB', '1048576' -> bytes (binary units)."""
    raw = text.strip().lower()
    number = raw.rstrip("abgikmt")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1
    if unit not in _UNITS or value <= 0:
        raise TandemError(f"{option} {text!r}: expected a size such as 500M or 2G")
    return int(value * _UNITS[unit])


def parse_duration(text: str, option: str = "--max-age") -> float:
    """'30m', '2h', '90s', '1d', '600' (seconds) -> seconds."""
    raw = text.strip().lower()
    number = raw.rstrip("adhimns")
    unit = raw[len(number):] or "s"
    try:
        value = float(number)
    except ValueError:
        value = -1
    if unit not in _SECONDS or value <= 0:
        raise TandemError(f"{option} {text!r}: expected a duration such as 90s, 30m or 2h")
    return value * _SECONDS[unit]


@dataclass(frozen=True)
class Bounds:
    max_bytes: int | None = None
    max_age_s: float | None = None

    def __bool__(self) -> bool:
        return self.max_bytes is not None or self.max_age_s is not None

    def probe_environment(self) -> dict[str, str]:
        """What the probe reads to rotate its events (engine/probe/autostart.py, segment_options)."""
        return {"TANDEM_PROBE_SEGMENT_BYTES": str(SEGMENT_BYTES), "TANDEM_PROBE_SEGMENT_MS": str(SEGMENT_MS)} if self else {}

    def jfr_max_bytes(self) -> int | None:
        return None if self.max_bytes is None else int(self.max_bytes * JFR_SHARE)

    def as_dict(self) -> dict:
        return {"max_bytes": self.max_bytes, "max_age_s": self.max_age_s, "segment_bytes": SEGMENT_BYTES,
                "segment_ms": SEGMENT_MS, "jfr_max_bytes": self.jfr_max_bytes()}


def bounds_from(max_size: str | None, max_age: str | None) -> Bounds:
    return Bounds(parse_size(max_size) if max_size else None, parse_duration(max_age) if max_age else None)


def disk_use(directory: Path) -> int:
    """Bytes the directory's files take on disk (allocated blocks: a sparse code table counts
    what it uses, a preallocated ring all of it), as du counts them."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # deleted meanwhile (JFR's rotation, ours)
                pass
    return total


class Keeper:
    """Packs closed segments and deletes the oldest to stay within BOUNDS. `step()` does one
    round; `start()` runs rounds every PERIOD_S in a thread until `stop()` (which does a last
    round, packing what the service closed as it exited)."""

    def __init__(self, session: Path, bounds: Bounds, say=None):
        self.session = Path(session)
        self.bounds = bounds
        self.say = say or (lambda line: print(line, file=sys.stderr))
        self.packed = 0
        self.deleted = 0
        self.raw_bytes = 0
        self.packed_bytes = 0
        self.jfr_packed = self.jfr_deleted = self.jfr_raw_bytes = self.jfr_packed_bytes = 0
        self.cpu_s = 0.0  # the keeper's own CPU time (packing, listing, deleting)
        self._spans: dict[Path, tuple[int, int]] = {}  # packed segment -> its (first, last) event time
        self._chunk_starts: dict[Path, int | None] = {}  # the oldest packed chunk -> its start
        self.failed: str | None = None
        self.over_by_fixed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Keeper":
        self._thread = threading.Thread(target=self._run, name="tandem-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.step()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                self.step()
            except Exception as err:  # the service runs on whatever happens here: say it once, keep going
                self._fail(f"{type(err).__name__}: {err}")

    def step(self) -> None:
        began = time.thread_time()
        try:
            self._step()
        finally:
            self.cpu_s += time.thread_time() - began

    def _step(self) -> None:
        if not self.session.is_dir():
            return
        for directory in sorted(self.session.glob(PYTHON_DIRS)):
            self._pack_closed(directory / GIL_EVENTS)
        for directory in sorted(self.session.glob(JVM_DIRS)):
            self._pack_jfr(directory)
            self._bound_jfr(directory)
        self._enforce()

    def _pack_jfr(self, directory: Path) -> None:
        """Pack the JVM's finished chunks, read through the agent's links in .chunks/ (JFR's own
        repository files are never touched: JFR, and any other recording of the JVM, owns them),
        then remove the link; the chunk's disk space goes when JFR rotates it out of its
        repository (under a keeper the agent gives JFR a maxage of one chunk period)."""
        links = sorted((directory / KEPT_CHUNKS).glob("*.jfr"), key=lambda p: p.name)
        for link in links[:-1]:  # (the newest: JFR's current chunk)
            try:
                if time.time() - os.lstat(link).st_mtime < JFR_SETTLE_S:
                    continue
                with open(link, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if len(data) <= FILE_STATE_OFFSET or data[FILE_STATE_OFFSET] != FILE_STATE_FINISHED:
                continue  # (a JVM killed mid-chunk leaves it unfinished: read as it is)
            full = f"{directory.name} stops recording (its agent keeps 32 MiB free)"
            dictionary = directory / PACKED_CHUNKS / PACKED_DICTIONARY
            if not dictionary.exists():  # the JVM's first chunk: what the others repeat of it packs to little
                if not self._write_packed(dictionary, _compress(data, JFR_ZSTD_LEVEL), link, full):
                    return
                self.jfr_packed_bytes += dictionary.stat().st_size
            target = directory / PACKED_CHUNKS / (link.name + PACKED_CHUNK_SUFFIX)
            if not self._write_packed(target, _compress(data, JFR_ZSTD_LEVEL, _dictionary(target)), link, full):
                return
            try:
                os.unlink(link)
            except OSError:
                pass
            self.jfr_packed += 1
            self.jfr_raw_bytes += len(data)
            self.jfr_packed_bytes += target.stat().st_size

    def _bound_jfr(self, directory: Path) -> None:
        """Delete the oldest packed chunks of a JVM while one holds events older than --max-age (as
        GIL segments) or they take more than JFR's share of --max-size (as JFR would)."""
        packed = packed_chunks(directory)
        if self.bounds.max_age_s is not None:
            oldest_kept_ns = time.time_ns() - int((self.bounds.max_age_s - 2 * PERIOD_S) * 1e9)
            while packed and (self._chunk_start_ns(packed[0]) or oldest_kept_ns) < oldest_kept_ns:
                self._delete(packed.pop(0), jfr=True)
        share = self.bounds.jfr_max_bytes()
        if share is not None:
            sizes = [_blocks(p) for p in packed]
            while packed and sum(sizes) > share:
                sizes.pop(0)
                self._delete(packed.pop(0), jfr=True)

    def _chunk_start_ns(self, packed: Path) -> int | None:
        """Wall-clock start (ns) of a packed chunk, from its header (read once); None when unreadable."""
        if packed not in self._chunk_starts:
            span = packed_chunk_span(packed)
            self._chunk_starts = {packed: span[0] if span else None}  # (only the oldest is asked, until it goes)
        return self._chunk_starts[packed]

    def _pack_closed(self, events_path: Path) -> None:
        segments = gil_segments(events_path)
        for segment in segments:
            if segment.packed:
                continue
            try:
                with open(segment.path, "rb") as f:
                    closed = _closed(f.read(4096))
            except FileNotFoundError:
                continue
            if not closed:
                continue  # the one being written (or one cut by a kill: packed once the process is gone)
            target = segment.path.with_name(segment.path.name + PACKED_SUFFIX)
            try:
                data = pack(segment.path)
            except OSError as err:
                self._fail(f"cannot pack {segment.path} ({err.strerror or err}); it stays unpacked")
                return
            if not self._write_packed(target, data, segment.path, f"GIL events of {segment.path.parent.name} are no longer "
                                      "written (counted as not written)"):
                return
            try:
                size = segment.path.stat().st_size
                os.unlink(segment.path)
            except OSError:
                continue
            self.packed += 1
            self.raw_bytes += size
            self.packed_bytes += len(data)

    def _write_packed(self, target: Path, data: bytes, source: Path, when_full: str) -> bool:
        """Write TARGET whole (through a temporary name and a rename) or say why not, once
        (WHEN_FULL: what a full disk does to the writer of SOURCE)."""
        tmp = target.with_name(target.name + ".tmp")
        try:
            if not target.parent.is_dir():
                os.mkdir(target.parent, 0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, target)
            return True
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if err.errno == errno.ENOSPC:  # the probe's drain and the agent meet it too: they stop writing
                self._fail(f"the session's disk is full: {when_full}; the service runs on")
            else:
                self._fail(f"cannot pack {source} ({err.strerror or err}); it stays unpacked")
            return False

    def _enforce(self) -> None:
        """Delete the oldest packed segments (of any process) while over a bound."""
        packed = []
        spans = {}
        for directory in self.session.glob(PYTHON_DIRS):
            for segment in gil_segments(directory / GIL_EVENTS):
                if segment.packed:
                    try:  # (a packed segment never changes: its span is read once)
                        spans[segment.path] = self._spans.get(segment.path) or packed_span(segment.path)
                    except (OSError, TandemError):
                        continue
                    packed.append((*spans[segment.path], segment.path))
        self._spans = spans
        packed.sort()
        if self.bounds.max_age_s is not None:
            # (a round late at worst: what turns too old before the next round goes now)
            oldest_kept = time.monotonic_ns() - int((self.bounds.max_age_s - 2 * PERIOD_S) * 1e9)
            while packed and packed[0][0] and packed[0][0] < oldest_kept:
                self._delete(packed.pop(0)[2])
        if self.bounds.max_bytes is not None:
            use = disk_use(self.session)
            limit = self.bounds.max_bytes - HEADROOM_BYTES * len(list(self.session.glob(PYTHON_DIRS)))
            while use > limit and packed:
                path = packed.pop(0)[2]
                use -= _blocks(path)
                self._delete(path)
            if use > limit and not self.over_by_fixed:
                self.over_by_fixed = True
                self.say(f"tandem: flight recorder: {self.session} takes {use >> 20} MiB with no GIL history left to "
                         f"delete (rings, code tables, JFR's chunks): --max-size is too small for it")

    def _delete(self, path: Path, jfr: bool = False) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        if jfr:
            self.jfr_deleted += 1
        else:
            self.deleted += 1

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
            self.say(f"tandem: flight recorder: {reason}")

    def summary(self) -> dict:
        return {**self.bounds.as_dict(), "packed_segments": self.packed, "deleted_segments": self.deleted,
                "raw_bytes_packed": self.raw_bytes, "packed_bytes": self.packed_bytes,
                "jfr_packed_chunks": self.jfr_packed, "jfr_deleted_chunks": self.jfr_deleted,
                "jfr_raw_bytes_packed": self.jfr_raw_bytes, "jfr_packed_bytes": self.jfr_packed_bytes,
                "cpu_s": round(self.cpu_s, 3), "problem": self.failed}


def _compress(data: bytes, level: int, dictionary=None) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=level, dict_data=dictionary).compress(data)


def _dictionary(packed: Path):
    return zstd_dictionary(packed)


def _closed(header_page: bytes) -> bool:
    if len(header_page) < OFFSET_STATE + 4:
        return False
    return bool(int.from_bytes(header_page[OFFSET_STATE:OFFSET_STATE + 4], "little") & STATE_CLOSED)


def _blocks(path: Path) -> int:
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0
