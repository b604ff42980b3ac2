"""JFR recordings to one table of JVM stop-the-world intervals (schema: docs/pauses.md).

Per file: the chunk headers are read here (engine.clock.chunks) to refuse what jdk.jfr
cannot read and to find the complete chunks; each JVM run of the file is read by the Java
class `tandem.ingest.PauseReader`, which returns whole columns; ticks are then put on
CLOCK_MONOTONIC (or the wall clock) by engine.clock.align.
"""
from __future__ import annotations

import concurrent.futures
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from engine import jvm
from engine.clock import align
from engine.clock.chunks import Chunk, ChunkScan, copy_chunks, scan_chunks, split_runs
from engine.errors import TandemError, TandemWarning
from engine.ingest import jfr_chunks, jfr_input
from engine.session import JVM_JSON, SESSION_JSON, current_boot_id, jvm_directory_of, process_alive, read_json


# The JFR event types each kind comes from (for witnesses such as `jfr print --events`).
PAUSE_EVENT_TYPES = (
    "jdk.SafepointBegin", "jdk.SafepointEnd", "jdk.ExecuteVMOperation", "jdk.GCPhasePause",
    "jdk.GarbageCollection", "jdk.Compilation", "jdk.Deoptimization",
)
SCHEMA = "tandem.pauses"
SCHEMA_VERSION = 1
# Files above this size get a progress bar (when the caller asks for progress).
PROGRESS_MIN_BYTES = 16 << 20

_JAVA_NULL = np.iinfo(np.int64).min


