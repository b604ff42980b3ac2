"""A structural walk of each JFR chunk's events, beside jdk.jfr (spec: docs/pauses.md, "Damage").

jdk.jfr's EventStream ends a chunk quietly when it meets damage. The walk reads what a
chunk holds without interpreting events: the chunk's metadata event (type names to ids),
then every event's size and type id from the first byte after the header to the chunk's
end. It knows where each event of the types ingest reads starts, so that when jdk.jfr
delivers fewer of them than the walk saw, ingest can say which chunk, from which byte,
how many bytes and how many pause events were lost.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.clock.chunks import HEADER_SIZE, Chunk
from engine.ingest import _chunkwalk

METADATA_TYPE_ID = 0
CHECKPOINT_TYPE_ID = 1
EVENT_SUPER_TYPE = "jdk.jfr.Event"

# Why a walk stopped before the chunk's end (codes of engine/ingest/chunkwalk.c).
_PROBLEMS = {
    1: "an event size runs past the chunk's end or is not positive",
    2: "an event's size or type id is cut by the chunk's end",
    3: "an event has a type id the chunk's metadata does not declare",
}


class MetadataError(ValueError):
    """The chunk's metadata event cannot be parsed: jdk.jfr cannot read the chunk at all."""


@dataclass
class ChunkWalk:
    """What one chunk holds, as far as its structure can be followed."""

    chunk: Chunk
    type_ids: dict[str, int]          # event type name -> id, from the chunk's metadata (empty: unreadable)
    walked_to: int                    # absolute file offset the walk reached (chunk end when intact)
    problem: str | None               # why the walk stopped early, or why the chunk cannot be read
    event_offsets: np.ndarray = field(repr=False)  # absolute offsets of the watched events, file order
    event_types: np.ndarray = field(repr=False)    # their type ids
    # After an early stop: the first byte from which whole events chain to the chunk's end
    # again (None: none found), and the type ids of the watched events from there on.
    resumed_at: int | None = None
    resumed_types: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def end(self) -> int:
        return self.chunk.offset + self.chunk.size

    @property
    def metadata_readable(self) -> bool:
        return bool(self.type_ids)

    def ids_of(self, names) -> np.ndarray:
        return np.array([self.type_ids[n] for n in names if n in self.type_ids], dtype=np.int64)

    def count(self, names) -> int:
        return int(np.isin(self.event_types, self.ids_of(names)).sum())


def walk_chunks(path: Path, chunks: list[Chunk], watched: tuple[str, ...]) -> list[ChunkWalk]:
    """Walks each chunk of `path`; `watched`: the event type names whose offsets are kept."""
    buffer = np.memmap(path, dtype=np.uint8, mode="r") if chunks else np.zeros(0, np.uint8)
    return [walk_chunk(buffer, chunk, watched) for chunk in chunks]


def walk_chunk(buffer: np.ndarray, chunk: Chunk, watched: tuple[str, ...]) -> ChunkWalk:
    start, end = chunk.offset + HEADER_SIZE, chunk.offset + chunk.size
    empty = np.zeros(0, np.int64)
    try:
        event_ids = read_event_types(buffer, chunk)
    except MetadataError as err:
        return ChunkWalk(chunk, {}, start, f"its metadata cannot be read ({err})", empty, empty)
    known = np.zeros(max(event_ids.values(), default=0) + 2, dtype=np.bool_)
    for type_id in event_ids.values():
        if type_id >= 0:
            known[type_id] = True
    known[METADATA_TYPE_ID] = known[CHECKPOINT_TYPE_ID] = True
    watch = np.zeros(len(known), dtype=np.bool_)
    for name in watched:
        if name in event_ids:
            watch[event_ids[name]] = True
    watch[CHECKPOINT_TYPE_ID] = True  # (checked against the checkpoints' own chain below)
    offsets, types, reached, code = _walk(buffer, start, end, known, watch)
    is_checkpoint = types == CHECKPOINT_TYPE_ID
    checkpoints, offsets, types = offsets[is_checkpoint], offsets[~is_checkpoint], types[~is_checkpoint]
    walk = ChunkWalk(chunk, event_ids, int(reached), _PROBLEMS.get(int(code)), offsets, types)
    if not code:
        # A damaged size can lead the walk (and jdk.jfr, which follows the same sizes) through
        # the middle of events and back onto whole ones further on, past events it never sees;
        # the checkpoints' chain of deltas (what jdk.jfr reads constant pools by) does not
        # depend on those sizes: a checkpoint on it that the walk did not step on says so.
        chain = _checkpoint_chain(buffer, chunk)
        missed = sorted(set(chain) - set(checkpoints.tolist())) if chain is not None else []
        if missed:
            visited = checkpoints[checkpoints < missed[0]]
            walk.walked_to = int(visited.max()) if visited.size else start
            walk.problem = f"its events skip the checkpoint at byte {missed[0]} (a damaged event size)"
        return walk
    resumed = int(_resync(buffer, reached, end, known))
    if resumed >= 0:
        walk.resumed_at = resumed
        types = _walk(buffer, resumed, end, known, watch)[1]
        walk.resumed_types = types[types != CHECKPOINT_TYPE_ID]
    return walk


