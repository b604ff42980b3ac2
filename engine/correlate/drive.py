"""The one driver of the correlation core: a source's steps pushed to the core in order, the
rows that became final handed to every sink. `tandem analyze`, the fleet's workers and the
notebook (engine/analysis/stream.py: a recorded session's GIL blocks) and `tandem live`
(engine/live/runner.py: what the live sources have at each poll) run it, with steps and sinks
of their own. Adding an output is one more sink."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from engine.correlate.core import Correlator, GilRows, Rows


@dataclass
class Step:
    """One push: the pauses read (checked, in any order), the GIL intervals read and those open
    now, the watermark (no row to come starts before it), and what the source's sinks read
    beside the rows (`read`: a GIL block, the frames polled)."""

    watermark_ns: int
    pauses: pd.DataFrame | None = None
    gil: GilRows | None = None
    open: GilRows | None = None
    read: object = None


class Sink(Protocol):
    def rows(self, step: Step | None, rows: Rows) -> None:
        """ROWS that became final at STEP (None: at the core's finish, nothing more to come)."""


def run_core(core: Correlator, steps: Iterable[Step], sinks: Sequence[Sink]) -> None:
    """Every step pushed to CORE in order, the core finished once they end; each push's rows to
    every sink, in the order given."""
    for step in steps:
        rows = core.push(pauses=step.pauses, gil=step.gil, open=step.open, watermark_ns=step.watermark_ns)
        for sink in sinks:
            sink.rows(step, rows)
    rows = core.finish()
    for sink in sinks:
        sink.rows(None, rows)
