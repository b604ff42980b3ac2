"""The live loop: poll sources, build intervals, join under the watermark, write, alert, show."""
from __future__ import annotations

import collections
import gc
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.live import watermark as wm
from engine.live.alerts import Alerts
from engine.live.impact import empty_gil_free
from engine.live.join import LiveJoin, empty_overlaps
from engine.live.memory import release_free_memory
from engine.live.sources import RepositorySource, SessionWatcher, _read_json
from engine.live.writer import RollingWriter

GIL_POLL_S = 0.2
JVM_POLL_S = 0.5
# With pause rings only: how often the loop looks at them (a ring poll is a few memory reads);
# new pause rows are joined at once (the GIL rings are polled then too).
RING_POLL_S = 0.05
SCAN_EVERY_S = 0.2
# pause_impact / gil_free rows: pauses the watermark has passed are finalized this often
# (engine/live/impact.py; ~50-100 ms of pandas each), right after a push of pause rows: the
# ring's next rows come at the agent's next flush, 0.2 s later.
FINALIZE_EVERY_S = 2.0
VIEW_EVERY_S = 1.0
JOIN_PAUSE_COLUMNS = ("pause_id", "kind", "name", "start_ns", "end_ns")
IMPACT_PAUSE_COLUMNS = ("os_thread_id", "at_safepoint")  # pause amplification (pause_impact)
JOIN_GIL_COLUMNS = ("pid", "tid", "state", "start_ns", "end_ns")
# After the command exits, how long to wait for processes it left behind.
LINGER_S = 5.0

_EMPTY = {
    "pauses": pd.DataFrame({"pause_id": pd.Series([], dtype="int64"), "kind": pd.Series([], dtype="string"),
                            "name": pd.Series([], dtype="string"), "start_ns": pd.Series([], dtype="int64"),
                            "end_ns": pd.Series([], dtype="int64"), "duration_ns": pd.Series([], dtype="int64")}),
    "gil": pd.DataFrame({"pid": pd.Series([], dtype="int64"), "tid": pd.Series([], dtype="int64"),
                         "thread_name": pd.Series([], dtype="string"), "state": pd.Series([], dtype="string"),
                         "start_ns": pd.Series([], dtype="int64"), "end_ns": pd.Series([], dtype="int64")}),
}


def _empty_tables() -> dict[str, pd.DataFrame]:
    from engine.live.impact import LiveImpact

    return dict(_EMPTY, overlaps=empty_overlaps(), gil_free=empty_gil_free(), pause_impact=LiveImpact()._empty_impact())