# ---------------------------------------------------------------- the event stream


def _walk(buffer: np.ndarray, start: int, end: int, known: np.ndarray, watch: np.ndarray):
    """Follows sizes from `start` to `end` (engine/ingest/chunkwalk.c): (offsets, type ids of
    watched events, reached, problem code)."""
    offsets, types, reached, code = _chunkwalk.walk(buffer, start, end, known, watch)
    return np.frombuffer(offsets, np.int64), np.frombuffer(types, np.int64), reached, code


def _checkpoint_chain(buffer: np.ndarray, chunk: Chunk) -> list[int] | None:
    """The chunk's checkpoint events as jdk.jfr finds its constant pools: from the one the
    header names (@16, relative to the chunk), each one's delta (after size, type id 1, start
    time and duration) to the one before, until a delta of 0. Absolute offsets, newest first;
    None where the chain leaves the chunk or lands on something else (jdk.jfr then cannot
    read the chunk's constant pools, and says so itself)."""
    raw = chunk.header or bytes(buffer[chunk.offset:chunk.offset + HEADER_SIZE])
    relative = int.from_bytes(raw[16:24], "big", signed=True)
    start, end = chunk.offset, chunk.offset + chunk.size
    chain: list[int] = []
    while True:
        pos = start + relative
        if not start + HEADER_SIZE <= pos < end or pos in chain:
            return None
        chain.append(pos)
        reader = _Reader(bytes(buffer[pos:min(end, pos + 64)]), 0, min(end, pos + 64) - pos)
        try:
            size, type_id = reader.varint(), reader.varint()
            if type_id != CHECKPOINT_TYPE_ID or size <= 0 or pos + size > end:
                return None
            reader.varint()  # start time
            reader.varint()  # duration
            delta = reader.varint()
        except MetadataError:
            return None
        if delta == 0:
            return chain
        relative += delta


def _resync(buffer: np.ndarray, stop: int, end: int, known: np.ndarray) -> int:
    """The first offset after `stop` from which at least RESYNC_MIN_EVENTS whole events (sizes
    in range, declared type ids) chain to `end` exactly; -1 if none."""
    return _chunkwalk.resync(buffer, stop, end, known, RESYNC_MIN_EVENTS)


RESYNC_MIN_EVENTS = 3


# ---------------------------------------------------------------- the metadata event


class _Reader:
    """An event's bytes (the metadata event; a checkpoint's first fields), read in plain Python
    (varints encoded as chunkwalk.c's read_varint reads them)."""

    def __init__(self, data: bytes, pos: int, end: int):
        self.data, self.pos, self.end = data, pos, end

    def varint(self) -> int:
        data, pos, end = self.data, self.pos, self.end
        value = shift = 0
        while True:
            if pos >= end:
                raise MetadataError("cut by the end of its event")
            byte = data[pos]
            pos += 1
            if shift == 56:  # the 9th byte is taken whole
                value |= byte << 56
                break
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        self.pos = pos
        return value - (1 << 64) if value >= 1 << 63 else value

    def count(self, what: str) -> int:
        n = self.varint()
        if not 0 <= n <= self.end - self.pos:
            raise MetadataError(f"{what} count {n} does not fit in the event")
        return n

    def string(self) -> str | None:
        if self.pos >= self.end:
            raise MetadataError("cut by the end of its event")
        encoding = self.data[self.pos]
        self.pos += 1
        if encoding == 0:
            return None
        if encoding == 1:
            return ""
        if encoding in (3, 5):  # UTF-8 / Latin-1 bytes
            n = self.count("string byte")
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            return raw.decode("utf-8" if encoding == 3 else "latin-1", "replace")
        if encoding == 4:  # chars, one compressed integer each
            n = self.count("string char")
            raw = self.data[self.pos:self.pos + n]
            if len(raw) == n and raw.isascii():  # (each char below 0x80 is its own one byte)
                self.pos += n
                return raw.decode("ascii")
            return "".join([chr(self.varint() & 0xFFFF) for _ in range(n)])
        raise MetadataError(f"unknown string encoding {encoding}")


