"""The facts of one correlation: the pauses put on the GIL side's clock (or refused), and the
header every result file carries (docs/results.md, "Outputs")."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.clock.facts import check_same_clock, clock_facts
from engine.correlate import Correlator
from engine.correlate.tables import check_pauses


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


def result_header(core: Correlator, pauses: pd.DataFrame, gil_attrs: dict, pause_clock, gil_clock, alignment: str,
            offset_ns: int | None, duplicate_gil_rows: int) -> dict:
    """The facts every result file carries (docs/results.md, "Outputs")."""
    span_start, span_end = (core.span[0], core.span[1]) if core.span_ns or core.pauses or core.gil_intervals else (0, 0)
    jvm_pids = pauses["jvm_pid"].dropna().astype(np.int64).unique() if "jvm_pid" in pauses.columns else []
    return {
        "span_start_ns": int(span_start),
        "span_end_ns": int(span_end),
        "span_ns": int(span_end - span_start),
        "python_pids": core.python_pids(),
        "jvm_pids": sorted(int(p) for p in jvm_pids),
        "pauses": core.pauses,
        "gil_intervals": core.gil_intervals,
        "dropped_events": _dropped_events(gil_attrs),
        "drain_lost_events": _dropped_events(gil_attrs, "drain_lost"),
        # a flight recorder's GIL window: what its segments keep, what rotation took before it
        "kept_windows": [{"pid": p.get("pid"), **p["kept_window"]} for p in gil_attrs.get("processes") or []
                         if p.get("kept_window")],
        "jfr_lost": _jfr_lost(pauses.attrs),
        "jvm_unflushed": [s["unflushed"] for s in pauses.attrs.get("sources") or [] if s.get("unflushed")],
        "duplicate_gil_rows_dropped": int(duplicate_gil_rows),
        "slack_ns": int(core.slack_ns),
        "alignment": alignment,
        "offset_ns": offset_ns,
        "clock": {"pauses": pause_clock.as_metadata(), "gil": gil_clock.as_metadata()},
    }


def _dropped_events(attrs: dict, key: str = "dropped") -> int:
    processes = attrs.get("processes")
    if processes:
        return int(sum(p.get(key) or 0 for p in processes))
    return int(attrs.get(key) or 0)


def _jfr_lost(attrs: dict) -> dict:
    """What ingest could not read of the JFR files (docs/pauses.md, "Damage"): bytes, pause
    events (None when some loss could not be counted) and one line per chunk."""
    sources = attrs.get("sources") or []
    damage = [d for s in sources for d in s.get("damage") or []]
    cut = [s for s in sources if s.get("lost_bytes")]
    counts = [d.get("lost_pause_events") for d in damage] + [None for _ in cut]
    return {
        "bytes": int(sum(d["lost_bytes"] for d in damage) + sum(s["lost_bytes"] for s in cut)),
        "pause_events": None if None in counts else int(sum(counts)),
        "pause_events_at_least": int(sum(d.get("lost_pause_events") if d.get("lost_pause_events") is not None
                                         else d.get("lost_pause_events_at_least") or 0 for d in damage)),
        "chunks": [f"{s['source']} chunk {d['chunk']}: from byte {d['from_byte']}, {d['lost_bytes']} bytes"
                   for s in sources for d in s.get("damage") or []]
                  + [f"{s['source']}: last {s['lost_bytes']} bytes (incomplete chunk)" for s in cut],
    }
