"""The events reader's common case as one compiled pass (engine/ring/reader.py `_EventsCheck`):
kept apart so that importing the ring package (the probe does) does not import numba."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def records_continue(seq, lane, lane_count, next_seq, counted) -> bool:
    """Whether every record continues its lane: lane < lane_count and seq == that lane's next
    (so no LOST marker either: a marker's seq is 0). On True, next_seq and counted (records per
    lane) are advanced past them; on False, neither has changed."""
    moved = next_seq.copy()
    for i in range(seq.size):
        l = lane[i]
        if l >= lane_count or seq[i] != moved[l]:
            return False
        moved[l] += np.uint64(1)
    for l in range(lane_count):
        counted[l] += np.int64(moved[l] - next_seq[l])
        next_seq[l] = moved[l]
    return True
