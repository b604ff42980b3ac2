"""The memory of a session's processes while it is recorded (`tandem live`): the same samples
and the same table as memory.parquet (engine.memory.table), over the latest KEEP_S seconds.

A daemon thread reads, every PERIOD_S, what was appended to the samples files since its last
read (SESSION/memory/<pid>.jsonl from the recorder, py-<pid>/memory.jsonl from CPython); another,
every JVM_EVERY_S, each JVM's memory events from its JFR repository (a chunk read once it is
finished, the open one up to its last flush; recording.jfr once the JVM has closed it). The first
then rebuilds the table of the samples kept and who grew over them (engine.memory.growth),
which the live view and the metrics read (`snapshot`); each live part gets the rows that
have settled since the last (`rows_to_write`).
"""
from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import TandemError
from engine.memory.growth import who_grew
from engine.memory.jvm import read_jvm_memory
from engine.memory.table import STALE_NS, process_rows, with_buckets
from engine.session import JVM_DIRS, PROCESS_MEMORY_DIR, PYTHON_DIRS, PYTHON_MEMORY, jvm_recordings, pid_from_name


KEEP_S = 600  # the window who grew is fitted on (its second half: the latest five minutes)
PERIOD_S = 2.0  # (a rebuild of the table costs tens of ms of pandas)
SAMPLE_PERIOD_S = 1.0  # the samplers' (engine/record/memory.py, engine/probe/memory.py)
JVM_EVERY_S = 5.0
FINAL_AFTER_NS = STALE_NS + int(JVM_EVERY_S * 2e9)  # when a row of the table no longer changes (rows_to_write)


@dataclass
class MemorySnapshot:
    """The latest state: per process its last row (column -> value, nulls left out), who grew."""

    latest: dict[int, dict] = field(default_factory=dict)
    growth: list = field(default_factory=list)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


