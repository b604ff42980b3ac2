"""The live loop: poll sources, build intervals, join under the watermark, write, alert, show."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.live import watermark as wm
from engine.live.alerts import Alerts
from engine.live.join import LiveJoin, empty_overlaps
from engine.live.sources import RepositorySource, SessionWatcher, _read_json
from engine.live.writer import RollingWriter

GIL_POLL_S = 0.2
JVM_POLL_S = 0.5
VIEW_EVERY_S = 1.0
JOIN_PAUSE_COLUMNS = ("pause_id", "kind", "name", "start_ns", "end_ns")
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
        self.error: BaseException | None = None
        self.step_seconds: list[float] = []
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
        # When tandem live had the row (CLOCK_MONOTONIC): arrived_ns - end_ns is the latency.
        pauses["arrived_ns"] = np.int64(time.monotonic_ns())
        self._next_pause_id += len(pauses)
        return pauses

    def step(self, *, final: bool = False) -> None:
        """Poll the GIL rings (every call: rings are bounded, keep up with them); every
        JVM_POLL_S (JFR flushes once a second) poll the JVMs and push both sides to the join."""
        began = time.monotonic()
        self.watcher.scan()
        # A pause ring is cheap to poll: every step then, and first (its rows' arrival is not
        # held back by the GIL side's work).
        rings = self.watcher.jvm and all(s.how != RepositorySource.how for s in self.watcher.jvm.values())
        due = final or time.monotonic() - self._last_jvm_poll >= (GIL_POLL_S if rings else JVM_POLL_S)
        pauses = self._poll_jvm(force=True) if due and rings and not final else None
        gil = self._poll_gil()
        if len(gil):
            self._gil_pending.append(gil)
        if not due:
            return
        if pauses is None:
            pauses = self._poll_jvm(force=True)
        gil = pd.concat(self._gil_pending, ignore_index=True) if self._gil_pending else _EMPTY["gil"]
        self._gil_pending = []
        if final:
            w = wm.END
        else:
            w = wm.watermark(self.watcher.gil.values(), self.watcher.jvm.values())
        if self.watermark_ns is not None:
            w = max(w, self.watermark_ns)
        # The join needs only these columns (the table check looks at every column it is given:
        # JFR's twenty make it several times slower); the parts get the whole pauses table.
        emitted = self.join.push(pauses[list(JOIN_PAUSE_COLUMNS)], gil[list(JOIN_GIL_COLUMNS)], w,
                                 keep_pauses_from_ns=wm.oldest_open_interval(self.watcher.gil.values()))
        self.watermark_ns = self.join.windowed.watermark_ns
        self.writer.add(pauses, gil, emitted)
        if len(emitted):
            self.alerts.check(self.join, emitted["pause_id"].to_numpy())
        self.step_seconds.append(time.monotonic() - began)

    def roll(self) -> None:
        self.writer.roll(self.join.summary(), dict(_EMPTY, overlaps=empty_overlaps()))

    # ---- the loop ----------------------------------------------------------------------------

    def all_done(self) -> bool:
        sources = [*self.watcher.gil.values(), *self.watcher.jvm.values()]
        return all(s.done for s in sources)

    def run(self) -> None:
        """Until stop is set, or the command has exited and its processes are done (or LINGER_S)."""
        last_view = 0.0
        done_since = None
        try:
            while not self.stop.is_set():
                self.step()
                if self.writer.due():
                    self.roll()
                if self.view is not None and time.monotonic() - last_view >= VIEW_EVERY_S:
                    last_view = time.monotonic()
                    self.view.update(self)
                if self.follow_recorder and "end_monotonic_ns" in _read_json(self.session / "session.json"):
                    self.command_done.set()  # the recorder (`tandem record`) has seen its command end
                if self.command_done.is_set():
                    done_since = done_since or time.monotonic()
                    if self.all_done() or time.monotonic() - done_since > LINGER_S:
                        break
                self.stop.wait(GIL_POLL_S)
            self.finish()
        except BaseException as err:  # reported by the caller (the loop may run in a thread)
            self.error = err
            try:
                self.writer.roll(self.join.summary(), dict(_EMPTY, overlaps=empty_overlaps()))
            except BaseException:
                pass
            raise

    def finish(self) -> None:
        """Everything still readable, joined with an infinite watermark; the last part written."""
        self.step(final=True)
        self.roll()
        if self.view is not None:
            self.view.update(self)
            self.view.final(self)
