"""A (CLOCK_MONOTONIC, wall clock) pair read here, with its error: what session.json, `tandem
live` and `tandem dump` stamp their moments with, and the host offset a recording without
clock syncs is aligned by (align.host_wall_minus_monotonic). The agent's jvm.json
(ClockPair.java) and the probe's ring header (ring.c) read theirs the same way."""
from __future__ import annotations

import time

# Tries of a clock pair: one preempted between its reads brackets milliseconds, not microseconds.
CLOCK_PAIR_TRIES = 5


def clock_pair(tries: int = CLOCK_PAIR_TRIES) -> tuple[int, int, int]:
    """(CLOCK_MONOTONIC, wall clock, error) in ns: the wall clock read between two CLOCK_MONOTONIC
    reads, the tightest bracket of TRIES; the bracket's midpoint, and half of it (rounded up) as
    the error."""
    best = None
    for _ in range(tries):
        before, wall, after = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        if best is None or after - before < best[2]:
            best = (before + (after - before) // 2, wall, after - before)
    monotonic, wall, bracket = best
    return monotonic, wall, bracket // 2 + 1
