"""The live watermark's bounds (engine/live/watermark.py): the last scan, each process's last
poll less the GIL margin, and young open releases holding it at their start."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.live.watermark import GIL_MARGIN_NS, OPEN_CONFIRM_NS, held_watermark, intervals_watermark

S = 1_000_000_000


def watermark(gil_sources, scanned_ns, releases=None, now_ns=None):
    """W as tandem live makes it at each push: the intervals' watermark, held by young releases."""
    return held_watermark(intervals_watermark(gil_sources, scanned_ns, now_ns), releases)


def _sources(*frontiers, done=()):
    return [SimpleNamespace(frontier_ns=f, done=i in done) for i, f in enumerate(frontiers)]


def test_the_watermark_trails_the_oldest_of_the_last_scan_and_the_last_polls_by_the_margin():
    assert watermark(_sources(10 * S, 12 * S), 11 * S) == (10 * S - GIL_MARGIN_NS, None)
    assert watermark(_sources(10 * S, 12 * S), 9 * S) == (9 * S - GIL_MARGIN_NS, None)
    # a process that has exited and was read to its end bounds nothing
    assert watermark(_sources(10 * S, 12 * S, done={0}), 13 * S) == (12 * S - GIL_MARGIN_NS, None)
    # a process found but never polled, or no scan yet: now
    assert watermark(_sources(None), 20 * S, now_ns=15 * S) == (15 * S - GIL_MARGIN_NS, None)
    assert watermark(_sources(), None, now_ns=15 * S) == (15 * S - GIL_MARGIN_NS, None)


def test_a_young_open_release_holds_the_watermark_where_its_thread_last_took_the_gil():
    poll = 20 * S
    # (release start, when its thread last took the GIL before it)
    young, older_young, old = (poll - S // 2, poll - S // 2 - 5_000), (poll - 3 * S // 4, poll - S), (poll - 2 * S, poll - 3 * S)
    w, held_until = watermark(_sources(poll), poll, np.array([old, young, older_young], np.int64))
    assert (w, held_until) == (poll - S, older_young[0] + OPEN_CONFIRM_NS)
    # the intervals are read up to the margin's bound all the same (what a cause's site window waits for)
    assert intervals_watermark(_sources(poll), poll) == poll - GIL_MARGIN_NS
    # confirmed (it began more than OPEN_CONFIRM before the poll) or none: the margin's W again
    assert watermark(_sources(poll), poll, np.array([old], np.int64)) == (poll - GIL_MARGIN_NS, None)
    assert watermark(_sources(poll), poll, np.zeros((0, 2), np.int64)) == (poll - GIL_MARGIN_NS, None)
    # a thread that took the GIL after the margin's bound holds nothing back
    recent = (poll - GIL_MARGIN_NS // 2, poll - GIL_MARGIN_NS // 3)
    assert watermark(_sources(poll), poll, np.array([recent], np.int64)) == (poll - GIL_MARGIN_NS, None)