class MemoryFollower:
    def __init__(self, session: Path, keep_s: float = KEEP_S, period_s: float = PERIOD_S, jvm_every_s: float = JVM_EVERY_S):
        self.session = Path(session)
        self.keep_ns = int(keep_s * 1e9)
        self.period_s = period_s
        self.jvm_every_s = jvm_every_s
        self._offsets: dict[Path, int] = {}
        self._samples: dict[Path, collections.deque] = {}  # a samples file -> its latest rows
        # JFR file -> (size, mtime), its JVM's pid, its events (JvmEvents: a window's worth is
        # kept and rebuilt from every PERIOD_S, so as arrays, not as a frame of text)
        self._chunks: dict[Path, tuple[tuple[int, int], int, JvmEvents]] = {}
        self._closed_jvms: set[Path] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # the JVM events, swapped in by one thread and read by the other
        self.snapshot = MemorySnapshot()
        self.problem: str | None = None
        self._written_to: dict[int, int] = {}  # pid -> the last t_ns rows_to_write handed out

    def start(self) -> "MemoryFollower":
        # Two threads: a JFR read takes seconds on a busy machine, and the samples must not wait for it.
        self._threads = [threading.Thread(target=self._run, args=(work, every), name=f"tandem-live-memory-{name}", daemon=True)
                         for name, work, every in (("samples", self.poll, self.period_s),
                                                   ("jvm", self._read_jvms, self.jvm_every_s))]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._read_jvms()  # the JVMs' closed recordings
        self.poll()  # the last samples

    def _run(self, work, every_s: float) -> None:
        while True:
            try:
                work()
            except Exception as err:  # never the live run's failure: said in the view, tried again
                self.problem = f"memory: {type(err).__name__}: {err}"
            if self._stop.wait(every_s):
                return

    def poll(self) -> MemorySnapshot:
        """The samples appended since the last poll, and the table and who grew, rebuilt."""
        for path in self._sample_files():
            self._read_new_lines(path)
        self.snapshot = self._build()
        return self.snapshot

    def rows_to_write(self, final: bool = False) -> pd.DataFrame:
        """The table's rows not handed out before and settled: sampled FINAL_AFTER_NS ago or more
        (a row's interpolated series wait for their next sample, its JVM series for the next
        read of the repository); every row left when FINAL (the run has ended)."""
        table = self.snapshot.table
        if table.empty:
            return table
        t = table["t_ns"].to_numpy(np.int64)
        settled = t <= (np.iinfo(np.int64).max if final else time.monotonic_ns() - FINAL_AFTER_NS)
        written = table["pid"].map(self._written_to).fillna(-1).to_numpy(np.int64)
        rows = table[settled & (t > written)]
        for pid, last in rows.groupby("pid")["t_ns"].max().items():
            self._written_to[int(pid)] = int(last)
        return rows.reset_index(drop=True)

    # ---- reading ---------------------------------------------------------------------------

    def _sample_files(self) -> list[Path]:
        return [*sorted((self.session / PROCESS_MEMORY_DIR).glob("*.jsonl")),
                *(d / PYTHON_MEMORY for d in sorted(self.session.glob(PYTHON_DIRS)) if (d / PYTHON_MEMORY).is_file())]

    def _read_new_lines(self, path: Path) -> None:
        """The complete lines appended since the last read (a line being written waits)."""
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offsets[path] = offset + end
        rows = self._samples.setdefault(path, collections.deque(maxlen=int(self.keep_ns / 1e9 / SAMPLE_PERIOD_S) + 60))
        for line in data[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue

    @staticmethod
    def _java_version(directory: Path) -> str | None:
        try:
            return json.loads((directory / "jvm.json").read_text()).get("java_version")
        except (OSError, ValueError):
            return None

    def _read_jvms(self) -> None:
        for directory in sorted(self.session.glob(JVM_DIRS)):
            if directory in self._closed_jvms or not directory.is_dir():
                continue
            files, closed = jvm_recordings(directory)
            if closed:  # its repository's chunks are all in recording.jfr: read it once, for good
                with self._lock:
                    for path in [p for p in self._chunks if directory in p.parents]:
                        del self._chunks[path]
                self._closed_jvms.add(directory)
            for path in files:
                try:
                    st = path.stat()
                except OSError:
                    continue  # JFR removed it (the JVM closed): recording.jfr follows
                stamp = (st.st_size, st.st_mtime_ns)
                if self._chunks.get(path, (None,))[0] == stamp or st.st_size == 0:
                    continue
                try:
                    events, _ = read_jvm_memory([path], flushed=True, java_version=self._java_version(directory))
                except TandemError:
                    continue  # a chunk JFR has just started, not flushed yet: next time
                with self._lock:
                    self._chunks[path] = (stamp, pid_from_name(directory.name), JvmEvents.of(events))
        cutoff = time.monotonic_ns() - self.keep_ns - STALE_NS
        with self._lock:
            for path, (stamp, pid, events) in list(self._chunks.items()):
                if len(events) and int(events.t_ns.max()) < cutoff:
                    self._chunks[path] = (stamp, pid, JvmEvents.of(None))  # (read, and older than the window)

    # ---- the table ---------------------------------------------------------------------------

    def _build(self) -> MemorySnapshot:
        outside, python = {}, {}
        for path, rows in self._samples.items():
            if not rows:
                continue
            frame = pd.DataFrame(list(rows))
            if path.parent.name == PROCESS_MEMORY_DIR:
                outside[int(path.stem)] = frame
            else:
                python[pid_from_name(path.parent.name)] = frame
        with self._lock:
            chunks = [(pid, events) for _, pid, events in self._chunks.values() if len(events)]
        jvms = {pid: JvmEvents.frame([e for p, e in chunks if p == pid]) for pid in sorted({p for p, _ in chunks})}
        parts = [process_rows(pid, outside.get(pid), python.get(pid), jvms.get(pid))
                 for pid in sorted(set(outside) | set(python) | set(jvms))]
        parts = [p for p in parts if p is not None and len(p)]
        if not parts:
            return MemorySnapshot()
        table = with_buckets(pd.concat(parts, ignore_index=True))
        latest = {}
        for pid, rows in table.groupby("pid", sort=True):
            last = rows.sort_values("t_ns").iloc[-1]
            latest[int(pid)] = {k: v for k, v in last.items() if not (isinstance(v, float) and np.isnan(v))}
        return MemorySnapshot(latest, who_grew(table), table)


@dataclass
class JvmEvents:
    """One JFR file's memory events (read_jvm_memory's long table) as arrays: its column names
    numbered (a few dozen names among a window's hundreds of thousands of events)."""

    t_ns: np.ndarray
    name: np.ndarray  # (int16: the number of each event's column in NAMES)
    names: np.ndarray
    value: np.ndarray
    after_gc: np.ndarray

    @classmethod
    def of(cls, table: pd.DataFrame | None) -> "JvmEvents":
        if table is None or not len(table):
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int16), np.zeros(0, object), np.zeros(0), np.zeros(0, bool))
        name, names = pd.factorize(table["column"].to_numpy(object))
        return cls(table["t_ns"].to_numpy(np.int64, copy=True), name.astype(np.int16), np.asarray(names, object),
                   table["value"].to_numpy(np.float64, copy=True), table["after_gc"].to_numpy(bool, copy=True))

    def __len__(self) -> int:
        return len(self.t_ns)

    @staticmethod
    def frame(parts: list["JvmEvents"]) -> pd.DataFrame:
        """PARTS as one long table (t_ns, column, value, after_gc) in time order, as process_rows reads it."""
        t = np.concatenate([p.t_ns for p in parts])
        order = np.argsort(t, kind="stable")
        return pd.DataFrame({"t_ns": t[order], "column": np.concatenate([p.names[p.name] for p in parts])[order],
                             "value": np.concatenate([p.value for p in parts])[order],
                             "after_gc": np.concatenate([p.after_gc for p in parts])[order]})