# Metadata bodies already parsed, by their bytes, and their event types: the chunks of one
# recording usually repeat one metadata, one JDK build writes the same one in every file, and
# `tandem live` reads the same recording again every few seconds; parsing one in Python holds
# the GIL that ingest's other threads need while jdk.jfr reads the file.
_PARSED_METADATA: "collections.OrderedDict[bytes, dict[str, int]]" = collections.OrderedDict()
_PARSED_METADATA_MAX = 16
_PARSED_METADATA_LOCK = threading.Lock()


def read_event_types(buffer: np.ndarray, chunk: Chunk) -> dict[str, int]:
    """Event type name -> type id, from the metadata event the chunk header points to.

    Layout as jdk.jfr reads it (ChunkHeader.readMetadata, MetadataReader): size, type id 0,
    start time, duration, metadata id, a string pool (count, strings), then one element tree
    whose elements are (name, attribute pairs, children), every name and value an index into
    the pool; event types are the `class` elements under `metadata` whose superType is
    jdk.jfr.Event.
    """
    metadata_offset = _metadata_offset(buffer, chunk)
    chunk_end = chunk.offset + chunk.size
    if not HEADER_SIZE <= metadata_offset < chunk.size:
        raise MetadataError(f"its offset {metadata_offset} lies outside the chunk")
    start = chunk.offset + metadata_offset
    size = _Reader(bytes(buffer[start:start + 10]), 0, min(10, chunk_end - start)).varint()
    if not 0 < size <= chunk_end - start:
        raise MetadataError(f"size {size} does not fit in the chunk")
    reader = _Reader(bytes(buffer[start:start + size]), 0, size)
    reader.varint()  # its size
    if reader.varint() != METADATA_TYPE_ID:
        raise MetadataError("the event at its offset is not a metadata event")
    for _ in range(3):  # start time, duration, metadata id
        reader.varint()
    body = reader.data[reader.pos:]
    with _PARSED_METADATA_LOCK:
        types = _PARSED_METADATA.get(body)
        if types is not None:
            _PARSED_METADATA.move_to_end(body)
    if types is None:
        types = _parse_event_types(_Reader(body, 0, len(body)))
        with _PARSED_METADATA_LOCK:
            _PARSED_METADATA[body] = types
            while len(_PARSED_METADATA) > _PARSED_METADATA_MAX:
                _PARSED_METADATA.popitem(last=False)
    return dict(types)


def _parse_event_types(reader: _Reader) -> dict[str, int]:
    """read_event_types of one metadata event's string pool and element tree."""
    pool = [reader.string() for _ in range(reader.count("string pool"))]

    def name(index: int) -> str | None:
        if not 0 <= index < len(pool):
            raise MetadataError(f"string index {index} outside its pool of {len(pool)}")
        return pool[index]

    types: dict[str, int] = {}

    def element(parent: str | None, depth: int) -> None:
        if depth > 32:
            raise MetadataError("its element tree is nested deeper than any JDK writes")
        tag = name(reader.varint())
        attributes = {}
        for _ in range(reader.count("attribute")):
            key = name(reader.varint())
            attributes[key] = name(reader.varint())
        if tag == "class" and parent == "metadata" and attributes.get("superType") == EVENT_SUPER_TYPE:
            try:
                types[attributes["name"]] = int(attributes["id"])
            except (KeyError, TypeError, ValueError):
                raise MetadataError("an event class without a name or a numeric id") from None
        for _ in range(reader.count("child")):
            element(tag, depth + 1)

    element(None, 0)
    if not types:
        raise MetadataError("it declares no event type")
    return types


