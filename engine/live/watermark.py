"""The watermark: a time before which no GIL interval still to come can start.

    W = min(per Python process still running: the start of its last poll - GIL_MARGIN,
            now - NEW_PROCESS_MARGIN  (a process not discovered yet starts after that))

An event is stamped before it is committed (a thread preempted in between commits late): the
margin covers that. Intervals still open (a thread released or waiting) do not hold W back:
the core is told about them at each push (engine/correlate/core.py, `open`). Pauses do not
bound W either: one that arrives after W passed it (JFR delivers 0.1 to 1.3 s after a pause's
end; repository-only pauses seconds later) is a late row the core accepts, finding the GIL
rows it kept `retain_ns` behind W. A pause is final once W has passed its end plus the slack,
so W's lag behind real time (LAG_NS) is the latency of its pause_impact row (its pairs with
closed GIL intervals come before: the core's eager_pairs).
"""
from __future__ import annotations

import time

from engine.correlate.schema import END

GIL_MARGIN_NS = 1_000_000_000
NEW_PROCESS_MARGIN_NS = 1_000_000_000
LAG_NS = max(GIL_MARGIN_NS, NEW_PROCESS_MARGIN_NS)  # how far W trails real time at most, besides a poll


def watermark(gil_sources, now_ns: int | None = None) -> int:
    now = time.monotonic_ns() if now_ns is None else now_ns
    bounds = [now - NEW_PROCESS_MARGIN_NS]
    for source in gil_sources:
        if source.done:
            continue
        bounds.append((source.frontier_ns if source.frontier_ns is not None else now) - GIL_MARGIN_NS)
    return min(bounds)


__all__ = ["END", "GIL_MARGIN_NS", "LAG_NS", "NEW_PROCESS_MARGIN_NS", "watermark"]
