"""The live terminal view (rich Live, refreshed about once a second) and its plain-text twin.

On a terminal: the rolling stops table (the correlation core's, over the final pauses: one
row per stop of the world, its GC pause and collection under it), the latest final pauses
that hit Python (one per stop), the requests hurt (with spans: the endpoints whose
slowest 1% lost most to stops of the world and GIL waits, over the spans of the last five
minutes, engine/spans/live.py), per-source
lines (where pauses come from: pause ring or JFR repository; dropped/missed GIL events;
clock error), the watermark's lag. Without a terminal (a pipe, a test), one status line
every PLAIN_EVERY_S and every discovery/exit/problem as its own line.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from engine.correlate.stops import stop_ids
from engine.live.watermark import END, GIL_MARGIN_NS
from engine.report.summary import _bytes, _duration, memory_lines, requests_hurt_lines, summary_rich_table


PLAIN_EVERY_S = 10.0
LATEST = 8


def _status_lines(run) -> list[str]:
    statuses = [source.status() for source in (*run.watcher.gil.values(), *run.watcher.jvm.values())]
    # Python processes that exited whole (workers that come and go: thousands) share one line,
    # but for the LATEST of them.
    whole = [s for s in statuses if s["done"] and "received" in s and not (s.get("problem") or s["dropped"] or s["missed"])]
    older = whole[:-LATEST]
    folded = {id(s) for s in older}
    lines = []
    if older:
        lines.append(f"{len(older)} more Python processes exited, each read whole: {sum(s['received'] for s in older)} events")
    for s in statuses:
        if id(s) in folded:
            continue
        state = "exited" if s["done"] else "live"
        if "received" in s:
            text = f"{s['source']} ({s['kind']}, {state}): {s['received']} events, dropped {s['dropped']}, missed {s['missed']}"
        else:
            err = s.get("clock_error_ns")
            text = (f"{s['source']} (pauses from {s['kind']}, {state}): {s['pauses']} pauses, clock error "
                    f"{'±' + _duration(err) if err is not None else 'unknown'}")
        if s.get("problem"):
            text += f"; {s['problem']}"
        lines.append(text)
    return lines


def headline(run) -> str:
    if run.watermark_ns is None:
        lag = "watermark not set yet"
    elif run.watermark_ns >= END:
        lag = "all input read"
    else:
        lag = f"watermark {(time.monotonic_ns() - run.watermark_ns) / 1e9:.1f} s behind"
    core = run.core
    # Said only when it happens: such a pause may miss pairs offline has (docs/live.md).
    beyond = (f" ({core.late_pauses_beyond_retention} older than the GIL rows kept)"
              if core.late_pauses_beyond_retention else "")
    spans = ""
    if run.spans is not None and (run.spans.received or run.spans.refused):
        refused = f", {run.spans.refused} refused" if run.spans.refused else ""
        spans = f", spans {run.spans.received} received / {run.spans.figured} figured{refused}"
    # (the most a GIL event came after the poll that could have read it: the watermark's GIL margin covers it)
    commit_lag = max((s.commit_lag_ns for s in list(run.watcher.gil.values())), default=0)
    return (f"tandem live: {core.pauses} pauses ({len(core.pending_ends())} not final yet), {core.gil_intervals} GIL intervals, "
            f"{run.overlap_rows} overlaps{spans}; {lag}; late rows {core.late_gil_rows} GIL / "
            f"{core.late_pauses} pauses{beyond}; GIL commit lag {_duration(commit_lag)} (margin {_duration(GIL_MARGIN_NS)}); "
            f"parts written {len(run.writer.parts_written)}")


def requests_hurt(run, final: bool = False) -> list[str]:
    """The requests hurt lines of the spans figured so far (none without a receiver or before a span)."""
    requests = run.spans.requests(force=final) if run.spans is not None else None
    return [] if requests is None else requests_hurt_lines(requests)


def latest_hits(run) -> pd.DataFrame:
    """The latest final pauses that hit Python, one row per stop of the world (a GC pause or
    collection inside a safepoint among them is left out: engine/correlate/stops.py)."""
    frame = pd.DataFrame(list(run.latest_hits), columns=["kind", "name", "start_ns", "end_ns", "duration_ns", "overlap_ns"])
    frame = frame.assign(pause_id=np.arange(len(frame), dtype=np.int64))
    frame = frame[stop_ids(frame) == frame["pause_id"].to_numpy()]  # (a stop's own pause)
    return frame.sort_values("end_ns").tail(LATEST)


def render(run):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    summary = run.core.stops()  # one row per stop of the world, its pauses under it
    latest = Table(title="latest pauses that hit Python", title_justify="left", pad_edge=False)
    for column in ("kind: name", "ends (s ago)", "pause", "overlap"):
        latest.add_column(column, justify="left" if column.startswith("kind") else "right")
    now = time.monotonic_ns()
    for row in latest_hits(run).itertuples(index=False):
        latest.add_row(f"{row.kind}: {row.name}", f"{(now - row.end_ns) / 1e9:.1f}", _duration(row.duration_ns), _duration(row.overlap_ns))
    parts = [Text(headline(run)), summary_rich_table(summary, {"slack_ns": run.core.slack_ns}), latest]
    parts += [Text(line, style="yellow" if line.startswith("  leak-like") else "") for line in memory_view_lines(run)]
    parts += [Text(line) for line in requests_hurt(run)]
    parts += [Text(line, style="yellow" if "killed" in line or "exited without" in line else "dim") for line in _status_lines(run)]
    return Group(*parts)


def memory_view_lines(run) -> list[str]:
    """Per process its RSS and who grew over the latest minutes (as `tandem analyze` prints it),
    once the window holds enough samples for a trend; else its RSS alone."""
    memory = run.memory
    if memory is None:
        return []
    snapshot = memory.snapshot
    grew = {g.pid for g in snapshot.growth}
    lines = memory_lines(snapshot.growth)
    lines += [f"memory of pid {pid} ({row.get('comm', '?')}): RSS {_bytes(row['rss'])}"
              for pid, row in sorted(snapshot.latest.items()) if pid not in grew and "rss" in row]
    if memory.problem:
        lines.append(memory.problem)
    return lines


class View:
    def __init__(self, console, live: bool):
        self.console = console
        self.live = live
        self._rich_live = None
        self._last_plain = 0.0
        self._said: set[str] = set()

    def __enter__(self):
        if self.live:
            from rich.live import Live

            self._rich_live = Live(console=self.console, refresh_per_second=1, transient=False, auto_refresh=False)
            self._rich_live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._rich_live is not None:
            self._rich_live.__exit__(*exc)

    def say(self, line: str) -> None:
        """A line that stays (alerts, discoveries, exits)."""
        if self._rich_live is not None:
            self._rich_live.console.print(line, markup=False, highlight=False)
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def update(self, run) -> None:
        for event in run.watcher.events:
            self.say(f"tandem: {event}")
        run.watcher.events.clear()
        if run.spans is not None and run.spans.problem and "spans" not in self._said:
            self._said.add("spans")
            self.say(f"tandem: spans refused: {run.spans.problem}")
        for line in _status_lines(run):
            if ("killed" in line or "exited without" in line) and line.split(":")[0] not in self._said:
                self._said.add(line.split(":")[0])
                self.say(f"tandem: {line}")
        for g in run.memory.snapshot.growth if run.memory is not None else ():
            if g.leak and (g.pid, g.leak) not in self._said:  # a leak named: said once, as a line that stays
                self._said.add((g.pid, g.leak))
                self.say(f"tandem: pid {g.pid} ({g.comm or '?'}): {memory_lines([g])[1].strip()}")
        if self._rich_live is not None:
            self._rich_live.update(render(run), refresh=True)
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            self.say(headline(run))

    def final(self, run) -> None:
        if self._rich_live is not None:
            if run.spans is not None:
                run.spans.requests(force=True)
            self._rich_live.update(render(run), refresh=True)
            return
        self.say(headline(run))
        for line in memory_view_lines(run):
            self.say(line)
        if run.step_seconds:
            import numpy as np

            steps = np.array(run.step_seconds)
            self.say(f"steps (read + correlate + write): {len(steps)}, p50 {np.median(steps):.2f} s, max {steps.max():.2f} s")
        for line in _status_lines(run):
            self.say(line)
        self.console.print(summary_rich_table(run.core.stops(), {"slack_ns": run.core.slack_ns}))
        for line in requests_hurt(run, final=True):
            self.say(line)
