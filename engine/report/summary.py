"""The summary printed with rich: one header line of facts, then one row per pause kind and name."""
from __future__ import annotations

import math

import pandas as pd

from engine.clock.facts import NOT_RECORDED
from engine.facts import AnalysisFacts, JfrLost
from engine.memory.growth import BUCKET_NAMES
from engine.spans.outputs import hurt_endpoints


JPYPE_GC_LINK_ADVICE = ("JPype's GC link: after a Python garbage collection that grew the process by its high-water mark "
                        "(+20 MiB), JPype called System.gc() holding the GIL; every Python thread waited for the Java "
                        "collection. Make Python garbage less often (reuse buffers, fewer large temporaries) or give the "
                        "JVM a heap that needs no full collection; JPype has no switch for the link.")


def _duration(ns: float | int | None) -> str:
    if ns is None:
        return "?"
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= size:
            return f"{ns / size:.3g} {unit}"
    return f"{ns:g} ns"


def header_line(header: dict) -> str:
    """Recording span, processes, dropped events and clock error in one line."""
    facts = AnalysisFacts.from_metadata(header)
    losses = facts.losses
    recorded = {side: clock for side, clock in facts.clock.items() if clock.method != NOT_RECORDED}
    errors = ", ".join(f"{side} ±{_duration(clock.error_ns)} ({clock.method})" for side, clock in recorded.items())
    python = ", ".join(map(str, facts.python_pids)) or ("none" if "gil" in recorded else "none (no CPython recorded)")
    jvms = ", ".join(map(str, facts.jvm_pids)) or ("unknown" if "pauses" in recorded else "none (no JVM recorded)")
    slack = f"; near misses within {_duration(facts.slack_ns)}" if facts.slack_ns else ""
    if facts.offset_ns is not None:
        slack += f"; pauses shifted by {facts.offset_ns} ns (explicit offset, clocks not checked)"
    drain_lost = f" (+{losses.drain_lost_events} not written: events file)" if losses.drain_lost_events else ""
    return (
        f"span {facts.span_ns / 1e9:.3f} s; Python pids {python}; JVM pids {jvms}; "
        f"{facts.pauses} pauses, {facts.gil_intervals} GIL intervals; "
        f"dropped events {losses.dropped_events}{drain_lost}; {_jfr_lost(losses.jfr_lost)}"
        f"{_kept_windows(losses.kept_windows)}clock error: {errors or 'unknown'}{slack}"
    )


def _kept_windows(windows) -> str:
    """What a flight recorder kept of each process's GIL events, and what it rotated out before."""
    parts = []
    for w in windows:
        kept_s = (w["last_ns"] - w["first_ns"]) / 1e9 if w.get("first_ns") is not None else 0.0
        before = f", {w['rotated_out_events']} earlier events rotated out" if w.get("rotated_out_events") else ""
        parts.append(f"pid {w['pid']} keeps the last {kept_s:.1f} s of GIL events (segments {w['first_segment']}-"
                     f"{w['first_segment'] + max(w['segments'] - 1, 0)}){before}")
    return f"flight recorder: {'; '.join(parts)}; " if parts else ""


def _jfr_lost(lost: JfrLost) -> str:
    if not lost.bytes:
        return ""
    if lost.pause_events is not None:
        events = str(lost.pause_events)
    else:
        events = f"at least {lost.pause_events_at_least}" if lost.pause_events_at_least else "uncounted"
    return f"JFR not read: {lost.bytes} bytes, pause events lost {events} ({'; '.join(lost.chunks)}); "


def _cell(value) -> str:
    """At most about 5 characters: the table must fit an 80-column terminal."""
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return str(value)


def _rate(value: float) -> str:
    for suffix, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return _cell(float(value))


MAX_ROWS_WITHOUT_HITS = 5


