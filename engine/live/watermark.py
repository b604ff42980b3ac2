"""The watermark: a time before which no interval still to come can start.

    W = min(GIL side, JVM side, now - NEW_PROCESS_MARGIN)

- GIL side, per Python process still running: the start of its last poll minus
  GIL_MARGIN (an event is stamped before it is committed; a thread preempted in between
  commits late). Intervals still open (a thread released or waiting) do *not* hold W back:
  when they close they are "late" rows and the late lane of engine/live/join.py pairs them.
- JVM side, per JVM still running: where its stream is complete (the last JFR flush read,
  or the pause ring's poll time minus JFR's flush lag) minus a horizon for pauses still in
  progress then: max(PAUSE_HORIZON_MIN, 2 x the longest pause seen from that JVM). Before a
  JVM has delivered anything, its start (jvm.json) bounds it.
- A process not discovered yet starts after now - NEW_PROCESS_MARGIN.

JFR data arrives 0.5 to 1.3 s late from the repository (0.1 to 0.4 s from a pause ring with
the agent's 200 ms flusher), so W trails real time by about that plus the margins: the slower stream
bounds it. Nothing is ever dropped for being late: a row starting before W goes through the
late lane instead of the windowed join.
"""
from __future__ import annotations

import time

from engine.correlate.schema import END

GIL_MARGIN_NS = 1_000_000_000
PAUSE_HORIZON_MIN_NS = 1_000_000_000
NEW_PROCESS_MARGIN_NS = 1_000_000_000


def watermark(gil_sources, jvm_sources, now_ns: int | None = None) -> int:
    now = time.monotonic_ns() if now_ns is None else now_ns
    bounds = [now - NEW_PROCESS_MARGIN_NS]
    for source in gil_sources:
        if source.done:
            continue
        bounds.append((source.frontier_ns if source.frontier_ns is not None else now) - GIL_MARGIN_NS)
    for source in jvm_sources:
        if source.done:
            continue
        horizon = max(PAUSE_HORIZON_MIN_NS, 2 * source.longest_ns)
        if source.frontier_ns is not None:
            bounds.append(source.frontier_ns - horizon)
        else:
            start = source.description.get("start_monotonic_ns")
            bounds.append(int(start) - horizon if isinstance(start, int) else -END)
    return min(bounds)


def oldest_open_interval(gil_sources) -> int | None:
    starts = [s.intervals.oldest_pending_start() for s in gil_sources if not s.done]
    starts = [s for s in starts if s is not None]
    return min(starts) if starts else None
