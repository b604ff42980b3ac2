"""The CPython GIL probe: every GIL hand-over of every thread, on CLOCK_MONOTONIC.

    import engine.probe
    engine.probe.start("run.gil")     # events -> run.gil, live ring -> run.gil.ring,
    ...                               # description -> run.gil.json
    engine.probe.stop()

Standard library only: this module is imported inside interpreters that have none of
tandem's dependencies (the `.pth` start hook, `python -m engine.probe`, Jep).
The native part is `engine.probe._probe` (module.c); backends are described in docs/probe.md.

Every interpreter of a session imports this module as it starts, so it imports only what
site has loaded already, plus threading and the extension: no json, pathlib, typing or
sysconfig (json and pathlib import re; together they cost a start ~20 ms; docs/probe.md,
"Start hooks").
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

from engine.errors import TandemError

__all__ = ["start", "stop", "status", "backend", "start_session", "check_gil_present", "BACKENDS"]

BACKENDS = ("auto", "precise", "exported", "sampling")

# Where the current recording's description goes (rewritten at stop with final counters).
_meta_path: str | None = None
_session_dir: str | None = None
_start_options: dict[str, object] = {}
# tid -> thread name, for every thread started through `threading` while recording.
_thread_names: dict[int, str] = {}
_names_lock = threading.Lock()
_meta_lock = threading.Lock()
_original_set_native_id = None


_JSON_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_string(text: str) -> str:
    """TEXT as a JSON string literal, ASCII only, as json.dumps writes it."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    out = []
    for char in text:
        code = ord(char)
        if char in _JSON_SHORT_ESCAPES:
            out.append(_JSON_SHORT_ESCAPES[char])
        elif " " <= char < "\x7f":
            out.append(char)
        elif code < 0x10000:
            out.append("\\u%04x" % code)
        else:  # beyond the BMP: a surrogate pair
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | code >> 10, 0xDC00 | code & 0x3FF))
    return '"' + "".join(out) + '"'


