"""What `tandem live` reads: the processes of a session as they appear and exit.

- `GilRingSource`: one `py-<pid>/gil.ring`, followed with `RingTailer` (exact missed/dropped).
- `PauseRingSource`: `jvm-<pid>/pauses.ring` (the agent's `live=true` output; record type
  JVM pause of docs/ring.md). `RingWithRepositorySource`, what `SessionWatcher` uses when a
  ring exists: the ring for latency, reconciled with the repository (docs/live.md).
- `RepositorySource`: otherwise the JVM's JFR disk repository, re-read with
  `engine.ingest.jfr.read_pauses` (it reads an unfinished chunk up to its last flush) about
  once a second, keeping the pauses not seen before; once the JVM has closed, its
  `recording.jfr` is read one last time the same way.
- `SessionWatcher`: discovers new `py-*` / `jvm-*` directories and picks the source.

A GIL source reports `frontier_ns`: nothing it delivers later starts before it (as far as
the source can tell; the watermark adds a margin, engine/live/watermark.py). Every source is
`done` once its producer has exited and everything was read. Pauses may come late (the core
keeps what they need: engine/correlate/core.py, `retain_ns`).
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from engine.clock.packed import is_zstd
from engine.errors import TandemError
from engine.ingest.codes import FIRST_ID, read_code_table, resolve
from engine.ingest.gil import Pairing, SampledRecords, interval_frame, started_threads
from engine.ingest.jfr import read_pauses
from engine.ingest.jfr_input import unzstd
from engine.ring import RingTailer
from engine.ring.layout import FILE_KIND_RING, GIL_RECORD_DTYPE
from engine.ring.reader import _read_header_page  # the reader's own checked header read
from engine.session import (AGENT_ERROR, GIL_CODES, GIL_RING, JVM_DIRS, JVM_JSON, PACKED_CHUNK_SUFFIX, PAUSES_RING, PYTHON_DIRS,
                            RECORDING, REPOSITORY, THREADS_JSONL, agent_error_line, jvm_recordings, packed_chunks, pid_from_name,
                            process_alive, raw_chunks, read_json)


PAUSE_RING_KINDS = {1: "safepoint", 2: "gc_pause", 3: "gc", 4: "vm_operation"}  # java-agent PauseRing.KIND_*
SYSTEM_GC_CALL = 5  # a System.gc() call's record (not a pause: docs/ring.md, "Java writer")


def system_gc_calls(jvm_pid: int = 0, start_ns=(), end_ns=(), tid=(), frames=()) -> pd.DataFrame:
    """System.gc() calls of a JVM (its pause ring's call records): the call's span, its
    thread, its innermost frames (the pauses table's system_gc_frames)."""
    tid = np.asarray(tid, np.int64)
    return pd.DataFrame({
        "jvm_pid": np.full(tid.size, jvm_pid, np.int64),
        "start_ns": np.asarray(start_ns, np.int64),
        "end_ns": np.asarray(end_ns, np.int64),
        "os_thread_id": pd.arrays.IntegerArray(tid, mask=tid == 0),
        "frames": pd.array(list(frames), dtype="string"),
    })


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


class _PauseSource:
    kind = "jvm"

    def __init__(self, directory: Path):
        self.directory = directory
        self.pid = pid_from_name(directory.name)
        self.done = False
        self.problem: str | None = None
        self.pauses_seen = 0
        self.clock_error_ns: int | None = None

    @property
    def label(self) -> str:
        return f"jvm-{self.pid}"

    def _seen(self, frame: pd.DataFrame) -> None:
        self.pauses_seen += len(frame)

    def take_calls(self) -> pd.DataFrame:
        """The System.gc() calls read since the last take (a JFR recording's are in its pauses)."""
        return system_gc_calls()


class PauseRingSource(_PauseSource):
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


class RepositorySource(_PauseSource):
    """Fallback: the JVM's JFR disk repository, re-read as it grows (then recording.jfr)."""

    how = "JFR repository (re-read)"

    def __init__(self, directory: Path):
        super().__init__(directory)
        self._stamps: dict[str, tuple[str, int, int]] = {}  # chunk name -> (its file now, size, mtime) when read
        self._seen_keys = np.zeros(0, np.int64)  # sorted hashes of the pauses taken: 8 bytes each
        self._offset_ns: int | None = None  # ticks -> CLOCK_MONOTONIC, locked at the first read
        self._final_read = False
        self._last_error: str | None = None
        # chunk -> safepoint ids it left unmatched (Begin there, End in the next chunk: JFR
        # splits the safepoint of a chunk rotation, e.g. JFRCheckpoint, across two chunks)
        self._split: dict[str, set[int]] = {}

    def _read(self, paths: list[Path]) -> pd.DataFrame | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unfinished chunks are expected here
            try:
                frame = read_pauses(paths)
            except TandemError as err:
                # Typically a chunk JFR has just started and not flushed yet, or one removed
                # while read (the JVM's exit, the keeper packing it): read it again later (where
                # it went); said only if it is still unreadable once the JVM is gone.
                self._last_error = str(err)
                return None
        runs = [run for source in frame.attrs.get("sources", []) for run in source.get("runs", [])]
        clock = runs[-1]["clock"] if runs else {}
        offset = clock.get("offset_ns") if clock.get("method") == "clock_sync" and clock.get("slope") is None else None
        if offset is not None:
            if self._offset_ns is None:
                self._offset_ns = int(offset)
            shift = self._offset_ns - int(offset)
            # Times on the locked alignment: one pause keeps the same times across re-reads.
            frame["start_ns"] = frame["start_ns"] + shift
            frame["end_ns"] = frame["end_ns"] + shift
            frame["clock_offset_ns"] = np.int64(self._offset_ns)
            self.clock_error_ns = abs(shift) + int(clock.get("error_ns") or 0)
        return frame

    def _new(self, frame: pd.DataFrame, final: bool = False) -> pd.DataFrame:
        if not final and "unmatched" in frame.columns:
            # A SafepointBegin whose End is not flushed yet: it comes back matched (with its
            # real end) in a later read, so it is not taken now.
            frame = frame[~frame["unmatched"].astype(bool)]
        keys = list(zip(frame["kind"].tolist(), frame["name"].fillna("").tolist(), frame["start_ns"].tolist(),
                        frame["end_ns"].tolist(), frame["safepoint_id"].fillna(-1).tolist(), frame["gc_id"].fillna(-1).tolist()))
        keys = np.array([hash(k) for k in keys], dtype=np.int64)
        at = np.searchsorted(self._seen_keys, keys)
        seen = (at < len(self._seen_keys)) & (self._seen_keys[np.minimum(at, max(len(self._seen_keys) - 1, 0))] == keys) \
            if len(self._seen_keys) else np.zeros(len(keys), bool)
        fresh = ~seen
        self._seen_keys = np.union1d(self._seen_keys, keys)
        new = frame[fresh].drop(columns=["pause_id"]).reset_index(drop=True)
        self._seen(new)
        return new

    def _note_split(self, chunk: str, frame: pd.DataFrame) -> None:
        unmatched = frame["unmatched"].astype(bool) & (frame["kind"].astype(str) == "safepoint") if len(frame) else []
        ids = set(frame.loc[unmatched, "safepoint_id"].dropna().astype(int).tolist()) if len(frame) else set()
        if ids:
            self._split[chunk] = ids
        else:
            self._split.pop(chunk, None)

    def _chunks(self) -> dict[str, Path]:
        """The JVM's chunks by name, wherever each is now: JFR's repository, the agent's links
        (.chunks/), or packed by the flight recorder's keeper, which moves a finished chunk
        away while it is followed (the raw file first: a packed chunk is the same, finished)."""
        packed = {p.name.removesuffix(PACKED_CHUNK_SUFFIX): p for p in packed_chunks(self.directory)}
        return dict(sorted((packed | raw_chunks(self.directory)).items()))

    def _join_split_chunks(self, chunks: dict[str, Path]) -> list[pd.DataFrame]:
        """The safepoints a chunk left unmatched, read whole from that chunk and the next one
        (a JFR file may hold several chunks, and jdk.jfr pairs a Begin and End across them), as
        soon as the next chunk has their End: not at the final read, which for a long session
        is later than the GIL rows the core keeps for a late pause."""
        import shutil
        import tempfile

        frames = []
        names = sorted(self._stamps)
        for name, following in zip(names, names[1:]):
            ids = self._split.get(name)
            if not ids or name not in chunks or following not in chunks:
                continue
            with tempfile.TemporaryDirectory(prefix="tandem-live-") as tmp:
                joined = Path(tmp) / name
                try:
                    with open(joined, "wb") as out:
                        for part in (chunks[name], chunks[following]):
                            if is_zstd(part):
                                unzstd(part, Path(tmp) / "part")
                                part = Path(tmp) / "part"
                            with open(part, "rb") as src:
                                shutil.copyfileobj(src, out)
                    if (self.directory / JVM_JSON).exists():  # the JVM's pid etc., as for its chunks
                        shutil.copy(self.directory / JVM_JSON, Path(tmp) / JVM_JSON)
                except (OSError, TandemError):
                    continue  # removed meanwhile (clean exit: recording.jfr follows), or packed half-written: next time
                frame = self._read([joined])
            if frame is None:
                continue
            whole = frame[(frame["kind"].astype(str) == "safepoint") & ~frame["unmatched"].astype(bool)]
            found = set(whole["safepoint_id"].dropna().astype(int).tolist()) & ids
            if found:
                frame = frame.assign(source=str(chunks[name]))
                taken = (frame["kind"].astype(str) == "safepoint") & frame["safepoint_id"].isin(list(found)).fillna(False)
                frames.append(self._new(frame[taken.to_numpy(bool)]))
            if found == ids:
                del self._split[name]
            else:
                self._split[name] = ids - found
        return frames

    def poll(self) -> pd.DataFrame:
        gone = not process_alive(self.pid)
        state = read_json(self.directory / JVM_JSON).get("state")
        recording = self.directory / RECORDING
        frames = []
        if (state == "closed" or gone) and recording.exists() and recording.stat().st_size > 0:
            # What offline reads (links left beside recording.jfr too: an exit cut short), less
            # the packed chunks, followed already.
            frame = self._read(jvm_recordings(self.directory, packed=False)[0])
            if frame is not None:
                frames.append(self._new(frame, final=True))
            self._final_read = True
        else:
            if gone:
                self._stamps.clear()  # the last read of every chunk keeps its unmatched safepoints
            chunks = self._chunks()
            for name, chunk in chunks.items():
                try:
                    st = chunk.stat()
                except OSError:
                    continue  # JFR removed it (clean exit: recording.jfr follows), or the keeper packed it: next time
                stamp = (str(chunk), st.st_size, st.st_mtime_ns)  # (a chunk packed meanwhile is read once more, finished)
                if self._stamps.get(name) == stamp or st.st_size == 0:
                    continue
                frame = self._read([chunk])
                if frame is not None:
                    self._stamps[name] = stamp
                    if not gone:
                        self._note_split(name, frame)
                    frames.append(self._new(frame, final=gone))
            if not gone:
                frames.extend(self._join_split_chunks(chunks))
            if gone:
                self._final_read = True
                if not recording.exists():
                    self.problem = "exited without closing its recording (killed?): read its repository up to the last flush"
        if self._final_read:
            self.done = True
            if not recording.exists() and self._last_error and not self.pauses_seen:
                self.problem = self._last_error
        agent_error = agent_error_line(self.directory)
        if agent_error:
            self.problem = agent_error
            self.done = self.done or not frames
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def status(self) -> dict:
        return {"source": self.label, "kind": self.how, "done": self.done, "problem": self.problem,
                "pauses": self.pauses_seen, "clock_error_ns": self.clock_error_ns}


PauseRingSource.status = RepositorySource.status  # same fields


class _Spans:
    """(start, end) pairs added a batch at a time and searched by start: sorted runs whose sizes
    at least double from the newest to the oldest (two neighbours of comparable size are
    merged), so that adding costs O(log n) a pair amortized and a search O(log n) runs, where
    one sorted array re-sorted at every poll cost O(n) a poll over a long live run."""

    def __init__(self):
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        order = np.argsort(starts, kind="stable")
        self.runs.append((starts[order], ends[order]))
        while len(self.runs) > 1 and self.runs[-2][0].size <= 2 * self.runs[-1][0].size:
            (s1, e1), (s2, e2) = self.runs.pop(-2), self.runs.pop()
            both = np.concatenate([s1, s2])
            order = np.argsort(both, kind="stable")
            self.runs.append((both[order], np.concatenate([e1, e2])[order]))

    def match(self, start: int, end: int, tolerance_ns: int) -> int | None:
        """The start of a pair whose start and end are both within TOLERANCE_NS of these, if any."""
        for starts, ends in self.runs:
            i = int(np.searchsorted(starts, start - tolerance_ns))
            while i < starts.size and starts[i] <= start + tolerance_ns:
                if abs(int(ends[i]) - end) <= tolerance_ns:
                    return int(starts[i])
                i += 1
        return None


class RingWithRepositorySource(PauseRingSource):
    """The pause ring for latency, reconciled with the JFR repository (then recording.jfr).

    The ring misses what JFR recorded before the agent's stream started (start-up
    safepoints), and kinds it does not carry (compilation, deoptimization). The repository is
    re-read every REPOSITORY_EVERY_S as RepositorySource does; a pause it has that no
    delivered ring row matches -- same kind, start and end within MATCH_NS -- is delivered
    too, late (the join's late lane pairs it). Times: a pause both sources have keeps the
    ring's (System.nanoTime() through the agent's tightest ClockSync pair; it was delivered
    first); a repository-only pause is moved onto the ring's alignment by the median
    (ring - repository) start difference of the matched pauses (tens of ns). Repository
    pauses of the RING_KINDS ending after the last ring row seen are held back (the ring may
    still bring them), except at the final read. The repository is read on a thread of its
    own (a read takes tenths of a second; ring rows must not wait for it).
    """

    how = "pause ring + JFR repository"
    # Kinds taken from the ring. vm_operation (not at a safepoint) is not: the ring carries
    # some the recording does not (a JFRCheckpoint at stream start-up), so those come from
    # the repository only, late, to stay equal to offline.
    RING_KINDS = ("safepoint", "gc_pause", "gc")
    MATCH_NS = 2_000  # the alignments differ by tens to hundreds of ns (agent clock_error_ns ~300)
    # The repository re-read is for reconciliation only (start-up pauses, kinds the ring does
    # not carry): rarely, so that its reads (tenths of a second, holding the GIL in part) do
    # not delay the ring's rows.
    REPOSITORY_EVERY_S = 5.0
    FIRST_READ_AFTER_S = 2.0
    CLOSING_EVERY_S = 0.2

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.repository = RepositorySource(directory)
        # kind -> the (start_ns, end_ns) of the delivered rows: 16 bytes a pause.
        self._delivered: dict[str, _Spans] = {}
        self._held: pd.DataFrame | None = None
        self._shifts: list[int] = []
        self._last_reconcile = 0.0
        self._ring_done = False
        self._repo_done = False
        self._last_ring_end: int | None = None
        self._thread: threading.Thread | None = None
        self._safepoints: pd.DataFrame | None = None
        self.ring_rows = 0
        self.repository_rows = 0
        self.matched_rows = 0

    def _match(self, kind: str, start: int, end: int) -> int | None:
        known = self._delivered.get(kind)
        return None if known is None else known.match(start, end, self.MATCH_NS)

    def _remember(self, frame: pd.DataFrame) -> None:
        # (plain arrays: this runs at every poll that brings pauses, on the live loop)
        kinds = frame["kind"].astype(str).to_numpy(object)
        starts, ends = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
        safepoint = kinds == "safepoint"
        if safepoint.any():
            sp = pd.DataFrame({"start_ns": starts[safepoint], "end_ns": ends[safepoint],
                               "name": frame["name"].to_numpy(object)[safepoint]})
            sp = pd.concat([self._safepoints, sp], ignore_index=True) if self._safepoints is not None else sp
            self._safepoints = sp.iloc[-4096:].reset_index(drop=True)  # recent ones are enough
        for kind in set(kinds.tolist()):
            mine = kinds == kind
            self._delivered.setdefault(kind, _Spans()).add(starts[mine], ends[mine])

    def _inside_safepoint(self, frame: pd.DataFrame, also: pd.DataFrame | None = None) -> np.ndarray:
        """vm_operation rows lying in a delivered safepoint of the same name: offline folds a VM
        operation at a safepoint into that safepoint (a re-read chunk whose SafepointEnd was
        not flushed yet shows it alone)."""
        out = np.zeros(len(frame), dtype=bool)
        ops = np.flatnonzero(frame["kind"].astype(str).to_numpy() == "vm_operation")
        sp = [self._safepoints] if self._safepoints is not None else []
        if also is not None:
            sp.append(also.loc[also["kind"].astype(str) == "safepoint", ["start_ns", "end_ns", "name"]])
        sp = [f for f in sp if len(f)]
        if not len(ops) or not sp:
            return out
        sp = pd.concat(sp, ignore_index=True)
        for i in ops:
            s, e, name = int(frame["start_ns"].iloc[i]), int(frame["end_ns"].iloc[i]), frame["name"].iloc[i]
            out[i] = bool(((sp["start_ns"] <= s + self.MATCH_NS) & (sp["end_ns"] >= e - self.MATCH_NS) & (sp["name"] == name)).any())
        return out

    def _repository_loop(self) -> None:
        """Re-reads the repository off the live loop (a read takes tenths of a second: the
        ring's rows must not wait for it). Until the repository side is done (its final read
        delivered): not `self.done`, which poll() sets for a moment when the ring closes."""
        # (the first read waits while the JVM starts, unless it is closing: its rows are late
        # anyway, and its read, holding the GIL in part, would stretch the steps that bring the
        # ring's first rows)
        self._hurry.wait(self.FIRST_READ_AFTER_S)
        while True:
            try:
                frame = self.repository.poll()
                self._batches.put((frame, self.repository.done))
            except Exception as err:  # reported as the source's problem; the ring goes on
                self._batches.put((pd.DataFrame(), True))
                self.problem = self.problem or f"reading the JFR repository: {err}"
                return
            if self.repository.done:
                return
            if self._hurry.is_set():  # the JVM is closing: recording.jfr soon, without spinning beside its exit
                time.sleep(self.CLOSING_EVERY_S)
            else:
                self._hurry.wait(self.REPOSITORY_EVERY_S)

    def poll(self) -> pd.DataFrame:
        import queue

        if not self._ring_done:
            ring = super().poll()  # may set done (producer closed the ring / exited)
            self._ring_done = self.done
            self.done = False
        else:
            ring = pd.DataFrame()
        ring_done = self._ring_done
        if len(ring):
            # An unmatched safepoint (the agent closed its stream before the End, e.g. JFR's own
            # end-of-recording safepoints at exit) comes from the repository / recording.jfr
            # instead, whole or unmatched as offline reads it.
            ring = ring[np.isin(ring["kind"].to_numpy(dtype=object), self.RING_KINDS) & ~ring["unmatched"].to_numpy(bool)]
            keep = np.array([self._match(k, s, e) is None for k, s, e in
                             zip(ring["kind"].astype(str), ring["start_ns"].tolist(), ring["end_ns"].tolist())], dtype=bool)
            ring = ring[keep].reset_index(drop=True)  # a pause the repository delivered first
            self._remember(ring)
            self.ring_rows += len(ring)
            if len(ring):
                self._last_ring_end = max(self._last_ring_end or 0, int(ring["end_ns"].max()))
        frames = [ring]
        if self._thread is None:
            self._batches = queue.Queue()
            self._hurry = threading.Event()
            self._thread = threading.Thread(target=self._repository_loop, name=f"tandem-live-{self.label}-repository", daemon=True)
            self._thread.start()
        if ring_done:
            self._hurry.set()  # the JVM is closing: read recording.jfr as soon as it is there
        batches = []
        while True:
            try:
                batches.append(self._batches.get_nowait())
            except queue.Empty:
                break
        repo_frames = [self._held] if self._held is not None and len(self._held) else []
        for frame, repo_done in batches:
            self._repo_done = self._repo_done or repo_done
            if len(frame):
                repo_frames.append(frame)
        # Final: the ring is closed and the repository side has read recording.jfr (or the
        # last chunks of a JVM gone): nothing more can come from either.
        final = ring_done and self._repo_done
        # Held rows wait for the ring to go past them: look at them again only when something
        # new came from either side (a reconcile costs tens of ms).
        now = time.monotonic()
        if repo_frames and (batches or final or (len(ring) and now - self._last_reconcile >= 1.0)):
            self._last_reconcile = now
            self._held = None
            repo = pd.concat(repo_frames, ignore_index=True) if len(repo_frames) > 1 else repo_frames[0]
            frames.append(self._reconcile(repo, final))
        # Once the ring is closed, done when the repository side is too, or when this JVM has
        # no repository at all (nothing to reconcile).
        self.done = ring_done and (self._repo_done or not (self.directory / REPOSITORY).exists())
        if self.repository.problem and not self.problem:
            self.problem = self.repository.problem
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else ring

    def _reconcile(self, repo: pd.DataFrame, final: bool) -> pd.DataFrame:
        kinds = repo["kind"].astype(str).tolist()
        starts, ends = repo["start_ns"].tolist(), repo["end_ns"].tolist()
        fresh = np.ones(len(repo), dtype=bool)
        for i, (k, s, e) in enumerate(zip(kinds, starts, ends)):
            hit = self._match(k, s, e)
            if hit is not None:
                fresh[i] = False
                self.matched_rows += 1
                if len(self._shifts) < 10_000:
                    self._shifts.append(hit - int(s))
        new = repo[fresh].reset_index(drop=True)
        if len(new):
            new = new[~self._inside_safepoint(new, also=new)].reset_index(drop=True)
        if not final and len(new) and "at_safepoint" in new.columns:
            # A VM operation run at a safepoint this read has not got whole (its Begin/End in
            # another chunk, or not flushed): offline names that safepoint after it. Held until
            # a safepoint containing it is delivered (then dropped) or the final read.
            wait_op = (new["kind"].astype(str).to_numpy() == "vm_operation") & new["at_safepoint"].fillna(False).astype(bool).to_numpy()
            held_ops, new = new[wait_op], new[~wait_op].reset_index(drop=True)
        else:
            held_ops = None
        if not final and len(new):
            last_ring_end = self._last_ring_end
            wait = new["kind"].astype(str).isin(self.RING_KINDS).to_numpy() & (
                True if last_ring_end is None else (new["end_ns"].to_numpy() >= last_ring_end))
            self._held = new[wait].reset_index(drop=True)
            new = new[~wait].reset_index(drop=True)
        if held_ops is not None and len(held_ops):
            self._held = pd.concat([self._held, held_ops], ignore_index=True) if self._held is not None else held_ops.reset_index(drop=True)
        if len(new):
            shift = int(np.median(self._shifts)) if self._shifts else 0
            new["start_ns"] = new["start_ns"] + shift
            new["end_ns"] = new["end_ns"] + shift
            self._remember(new)
            self._seen(new)
            self.repository_rows += len(new)
        return new

    def status(self) -> dict:
        out = PauseRingSource.status(self)
        out.update(ring_rows=self.ring_rows, repository_rows=self.repository_rows, matched=self.matched_rows)
        return out


class SessionWatcher:
    """New `py-*` and `jvm-*` directories of SESSION, each turned into its source once."""

    def __init__(self, session: Path):
        self.session = Path(session)
        self.gil: dict[Path, GilRingSource] = {}
        self.jvm: dict[Path, _PauseSource] = {}
        self.events: list[str] = []  # human-readable discoveries and exits, for the view
        self.scanned_ns: int | None = None  # when the last scan began (the watermark's bound for processes not found yet)

    def scan(self) -> None:
        self.scanned_ns = time.monotonic_ns()
        for directory in sorted(self.session.glob(PYTHON_DIRS)):
            if directory.is_dir() and directory not in self.gil:
                self.gil[directory] = GilRingSource(directory)
                self.events.append(f"{directory.name}: Python process found")
        for directory in sorted(self.session.glob(JVM_DIRS)):
            if not directory.is_dir() or directory in self.jvm:
                continue
            # The agent writes jvm.json once it has started, the window of its own start-up's
            # operations in it (asked_by_tandem): until then, even with its ring made, it is
            # still starting (look again next scan), unless it failed or its JVM is gone.
            if not ((directory / JVM_JSON).exists() or (directory / AGENT_ERROR).exists() or _jvm_gone(directory)):
                continue
            source = (RingWithRepositorySource(directory) if (directory / PAUSES_RING).exists()
                      else RepositorySource(directory))
            self.jvm[directory] = source
            self.events.append(f"{directory.name}: JVM found, pauses from its {source.how}")


def _jvm_gone(directory: Path) -> bool:
    """The JVM of a session's jvm-<pid> directory has exited (a directory not so named: not known gone)."""
    pid = pid_from_name(directory.name)
    return pid is not None and not process_alive(pid)
