"""A session directory (docs/session.md) as a list of sources to analyze.

Discovery only: which JVM recordings and which GIL event files a session holds, and what
their producers said about themselves. Reading them is ingest's job.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from engine.clock.chunks import scan_chunks
from engine.clock.packed import PACKED_DICTIONARY, is_zstd, packed_chunk_span
from engine.errors import TandemError
from engine.probe.memory import THREAD_NAME as MEMORY_THREAD_NAME


# The names of a session directory (docs/session.md), for every module that reads one. (The GIL
# probe, engine/probe, spells its own: it runs inside the recorded service and imports nothing.)
SESSION_JSON = "session.json"
PYTHON_DIRS, JVM_DIRS = "py-*", "jvm-*"  # one directory per process: py-<pid>, jvm-<pid>
GIL_EVENTS, GIL_RING, GIL_CODES, PROBE_JSON, THREADS_JSONL = "gil.events", "gil.ring", "gil.codes", "probe.json", "threads.jsonl"
JVM_JSON, RECORDING, REPOSITORY, KEPT_CHUNKS = "jvm.json", "recording.jfr", "repository", ".chunks"
PAUSES_RING, AGENT_ERROR = "pauses.ring", "agent-error.txt"
# The Python threads the probe starts inside a recorded service (engine/probe/memory.py's
# sampler): tandem's own, never a cause of the service's pauses.
PROBE_THREAD_NAMES = (MEMORY_THREAD_NAME,)
# Memory samples: SESSION/memory/<pid>.jsonl from outside (tandem record), py-<pid>/memory.jsonl from inside CPython.
PROCESS_MEMORY_DIR, PYTHON_MEMORY = "memory", "memory.jsonl"
# The flight recorder's GIL segments (docs/ring.md, "Segments"): gil.events.000000, ...; the
# keeper packs a closed one into gil.events.000000.packed (engine/ingest/segments.py reads both).
PACKED_SUFFIX = ".packed"
# ... and packs each finished JFR chunk the agent kept a link to (.chunks/) into
# jvm-<pid>/packed/<chunk>.zst (one Zstandard frame of the whole chunk), then removes the link.
PACKED_CHUNKS, PACKED_CHUNK_SUFFIX = "packed", ".zst"
# The JVM's first finished chunk, packed alone, is their Zstandard dictionary (PACKED_DICTIONARY).
_SEGMENT_NAME = re.compile(r"^(?P<base>.+)\.(?P<number>\d{6})(?P<packed>\.packed)?$")


@dataclass(frozen=True)
class Segment:
    path: Path
    number: int
    packed: bool


def gil_segments(events_path: Path) -> list[Segment]:
    """The segments of the recording whose events file would be EVENTS_PATH (`py-<pid>/gil.events`),
    in order, packed and raw (a segment both packed and raw, caught between the keeper's rename
    and its unlink, counts once, packed); [] for a recording without rotation."""
    events_path = Path(events_path)
    found: dict[int, Segment] = {}
    try:
        names = [entry.name for entry in os.scandir(events_path.parent)]
    except OSError:
        return []
    for name in names:
        match = _SEGMENT_NAME.match(name)
        if not match or match["base"] != events_path.name:
            continue
        number, packed = int(match["number"]), bool(match["packed"])
        if number not in found or packed:
            found[number] = Segment(events_path.parent / name, number, packed)
    return [found[n] for n in sorted(found)]


def has_gil_events(directory: Path) -> bool:
    """Whether a py-<pid> directory holds drained GIL events: its events file or its segments."""
    return (directory / GIL_EVENTS).exists() or bool(gil_segments(directory / GIL_EVENTS))


def process_alive(pid: int | None) -> bool:
    """Whether `pid` runs (a zombie has exited, unreaped: not alive)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass
class JvmSource:
    """One JVM of the session: its closed recording, or the chunks left in its repository."""

    directory: Path
    recordings: list[Path]
    description: dict = field(default_factory=dict)
    closed: bool = True  # False: the JVM died before closing (SIGKILL); chunks only

    @property
    def pid(self) -> int | None:
        return self.description.get("pid") or pid_from_name(self.directory.name)