def _metadata_offset(buffer: np.ndarray, chunk: Chunk) -> int:
    if chunk.header:
        raw = chunk.header
    else:
        raw = bytes(buffer[chunk.offset:chunk.offset + HEADER_SIZE])
    return int.from_bytes(raw[24:32], "big", signed=True)


# ---------------------------------------------------------------- what jdk.jfr lost


@dataclass(frozen=True)
class Damage:
    """One chunk jdk.jfr did not read to its end."""

    chunk: int                        # index in the file
    chunk_offset: int                 # where the chunk starts in the file
    from_byte: int                    # absolute file offset from which nothing was read
    lost_bytes: int                   # from `from_byte` to the chunk's end
    lost_pause_events: int | None     # pause events the walk saw there; None: not countable
    reason: str
    # When not countable: the pause events the walk found after the damage, where whole events
    # chain to the chunk's end again (a lower bound; the damaged bytes may have held more).
    lost_pause_events_at_least: int | None = None

    def as_metadata(self) -> dict:
        return dict(self.__dict__)

    def describe(self) -> str:
        if self.lost_pause_events is not None:
            events = f"{self.lost_pause_events} pause event(s)"
        elif self.lost_pause_events_at_least:
            events = f"at least {self.lost_pause_events_at_least} pause event(s)"
        else:
            events = "pause events not countable"
        return (f"chunk {self.chunk} (at byte {self.chunk_offset}): {self.reason}; lost from byte {self.from_byte}: "
                f"{self.lost_bytes} bytes, {events}")


def chunk_damage(walk: ChunkWalk, delivered: int | None, watched: tuple[str, ...], pause_types: tuple[str, ...],
                 error: str | None = None) -> Damage | None:
    """Compares what jdk.jfr delivered from one chunk (`delivered` events of the `watched`
    types, None if it could not read the chunk) with what the walk saw there."""
    chunk = walk.chunk
    if not walk.metadata_readable:
        return Damage(chunk.index, chunk.offset, chunk.offset, chunk.size, None, f"unreadable: {walk.problem}")
    pause_ids = walk.ids_of(pause_types)
    is_pause = np.isin(walk.event_types, pause_ids)
    walked = len(walk.event_types)
    # After an early stop of the walk, only a lower bound: the pause events before the stop
    # that jdk.jfr did not deliver, plus those found where whole events chain again.
    resumed = f"; whole events again from byte {walk.resumed_at}" if walk.resumed_at is not None else ""
    after_damage = int(np.isin(walk.resumed_types, pause_ids).sum())

    def lost(before_stop: int) -> dict:
        if not walk.problem:
            return {"lost_pause_events": before_stop}
        return {"lost_pause_events": None, "lost_pause_events_at_least": before_stop + after_damage}

    if delivered is None:
        reason = f"jdk.jfr cannot read it ({error})" if error else "jdk.jfr cannot read it"
        return Damage(chunk.index, chunk.offset, chunk.offset, chunk.size, reason=reason + resumed, **lost(int(is_pause.sum())))
    if delivered < walked:
        start = int(walk.event_offsets[delivered])
        reason = f"jdk.jfr stopped after {delivered} of the {walked} events it reads"
        if walk.problem:
            reason += f", and the walk stopped at byte {walk.walked_to}: {walk.problem}"
        return Damage(chunk.index, chunk.offset, start, walk.end - start, reason=reason + resumed,
                      **lost(int(is_pause[delivered:].sum())))
    if walk.problem:
        return Damage(chunk.index, chunk.offset, walk.walked_to, walk.end - walk.walked_to,
                      reason=f"damaged at byte {walk.walked_to}: {walk.problem}{resumed}", **lost(0))
    return None


def damage_message(path: Path, damages: list[Damage], chunks: int) -> str:
    """One line for a file's damaged chunks."""
    pauses = [d.lost_pause_events for d in damages]
    counted = sum(p if p is not None else (d.lost_pause_events_at_least or 0) for p, d in zip(pauses, damages))
    if None not in pauses:
        total = f"{counted} pause event(s)"
    else:
        total = f"at least {counted} pause event(s)" if counted else "an uncounted number of pause events"
    return (f"{path}: damaged recording: {len(damages)} of {chunks} chunk(s) not read to the end, "
            f"{sum(d.lost_bytes for d in damages)} bytes and {total} lost: " + "; ".join(d.describe() for d in damages))
