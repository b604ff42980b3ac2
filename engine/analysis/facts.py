"""The facts of one correlation: the pauses put on the GIL side's clock (or refused), and the
header every result file carries (docs/results.md, "Outputs")."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.clock.facts import check_same_clock, clock_facts
from engine.correlate import Correlator
from engine.correlate.tables import check_pauses
from engine.facts import AnalysisFacts, Losses


def aligned_pauses(pauses: pd.DataFrame, pauses_source: str | None, gil_attrs: dict, gil_source: str,
                   offset_ns: int | None):
    """The pauses checked (engine.correlate.tables.check_pauses) and on the GIL side's clock (OFFSET_NS added,
    else both sides must be on one clock); with both sides' clock facts and how they were aligned."""
    pause_clock = clock_facts(pauses.attrs, pauses_source or pauses.attrs.get("source") or "pauses table")
    gil_clock = clock_facts(gil_attrs, gil_source)
    alignment = check_same_clock(pause_clock, gil_clock, offset_ns)
    pauses = check_pauses(pauses, pause_clock.source)
    if offset_ns:
        pauses["start_ns"] = pauses["start_ns"] + offset_ns  # (new columns: the given table's are shared)
        pauses["end_ns"] = pauses["end_ns"] + offset_ns
    return pauses, pause_clock, gil_clock, alignment


def analysis_facts(core: Correlator, pauses: pd.DataFrame, gil_attrs: dict, pause_clock, gil_clock, alignment: str,
                   offset_ns: int | None, duplicate_gil_rows: int, *, gil_table: list[str] | None = None,
                   why: dict | None = None) -> AnalysisFacts:
    """The facts every result file carries (docs/results.md, "Outputs"), from the core and the inputs' metadata."""
    span_start, span_end = (core.span[0], core.span[1]) if core.span_ns or core.pauses or core.gil_intervals else (0, 0)
    jvm_pids = pauses["jvm_pid"].dropna().astype(np.int64).unique() if "jvm_pid" in pauses.columns else []
    return AnalysisFacts(
        span_start_ns=int(span_start),
        span_end_ns=int(span_end),
        python_pids=tuple(core.python_pids()),
        jvm_pids=tuple(sorted(int(p) for p in jvm_pids)),
        pauses=core.pauses,
        gil_intervals=core.gil_intervals,
        losses=Losses.of_inputs(pauses.attrs, gil_attrs, duplicate_gil_rows),
        slack_ns=int(core.slack_ns),
        alignment=alignment,
        offset_ns=offset_ns,
        clock={"pauses": pause_clock, "gil": gil_clock},
        gil_table=None if gil_table is None else tuple(gil_table),
        why=why,
    )
