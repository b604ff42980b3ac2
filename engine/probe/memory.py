"""What CPython's own accounting says about the memory of this process, once a second and at exit.

A daemon thread started with the GIL probe (engine.probe.start_session) appends one JSON
line to SESSION/py-<pid>/memory.jsonl per sample, stamped with CLOCK_MONOTONIC:

    blocks            sys.getallocatedblocks(): objects and other blocks pymalloc holds
    arena_bytes       pymalloc's arenas (mmap'd apart from malloc) and the bytes of their
    pymalloc_bytes    allocated blocks, from _PyObject_DebugMallocStats written into memory
    malloc_in_use     glibc mallinfo2(): uordblks + hblkhd (every malloc of the process:
    malloc_mmapped    Python's large objects, numpy buffers, the JVM's own mallocs in one
    malloc_free       embedding it...), hblkhd, and fordblks (freed but held by malloc)
    tracemalloc       tracemalloc's traced total, when the user has it tracing (numpy's
                      buffers included: numpy reports them under its own domain)
    tracemalloc_numpy the part of it in numpy's domain (its array buffers), from a snapshot
                      every NUMPY_PERIOD_S at most and less often when one is slow (a snapshot
                      copies every trace holding the GIL: at most 1% of the time), the
                      latest on every line
    cpu_ns            the CPU time of this thread so far (what the sampling cost the service;
                      not in memory.parquet)

Each sample holds the GIL while getallocatedblocks and the malloc statistics walk pymalloc's
pools (mallinfo2 is constant-time). Standard library only; ctypes is imported by the thread itself, never on the
interpreter's start path. A failure stops the sampling, never the service.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

FILE_NAME = "memory.jsonl"
THREAD_NAME = "tandem-memory"  # (tandem's own thread in the service: engine.session.PROBE_THREAD_NAMES)
PERIOD_S = 1.0
NUMPY_DOMAIN = 389047  # numpy's NPY_TRACE_DOMAIN: its data buffers in tracemalloc
NUMPY_PERIOD_S = 10.0
NUMPY_DUTY = 0.01  # the snapshots' share of the time at most
JOIN_AT_EXIT_S = 1.0  # (a sampler stuck in a write does not hold the service's exit longer)

_started_in_pid: int | None = None
_thread: threading.Thread | None = None
_stopping = threading.Event()


def start(directory: str, period_s: float = PERIOD_S) -> None:
    """Sample this process into DIRECTORY/memory.jsonl from a daemon thread (once per process:
    a forked child calls this again from its own start), and once more as it exits."""
    global _started_in_pid, _thread, _stopping
    if _started_in_pid == os.getpid():
        return
    _started_in_pid = os.getpid()
    _stopping = threading.Event()  # (a forked child's own)
    _thread = threading.Thread(target=_sample_forever, args=(os.path.join(directory, FILE_NAME), period_s, _stopping),
                               name=THREAD_NAME, daemon=True)
    _thread.start()
    atexit.register(_end)


def stop() -> None:
    """End the sampling with a last sample, and its thread (tandem attach's stop leaves no thread
    of ours in the service)."""
    _end()
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join()  # (not only JOIN_AT_EXIT_S: after a stop, none of ours runs on)


def _end() -> None:
    """The sampling stops, its thread taking the last sample (at exit: a short program's end
    state comes after its last second), and the thread is waited for: a few milliseconds. A
    daemon thread still running Python while the interpreter is torn down can crash it (CPython
    3.12, a program ending while this thread was still importing at its start)."""
    global _started_in_pid
    if _started_in_pid != os.getpid():
        return
    _started_in_pid = None
    _stopping.set()
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join(JOIN_AT_EXIT_S)


def _sample_forever(path: str, period_s: float, stopping: threading.Event) -> None:
    try:
        sampler = _Sampler(path)
    except Exception:
        return
    try:
        sampler.write()
        while not stopping.wait(period_s):
            sampler.write()
        sampler.write()  # (the last: the state as the sampling ends)
    except Exception:  # never into the service: the samples so far stay
        pass
    finally:
        sampler.close()


class _Sampler:
    """Writes samples to the file (on the sampler's thread, the only one that writes)."""

    def __init__(self, path: str):
        from engine.probe import _json  # (the probe's JSON writer: no json import in the service)

        self._json, self._read = _json, _Readers()
        self._cpu_clock = time.pthread_getcpuclockid(threading.get_ident())  # (the sampler thread's)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self) -> None:
        sample = self._read.sample()
        sample["cpu_ns"] = time.clock_gettime_ns(self._cpu_clock)  # the sampler thread's CPU so far: the sampling's cost
        os.write(self._fd, (self._json(sample) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class _Readers:
    """The sampling functions this interpreter allows (each left out where it is missing)."""

    def __init__(self):
        import ctypes

        self._ctypes = ctypes
        try:
            self._libc = ctypes.CDLL(None)
        except OSError:
            self._libc = None
        self._mallinfo2 = None
        if self._libc is not None and hasattr(self._libc, "mallinfo2"):  # glibc 2.33+
            class MallInfo2(ctypes.Structure):
                _fields_ = [(name, ctypes.c_size_t) for name in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                    "keepcost")]

            self._mallinfo2 = self._libc.mallinfo2
            self._mallinfo2.restype = MallInfo2
            self._mallinfo2.argtypes = []
        self._numpy_bytes: int | None = None
        self._numpy_due = 0.0
        self._malloc_stats = None
        try:
            stats = ctypes.pythonapi._PyObject_DebugMallocStats
            memstream = self._libc.open_memstream
        except AttributeError:  # libpython's symbols not global (some embedders), or not glibc
            return
        stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int
        memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
        memstream.restype = ctypes.c_void_p
        self._libc.fclose.argtypes = [ctypes.c_void_p]
        self._libc.free.argtypes = [ctypes.c_void_p]
        self._malloc_stats = (stats, memstream)

    def sample(self) -> dict:
        sample = {"t": time.monotonic_ns(), "blocks": sys.getallocatedblocks()}
        sample.update(self._pymalloc())
        if self._mallinfo2 is not None:
            info = self._mallinfo2()
            sample.update(malloc_in_use=info.uordblks + info.hblkhd, malloc_mmapped=info.hblkhd,
                          malloc_free=info.fordblks)
        tracemalloc = sys.modules.get("tracemalloc")  # imported by whoever turned it on
        if tracemalloc is not None and tracemalloc.is_tracing():
            sample["tracemalloc"] = tracemalloc.get_traced_memory()[0]
            if "numpy" in sys.modules:
                sample["tracemalloc_numpy"] = self._numpy_traced(tracemalloc)
        return sample

    def _numpy_traced(self, tracemalloc) -> int | None:
        """The bytes tracemalloc traces in numpy's domain: a snapshot when due, else the latest."""
        now = time.monotonic()
        if now >= self._numpy_due:
            snapshot = tracemalloc.take_snapshot()
            numpy = snapshot.filter_traces([tracemalloc.DomainFilter(True, NUMPY_DOMAIN)])
            self._numpy_bytes = sum(trace.size for trace in numpy.traces)
            took = time.monotonic() - now
            self._numpy_due = now + max(NUMPY_PERIOD_S, took / NUMPY_DUTY)
        return self._numpy_bytes

    def _pymalloc(self) -> dict:
        """pymalloc's arenas and allocated bytes, from its statistics printed into memory
        (sys._debugmallocstats prints the same to the process's stderr)."""
        if self._malloc_stats is None:
            return {}
        ctypes = self._ctypes
        stats, memstream = self._malloc_stats
        buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
        stream = memstream(ctypes.byref(buffer), ctypes.byref(size))
        if not stream:
            return {}
        try:
            printed = stats(stream)
        finally:
            self._libc.fclose(stream)
            text = ctypes.string_at(buffer, size.value) if size.value else b""
            self._libc.free(buffer)
        if not printed:  # pymalloc not in use (PYTHONMALLOC=malloc)
            return {}
        found = {}
        for line in text.splitlines():
            if line.startswith(b"# arenas allocated current"):
                found["arenas"] = int(line.rsplit(b"=", 1)[1].replace(b",", b""))
            elif line.startswith(b"# bytes in allocated blocks"):
                found["pymalloc_bytes"] = int(line.rsplit(b"=", 1)[1].replace(b",", b""))
            elif b"bytes/arena" in line:
                found["arena_bytes"] = int(line.rsplit(b"=", 1)[1].replace(b",", b""))
        return found
