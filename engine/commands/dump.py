"""`tandem dump SESSION -o SNAPSHOT [--last 10m]`: a consistent, analyzable copy of a session,
taken while it records, without stopping anything (docs/session.md, "Flight recorder")."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

# Bytes copied at a time from a file being written: what was whole when its size was read.
_COPY_CHUNK = 1 << 20


def dump(
    session: Path = typer.Argument(..., help="A session directory, recording or not."),
    output: Path = typer.Option(..., "-o", "--output", help="Snapshot directory to create (must not exist or be empty)."),
    last: Optional[str] = typer.Option(None, "--last", help="Keep only this much of the most recent history (e.g. 10m, 1h)."),
) -> None:
    """Copy SESSION as it is now into SNAPSHOT: closed GIL segments, the one being written up to its
    last whole record, each JVM's recording (of a running one what JFR has flushed); SESSION records on."""
    from rich.console import Console

    from engine.clock.pair import clock_pair
    from engine.errors import TandemError
    from engine.record import keeper as keeping, session as sessions
    from engine.session import JVM_DIRS, PYTHON_DIRS, SESSION_JSON, read_json

    source = Path(session).expanduser().absolute()
    if not (source / SESSION_JSON).is_file():
        raise TandemError(f"{source}: not a tandem session (no {SESSION_JSON})")
    last_s = keeping.parse_duration(last, "--last") if last else None
    target = Path(output).expanduser().absolute()
    if target == source or source in target.parents:
        raise TandemError(f"{target}: the snapshot must be outside the session")
    sessions.keep_private()
    from engine.probe.private import private_directory

    private_directory(target, empty=True)
    console = Console(stderr=True)
    at_ns, at_wall_ns, _ = clock_pair()
    since_ns = at_ns - int(last_s * 1e9) if last_s is not None else None
    notes: list[str] = []
    for directory in sorted(source.glob(PYTHON_DIRS)):
        if directory.is_dir():
            _dump_python(directory, target / directory.name, since_ns, notes)
    for directory in sorted(source.glob(JVM_DIRS)):
        if directory.is_dir():
            _dump_jvm(directory, target / directory.name, last_s, notes)
    description = read_json(source / SESSION_JSON, strict=True)
    description["dump"] = {"of": str(source), "at_monotonic_ns": at_ns, "at_wall_ns": at_wall_ns, "last_s": last_s}
    sessions.write_description(target, description)
    for note in notes:
        console.print(f"tandem: {note}", highlight=False)
    console.print(f"tandem: snapshot of {source} in {target}", highlight=False)


def yield_to_the_service() -> None:
    """A dump is never urgent, the service always is: the lowest CPU priority and the idle I/O
    class, so the dump runs on what the service leaves."""
    import ctypes
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass
    number = {"x86_64": 251, "aarch64": 30}.get(os.uname().machine)  # ioprio_set: no wrapper in Python's os
    if number is not None:
        try:  # (IOPRIO_WHO_PROCESS, this process, IOPRIO_CLASS_IDLE << 13)
            ctypes.CDLL(None, use_errno=True).syscall(number, 1, 0, 3 << 13)
        except (OSError, AttributeError):
            pass


def _dump_python(source: Path, target: Path, since_ns: int | None, notes: list[str]) -> None:
    """One py-<pid>: its side files, its kept segments (from SINCE_NS on), or its events file."""
    from engine.ingest.segments import packed_span
    from engine.probe.private import private_directory
    from engine.session import GIL_CODES, GIL_EVENTS, PROBE_JSON, THREADS_JSONL, gil_segments

    private_directory(target)
    for name in (PROBE_JSON, THREADS_JSONL):
        _copy_whole(source / name, target / name)
    _copy_code_table(source / GIL_CODES, target / GIL_CODES)
    segments = gil_segments(source / GIL_EVENTS)
    if not segments:
        if (source / GIL_EVENTS).exists():
            _copy_records(source / GIL_EVENTS, target / GIL_EVENTS)
            if since_ns is not None:
                notes.append(f"{source.name}: recorded without --max-size/--max-age (one events file): --last keeps all of it")
        return
    kept = segments
    if since_ns is not None:
        # The newest segments whose events reach SINCE_NS, whole (segments continue one another).
        # Raw ones are the newest (the keeper packs a closed one within a round): kept, unread.
        first = next((i for i, s in enumerate(segments) if not s.packed or (packed_span(s.path)[1] or since_ns) >= since_ns),
                     len(segments) - 1)
        kept = segments[first:]
    for segment in kept:
        destination = target / segment.path.name
        try:
            if segment is segments[-1] and not segment.packed:
                _copy_records(segment.path, destination)  # (may be the one being written)
            else:
                _link_or_copy(segment.path, destination)  # closed: never written again
        except FileNotFoundError:  # rotated out or packed meanwhile
            packed = segment.path.with_name(segment.path.name + ".packed")
            if not segment.packed and packed.exists():
                _link_or_copy(packed, target / packed.name)


def _dump_jvm(source: Path, target: Path, last_s: float | None, notes: list[str]) -> None:
    """One jvm-<pid>/: its closed recording; of a running JVM, what JFR has flushed to its disk
    repository (its chunks, the one being written cut at its last flush and marked finished),
    never a command to the JVM: JFR.dump rotates the chunk at a safepoint, a stop the service
    would pay for. Under a flight recorder also the history the keeper holds (JFR's own
    repository then holds its last two chunks only)."""
    from engine.probe.private import private_directory
    from engine.session import JVM_JSON, RECORDING, REPOSITORY

    private_directory(target)
    _copy_whole(source / JVM_JSON, target / JVM_JSON)
    _dump_kept_chunks(source, target, last_s)
    if (source / RECORDING).exists():
        _link_or_copy(source / RECORDING, target / RECORDING)
        return
    if _copy_flushed_chunks(source / REPOSITORY, target / REPOSITORY, last_s) == 0 and not any(target.rglob("*.jfr*")):
        notes.append(f"{source.name}: JFR had flushed nothing to its repository yet: no JVM events in the snapshot")


