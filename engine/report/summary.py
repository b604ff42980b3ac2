"""The summary printed with rich: one header line of facts, then one row per pause kind and name."""
from __future__ import annotations

import math

import pandas as pd


def _duration(ns: float | int | None) -> str:
    if ns is None:
        return "?"
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= size:
            return f"{ns / size:.3g} {unit}"
    return f"{ns:g} ns"


def header_line(header: dict) -> str:
    """Recording span, processes, dropped events and clock error in one line."""
    span_s = header.get("span_ns", 0) / 1e9
    clocks = header.get("clock", {})
    errors = ", ".join(f"{side} ±{_duration(facts.get('error_ns'))} ({facts.get('method')})" for side, facts in clocks.items())
    python = ", ".join(map(str, header.get("python_pids", []))) or "none"
    jvms = ", ".join(map(str, header.get("jvm_pids", []))) or "unknown"
    slack = f"; near misses within {_duration(header['slack_ns'])}" if header.get("slack_ns") else ""
    if header.get("offset_ns") is not None:
        slack += f"; pauses shifted by {header['offset_ns']} ns (explicit offset, clocks not checked)"
    return (
        f"span {span_s:.3f} s; Python pids {python}; JVM pids {jvms}; "
        f"{header.get('pauses', 0)} pauses, {header.get('gil_intervals', 0)} GIL intervals; "
        f"dropped events {header.get('dropped_events', 0)}; clock error: {errors or 'unknown'}{slack}"
    )


def _cell(value) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}"
    return str(value)


def summary_rich_table(summary: pd.DataFrame, header: dict | None = None):
    """A rich Table of the summary (its header line is printed apart, see print_summary)."""
    from rich import box
    from rich.table import Table

    # Light borders: 13 columns must stay readable in an 80-column terminal.
    table = Table(title="JVM pauses that hit Python", box=box.SIMPLE_HEAD, pad_edge=False)
    labels = {
        "kind": "kind", "name": "name", "pauses": "pauses", "pauses_hit": "hit Python", "hits_per_hour": "hits/h",
        "mean_overlap_ms": "mean ms", "p50_overlap_ms": "p50 ms", "p99_overlap_ms": "p99 ms",
        "max_overlap_ms": "max ms", "total_overlap_ms": "total ms", "threads_affected": "threads",
        "pauses_near_miss": "near misses", "pauses_amplified": "amplified",
    }
    for column, label in labels.items():
        if column in ("kind", "name"):
            table.add_column(label, overflow="fold", min_width=8)
        else:
            table.add_column(label, justify="right")
    for row in summary.itertuples(index=False):
        table.add_row(*(_cell(getattr(row, column)) for column in labels))
    return table


def print_summary(summary: pd.DataFrame, header: dict, console=None) -> None:
    """Print the header line, then the summary table (to a new rich Console unless one is given)."""
    from rich.console import Console

    console = console or Console()
    console.print(header_line(header), markup=False, highlight=False)
    console.print(summary_rich_table(summary, header))