def summary_rich_table(summary: pd.DataFrame, header: dict | None = None):
    """A rich Table of the summary (its header line is printed apart, see print_summary), or of
    the stops table (a `part_of` column, engine/correlate/stops.py): one row per stop of the
    world, the pauses inside the stops of a row (its GC pause, its collection) under it as detail."""
    from rich import box
    from rich.table import Table

    header = header or {}
    labels = {
        "pauses": "pauses", "pauses_hit": "hit", "hits_per_hour": "hits/h",
        "mean_overlap_ms": "mean", "p50_overlap_ms": "p50", "p99_overlap_ms": "p99",
        "max_overlap_ms": "max", "total_overlap_ms": "total", "threads_affected": "thr",
    }
    # Columns that can only be zero in this analysis are left out rather than printed empty.
    if header.get("slack_ns"):
        labels["pauses_near_miss"] = "near"
    if "pauses_amplified" in summary and int(summary["pauses_amplified"].sum()) > 0:
        labels["pauses_amplified"] = "ampl"
    stops = "part_of" in summary.columns
    caption = "hit: pauses overlapping a released or waiting Python thread\nthr: Python threads affected"
    if stops:
        caption = ("one row per stop of the world; └ the pauses inside those stops\n"
                   "hit: stops overlapping a released or waiting Python thread\nthr: Python threads affected")
    table = Table(title="JVM pauses that hit Python (overlap times in ms)", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True, caption=caption)
    table.add_column("kind: name", overflow="fold", min_width=22, max_width=34)
    for label in labels.values():
        table.add_column(label, justify="right")

    def cells(row) -> list[str]:
        return [_rate(getattr(row, column)) if column == "hits_per_hour" else _cell(getattr(row, column)) for column in labels]

    detail = summary[summary["part_of"].notna()] if stops else None
    leads = summary[summary["part_of"].isna()] if stops else summary
    hit = leads[leads["pauses_hit"] > 0]
    missed = leads[leads["pauses_hit"] == 0]
    for row in pd.concat([hit, missed.head(MAX_ROWS_WITHOUT_HITS)]).itertuples(index=False):
        table.add_row(f"{row.kind}: {row.name}", *cells(row))
        if stops and row.pauses_hit > 0:
            for inner in detail[detail["part_of"] == f"{row.kind}: {row.name}"].itertuples(index=False):
                table.add_row(f" └ {inner.kind}: {inner.name}", *cells(inner), style="dim")
    if len(missed) > MAX_ROWS_WITHOUT_HITS:
        rest = missed.iloc[MAX_ROWS_WITHOUT_HITS:]
        table.add_row(f"... {len(rest)} more that never hit Python", str(int(rest["pauses"].sum())), "0",
                      *([""] * (len(labels) - 2)), style="dim")
    return table


def print_summary(summary: pd.DataFrame, header: dict, console=None, stops: pd.DataFrame | None = None) -> None:
    """Print the header line, then the stops table (one row per stop of the world, its pauses as
    detail) or, without one, the summary table (to a new rich Console unless one is given)."""
    from rich.console import Console

    console = console or Console()
    console.print(header_line(header), markup=False, highlight=False)
    table = stops if stops is not None and len(stops) else summary
    if len(table):
        console.print(summary_rich_table(table, header))
    else:  # (an empty table says nothing: a session of Python alone, a span with no pause)
        console.print("no JVM pause in these inputs: nothing to correlate", markup=False, highlight=False)
    for line in why_lines(header.get("why") or {}):
        console.print(line, markup=False, highlight=False)


def _where(fact: dict) -> str:
    place = f"{fact['file']}:{fact['line']}" if fact.get("file") and fact.get("line") is not None else fact.get("file") or ""
    return f"{fact['function']} ({place})" if place else str(fact["function"])


def why_lines(why: dict) -> list[str]:
    """Who was hit (the Python code pauses overlapped most) and who caused pauses (Python
    threads that asked the JVM for them), with JPype's GC link named (docs/results.md)."""
    lines = []
    if why.get("functions_hit"):
        lines.append("Python code hit most (total overlap): " + "; ".join(
            f"{_where(f)} {_duration(f['overlap_ns'])}" for f in why["functions_hit"]))
    for cause in why.get("caused_by_python", []):
        held = f", holding the GIL in {cause['held_gil']} (every other Python thread waited)" if cause["held_gil"] else ""
        java = f" through Java {cause['java_frames']}" if cause.get("java_frames") else ""
        link = ""
        if cause["jpype_gc_link"]:
            link = (" - JPype's GC link" if cause["jpype_gc_link"] == cause["stops"]
                    else f" - {cause['jpype_gc_link']} of them JPype's GC link")
        inferred = ""
        if cause.get("inferred"):  # (docs/results.md, "cause_inferred")
            inferred = (" (inferred: JFR named no requester; the one thread holding the GIL through it)"
                        if cause["inferred"] == cause["stops"] else f" ({cause['inferred']} of them inferred)")
        if "set_off_by" in cause:  # JPype's reference-queue thread: set off by a Java collection, not by Python code
            lines.append(f"caused by JPype's reference-queue thread (thread {cause['thread']}, a Java thread running "
                         f"Python's garbage collection; Java {cause['java_frames']}) asked for {cause['stops']} stop(s) of "
                         f"the world, {_duration(cause['duration_ns'])}{held}{link}: {_set_off_by(cause['set_off_by'])}")
            continue
        lines.append(f"caused by Python: thread {cause['thread']} at {_where(cause)}{java} asked for {cause['stops']} "
                     f"stop(s) of the world, {_duration(cause['duration_ns'])}{held}{link}{inferred}")
    if why.get("tandem_start"):
        own = why["tandem_start"]
        lines.append(f"tandem's own: {own['stops']} stop(s) of the world, {_duration(own['duration_ns'])}, as its agent "
                     "started the JVM's recording (JFR's start-up operations, asked for by the thread that started the "
                     "JVM: not the service's)")
    if why.get("jpype_gc_link_stops"):
        lines.append(f"JPype's GC link, {why['jpype_gc_link_stops']} stop(s): {JPYPE_GC_LINK_ADVICE}")
    return lines