@dataclass
class PythonSource:
    """One CPython interpreter of the session: its drained GIL events (or live ring)."""

    directory: Path
    events: Path | None
    ring: Path | None
    description: dict = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.description.get("pid") or pid_from_name(self.directory.name)


@dataclass
class Session:
    path: Path
    description: dict
    jvms: list[JvmSource]
    pythons: list[PythonSource]

    @classmethod
    def open(cls, path: Path | str) -> "Session":
        path = Path(path)
        if not path.is_dir():
            raise TandemError(f"{path}: not a session directory (expected the -o directory of `tandem record`)")
        jvms = [_jvm_source(d) for d in sorted(path.glob(JVM_DIRS)) if d.is_dir()]
        pythons = [_python_source(d) for d in sorted(path.glob(PYTHON_DIRS)) if d.is_dir()]
        jvms = [j for j in jvms if j.recordings]
        if not jvms and not pythons:
            if (path / "pauses.parquet").is_file() and (path / "pause_impact.parquet").is_file():
                gil = f" --gil {path / 'gil.parquet'}" if (path / "gil.parquet").is_file() else ""
                raise TandemError(f"{path}: the results of `tandem analyze`, not a session (analyze them again with "
                                  f"--pauses {path / 'pauses.parquet'}{gil}; read them with the notebook or `tandem export`)")
            raise TandemError(f"{path}: the session holds no JVM recording and no GIL events (was anything started under `tandem record`?)")
        return cls(path, read_json(path / SESSION_JSON, strict=True), jvms, pythons)

    def identity(self) -> "SessionIdentity":
        """Where this session lands in a fleet dataset (docs/fleet.md, "Session identity")."""
        return session_identity(self.path, self.description,
                                [j.description for j in self.jvms] + [p.description for p in self.pythons])


@dataclass(frozen=True)
class SessionIdentity:
    """host and date (UTC day of the session's start) partition a fleet dataset; session_id names
    the session's file in each partition: unique per (host, boot, start instant)."""

    host: str
    date: str  # yyyy-mm-dd
    session_id: str
    boot_id: str | None
    start_wall_ns: int
    start_monotonic_ns: int | None

    def as_metadata(self) -> dict:
        return {"session_id": self.session_id, "host": self.host, "date": self.date, "boot_id": self.boot_id,
                "start_wall_ns": self.start_wall_ns, "start_monotonic_ns": self.start_monotonic_ns}


def session_identity(path: Path, description: dict, producers: list[dict] = ()) -> SessionIdentity:
    """From session.json (hostname, boot_id, start_wall_ns, start_monotonic_ns, as `tandem record`
    writes them); a session without one borrows them from its first producer's jvm.json/probe.json."""
    facts = dict(description)
    for producer in producers:
        for key in ("hostname", "boot_id", "start_wall_ns", "start_monotonic_ns"):
            facts.setdefault(key, producer.get(key))
    if not facts.get("hostname") or not facts.get("start_wall_ns"):
        raise TandemError(f"{path}: session.json names no hostname or start time (record with `tandem record`, "
                          "or add \"hostname\" and \"start_wall_ns\")")
    host = re.sub(r"[^A-Za-z0-9._-]", "_", str(facts["hostname"]))
    start_wall_ns = int(facts["start_wall_ns"])
    start = datetime.fromtimestamp(start_wall_ns / 1e9, tz=timezone.utc)
    digest = hashlib.sha256(f"{host}\0{facts.get('boot_id')}\0{facts.get('start_monotonic_ns')}\0{start_wall_ns}".encode())
    session_id = f"{start:%Y%m%dT%H%M%SZ}-{digest.hexdigest()[:16]}"
    monotonic = facts.get("start_monotonic_ns")
    return SessionIdentity(host, f"{start:%Y-%m-%d}", session_id, facts.get("boot_id"), start_wall_ns,
                           int(monotonic) if monotonic is not None else None)


def current_boot_id() -> str | None:
    """This machine's boot id (36-char text), or None where Linux does not provide it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def pid_from_name(name: str) -> int | None:
    """The pid in a process directory's name (py-<pid>, py-<pid>.<n> for a pid used again,
    jvm-<pid>), if any."""
    tail = name.rsplit("-", 1)[-1].split(".", 1)[0]
    return int(tail) if tail.isdigit() else None


def read_json(path: Path, strict: bool = False) -> dict:
    """A description (session.json, jvm.json, probe.json, docs/session.md): {} when missing;
    when unreadable (its writer may be midway), {}, or with STRICT an error naming it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        if strict:
            raise TandemError(f"{path}: unreadable session description ({err})") from None
        return {}