def _copy_flushed_chunks(repository: Path, target: Path, last_s: float | None) -> int:
    """The repository's chunk files as they are on disk: a finished one linked (it never changes),
    the one being written copied up to its last flush and marked finished (engine.ingest.jfr
    reads such a copy as a closed chunk); those older than LAST_S left out. Returns how many."""
    import time

    from engine.clock.chunks import copy_chunks, scan_chunks
    from engine.errors import TandemError
    from engine.probe.private import private_directory

    if not repository.is_dir():
        return 0
    since = time.time() - last_s if last_s is not None else 0.0
    copied = 0
    for chunk in sorted(repository.rglob("*.jfr")):
        if _mtime(chunk) < since:
            continue
        destination = target / chunk.relative_to(repository)
        private_directory(destination.parent)
        try:
            scan = scan_chunks(chunk)
            if scan.unfinished is None:
                _link_or_copy(chunk, destination)
            elif scan.chunks:
                copy_chunks(chunk, scan.chunks, destination)
            else:
                continue  # (not flushed yet)
        except (FileNotFoundError, TandemError):
            continue  # JFR rotated it out meanwhile, or has not written its header yet
        copied += 1
    return copied


def _dump_kept_chunks(source: Path, target: Path, last_s: float | None) -> None:
    """A flight-recorded JVM's history outside JFR's own recording: the chunks the keeper packed
    and the finished ones the agent keeps links to, not packed yet (hard links: they never
    change), those that end within LAST_S when given (a chunk is packed, or its link's time
    set, after it ends). A chunk the snapshot's recording.jfr holds too is read once
    (engine.session.jvm_recordings)."""
    import time

    from engine.clock.chunks import FILE_STATE_FINISHED, FILE_STATE_OFFSET
    from engine.probe.private import private_directory
    from engine.session import KEPT_CHUNKS, PACKED_CHUNKS, PACKED_DICTIONARY, packed_chunks

    since = time.time() - last_s if last_s is not None else 0.0
    # links first: one packed meanwhile has left .chunks/ for packed/, listed after
    kept = [p for p in sorted((source / KEPT_CHUNKS).glob("*.jfr"))[:-1]  # (the newest: JFR's current chunk, from the repository)
            if _file_state(p, FILE_STATE_OFFSET) == FILE_STATE_FINISHED]
    dictionary = [source / PACKED_CHUNKS / PACKED_DICTIONARY] if (source / PACKED_CHUNKS / PACKED_DICTIONARY).exists() else []
    for kind, files in ((KEPT_CHUNKS, kept), (PACKED_CHUNKS, packed_chunks(source))):
        files = [p for p in files if _mtime(p) >= since]
        if files and kind == PACKED_CHUNKS:
            files += dictionary  # (the packed chunks are compressed with it)
        if files:
            private_directory(target / kind)
        for path in files:
            try:
                _link_or_copy(path, target / kind / path.name)
            except FileNotFoundError:
                pass  # packed meanwhile (then linked from packed/ below) or deleted by the keeper


def _file_state(path: Path, offset: int) -> int | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            state = f.read(1)
    except OSError:
        return None
    return state[0] if state else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _copy_whole(source: Path, target: Path) -> None:
    import shutil

    try:
        shutil.copyfile(source, target)
    except FileNotFoundError:
        pass


def _link_or_copy(source: Path, target: Path) -> None:
    """A file that no longer changes: a hard link (no copy, no I/O), else a copy."""
    import os
    import shutil

    try:
        os.link(source, target)
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise
        shutil.copyfile(source, target)


def _copy_records(source: Path, target: Path) -> None:
    """An events file that may be being written: its bytes up to the last whole record when looked at
    (docs/ring.md: a reader of a file not closed reads whole records only)."""
    import os

    from engine.ring.layout import GIL_RECORD_DTYPE, records_offset_of

    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(min(size, 1 << 16))
        offset = records_offset_of(head)
        if offset and size > offset:
            size = offset + (size - offset) // GIL_RECORD_DTYPE.itemsize * GIL_RECORD_DTYPE.itemsize
        f.seek(0)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            left = size
            while left > 0:
                chunk = f.read(min(left, _COPY_CHUNK))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)


# The code table's header (docs/ring.md, "Code table"): 64 bytes, `used` (u64) at byte 24.
# (engine.ingest.codes reads it too, but imports pandas: a dump stays light on the service's CPUs.)
_CODES_HEADER, _CODES_USED = 64, 24


def _copy_code_table(source: Path, target: Path) -> None:
    """The code table up to its committed entries (the file is a sparse 16 MiB mapping)."""
    try:
        with open(source, "rb") as f:
            header = f.read(_CODES_HEADER)
            if len(header) < _CODES_HEADER:
                return
            used = int.from_bytes(header[_CODES_USED:_CODES_USED + 8], "little")
            data = header + f.read(min(used, 1 << 30))
    except FileNotFoundError:
        return
    target.write_bytes(data)


def register(app: typer.Typer) -> None:
    app.command("dump")(dump)