def _set_off_by(collections: list[dict]) -> str:
    """What set off stops asked for by JPype's reference-queue thread (why_facts' set_off_by)."""
    named = ", ".join(f"{c['collector']}" + (f" ({c['cause']})" if c["cause"] else "") + f" before {c['stops']}"
                      for c in collections if c["collector"] is not None)
    unknown = sum(c["stops"] for c in collections if c["collector"] is None)
    before = f"set off by the Java collection just before each ({named})" if named else ""
    if unknown:
        before += ("; " if before else "") + f"{unknown} with no Java collection recorded before it"
    return (before + ": a Java collection wakes JPype's reference queue, which collects Python's garbage holding the "
            "GIL and calls System.gc() when the process has grown past JPype's high-water mark; no one Python thread's "
            "code asked (the growth is the whole process's)")


def requests_hurt_lines(requests: pd.DataFrame, limit: int = 5) -> list[str]:
    """Requests hurt (requests.parquet, docs/results.md): the endpoints whose slowest 1% lost the
    largest share of their time to stops of the world and GIL waits, with figures."""
    hurt = hurt_endpoints(requests, limit)
    if not len(hurt):
        return [f"requests hurt: none ({len(requests)} endpoint(s); no slowest 1% lost 1% of its time to pauses or GIL waits)"]
    lines = ["requests hurt (slowest 1% of each endpoint: share of its time in stops of the world / GIL waits):"]
    for row in hurt.itertuples(index=False):
        service = f"{row.service_name} " if isinstance(row.service_name, str) and row.service_name else ""
        lines.append(f"  {service}{row.endpoint}: {row.spans} spans, p99 {row.p99_latency_ms:.3g} ms, "
                     f"{row.tail_lost_share:.0%} lost ({row.tail_pause_share:.0%} stops, {row.tail_gil_wait_share:.0%} "
                     f"GIL waits); p99 pause {row.p99_pause_ms:.3g} ms, p99 GIL wait {row.p99_gil_wait_ms:.3g} ms")
        if isinstance(row.top_stops, str):
            lines.append(f"    cost most: {row.top_stops.split(' | ')[0]}")
    return lines


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def memory_lines(growths: list) -> list[str]:
    """Who grew (engine/memory/growth.py): per process its RSS, the trend of its second half
    split by bucket, and the leak-like growth named with its rate, or that there is none."""
    lines = []
    for g in growths:
        lines.append(f"memory of pid {g.pid} ({g.comm or '?'}): RSS {_bytes(g.rss_first)} -> {_bytes(g.rss_last)} "
                     f"(peak {_bytes(g.rss_peak)}) over {g.span_s:.0f} s; trend {_bytes(g.rss_rate)}/s: "
                     + ", ".join(f"{BUCKET_NAMES[b]} {_bytes(rate)}/s" for b, rate in g.rates.items()))
        if g.leak:
            part = f" ({g.leak_part})" if g.leak_part else ""
            live = f", its live set after GC +{_bytes(g.leak_rate)}/s" if g.leak == "jvm_heap" else ""
            lines.append(f"  leak-like growth: RSS +{_bytes(g.rss_rate)}/s, {g.leak_share:.0%} of it "
                         f"{BUCKET_NAMES[g.leak]}{part} at +{_bytes(g.rates[g.leak])}/s{live}")
        else:
            lines.append("  no leak-like growth")
    return lines
