"""The agent's live pause ring (`jvm-<pid>/pauses.ring`, `live=true`; record type JVM pause of
docs/ring.md) as a live source (engine/live/sources.py): records already on CLOCK_MONOTONIC."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from engine.live.jvm_source import PAUSE_RING_KINDS, SYSTEM_GC_CALL, JvmSource, system_gc_calls
from engine.ring import RingTailer
from engine.ring.layout import FILE_KIND_RING
from engine.ring.reader import _read_header_page  # the reader's own checked header read
from engine.session import JVM_JSON, PAUSES_RING, process_alive, read_json


class PauseRingSource(JvmSource):
    """The agent's live pause ring (`live=true`): records already on CLOCK_MONOTONIC."""

    how = "pause ring"

    def __init__(self, directory: Path):
        super().__init__(directory)
        self._empty: pd.DataFrame | None = None

        self.tailer = RingTailer(directory / PAUSES_RING)
        self.names = dict(self.tailer.header.names)
        self.calls: list[pd.DataFrame] = []  # System.gc() calls not taken yet (take_calls)
        self._agent_start: tuple | None = None
        self.clock_error_ns = 0  # (System.nanoTime() through the agent's ClockSync: on CLOCK_MONOTONIC)

    def _refresh_names(self) -> None:
        fd = os.open(self.tailer.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            header = _read_header_page(fd, self.tailer.path, os.fstat(fd).st_size, FILE_KIND_RING)
        finally:
            os.close(fd)
        self.names = dict(header.names)

    def take_calls(self) -> pd.DataFrame:
        """The System.gc() calls read since the last take (system_gc_calls columns)."""
        calls, self.calls = self.calls, []
        return pd.concat(calls, ignore_index=True) if calls else system_gc_calls()

    def _asked_by_tandem(self, requester: np.ndarray, start_ns: np.ndarray) -> np.ndarray:
        """As the recording's reader marks them: requested by the agent's own start-up (jvm.json)."""
        if self._agent_start is None or self._agent_start[0] is None:  # (the agent writes it as it starts)
            facts = read_json(self.directory / JVM_JSON) or {}
            self._agent_start = tuple(facts.get(f"agent_start_{key}") for key in
                                      ("os_thread_id", "from_monotonic_ns", "to_monotonic_ns"))
        tid, first, last = self._agent_start
        if tid is None or first is None or last is None:
            return np.zeros(start_ns.size, bool)
        return (requester == int(tid)) & (start_ns >= int(first)) & (start_ns <= int(last))

    def poll(self) -> pd.DataFrame:
        gone = not process_alive(self.pid)
        records = self.tailer.poll(producer_gone=gone)
        if not len(records) and not gone and not self.tailer.closed_by_producer and self._empty is not None:
            return self._empty  # the usual case every 50 ms: nothing new
        used = np.unique(np.r_[records["name_code"], records["cause_code"]]).tolist()
        if not {c for c in used if c} <= set(self.names):
            self._refresh_names()
        calls = records["kind"] == SYSTEM_GC_CALL
        if calls.any():
            call = records[calls]
            tid = call["tid"].astype(np.int64)
            self.calls.append(system_gc_calls(self.pid, call["start_ns"].astype(np.int64), call["end_ns"].astype(np.int64),
                                              tid, [self.names.get(int(c)) for c in call["name_code"]]))
            records = records[~calls]
        codes = records["name_code"].astype(np.int64)
        kinds = [PAUSE_RING_KINDS.get(int(k), f"kind{int(k)}") for k in records["kind"]]
        ids = records["id"].astype(np.int64)
        is_sp = np.array([k == "safepoint" for k in kinds], dtype=bool).reshape(-1)
        tid = records["tid"].astype(np.int64)
        requester = records["requester"].astype(np.int64)
        frame = pd.DataFrame({
            "kind": pd.array(kinds, dtype="string"),
            "name": pd.array([self.names.get(int(c), "") for c in codes], dtype="string"),
            "start_ns": records["start_ns"].astype(np.int64),
            "end_ns": records["end_ns"].astype(np.int64),
            "safepoint_id": pd.arrays.IntegerArray(ids, mask=~is_sp),
            "gc_id": pd.arrays.IntegerArray(ids.copy(), mask=is_sp.copy()),
            "os_thread_id": pd.arrays.IntegerArray(tid, mask=tid == 0),
            "jvm_pid": pd.array([self.pid] * len(records), dtype="Int64"),
            # aux bit 0: a safepoint whose End the agent never saw (end = end of its Begin).
            "unmatched": pd.array((records["aux"].astype(np.int64) & 1).astype(bool), dtype="boolean"),
            "requester_os_thread_id": pd.arrays.IntegerArray(requester, mask=requester == 0),
            "cause": pd.array([self.names.get(int(c)) for c in records["cause_code"]], dtype="string"),
            "asked_by_tandem": self._asked_by_tandem(requester, records["start_ns"].astype(np.int64)),
        })
        frame["duration_ns"] = frame["end_ns"] - frame["start_ns"]
        if self._empty is None:
            self._empty = frame.iloc[:0]
        self._seen(frame)
        if gone or self.tailer.closed_by_producer:
            self.done = True
            if gone and not self.tailer.closed_by_producer:
                self.problem = "exited without closing its pause ring (killed?)"
            self.tailer.close()
        return frame
