"""The watermark: a time before which no GIL interval still to come can start.

    base = min(the start of the last scan for new processes,
               per Python process still running: the start of its last poll)
    W    = min(base - GIL_MARGIN,
               for each release open now that began less than OPEN_CONFIRM before base:
               when its thread last took the GIL before it)

A process's stamps all come after its `py-<pid>` directory exists (the probe makes it, then its
ring, then hooks the GIL), so one not listed by a scan stamps nothing before that scan began.
An event is stamped before it is committed (a thread preempted in between commits late): the
margin covers that; each source keeps the largest such lag it saw (`commit_lag_ns`, in the
headline). Intervals still open (a thread released or waiting) are told to the core at each
push (engine/correlate/core.py, `open`), but a release may never close: a thread ending, a
thread leaving Python for good, a daemon thread asleep when its process exits. Offline has no
interval for such a release, and a thread's lifetime ends with its latest interval
(docs/results.md, "gil_free"), so the stretch it held the GIL before the release counts only if
the release closes. While a release is younger than OPEN_CONFIRM, W stays where that stretch
began: a thread gone by then ends, live as offline, with its latest interval; one that lives on
past it is taken as alive (holding, then released), which offline has only if it takes the GIL
again.

Pauses do not bound W: one that arrives after W passed it (JFR delivers 0.1 to 1.3 s after a
pause's end; repository-only pauses seconds later) is a late row the core accepts, finding the
GIL rows it kept `retain_ns` behind W. A pause is final once W has passed its end plus the
slack, so W's lag behind real time (LAG_NS, unless a young release holds it) is the latency of
its pause_impact row (its pairs with closed GIL intervals come before: the core's eager_pairs).
"""
from __future__ import annotations

import time

import numpy as np

from engine.correlate.schema import END

# A thread preempted between its stamp and its commit is late by a scheduling delay (ms);
# the largest lag seen is in the headline and the bench.
GIL_MARGIN_NS = 250_000_000
OPEN_CONFIRM_NS = 1_000_000_000
LAG_NS = GIL_MARGIN_NS  # how far W trails the last poll, but while a young open release holds it


def intervals_watermark(gil_sources, scanned_ns: int | None, now_ns: int | None = None) -> int:
    """base - GIL_MARGIN for the sources' last polls and the last scan (SCANNED_NS, None: none
    yet: now): every GIL interval starting before it has been read (closed, or open now). What
    needs the intervals and not the lifetimes (a live cause's site window) waits for this one,
    not for a young release's hold."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    base = min([now if scanned_ns is None else scanned_ns,
                *(now if s.frontier_ns is None else s.frontier_ns for s in gil_sources if not s.done)])
    return base - GIL_MARGIN_NS


def held_watermark(intervals_ns: int, releases: np.ndarray | None) -> tuple[int, int | None]:
    """W: the intervals' watermark INTERVALS_NS, held by the young ones among RELEASES (rows: the
    start of a release open now, and when its thread last took the GIL before it); and when the
    release holding it is confirmed (a poll begun then lets W past it), None: none holds it."""
    w, base = intervals_ns, intervals_ns + GIL_MARGIN_NS
    if releases is not None and len(releases):
        young = releases[releases[:, 0] > base - OPEN_CONFIRM_NS]
        if young.size and int(young[:, 1].min()) < w:
            first = int(np.argmin(young[:, 1]))
            return int(young[first, 1]), int(young[first, 0]) + OPEN_CONFIRM_NS
    return w, None


__all__ = ["END", "GIL_MARGIN_NS", "LAG_NS", "OPEN_CONFIRM_NS", "held_watermark", "intervals_watermark"]