def read_pauses(
    paths: str | Path | Iterable[str | Path], *, progress=None, jvm_options: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Reads one or more JFR recordings into one table of pause intervals.

    Returns a DataFrame with the columns of docs/pauses.md, sorted by `start_ns`, and
    `df.attrs` holding the metadata (sources, JVMs, clock domain, method, offset, error).
    `progress`: a rich Console to draw a progress bar on for large files, or None.
    `jvm_options`: JVM flags, used only if this call is the one that starts the JVM.
    Raises TandemError for files that cannot be read; warns (TandemWarning) when a
    truncated file lost data.
    """
    path_list = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not path_list:
        raise TandemError("no recording given")
    try:
        return _read_named(path_list, progress, jvm_options)
    except FileNotFoundError as err:  # (there when listed, removed while read: a JVM's exit moves its chunks)
        raise TandemError(f"{err.filename}: removed while it was being read") from None


def _read_named(path_list: list[Path], progress, jvm_options: tuple[str, ...]) -> pd.DataFrame:
    """read_pauses of PATH_LIST, gzip inside or not (what is said names the user's files)."""
    with jfr_input.readable_recordings(path_list) as (readable, named):
        if readable == path_list:
            return _read_pauses(readable, progress, jvm_options)
        # gzip inside: read the decompressed copies, name the user's files in what we say
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                table = _read_pauses(readable, progress, jvm_options)
        except TandemError as err:
            raise TandemError(named(str(err))) from None
        finally:
            for warning in caught:
                warnings.warn(named(str(warning.message)), warning.category, stacklevel=2)
        table["source"] = table["source"].map(named).astype("string")
        table.attrs = jfr_input.named_everywhere(table.attrs, named)
        return table


def _read_pauses(path_list: list[Path], progress, jvm_options: tuple[str, ...]) -> pd.DataFrame:
    scans = [scan_chunks(p) for p in path_list]  # refuse bad files before starting the JVM
    for scan in scans:
        if scan.unfinished is not None:
            warnings.warn(_unfinished_message(scan), TandemWarning, stacklevel=3)
        elif scan.lost_bytes:
            warnings.warn(_lost_message(scan), TandemWarning, stacklevel=3)

    parts, sources = [], []
    with _Progress(progress, sum(s.complete_bytes for s in scans)) as bar:
        for scan in scans:
            file_parts, source_meta = _read_file(scan, bar, jvm_options)
            parts.extend(file_parts)
            sources.append(source_meta)

    metadata = _table_metadata(sources)  # refuses mixed clock domains before building anything
    table = _build_table(parts)  # (every file gave a part, or _read_file refused it)
    table.attrs = metadata
    return table


def _lost_message(scan: ChunkScan) -> str:
    return (
        f"{scan.path}: truncated or unfinished recording: chunk {len(scan.chunks)} (from byte {scan.complete_bytes}) "
        f"is not complete: the last {scan.lost_bytes} of {scan.file_size} bytes ({100 * scan.lost_bytes / scan.file_size:.1f}%) "
        f"were skipped, pause events in them not countable; {len(scan.chunks)} complete chunk(s) read"
    )


def _unfinished_message(scan: ChunkScan) -> str:
    chunk = scan.unfinished
    tail = (
        f"the {scan.lost_bytes} bytes written after that flush ({100 * scan.lost_bytes / scan.file_size:.1f}% of the file)"
        if scan.lost_bytes else "nothing on disk after that flush"
    )
    earlier = f"; {len(scan.chunks) - 1} earlier finished chunk(s) read too" if len(scan.chunks) > 1 else ""
    recovered = f"recovered {chunk.size} bytes, {chunk.duration_nanos / 1e9:.1f} s of events up to that flush"
    lost = unflushed(scan)
    if lost is not None and lost["window_ns"] is not None:
        return f"{scan.path}: unfinished chunk: {lost['line']}; {recovered}; lost {tail}{earlier}"
    clock = _utc(chunk.start_nanos + chunk.duration_nanos)
    return (
        f"{scan.path}: unfinished chunk (the JVM was killed or is still recording): {recovered} ({clock}); "
        f"lost {tail} and whatever the JVM had not flushed yet (JFR flushes about once a second){earlier}"
    )


def _utc(wall_ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(wall_ns // 1_000_000_000)) + f".{wall_ns // 1_000_000 % 1000:03d} UTC"


def unflushed(scan: ChunkScan) -> dict | None:
    """The window a JVM that ended without closing its recording lost (docs/pauses.md,
    "Unflushed"): from its last JFR flush (the unfinished chunk's end) to its process's end,
    when that end is known; None when every chunk is finished or the JVM still runs.

    Without DestroyJavaVM (a JNI host such as jpy exiting, os._exit under JPype, SIGKILL) no
    shutdown hook runs and JFR's buffers are never written: the JVM's pauses after its last
    flush are not in the session. SESSION/session.json's end (docs/session.md) bounds when
    the process ended only if the JVM is the command's own process (a child JVM could
    outlive the command)."""
    chunk = scan.unfinished
    if chunk is None:
        return None
    jvm_json, jvm_dir = _agent_description(scan.path), jvm_directory_of(scan.path)
    pid = jvm_json.get("pid")
    session = read_json(jvm_dir.parent / SESSION_JSON) if jvm_dir is not None else {}
    end_wall, end_mono = session.get("end_wall_ns"), session.get("end_monotonic_ns")
    flushed_to = chunk.start_nanos + chunk.duration_nanos
    ended = pid is not None and session.get("pid") == pid and isinstance(end_wall, int) and end_wall >= flushed_to
    if not ended and (pid is None or process_alive(pid)) and jvm_json.get("boot_id") in (None, current_boot_id()):
        return None  # (still recording: its pauses are yet to be flushed, not lost)
    window = end_wall - flushed_to if ended else None
    if window is not None:
        line = (f"JVM pid {pid}: its host exited without shutting the JVM down; pauses after {_utc(flushed_to)} "
                f"(the last JFR flush) are not in the session (window {window / 1e6:.0f} ms)")
    else:
        line = (f"JVM pid {pid}: it ended without shutting down; pauses after {_utc(flushed_to)} (the last JFR "
                f"flush) are not in the session (window unknown: its end was not recorded)")
    return {
        "jvm_pid": pid,
        "last_flush_wall_ns": int(flushed_to),
        # the same instant on the session's CLOCK_MONOTONIC (through its end's wall/monotonic pair)
        "last_flush_ns": int(end_mono - window) if window is not None and isinstance(end_mono, int) else None,
        "end_wall_ns": int(end_wall) if ended else None,
        "window_ns": None if window is None else int(window),
        "line": line,
    }


# ---------------------------------------------------------------- one file


def _read_file(scan: ChunkScan, bar: "_Progress", jvm_options: tuple[str, ...]) -> tuple[list[dict], dict]:
    runs = split_runs(scan.chunks)
    jvm_json = _agent_description(scan.path)
    frames, run_meta, damages = [], [], []
    watched = _reader_event_types(jvm_options)
    # The structural walk runs on a thread of its own while jdk.jfr reads (in the JVM): its
    # counts are needed only once a run has been read.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tandem-jfr-walk") as pool:
        walking = pool.submit(lambda: {w.chunk.index: w for w in jfr_chunks.walk_chunks(scan.path, scan.chunks, watched)})
        for run in runs:
            pieces, damage = _read_run(scan, run, walking, watched, bar, jvm_options)
            damages.extend(damage)
            for piece, reader in pieces:
                frame, meta = _run_columns(scan, piece, reader, jvm_json)
                frames.append(frame)
                run_meta.append(meta)
        walks = walking.result()
    unreadable = [m for m in run_meta if m["unreadable_events"]]  # (damage inside events, which the walk cannot see)
    if damages:
        warnings.warn(jfr_chunks.damage_message(scan.path, damages, len(scan.chunks)), TandemWarning, stacklevel=4)
    elif run_meta and not unreadable and not any(len(frame["source"][0]) for frame in frames):
        # Intact chunks (the walk found nothing jdk.jfr missed) holding no pause event: the
        # settings it was recorded with left them out; not damage.
        warnings.warn(_no_pauses_message(scan.path, walks.values()), TandemWarning, stacklevel=4)
    if unreadable:
        warnings.warn(f"{scan.path}: damaged recording: {sum(m['unreadable_events'] for m in unreadable)} event(s) "
                      f"whose fields could not be read were skipped (first: {unreadable[0]['first_unreadable']})",
                      TandemWarning, stacklevel=4)
    if not run_meta:
        raise TandemError(f"{scan.path}: jdk.jfr cannot read any chunk of this recording: "
                          + "; ".join(d.describe() for d in damages))
    source = {
        "source": str(scan.path),
        "jfr_format": scan.format_version,
        "file_bytes": scan.file_size,
        "chunks": len(scan.chunks),
        "lost_bytes": scan.lost_bytes,
        "damage": [d.as_metadata() for d in damages],
        "damaged_bytes": sum(d.lost_bytes for d in damages),
        "lost_pause_events": _lost_pause_events(damages),
        "unflushed": unflushed(scan),
        "runs": run_meta,
    }
    return frames, source


def _no_pauses_message(path: Path, walks) -> str:
    """Which pause event types a recording without any lacks, and why that is settings."""
    declared = {name for walk in walks for name in walk.type_ids}
    off = [t for t in PAUSE_EVENT_TYPES if t in declared]
    unknown = [t for t in PAUSE_EVENT_TYPES if t not in declared]
    parts = []
    if off:
        parts.append(f"{', '.join(off)} known to this JVM but not recorded")
    if unknown:
        parts.append(f"{', '.join(unknown)} not known to the JVM that wrote it")
    return (f"{path}: no pause events ({'; '.join(parts)}): recorded with settings that disabled them, the file is "
            "not damaged; record with `tandem record`, or with the settings in docs/pauses.md (\"Settings\")")


def _lost_pause_events(damages: list) -> int | None:
    """Pause events lost in damaged chunks; None when some loss could not be counted."""
    counts = [d.lost_pause_events for d in damages]
    return None if None in counts else sum(counts)


def _read_run(scan: ChunkScan, run: list[Chunk], walking: concurrent.futures.Future, watched: tuple[str, ...],
              bar: "_Progress", jvm_options: tuple[str, ...]) -> tuple[list, list]:
    """Reads one JVM run: [(chunks, reader)] and the damage found (jfr_chunks.Damage list).

    The run is read whole; when jdk.jfr delivers fewer events than the structural walk saw
    (or cannot read it), each chunk is read alone, so one damaged chunk costs only itself
    and the loss is placed in its chunk. `walking`: the walk of every chunk, by index."""
    try:
        reader = _read_chunks(scan, run, bar, jvm_options)
    except TandemError as err:
        reader, whole_error = None, err
    walks = walking.result()
    walked = sum(len(walks[c.index].event_types) for c in run)
    if reader is not None and int(reader.eventsSeen()) >= walked and all(walks[c.index].metadata_readable for c in run):
        damage = [jfr_chunks.chunk_damage(walks[c.index], len(walks[c.index].event_types), watched, PAUSE_EVENT_TYPES)
                  for c in run]
        return [(run, reader)], [d for d in damage if d is not None]
    if reader is None and len(run) == 1 and not isinstance(whole_error, _JdkJfrError):
        raise whole_error  # a timeout, not damage
    pieces, damage = [], []
    quiet = _Progress(None, 0)
    for chunk in run:
        walk = walks[chunk.index]
        try:
            alone = reader if len(run) == 1 else _read_chunks(scan, [chunk], quiet, jvm_options)
            error = None if alone is not None else whole_error.reason
        except _JdkJfrError as err:
            alone, error = None, err.reason
        delivered = None if alone is None else int(alone.eventsSeen())
        found = jfr_chunks.chunk_damage(walk, delivered, watched, PAUSE_EVENT_TYPES, error)
        if found is not None:
            damage.append(found)
        if alone is not None and walk.metadata_readable:  # else what jdk.jfr made of it cannot be checked
            pieces.append(([chunk], alone))
    return pieces, damage


def _read_chunks(scan: ChunkScan, run: list[Chunk], bar: "_Progress", jvm_options: tuple[str, ...]):
    if len(scan.chunks) == len(run) and scan.lost_bytes == 0 and scan.unfinished is None:
        return _run_java_reader(scan.path, scan.path, run, bar, jvm_options)
    # jdk.jfr reads a path, not a byte range: hand it a copy of these chunks (only for
    # truncated, unfinished or damaged files and files holding several JVM runs), an
    # unfinished chunk cut at its last flush and marked finished.
    with tempfile.TemporaryDirectory(prefix="tandem-ingest-") as tmpdir:
        copy = copy_chunks(scan.path, run, Path(tmpdir) / f"run{run[0].index}.jfr")
        return _run_java_reader(scan.path, copy, run, bar, jvm_options)


def _reader_event_types(jvm_options: tuple[str, ...]) -> tuple[str, ...]:
    """The event types PauseReader subscribes to: the ones whose delivery the walk checks."""
    jpype = jvm.start_jvm(extra_options=jvm_options)
    return tuple(str(t) for t in jpype.JClass("tandem.ingest.PauseReader").EVENT_TYPES)


def _agent_description(path: Path) -> dict:
    """The tandem agent's jvm.json for this recording (docs/session.md), if any.

    It sits beside `recording.jfr`, or, for a chunk of the JVM's disk repository (all that
    survives a SIGKILL), beside the `repository/` folder that holds the chunk.
    """
    for folder in (path.parent, jvm_directory_of(path)):
        description = read_json(folder / JVM_JSON) if folder is not None else {}
        if description:
            return description
    return {}


class _JdkJfrError(TandemError):
    """jdk.jfr threw while reading (damage), as opposed to the reading guard's timeout."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# The reading guard: far above jdk.jfr's real speed (tens of MB/s on the pause types alone,
# the notes on reading speed), so only a reader that waits for data ever reaches it.
READ_TIMEOUT_BASE_S = 120.0
READ_TIMEOUT_MIN_BYTES_PER_S = 1 << 20


def _read_timeout_s(size: int) -> float:
    return READ_TIMEOUT_BASE_S + size / READ_TIMEOUT_MIN_BYTES_PER_S


def _run_java_reader(path: Path, java_path: Path, run: list[Chunk], bar: "_Progress", jvm_options: tuple[str, ...] = ()):
    """Runs tandem.ingest.PauseReader on `java_path`, converting Java exceptions to TandemError."""
    jpype = jvm.start_jvm(extra_options=jvm_options)
    reader = jpype.JClass("tandem.ingest.PauseReader")()
    # Every chunk of a run has the same ticks per second (split_runs); with it the reader
    # reads tick timespans without jdk.jfr's slow getDuration when that changes nothing.
    reader.setTicksPerSecond(run[0].ticks_per_second)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            reader.readFile(str(java_path))
        except BaseException as err:  # re-raised in the calling thread
            failure.append(err)
        finally:
            # JPype attached this thread to the JVM and never detaches it by itself: without
            # this the JVM keeps a Java thread per read (tandem live re-reads every 5 s).
            jpype.java.lang.Thread.detach()

    size = run[-1].offset + run[-1].size - run[0].offset
    # JPype releases the GIL inside Java, so this thread can draw progress and watch the
    # clock meanwhile: jdk.jfr waits forever on a chunk it believes is still being written,
    # and ingest must never hang (it only hands jdk.jfr finished chunks; this is the guard).
    worker = threading.Thread(target=work, name="tandem-jfr-reader", daemon=True)
    worker.start()
    deadline = time.monotonic() + _read_timeout_s(size)
    first, last = run[0].start_ticks, run[-1].end_ticks
    while worker.is_alive():
        worker.join(0.1)
        if bar.enabled:
            seen = int(reader.progressTicks)
            if seen != _JAVA_NULL and last > first:
                bar.set_fraction(size, min(1.0, max(0.0, (seen - first) / (last - first))))
        if worker.is_alive() and time.monotonic() > deadline:
            reader.abort()
            worker.join(5)
            raise TandemError(
                f"{path}: jdk.jfr did not finish reading {size} bytes in {_read_timeout_s(size):.0f} s "
                "(waiting for data that a live JVM has not written yet?); reading was stopped"
            )
    if bar.enabled:
        bar.done(size)
    if failure:
        err = failure[0]
        if isinstance(err, jpype.JException):
            message = str(err.getMessage() or err.getClass().getSimpleName())
            raise _JdkJfrError(f"{path}: jdk.jfr cannot read this recording: {message}", message) from None
        raise err
    return reader


# ---------------------------------------------------------------- Java columns to a DataFrame

# Columns in table order (docs/pauses.md); how each is built from the reader's arrays.
_STRING_COLUMNS = ("kind", "name", "cause", "system_gc_frames", "operation", "collector", "compiler", "source")
_NULLABLE_INT_COLUMNS = (
    "safepoint_id", "gc_id", "os_thread_id", "requester_os_thread_id", "system_gc_os_thread_id", "jvm_pid",
    "time_to_safepoint_ns", "total_threads", "jni_critical_threads", "sum_of_pauses_ns", "longest_pause_ns",
)
_COLUMNS = (
    "pause_id", "kind", "name", "start_ns", "end_ns", "duration_ns", "safepoint_id", "gc_id", "cause",
    "os_thread_id", "requester_os_thread_id", "system_gc_os_thread_id", "system_gc_frames", "jvm_pid", "time_to_safepoint_ns",
    "operation", "collector", "compiler", "total_threads", "jni_critical_threads", "sum_of_pauses_ns", "longest_pause_ns",
    "unmatched", "at_safepoint", "asked_by_tandem", "chunk", "source",
)


def _run_columns(scan: ChunkScan, run: list[Chunk], reader, jvm_json: dict) -> tuple[dict, dict]:
    """One run's rows as plain numpy arrays (made into the table once, by _build_table).

    String columns are (int32 codes, dictionary) pairs, code -1 is null; nullable integer
    columns hold Java's null (Long.MIN_VALUE); `at_safepoint` is -1/0/1.
    """
    tps = run[0].ticks_per_second
    os_name = _os_name(_jstr(reader.osVersion()) or _jstr(reader.jvmVersion()))
    boot_id = current_boot_id()
    same_boot = None if not (jvm_json.get("boot_id") and boot_id) else jvm_json["boot_id"] == boot_id
    alignment = align.choose_alignment(
        run,
        os_name=os_name,
        fast_time=int(reader.fastTimeEnabled()),
        sync_ticks=_longs(reader.syncTicks()),
        sync_mono=_longs(reader.syncMonotonicNanos()),
        sync_span=_longs(reader.syncSpanTicks()),
        same_boot=same_boot,
    )
    pid = int(reader.jvmPid())
    if pid == _JAVA_NULL:
        pid = jvm_json.get("pid")

    n = int(reader.size())
    dictionary = [str(s) for s in reader.dictionary()]
    start_ticks = _longs(reader.startTicks())
    duration_ns = align.tickspan_to_ns(_longs(reader.endTicks()) - start_ticks, tps)
    start_ns = align.ticks_to_domain_ns(start_ticks, run, alignment)
    ttsp_ticks = _longs(reader.timeToSafepointTicks())
    ttsp = np.where(ttsp_ticks == _JAVA_NULL, _JAVA_NULL, align.tickspan_to_ns(np.where(ttsp_ticks == _JAVA_NULL, 0, ttsp_ticks), tps))
    first_index = run[0].index
    requester = _longs(reader.requesterOsThreadId())

    columns = {
        "kind": (_ints(reader.kind()), [str(name) for name in reader.KINDS]),  # (tandem.jfr.PauseKinds)
        "name": (_ints(reader.name()), dictionary),
        "start_ns": start_ns,
        "end_ns": start_ns + duration_ns,
        "duration_ns": duration_ns,
        "safepoint_id": _longs(reader.safepointId()),
        "gc_id": _longs(reader.gcId()),
        "cause": (_ints(reader.cause()), dictionary),
        "os_thread_id": _longs(reader.osThreadId()),
        "requester_os_thread_id": requester,
        "system_gc_os_thread_id": _longs(reader.systemGcOsThreadId()),
        "system_gc_frames": (_ints(reader.systemGcFrames()), dictionary),
        "jvm_pid": np.full(n, _JAVA_NULL if pid is None else int(pid), dtype=np.int64),
        "time_to_safepoint_ns": ttsp,
        "operation": (_ints(reader.operation()), dictionary),
        "collector": (_ints(reader.collector()), dictionary),
        "compiler": (_ints(reader.compiler()), dictionary),
        "total_threads": _longs(reader.totalThreads()),
        "jni_critical_threads": _longs(reader.jniCriticalThreads()),
        "sum_of_pauses_ns": _longs(reader.sumOfPausesNanos()),
        "longest_pause_ns": _longs(reader.longestPauseNanos()),
        "unmatched": _ints(reader.unmatched()).astype(bool),
        "at_safepoint": _ints(reader.atSafepoint()),
        "asked_by_tandem": _asked_by_tandem(requester, start_ns, alignment, jvm_json),
        "chunk": (first_index + align.chunk_of_ticks(start_ticks, run)).astype(np.int32),
        "source": (np.zeros(n, np.int32), [str(scan.path)]),
    }
    young, old = _jstr(reader.youngCollector()), _jstr(reader.oldCollector())
    meta = {
        "chunks": [first_index, run[-1].index],
        "jvm_name": _jstr(reader.jvmName()) or jvm_json.get("vm_name"),
        "jvm_version": _jstr(reader.jvmVersion()) or jvm_json.get("vm_version"),
        "jvm_vendor": _jstr(reader.jvmVendor()) or jvm_json.get("java_vendor"),
        "jvm_pid": pid,
        "os": os_name,
        "collector": "/".join(c for c in (young, old) if c) or None,
        "ticks_per_second": tps,
        "fast_time": {1: True, 0: False}.get(int(reader.fastTimeEnabled())),
        "orphan_safepoint_ends": int(reader.orphanSafepointEnds()),
        "events_seen": int(reader.eventsSeen()),
        "unreadable_events": int(reader.unreadableEvents()),
        "first_unreadable": _jstr(reader.firstUnreadable()),
        "clock": alignment.as_metadata(),
    }
    return columns, meta


def _asked_by_tandem(requester: np.ndarray, start_ns: np.ndarray, alignment, jvm_json: dict) -> np.ndarray:
    """Per event: asked for by the tandem agent as it started its recording (JFR's own VM
    operations, run for the thread that runs the agent: with -javaagent in JPype or jpy, a
    Python thread), known by that thread and window in jvm.json; on the monotonic clock only."""
    tid, first, last = (jvm_json.get(f"agent_start_{key}") for key in ("os_thread_id", "from_monotonic_ns", "to_monotonic_ns"))
    if tid is None or first is None or last is None or alignment.domain != "monotonic":
        return np.zeros(start_ns.size, bool)
    return (requester == int(tid)) & (start_ns >= int(first)) & (start_ns <= int(last))


def _build_table(parts: list[dict]) -> pd.DataFrame:
    """The table from the runs' columns: concatenated, sorted by (start_ns, end_ns), stable.

    Sorting happens on the numpy arrays (one lexsort, then a take per column) and strings
    are decoded from their codes only after that, straight into Arrow: no pandas sort, no
    Python string per row.
    """
    def joined(name: str) -> np.ndarray:
        arrays = [part[name] for part in parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    start_ns, end_ns = joined("start_ns"), joined("end_ns")
    order = np.lexsort((end_ns, start_ns))  # stable: ties keep read order, as before
    n = len(order)
    data: dict = {}
    for name in _COLUMNS:
        if name == "pause_id":
            data[name] = np.arange(n, dtype=np.int64)
        elif name in _STRING_COLUMNS:
            codes, dictionary = _merged_codes([part[name] for part in parts])
            data[name] = _strings(dictionary, codes[order])
        elif name in _NULLABLE_INT_COLUMNS:
            data[name] = _nullable(joined(name)[order])
        elif name == "at_safepoint":
            values = joined(name)[order]
            data[name] = pd.arrays.BooleanArray(values == 1, mask=values < 0)
        else:
            data[name] = joined(name)[order]
    return pd.DataFrame(data, copy=False)


def _merged_codes(columns: list[tuple[np.ndarray, list[str]]]) -> tuple[np.ndarray, list[str]]:
    """One (codes, dictionary) pair from the runs' pairs (dictionaries appended, codes shifted)."""
    if len(columns) == 1:
        return columns[0]
    all_codes, dictionary = [], []
    for codes, values in columns:
        all_codes.append(np.where(codes < 0, -1, codes + len(dictionary)).astype(np.int32))
        dictionary.extend(values)
    return np.concatenate(all_codes), dictionary


def _longs(java_array) -> np.ndarray:
    # JPype exposes Java primitive arrays through the buffer protocol: one bulk copy out of
    # the Java heap (JNI Get<Type>ArrayElements), which numpy then views without copying.
    return np.asarray(java_array, dtype=np.int64)


def _ints(java_array) -> np.ndarray:
    return np.asarray(java_array, dtype=np.int32)


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64), mask=values == _JAVA_NULL)


def _strings(dictionary, codes: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """A pandas `string` column from int codes into `dictionary` (-1 is null), decoded in Arrow."""
    import pyarrow as pa

    indices = pa.array(codes, type=pa.int32(), mask=codes < 0)
    # large_string: what pandas' "string" dtype holds anyway (saves it a cast per column).
    return pd.array(pa.array(dictionary, pa.large_string()).take(indices), dtype="string")


def _jstr(value) -> str | None:
    return None if value is None else str(value)


def _os_name(os_version: str | None) -> str | None:
    if not os_version:
        return None
    # jdk.OSInformation ("uname: Linux ...", "OS: Windows 10 ..."), or else the JVM's own
    # version string ("... for linux-amd64 JRE ...").
    text = os_version.lower()
    for needle, name in (("windows", "windows"), ("mac os", "macos"), ("darwin", "macos"), ("bsd-", "macos"),
                         ("linux", "linux")):
        if needle in text:
            return name
    return None


# ---------------------------------------------------------------- metadata


def _table_metadata(sources: list[dict]) -> dict:
    runs = [run for source in sources for run in source["runs"]]
    domains = sorted({run["clock"]["domain"] for run in runs})
    if len(domains) > 1:
        detail = "; ".join(
            f"{s['source']} is {run['clock']['domain']} ({run['clock']['method']})" for s in sources for run in s["runs"]
        )
        raise TandemError(f"cannot put these recordings on one clock: {detail}; read them separately")

    def joined(values) -> str | None:
        unique = list(dict.fromkeys(str(v) for v in values if v is not None))
        return ", ".join(unique) if unique else None

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "clock_domain": domains[0] if domains else None,
        "source": joined(s["source"] for s in sources),
        "jfr_format": joined(s["jfr_format"] for s in sources),
        "jvm_version": joined(r["jvm_version"] for r in runs),
        "jvm_vendor": joined(r["jvm_vendor"] for r in runs),
        "collector": joined(r["collector"] for r in runs),
        "clock_method": joined(r["clock"]["method"] for r in runs),
        "sources": sources,
    }


# ---------------------------------------------------------------- progress


class _Progress:
    """A rich progress bar over the bytes of all files, drawn only when asked and worth it."""

    def __init__(self, console, total_bytes: int):
        self.enabled = console is not None and total_bytes >= PROGRESS_MIN_BYTES
        self._console = console
        self._total = total_bytes
        self._done = 0

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("reading JFR"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                                 console=self._console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("jfr", total=self._total)
        return self

    def set_fraction(self, run_bytes: int, fraction: float) -> None:
        self._bar.update(self._task, completed=self._done + int(run_bytes * fraction))

    def done(self, run_bytes: int) -> None:
        self._done += run_bytes
        self._bar.update(self._task, completed=self._done)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.stop()
