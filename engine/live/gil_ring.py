"""A Python process's GIL ring (`py-<pid>/gil.ring`) as a live source (engine/live/sources.py):
followed with `RingTailer` (exact missed/dropped), its records paired into intervals poll by poll."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import TandemError
from engine.ingest.codes import FIRST_ID, read_code_table, resolve
from engine.ingest.gil import Pairing, SampledRecords, interval_frame, started_threads
from engine.ring import RingTailer
from engine.ring.layout import GIL_RECORD_DTYPE
from engine.session import GIL_CODES, GIL_RING, THREADS_JSONL, pid_from_name, process_alive


class GilRingSource:
    kind = "python"

    def __init__(self, directory: Path):
        self.directory = directory
        self.pid = pid_from_name(directory.name)
        self.tailer = None
        self.pairing = Pairing(directory.name)  # (each thread's last event carried from poll to poll)
        self.thread_names: dict[int, str] = {}
        self.done = False
        self.problem: str | None = None
        self.frontier_ns: int | None = None
        self.commit_lag_ns = 0  # the most an event read was stamped before the poll that could first have read it
        self._latest_end: dict[int, int] = {}  # tid -> the end of its latest interval
        self._names_size = -1
        self._codes: dict | None = None

    @property
    def label(self) -> str:
        return self.directory.name

    def _thread_names(self) -> None:
        side = self.directory / THREADS_JSONL
        try:
            size = side.stat().st_size
        except OSError:
            return
        if size == self._names_size:
            return
        self._names_size = size
        self.thread_names.update(started_threads(side))

    def poll(self) -> pd.DataFrame:
        """The intervals closed by the records committed since the last poll."""
        started = time.monotonic_ns()
        gone = not process_alive(self.pid)
        if self.tailer is None:
            ring = self.directory / GIL_RING
            if not ring.exists():
                if gone:
                    self.done = True
                    self.problem = "exited before its ring appeared"
                self.frontier_ns = started  # (its stamps come after its ring is made)
                return self._intervals(np.zeros(0, GIL_RECORD_DTYPE))
            self.tailer = RingTailer(ring)
        missed_before = self.tailer.missed
        records = self.tailer.poll(producer_gone=gone)
        if self.tailer.missed > missed_before:
            # Records were overwritten before we read them: a thread's last event and its next
            # one read are no longer consecutive, so pairing them would invent an interval.
            self.pairing.forget()
        self._thread_names()
        out = self._intervals(records)
        if len(out):  # each thread's latest interval end: where an open release's holding stretch began
            tids, at = np.unique(out["tid"].to_numpy(np.int64), return_inverse=True)
            ends = np.full(tids.size, np.iinfo(np.int64).min)
            np.maximum.at(ends, at, out["end_ns"].to_numpy(np.int64))
            self._latest_end.update(zip(tids.tolist(), ends.tolist()))
        if len(records) and self.frontier_ns is not None:
            self.commit_lag_ns = max(self.commit_lag_ns, self.frontier_ns - int(records["mono_ns"].min()))
        self.frontier_ns = started
        if gone:
            self.done = True
            if not self.tailer.closed_by_producer:
                self.problem = "exited without closing its ring (killed?)"
            self.tailer.close()
        return out

    def _intervals(self, records: np.ndarray) -> pd.DataFrame:
        try:
            # (`code`: each release's code, named on demand by code_names; the live parts' gil
            # table has no code columns, docs/live.md)
            out = interval_frame(self.pid or 0, *self.pairing.intervals(records))
        except SampledRecords:
            raise TandemError(f"{self.label}: sampling-backend GIL records are not supported by `tandem live` "
                              "(use `tandem record` + `tandem analyze`)") from None
        if len(out) and self.thread_names:
            out["thread_name"] = out["tid"].map(self.thread_names).astype("string")
        return out

    def code_names(self, code: np.ndarray) -> pd.DataFrame:
        """function, file, line of each of this process's release codes (gil.codes, read again
        when a code is not in it yet: the probe appends as code first releases the GIL)."""
        path = self.directory / GIL_CODES
        ids = np.asarray(code, np.uint64) & 0xFFFFFFFF
        wanted = {int(i) for i in ids.tolist() if i >= FIRST_ID}
        if self._codes is None or not wanted <= set(self._codes):
            self._codes = read_code_table(path)
        return resolve(code, self._codes, recorded=path.exists())

    def open_intervals(self) -> list[tuple[int, int, int, int, int]]:
        """(pid, tid, state, start_ns, code) of each interval open now (its closing event not read yet)."""
        tid, state, start, code = self.pairing.open_intervals(codes=True)
        return [(self.pid or 0, *row) for row in zip(tid.tolist(), state.tolist(), start.tolist(), code.tolist())]

    def open_releases(self) -> list[tuple[int, int, int, int]]:
        """(pid, tid, start_ns, held_since_ns) of each release open now, held_since_ns: when the
        thread last took the GIL before it (its latest interval's end; the release itself when
        none) (engine/live/watermark.py)."""
        tid, state, start = self.pairing.open_intervals()
        return [(self.pid or 0, t, b, min(b, self._latest_end.get(t, b)))
                for t, s, b in zip(tid.tolist(), state.tolist(), start.tolist()) if s == 0]

    def status(self) -> dict:
        t = self.tailer
        return {
            "source": self.label, "kind": "GIL ring", "done": self.done, "problem": self.problem,
            "received": t.received if t else 0, "missed": t.missed if t else 0,
            "dropped": t.dropped if t else 0,
        }