def jvm_recordings(directory: Path, packed: bool = True) -> tuple[list[Path], bool]:
    """The JFR files of one jvm-<pid>/ directory, and whether the JVM closed its recording.

    Closed: recording.jfr. Killed before closing: the chunks left in its disk repository and
    those the agent kept links to (.chunks/, docs/session.md), in the order JFR wrote them
    (their names are timestamps). Under a flight recorder the chunks packed by the
    keeper come first (unless PACKED is false: a reader that followed them already), then
    recording.jfr or the kept and repository chunks not packed yet (a chunk found both packed
    and raw, packed as the JVM exited, is read once)."""
    packed = packed_chunks(directory) if packed else []
    kept = sorted((directory / KEPT_CHUNKS).glob("*.jfr"), key=lambda p: p.name)
    recording = directory / RECORDING
    if recording.is_file() and recording.stat().st_size > 0:  # (links left beside it: a snapshot's, or an exit cut short)
        return _not_in(packed + kept, [recording]) + [recording], True
    chunks = list(raw_chunks(directory).values())
    return _not_in(packed, chunks) + chunks, False


def raw_chunks(directory: Path) -> dict[str, Path]:
    """A jvm-<pid>/'s unpacked chunks by name, in the order JFR wrote them: the repository's and
    the agent's links, the same chunk once (a link shares its file). The links reach further
    back under a keeper (JFR keeps two chunks) or after JFR cleared its repository on a full disk."""
    named = {p.name: p for p in (directory / KEPT_CHUNKS).glob("*.jfr")} | {p.name: p for p in (directory / REPOSITORY).rglob("*.jfr")}
    return dict(sorted(named.items()))


def packed_chunks(directory: Path) -> list[Path]:
    """The JFR chunks the flight recorder's keeper packed for one jvm-<pid>/, oldest first."""
    return sorted((p for p in (directory / PACKED_CHUNKS).glob("*.jfr" + PACKED_CHUNK_SUFFIX) if p.name != PACKED_DICTIONARY),
                  key=lambda p: p.name)


def _not_in(chunks: list[Path], recordings: list[Path]) -> list[Path]:
    """CHUNKS (single chunks, packed or raw) without those RECORDINGS hold too (same chunk start:
    packed while the JVM wrote its recording at exit, or a snapshot's JFR.dump holds it)."""
    if not chunks:
        return []

    def starts(path: Path) -> list[int]:
        if is_zstd(path):
            return [span[0]] if (span := packed_chunk_span(path)) else []
        try:
            return [chunk.start_nanos for chunk in scan_chunks(path).chunks]
        except TandemError:  # the reader says what is wrong with it
            return []

    known = {start for recording in recordings for start in starts(recording)}
    return [p for p in chunks if not set(starts(p)) & known]


def jvm_directory_of(chunk: Path) -> Path | None:
    """The jvm-<pid> directory of a chunk in its repository/ (None for a file elsewhere)."""
    parts = chunk.parent.parts
    if REPOSITORY not in parts:
        return None
    return Path(*parts[: len(parts) - parts[::-1].index(REPOSITORY) - 1])


def agent_error_line(jvm_dir: Path) -> str | None:
    """What the agent left in agent-error.txt when it could not record (docs/session.md)."""
    try:
        return (jvm_dir / AGENT_ERROR).read_text().strip() or None
    except OSError:
        return None


def _jvm_source(directory: Path) -> JvmSource:
    recordings, closed = jvm_recordings(directory)
    return JvmSource(directory, recordings, read_json(directory / JVM_JSON, strict=True), closed=closed)


def _python_source(directory: Path) -> PythonSource:
    events = directory / GIL_EVENTS
    ring = directory / GIL_RING
    return PythonSource(
        directory,
        events if has_gil_events(directory) else None,
        ring if ring.exists() else None,
        read_json(directory / PROBE_JSON, strict=True),
    )