def _json(value: object) -> str:
    """VALUE (dicts, lists, str, int, float, bool, None) as JSON text: the side files are
    written without the json module, whose import (it imports re) would cost every start."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, dict):
        return "{" + ", ".join(_json_string(str(k)) + ": " + _json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not written as JSON here")


def check_gil_present(gil_disabled_config: object, is_gil_enabled: object) -> None:
    """Raise TandemError when there is no GIL to watch.

    `gil_disabled_config` is `sysconfig.get_config_var("Py_GIL_DISABLED")` (1 on a
    free-threaded build), `is_gil_enabled` is `sys._is_gil_enabled` where it exists (a
    free-threaded build may still run with the GIL, e.g. PYTHON_GIL=1, but the probe is
    not built for that layout either).
    """
    if gil_disabled_config:
        enabled = is_gil_enabled() if is_gil_enabled is not None else False
        state = "enabled at run time, but this build's GIL is not the one the probe knows" if enabled else "disabled"
        raise TandemError(f"no GIL to watch: this is a free-threaded build of CPython (GIL {state})")


def _native():
    # A free-threaded build's ABI flags hold "t" (sysconfig's Py_GIL_DISABLED, without
    # importing sysconfig).
    check_gil_present("t" in getattr(sys, "abiflags", ""), getattr(sys, "_is_gil_enabled", None))
    try:
        from engine.probe import _probe
    except ImportError as err:
        raise TandemError(
            f"the GIL probe is not built for Python {sys.version.split()[0]} ({err}); "
            "run `make build`, or engine.probe.build.build_probe(python) for another interpreter"
        ) from None
    return _probe


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# tid -> name is also appended, one JSON line per new or renamed thread, to a side file
# (threads.jsonl / FILE.threads.jsonl) as threads start, so a process that never reaches
# stop() (SIGKILL, os._exit, a JVM embedding Python with Jep that exits without finalizing
# it) still leaves the names. One small O_APPEND write per thread start.
_names_path: str | None = None


def _record_thread_name(thread: threading.Thread) -> None:
    """Remember tid -> name, and append it to the side file when new or changed."""
    # After a fork the child's thread object keeps the parent's native_id (threading's
    # _after_fork resets only its ident): the running thread's own id is the true one.
    tid = threading.get_native_id() if thread.ident == threading.get_ident() else thread.native_id
    with _names_lock:
        if tid is None or _thread_names.get(tid) == thread.name:
            return
        _thread_names[tid] = thread.name
        path = _names_path
    if path is not None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, (_json({"tid": tid, "name": thread.name}) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:  # a thread start must never fail because of the probe
            pass


def _watch_thread_names() -> None:
    """Record tid -> name of the threads alive now and of every thread started from now on
    through `threading` (its _set_native_id runs in the new thread before its target)."""
    global _original_set_native_id
    if _original_set_native_id is None and hasattr(threading.Thread, "_set_native_id"):
        original = threading.Thread._set_native_id

        def _set_native_id(self):
            original(self)
            _record_thread_name(self)

        _original_set_native_id = original
        threading.Thread._set_native_id = _set_native_id
    for thread in threading.enumerate():
        _record_thread_name(thread)


def _write_meta(state: str, status: dict, final: bool = False) -> None:
    """Write the description (probe.json / FILE.json); FINAL: the last write of a recording."""
    global _meta_path
    for thread in threading.enumerate():  # names may have changed since start
        _record_thread_name(thread)
    with _names_lock:
        names = {str(tid): name for tid, name in _thread_names.items()}
    with _meta_lock:  # thread starts and stop() may write at the same time
        if _meta_path is None:  # stopped meanwhile: the closed description stays
            return
        meta = {
            "pid": os.getpid(),
            "python_version": sys.version.split()[0],
            "python_executable": sys.executable,
            "backend": status.get("backend"),
            "method": status.get("method"),  # precise: "got" (the GIL's mutexes) or "inline" (patched functions)
            "method_reason": status.get("method_reason", ""),  # why inline, not got
            "misses": status.get("misses"),
            # GOT method: sub-interpreters' own GILs known now / learned / not kept (docs/probe.md)
            "own_gils": status.get("own_gils"),
            "fallback_reasons": status.get("fallback_reasons", ""),
            "clock": status.get("clock"),                # stamp clock: "tsc" or "clock_gettime"
            "clock_reason": status.get("clock_reason", ""),  # why not tsc
            "boot_id": _boot_id(),
            "ring_path": status.get("ring_path"),
            "events_path": status.get("events_path"),
            "state": state,
            "events": status.get("events"),
            "ring": status.get("ring", {}),
            "thread_names": names,
        }
        tmp = f"{_meta_path}.{threading.get_native_id()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_json(meta))
        os.replace(tmp, _meta_path)
        if final:
            _meta_path = None


def _start_files(ring: str, events: str, meta: str, names: str, codes: str, record_code: bool = True, **options: object) -> dict:
    global _meta_path, _names_path
    probe = _native()
    for path in (ring, events, names, codes):
        try:  # the ring creates them exclusively (O_EXCL); starting again overwrites
            os.unlink(path)
        except FileNotFoundError:
            pass
    try:
        status = probe.start(ring, events, codes_path=codes if record_code else None, **options)
    except probe.ProbeError as err:
        raise TandemError(str(err)) from None
    _meta_path = meta
    with _names_lock:
        _thread_names.clear()  # written again below, into this recording's side file
        _names_path = names
    _watch_thread_names()
    _write_meta("recording", status)
    atexit.register(stop)
    _stop_at_os_exit()
    return status


_original_os_exit = None


def _stop_at_os_exit() -> None:
    """os._exit skips atexit: a multiprocessing fork worker ends with it, as do servers'
    forked children. Stop first there too, so the events file is closed and probe.json
    counts every event."""
    global _original_os_exit
    if _original_os_exit is not None:
        return
    original = _original_os_exit = os._exit

    def _exit(status):
        try:
            stop()
        except BaseException:  # exiting must never fail because of the probe
            pass
        original(status)

    os._exit = _exit


def start(
    file: str | os.PathLike,
    backend: str = "auto",
    capacity: int = 1 << 20,  # 32 MiB: 16 lanes of 65536 slots (docs/probe.md, "Ring size")
    drain_period_us: int = 20_000,  # the longest sleep between passes; sooner as lanes fill, at once when half full
    sample_period_us: int = 100,
    clock: str = "auto",
    wait_when_full: bool = False,
    record_code: bool = True,
    segment_bytes: int = 0,
    segment_ms: int = 0,
) -> dict:
    """Start recording GIL events of this process into FILE.

    FILE receives the drained events (the ring's record layout, docs/ring.md); the live
    ring is FILE.ring, the description (pid, version, backend, thread names) FILE.json and
    the code table (the Python code each release was in, docs/ring.md) FILE.codes.
    backend: "auto" (precise, else exported, else sampling) or one of them by name.
    clock: the stamps' clock: "auto" (TANDEM_PROBE_CLOCK if set, else "tsc" where the TSC
    is invariant and the kernel's clocksource is tsc), "tsc" (where usable) or
    "clock_gettime". Recorded times are CLOCK_MONOTONIC ns either way (docs/probe.md).
    wait_when_full: False (default) never blocks a thread: an event that finds its lane
    full is dropped and counted exactly; True makes such a thread wait (up to 250 ms per
    event, holding the GIL) for the drain thread to make room, for a lossless events file.
    record_code: False records no code (no FILE.codes; the gil table's function/file/line
    are null): the benchmark's comparison.
    segment_bytes, segment_ms: when either is set, the events go to segments FILE.000000,
    FILE.000001, ..., each closed whole once it is that long or that old (docs/ring.md,
    "Segments"): what the flight recorder compresses and rotates. 0, 0: one file.
    Returns the status dict (see status()). Stopped by stop() or at interpreter exit.
    """
    if backend not in BACKENDS:
        raise TandemError(f"unknown GIL probe backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    file = os.path.abspath(os.fspath(file))
    os.makedirs(os.path.dirname(file), exist_ok=True)
    options = dict(backend=backend, capacity=capacity, drain_period_us=drain_period_us, sample_period_us=sample_period_us,
                   clock=clock, wait_when_full=wait_when_full, record_code=record_code, segment_bytes=segment_bytes,
                   segment_ms=segment_ms)
    return _start_files(file + ".ring", file, file + ".json", file + ".threads.jsonl", file + ".codes", **options)


def start_session(session: str | os.PathLike, **options: object) -> dict:
    """Record into SESSION/py-<pid>/ (gil.ring, gil.events, gil.codes, probe.json; docs/session.md;
    py-<pid>.<n>/ when an earlier process of the session had this pid).

    A process forked from this one records into its own py-<pid> directory."""
    global _session_dir, _start_options
    from engine.probe.private import process_directory

    directory = process_directory(session, os.getpid())
    status = _start_files(*(os.path.join(directory, name) for name in ("gil.ring", "gil.events", "probe.json",
                                                                       "threads.jsonl", "gil.codes")), **options)
    try:  # CPython's own memory accounting, once a second (engine/probe/memory.py); never at the recording's cost
        if os.environ.get("TANDEM_MEMORY") != "0":  # (`tandem record --no-memory`)
            from engine.probe import memory
            memory.start(directory)
    except Exception:
        pass
    if _session_dir is None:
        os.register_at_fork(after_in_child=_restart_in_fork_child)
    _session_dir = os.fspath(session)
    _start_options = options
    return status


def _restart_in_fork_child() -> None:
    # The native side already forgot the parent's ring (pthread_atfork); the hooks are still
    # installed, so this only creates the child's own ring.
    global _meta_path, _names_path
    _meta_path = None
    with _names_lock:
        _thread_names.clear()
        _names_path = None
    if _session_dir is not None:
        try:
            start_session(_session_dir, **_start_options)
        except TandemError as err:
            print(f"tandem: GIL probe not started in child {os.getpid()}: {err}", file=sys.stderr)


def stop() -> dict:
    """Stop recording (no-op when not recording); returns the final status."""
    global _names_path
    try:
        from engine.probe import _probe
    except ImportError:
        return {"backend": "none", "running": False}
    if not _probe.status()["running"]:
        return _probe.status()
    final = _probe.stop()
    try:
        _write_meta("closed", final, final=True)
    except OSError as err:  # the session deleted or read-only meanwhile: one line, never a traceback
        print(f"tandem: GIL probe in pid {os.getpid()}: cannot write {_meta_path} at the end ({err.strerror})",
              file=sys.stderr)
    with _names_lock:
        _names_path = None
    return final


def status() -> dict:
    """backend, running, events, threads_seen, what the backend misses, ring counters."""
    return _native().status()


def backend() -> str | None:
    """Name of the backend recording now ("precise", "exported", "sampling"), else None."""
    try:
        from engine.probe import _probe
    except ImportError:
        return None
    name = _probe.status()["backend"]
    return None if name == "none" else name