class LiveRun:
    def __init__(self, session: Path, out: Path, *, roll_ns: int, slack_ns: int = 0, alerts: Alerts | None = None, view=None,
                 follow_recorder: bool = False):
        self.session = Path(session)
        self.watcher = SessionWatcher(self.session)
        self.join = LiveJoin(slack_ns=slack_ns)
        self.writer = RollingWriter(out, roll_ns, {"session": str(self.session), "slack_ns": int(slack_ns)})
        self.alerts = alerts or Alerts(None)
        self.view = view
        self.watermark_ns: int | None = None
        self.follow_recorder = follow_recorder  # `tandem live SESSION`: stop once the session's recorder has finished
        self.stop = threading.Event()        # Ctrl-C / SIGTERM: flush and stop now
        self.command_done = threading.Event()  # `live -- cmd`: the command has exited
        self._next_pause_id = 0
        self._last_jvm_poll = 0.0
        self._last_gil_poll = 0.0
        self._last_scan = 0.0
        self._last_finalize = 0.0
        self._finalizing = None  # (done event, result) of the finalization running on its thread
        self.error: BaseException | None = None
        self.step_seconds: collections.deque[float] = collections.deque(maxlen=10_000)  # the latest steps
        self._gil_pending: list[pd.DataFrame] = []

    # ---- one step --------------------------------------------------------------------------

    def _poll_gil(self) -> pd.DataFrame:
        frames = [source.poll() for source in list(self.watcher.gil.values()) if not source.done]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else _EMPTY["gil"]

    def _poll_jvm(self, force: bool) -> pd.DataFrame:
        self._last_jvm_poll = time.monotonic()
        frames = [source.poll() for source in list(self.watcher.jvm.values()) if not source.done]
        frames = [f for f in frames if len(f)]
        if not frames:
            return _EMPTY["pauses"]
        pauses = pd.concat(frames, ignore_index=True).sort_values(["start_ns", "end_ns"], kind="stable", ignore_index=True)
        pauses.insert(0, "pause_id", np.arange(self._next_pause_id, self._next_pause_id + len(pauses), dtype=np.int64))
        # When tandem live read the row (CLOCK_MONOTONIC); arrived_ns (set once joined) follows.
        pauses["polled_ns"] = np.int64(time.monotonic_ns())
        self._next_pause_id += len(pauses)
        return pauses

    def _rings_only(self) -> bool:
        return bool(self.watcher.jvm) and all(s.how != RepositorySource.how for s in self.watcher.jvm.values())

    def step(self, *, final: bool = False) -> None:
        """One turn of the loop.

        With a pause ring per JVM (the usual case) the rings are polled at every call
        (RING_POLL_S apart): new pause rows are joined at once, with the GIL rings polled
        just before; otherwise the GIL rings are polled every GIL_POLL_S and their intervals
        pushed then. Without rings (JFR repository re-read), the JVMs are polled every
        JVM_POLL_S and the GIL intervals buffered in between."""
        began = time.monotonic()
        if final or began - self._last_scan >= SCAN_EVERY_S:
            self._last_scan = began
            self.watcher.scan()
        rings = self._rings_only()
        if rings and not final:
            pauses = self._poll_jvm(force=True)
            due = len(pauses) > 0 or began - self._last_gil_poll >= GIL_POLL_S
            if not due:
                return
            self._last_gil_poll = time.monotonic()
            gil = self._poll_gil()
        else:
            gil_due = final or began - self._last_gil_poll >= GIL_POLL_S
            if gil_due:
                self._last_gil_poll = began
                gil = self._poll_gil()
                if len(gil):
                    self._gil_pending.append(gil)
            if not (final or began - self._last_jvm_poll >= JVM_POLL_S):
                self._maybe_finalize(began)
                return
            pauses = self._poll_jvm(force=True)
            gil = pd.concat(self._gil_pending, ignore_index=True) if self._gil_pending else _EMPTY["gil"]
            self._gil_pending = []
        self._push(pauses, gil, final)
        if final:
            self._finalize(final=True)
        elif len(pauses) or not rings or began - self._last_finalize >= 3 * FINALIZE_EVERY_S:
            self._maybe_finalize(began)  # (a JVM without pauses for a while: the GIL side still moves on)
        self.step_seconds.append(time.monotonic() - began)

    def _maybe_finalize(self, now: float) -> None:
        self._collect_finalized()
        if now - self._last_finalize >= FINALIZE_EVERY_S and self.watermark_ns is not None and self._finalizing is None:
            self._last_finalize = now
            self._finalize(final=False)

    def _open_intervals(self) -> list:
        return [iv for s in self.watcher.gil.values() if not s.done for iv in s.intervals.open_intervals()]

    def _finalize(self, final: bool) -> None:
        """pause_impact and gil_free rows that became final go to the current part. The costly
        part (the offline pause_impact / gil_free code, 50-300 ms) runs on a thread of its
        own, so that ring rows keep being read and joined meanwhile; the final one here."""
        impact_state = self.join.impact
        if final:
            self._collect_finalized(wait=True)
            job = self.join.prepare_final([], final=True)
            if job is not None:
                self._finalized(*impact_state.compute(job))
            return
        job = self.join.prepare_final(self._open_intervals())
        if job is None:
            return
        pairs = job.get("virtual_pairs")
        if pairs is not None and len(pairs):
            self.writer.add(None, None, pairs)  # overlaps rows, now (see LiveJoin.forget_finalized)
        done = threading.Event()
        result: dict = {}

        def work():
            try:
                result["out"] = impact_state.compute(job)
            except BaseException as err:  # raised in the loop's thread
                result["error"] = err
            finally:
                done.set()

        self._finalizing = (done, result)
        threading.Thread(target=work, name="tandem-live-finalize", daemon=True).start()

    def _collect_finalized(self, wait: bool = False) -> None:
        if self._finalizing is None:
            return
        done, result = self._finalizing
        if wait:
            done.wait()
        if not done.is_set():
            return
        self._finalizing = None
        if "error" in result:
            raise result["error"]
        self._finalized(*result["out"])

    def _finalized(self, impact: pd.DataFrame, free: pd.DataFrame) -> None:
        self.writer.add(None, None, None, pause_impact=impact, gil_free=free)
        if len(impact):
            self.alerts.check_final(self.join, impact)

    def _push(self, pauses: pd.DataFrame, gil: pd.DataFrame, final: bool) -> None:
        if final:
            w = wm.END
        else:
            w = wm.watermark(self.watcher.gil.values(), self.watcher.jvm.values())
        if self.watermark_ns is not None:
            w = max(w, self.watermark_ns)
        # The join needs only these columns (the table check looks at every column it is given:
        # JFR's twenty make it several times slower); the parts get the whole pauses table.
        columns = [*JOIN_PAUSE_COLUMNS, *(c for c in IMPACT_PAUSE_COLUMNS if c in pauses.columns)]
        emitted = self.join.push(pauses[columns], gil[list(JOIN_GIL_COLUMNS)], w,
                                 keep_pauses_from_ns=wm.oldest_open_interval(self.watcher.gil.values()))
        if len(pauses):
            # When the row was in the join (its pairs with every GIL interval arrived so far
            # emitted): arrived_ns - end_ns is the end-of-pause-to-row latency.
            pauses["arrived_ns"] = np.int64(time.monotonic_ns())
        self.watermark_ns = self.join.windowed.watermark_ns
        self.writer.add(pauses, gil, emitted)
        if len(emitted):
            self.alerts.check(self.join, emitted["pause_id"].to_numpy())

    def roll(self, wait: bool = False) -> None:
        self._collect_finalized()
        self.writer.roll(self.join.summary(), _empty_tables(), wait=wait)
        release_free_memory()

    # ---- the loop ----------------------------------------------------------------------------

    def all_done(self) -> bool:
        sources = [*self.watcher.gil.values(), *self.watcher.jvm.values()]
        return all(s.done for s in sources)

    def run(self) -> None:
        """Until stop is set, or the command has exited and its processes are done (or LINGER_S)."""
        last_view = 0.0
        done_since = None
        # Everything loaded so far (pandas, numpy, the JVM bridge: ~160k objects) lives as long
        # as the process: out of the cyclic GC's full collections, which otherwise stop this
        # loop for 0.1-0.4 s every few seconds.
        gc.collect()
        gc.freeze()
        try:
            while not self.stop.is_set():
                self.step()
                if self.writer.due():
                    self.roll()
                if self.writer.error is not None:
                    raise self.writer.error
                if self.view is not None and time.monotonic() - last_view >= VIEW_EVERY_S:
                    last_view = time.monotonic()
                    self.view.update(self)
                if self.follow_recorder and "end_monotonic_ns" in _read_json(self.session / "session.json"):
                    self.command_done.set()  # the recorder (`tandem record`) has seen its command end
                if self.command_done.is_set():
                    done_since = done_since or time.monotonic()
                    if self.all_done() or time.monotonic() - done_since > LINGER_S:
                        break
                self.stop.wait(RING_POLL_S if self._rings_only() else GIL_POLL_S)
            self.finish()
        except BaseException as err:  # reported by the caller (the loop may run in a thread)
            self.error = err
            try:
                self.writer.roll(self.join.summary(), _empty_tables(), wait=True)
            except BaseException:
                pass
            raise

    def finish(self) -> None:
        """Everything still readable, joined with an infinite watermark; the last part written."""
        self.step(final=True)
        self.roll(wait=True)
        if self.view is not None:
            self.view.update(self)
            self.view.final(self)
