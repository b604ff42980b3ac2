"""Readers of tandem's shared-memory ring and of its drained events files (docs/ring.md).

    from engine.ring import RingTailer, read_events
    with RingTailer("SESSION/py-123/gil.ring") as tail:    # live: new records per poll
        batch = tail.poll()                                 # numpy structured array
    events = read_events("SESSION/py-123/gil.events")      # offline: everything drained
    timeline = by_time(events.records)                      # records come lane by lane

Order (format v2, per-thread lanes): records are in production order per lane, hence per
thread; across lanes only their timestamps order them.

Pure Python + numpy: the reader never needs the native probe.
"""
from engine.ring.layout import (
    GIL_DROP,
    GIL_RECORD_DTYPE,
    GIL_SAMPLE_FREE,
    GIL_SAMPLE_HELD,
    GIL_TAKE_ACQUIRED,
    GIL_TAKE_REQUEST,
    LANE_DTYPE,
    LOST_MARKER,
    PAUSE_RECORD_DTYPE,
    RECORD_TYPE_GIL,
    RECORD_TYPE_PAUSE,
    RingHeader,
    current_boot_id,
    parse_header,
)
from engine.ring.reader import EventsFile, RingTailer, by_time, read_events, read_ring

__all__ = [
    "EventsFile",
    "GIL_DROP",
    "GIL_RECORD_DTYPE",
    "GIL_SAMPLE_FREE",
    "GIL_SAMPLE_HELD",
    "GIL_TAKE_ACQUIRED",
    "GIL_TAKE_REQUEST",
    "LANE_DTYPE",
    "LOST_MARKER",
    "PAUSE_RECORD_DTYPE",
    "RECORD_TYPE_GIL",
    "RECORD_TYPE_PAUSE",
    "RingHeader",
    "RingTailer",
    "by_time",
    "current_boot_id",
    "parse_header",
    "read_events",
    "read_ring",
]
