"""`make bench`: every benchmark runs side by side with its anchor in one run, reported as ratios.

Each `bench/bench_*.py` module defines `main(console) -> list[Row]`; `python -m bench`
runs them all (or those named on the command line) and prints one table.
"""
from dataclasses import dataclass


@dataclass
class Row:
    area: str        # "ingest", "probe", "join", ...
    what: str        # what was measured, e.g. "tandem ingest vs EventStream.openFile"
    ours: float      # seconds (or ns/event, see unit)
    anchor: float    # same unit, the anchor's figure
    unit: str        # "s", "ns/event", "events/s"
    goal: str        # the bar from the issue, e.g. "<= 1.5x"
    ratio_ok: bool | None  # whether the bar is met; None: a row without a bar (a floor, a breakdown)

    @property
    def ratio(self) -> float:
        return self.ours / self.anchor if self.anchor else float("inf")
