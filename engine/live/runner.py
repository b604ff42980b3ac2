"""The live loop: the live sources' polls as the steps of the core's driver (engine/correlate/drive.py).

Each step reads what the sources have (pause rings or the JFR repository, GIL rings), pushes it
to the core with the watermark and the GIL intervals open now, and hands the rows that came out
to the writer, the alerts and the view: the pauses read and their overlaps rows with closed GIL
intervals at once (the core's eager_pairs), pause_impact and gil_free rows once final.
`tandem analyze` runs the same driver over a recorded session (engine/analysis/stream.py).
"""
from __future__ import annotations

import collections
import gc
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.correlate import Correlator, GilRows, Rows
from engine.correlate.core import warm_up
from engine.correlate.drive import Step, run_core
from engine.correlate.inputs import gil_rows_from_frame
from engine.correlate.schema import END, GIL_COLUMNS, GIL_STATES, core_columns, empty_frame, to_pandas
from engine.live import watermark as wm
from engine.live.alerts import Alerts
from engine.analysis.causes import warm_up as warm_up_causes
from engine.live.causes import LiveCauses
from engine.live.lifetimes import ProcLifetimes
from engine.live.memory import release_free_memory
from engine.live.repository import RepositorySource
from engine.live.sources import SessionWatcher
from engine.live.writer import RollingWriter
from engine.memory.follow import MemoryFollower
from engine.session import SESSION_JSON, process_alive, read_json
from engine.spans.live import DUE_AFTER_REPOSITORY_NS, DUE_AFTER_RING_NS

GIL_POLL_S = 0.2
JVM_POLL_S = 0.5
# With pause rings only: how often the loop looks at them (a ring poll is a few memory reads);
# new pause rows are pushed at once (the GIL rings are polled then too).
RING_POLL_S = 0.05
SCAN_EVERY_S = 0.2
VIEW_EVERY_S = 1.0
# How far behind the watermark a late row (a repository-only pause: start-up, compilation,
# deoptimization; it comes a re-read (5 s) plus a flush late, more on a loaded machine) still
# finds every GIL row offline pairs it with. 30 s of a busy producer's intervals is ~100k rows.
RETAIN_NS = 30_000_000_000
# A full cyclic collection after this many collections of the middle generation (Python's
# default: 10); see run().
FULL_GC_EVERY = 100
# After the command exits, how long to wait for processes it left behind.
LINGER_S = 5.0
# ... and, past it, how long a source whose process has exited may still take to read what it left.
LAST_READ_S = 60.0
LATEST = 16


class LiveRun:
    def __init__(self, session: Path, out: Path, *, roll_ns: int, slack_ns: int = 0, alerts: Alerts | None = None, view=None,
                 follow_recorder: bool = False, spans=None):
        self.session = Path(session)
        self.watcher = SessionWatcher(self.session)
        self.lifetimes = ProcLifetimes()
        self.core = Correlator(slack_ns, lifetimes=self.lifetimes, retain_ns=RETAIN_NS, eager_pairs=True,
                               gil_source=f"{self.session}: GIL rings", pauses_source=f"{self.session}: pauses")
        self.writer = RollingWriter(out, roll_ns, {"session": str(self.session), "slack_ns": int(slack_ns)})
        self.alerts = alerts or Alerts(None)
        self.view = view
        self.watermark_ns: int | None = None
        self._held_until_ns: int | None = None  # a young open release holds W until then (engine/live/watermark.py)
        self.intervals_ns: int | None = None  # W without that hold: the causes' site windows wait for it
        self.follow_recorder = follow_recorder  # `tandem live SESSION`: stop once the session's recorder has finished
        self.stop = threading.Event()        # Ctrl-C / SIGTERM: flush and stop now
        self.command_done = threading.Event()  # `live -- cmd`: the command has exited
        self._next_pause_id = 0
        self._last_jvm_poll = 0.0
        self._last_gil_poll = 0.0
        self._last_scan = 0.0
        self.error: BaseException | None = None
        self.step_seconds: collections.deque[float] = collections.deque(maxlen=10_000)  # the latest steps
        self.overlap_rows = 0
        self.latest_hits: collections.deque[dict] = collections.deque(maxlen=LATEST)  # final pauses that hit Python
        self.memory = MemoryFollower(self.session)  # the processes' memory and who grew (view, metrics)
        self.spans = spans  # engine.spans.live.LiveSpans: received spans, figured as the watermark passes them
        # who asked for each pause: pause_impact rows get their cause columns once those are due
        self.causes = LiveCauses(RETAIN_NS, self._code_names, self.lifetimes.alive)
        self._calls: list[pd.DataFrame] = []

    # ---- one step --------------------------------------------------------------------------

    def _poll_gil(self) -> pd.DataFrame:
        frames = [source.poll() for source in list(self.watcher.gil.values()) if not source.done]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else empty_frame("gil")

    def _poll_jvm(self) -> pd.DataFrame:
        self._last_jvm_poll = time.monotonic()
        sources = [source for source in list(self.watcher.jvm.values()) if not source.done]
        frames = [f for f in (source.poll() for source in sources) if len(f)]
        self._calls.extend(c for c in (s.take_calls() for s in sources) if len(c))
        if not frames:
            return empty_frame("pauses")
        pauses = pd.concat(frames, ignore_index=True).sort_values(["start_ns", "end_ns"], kind="stable", ignore_index=True)
        pauses.insert(0, "pause_id", np.arange(self._next_pause_id, self._next_pause_id + len(pauses), dtype=np.int64))
        # When tandem live read the row (CLOCK_MONOTONIC); arrived_ns (handed to a part) follows.
        pauses["polled_ns"] = np.int64(time.monotonic_ns())
        self._next_pause_id += len(pauses)
        return pauses

    def _rings_only(self) -> bool:
        return bool(self.watcher.jvm) and all(s.how != RepositorySource.how for s in self.watcher.jvm.values())

    def _next_due_ns(self) -> int | None:
        """When (CLOCK_MONOTONIC) the watermark will pass the first pending pause (its rows are
        due at the next push) or a waiting pause_impact row's site window; None: nothing waits."""
        ends = self.core.pending_ends()
        # (while a young open release holds W, it moves when the release closes, seen at the
        # regular GIL polls, or once it is confirmed; the causes' watermark is not held)
        due = [max(int(ends.min()) + self.core.slack_ns + wm.LAG_NS, self._held_until_ns or 0)] if ends.size else []
        causes = self.causes.next_due_ns()
        if causes is not None:
            due.append(causes + wm.LAG_NS)
        return min(due) if due else None

    def _final_due(self, now: float) -> bool:
        due = self._next_due_ns()
        return due is not None and time.monotonic_ns() > due

    def _wait_s(self) -> float:
        """Until the next turn: a poll period, or less when a pending row falls due before it
        (one already due was pushed for in this turn: the watermark may be held back)."""
        poll = RING_POLL_S if self._rings_only() else GIL_POLL_S
        due, now = self._next_due_ns(), time.monotonic_ns()
        return poll if due is None or due <= now else min(poll, (due - now) / 1e9)

    def step(self, *, final: bool = False) -> Step | None:
        """One turn of the loop: the pause sources are polled every RING_POLL_S with pause rings
        (JVM_POLL_S with the JFR repository alone); the GIL rings when pauses came, when a pending
        pause is due, or every GIL_POLL_S; then the core's step (None: nothing to push this turn)."""
        began = time.monotonic()
        if final or began - self._last_scan >= SCAN_EVERY_S:
            self._scan(began)
        rings = self._rings_only()
        pauses = self._poll_jvm() if final or rings or began - self._last_jvm_poll >= JVM_POLL_S else empty_frame("pauses")
        if not (final or len(pauses) or began - self._last_gil_poll >= GIL_POLL_S or self._final_due(began)):
            self._emit_causes()  # (rows that waited for a causes batch)
            return None
        self._last_gil_poll = time.monotonic()
        if self._last_scan < began:
            self._scan(self._last_gil_poll)  # (the watermark is bounded by the last scan: a fresh one)
        # /proc before the rings: a thread gone in the snapshot has all its events in this read.
        self.lifetimes.snapshot([s.pid for s in self.watcher.gil.values() if s.pid])
        return self._step(pauses, self._poll_gil(), final)

    def _scan(self, now: float) -> None:
        self._last_scan = now
        self.watcher.scan()

    def _open_intervals(self) -> tuple[GilRows, np.ndarray]:
        """The GIL intervals open now, of threads alive (one that exited while released leaves no
        interval), and the code of each (its DROP's)."""
        rows = [iv for s in self.watcher.gil.values() if not s.done for iv in s.open_intervals()
                if self.lifetimes.alive(iv[0], iv[1])]
        if not rows:
            return GilRows.empty(), np.zeros(0, np.uint64)
        pid, tid, state, start, code = zip(*rows)
        pid, tid, start = (np.array(c, np.int64) for c in (pid, tid, start))
        return GilRows(pid, tid, np.array(state, np.int8), start, start), np.array(code, np.uint64)

    def _open_now(self) -> tuple[GilRows, np.ndarray]:
        """The intervals open now and their codes, none once the watermark has passed everything."""
        return self._open_intervals() if self.watermark_ns < END else (GilRows.empty(), np.zeros(0, np.uint64))

    def _step(self, pauses: pd.DataFrame, gil: pd.DataFrame, final: bool) -> Step:
        opened = None if final else self._open_intervals()[0]
        releases = None if final else np.array([(b, h) for s in self.watcher.gil.values() if not s.done
                                                for p, t, b, h in s.open_releases() if self.lifetimes.alive(p, t)],
                                               np.int64).reshape(-1, 2)
        intervals = wm.intervals_watermark(self.watcher.gil.values(), self.watcher.scanned_ns)
        w, self._held_until_ns = wm.held_watermark(intervals, releases)
        # (the core reads its columns; the parts get every column of the pauses: `read`)
        return Step(max(w, self.core.watermark_ns), pauses=pauses[core_columns(pauses)] if len(pauses) else None,
                    gil=gil_rows_from_frame(gil[list(GIL_COLUMNS)]) if len(gil) else None, open=opened,
                    read=(pauses, gil, intervals))

    def rows(self, step: Step | None, rows: Rows) -> None:
        """The driver's sink (engine/correlate/drive.py): a push's rows, with what its step read."""
        if step is None:  # (the core's finish)
            self.watermark_ns = self.intervals_ns = END
            self._emit(rows, empty_frame("pauses"), empty_frame("gil"))
            return
        pauses, gil, intervals = step.read
        self.watermark_ns = self.core.watermark_ns
        self.intervals_ns = max(intervals, self.watermark_ns, self.intervals_ns or self.watermark_ns)
        self._emit(rows, pauses, gil)

    def _emit(self, rows: Rows, pauses: pd.DataFrame, gil: pd.DataFrame) -> None:
        """Rows that came out to the current part, the alerts and the view, with the pauses and
        GIL intervals read in this step; pause_impact rows once their causes are due
        (_emit_causes). arrived_ns, when a pause's row was handed over with its first overlaps
        rows (pause end to it: the latency the bench measures)."""
        now = np.int64(time.monotonic_ns())
        # (an empty table is left out: converting it costs more than the rows of a step)
        tables = {name: to_pandas(table, name) if table.num_rows else None for name, table in rows.tables().items()}
        impact, overlaps, free = tables["pause_impact"], tables["overlaps"], tables["gil_free"]
        calls, self._calls = (pd.concat(self._calls, ignore_index=True) if self._calls else None), []
        self.causes.add(pauses, gil, calls, impact)
        gil = gil.drop(columns="code", errors="ignore")  # (the parts' gil table has no code columns)
        if len(pauses):
            pauses = pauses.assign(arrived_ns=now)
        self.overlap_rows += 0 if overlaps is None else len(overlaps)
        self.writer.add(pauses, gil, overlaps, gil_free=free, spans=self._figured_spans(pauses, gil))
        self.alerts.check(None, overlaps)
        self._emit_causes()

    def _emit_causes(self) -> None:
        """The pause_impact rows whose causes are due, with them, to the part, the alerts and
        the view (arrived_ns: when the row was handed over, complete)."""
        if self.intervals_ns is None:
            return
        impact = self.causes.due(self.intervals_ns, self._open_now)
        if impact is None:
            return
        impact = impact.assign(arrived_ns=np.int64(time.monotonic_ns()))
        self.writer.add(None, None, None, pause_impact=impact)
        self.alerts.check(impact, None)
        hits = impact[impact["hit_python"].to_numpy(bool)]
        self.latest_hits.extend(hits[["kind", "name", "start_ns", "end_ns", "duration_ns", "overlap_ns"]].to_dict("records"))

    def _code_names(self, pid: int, codes: np.ndarray) -> pd.DataFrame | None:
        source = next((s for s in self.watcher.gil.values() if s.pid == pid), None)
        return source.code_names(codes) if source is not None else None

    def _figured_spans(self, pauses: pd.DataFrame, gil: pd.DataFrame) -> pd.DataFrame | None:
        """The received spans the watermark has now passed, with their figures (engine/spans/live.py)."""
        if self.spans is None:
            return None
        self.spans.add_rows(pauses, gil)
        if self.watermark_ns is None:
            return None
        # (a stop of the world reaches this loop from the pause ring within a poll, from the JFR repository a re-read later)
        self.spans.due_after_ns = DUE_AFTER_RING_NS if self._rings_only() else DUE_AFTER_REPOSITORY_NS

        def open_gil() -> pd.DataFrame:
            rows, _ = self._open_now()
            return pd.DataFrame({"pid": rows.pid, "tid": rows.tid, "state": np.asarray(GIL_STATES)[np.asarray(rows.state, np.int64)],
                                 "start_ns": rows.start_ns})

        return self.spans.due(self.watermark_ns, open_gil)

    def roll(self, wait: bool = False, final: bool = False) -> None:
        self.writer.roll(self.core.summary(), wait=wait, more={"memory": self.memory.rows_to_write(final)})
        release_free_memory()

    # ---- the loop ----------------------------------------------------------------------------

    def _reading_last(self) -> bool:
        """A source whose process has exited is still reading what it left (a JVM's
        recording.jfr takes seconds to read on a loaded machine): its rows are not lost to
        the linger's end."""
        return any(not s.done and s.pid and not process_alive(s.pid)
                   for s in [*self.watcher.gil.values(), *self.watcher.jvm.values()])

    def all_done(self) -> bool:
        sources = [*self.watcher.gil.values(), *self.watcher.jvm.values()]
        return all(s.done for s in sources)

    def run(self) -> None:
        """Until stop is set, or the command has exited and its processes are done (or LINGER_S)."""
        # Everything loaded so far (pandas, numpy, the JVM bridge: ~160k objects) lives as long
        # as the process: out of the cyclic GC's full collections, which otherwise stop this
        # loop for 0.1-0.4 s every few seconds.
        warm_up()  # (while the command starts: the first pauses do not wait for numba)
        warm_up_causes()
        gc.collect()
        gc.freeze()
        # What the loop makes and keeps (the GIL archive, the kept pauses, pandas' caches) still
        # makes each full collection cost tens of ms with the GIL held; at Python's default one
        # runs every few seconds, and the pause_impact rows due meanwhile wait (their p99 tail).
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, FULL_GC_EVERY)
        self.memory.start()
        try:
            run_core(self.core, self._steps(), [self])
            self.memory.stop()
            self.roll(wait=True, final=True)
            if self.view is not None:
                self.view.update(self)
                self.view.final(self)
        except BaseException as err:  # reported by the caller (the loop may run in a thread)
            self.error = err
            try:
                self.writer.roll(self.core.summary(), wait=True)
            except BaseException:
                pass
            raise

    def _steps(self):
        """The loop's steps, each pushed (and its rows taken) before the loop goes on, until stop
        is set, or the command has exited and its processes are done (or LINGER_S); the last one
        reads everything still readable."""
        last_view = 0.0
        done_since = None
        while not self.stop.is_set():
            began = time.monotonic()
            step = self.step()
            if step is not None:
                yield step
                self.step_seconds.append(time.monotonic() - began)
            if self.writer.due():
                self.roll()
            if self.writer.error is not None:
                raise self.writer.error
            if self.view is not None and time.monotonic() - last_view >= VIEW_EVERY_S:
                last_view = time.monotonic()
                self.view.update(self)
            if self.follow_recorder and "end_monotonic_ns" in read_json(self.session / SESSION_JSON):
                self.command_done.set()  # the recorder (`tandem record`) has seen its command end
            if self.command_done.is_set():
                done_since = done_since or time.monotonic()
                lingered = time.monotonic() - done_since
                if self.all_done() or (lingered > LINGER_S and not (self._reading_last() and lingered < LAST_READ_S)):
                    break
            self.stop.wait(self._wait_s())
        yield self.step(final=True)
