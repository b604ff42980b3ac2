"""Correlation: JVM pauses and GIL intervals on one clock, joined into the result tables.

    from engine.analysis import correlate
    result = correlate(pauses_df, gil_df, slack_ns=50_000_000)
    result.summary()                     # rich table, returns the summary DataFrame
    result.timeline(t0, t1, "t.png")     # matplotlib Figure
    result.write("OUT")                  # the Parquet files of docs/results.md

Input tables and output schemas: docs/results.md. Join semantics: docs/join.md.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from engine.analysis.stream import MemorySink, StreamedAnalysis, analyze_streamed, drive
from engine.correlate import RESULT_TABLES
from engine.correlate.schema import empty_frame
from engine.facts import AnalysisFacts
from engine.ingest.gil import SampledRecords
from engine.ingest.gil_stream import FrameGil
from engine.ingest.inputs import gil_from, pauses_from, streamable_gil
from engine.report.summary import print_summary
from engine.report.timeline import draw_timeline
from engine.results import Results, worst_window
from engine.store import write_table


@dataclass
class Analysis:
    """The result tables of one correlation (schemas: docs/results.md) and the facts about it."""

    pauses: pd.DataFrame
    gil: pd.DataFrame
    gil_free: pd.DataFrame
    overlaps: pd.DataFrame
    pause_impact: pd.DataFrame
    summary_table: pd.DataFrame
    header: dict = field(default_factory=dict)
    stops: pd.DataFrame = field(default_factory=lambda: empty_frame("stops"))

    @property
    def facts(self) -> AnalysisFacts:
        """The header as typed facts (engine.facts): span, processes, losses, clocks."""
        return AnalysisFacts.from_metadata(self.header)

    def tables(self) -> dict[str, pd.DataFrame]:
        """The result tables by file stem (summary and stops included)."""
        return {name: getattr(self, "summary_table" if name == "summary" else name) for name in RESULT_TABLES}

    def summary(self, console=None, show: bool = True) -> pd.DataFrame:
        """Print the summary with its header line (rich) unless show=False; return the summary table."""
        if show:
            print_summary(self.summary_table, self.header, console=console, stops=self.stops)
        return self.summary_table

    def timeline(self, start_ns: int | None = None, end_ns: int | None = None, path: str | os.PathLike | None = None):
        """A matplotlib Figure of [start_ns, end_ns) (default: everything); saved as PNG if path is given."""
        return draw_timeline(self, start_ns, end_ns, path)

    def worst_window(self, margin: float = 3.0) -> tuple[int, int]:
        """[start_ns, end_ns) around the pause that overlapped Python longest (else the longest
        pause), padded by `margin` times its duration on each side (at least 5 ms)."""
        span = int(self.header.get("span_start_ns", 0)), int(self.header.get("span_end_ns", 1))
        return worst_window(self.pause_impact, span, margin)

    def write(self, out_dir: str | os.PathLike) -> list[Path]:
        """Write every result table as OUT/<name>.parquet, each atomically; existing results are replaced."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return [
            write_table(table, out / f"{name}.parquet", {"table": name, "analysis": self.header})
            for name, table in self.tables().items()
        ]


def correlate(
    pauses: pd.DataFrame,
    gil: pd.DataFrame,
    *,
    slack_ns: int = 0,
    offset_ns: int | None = None,
    pauses_source: str | None = None,
    gil_source: str | None = None,
) -> Analysis:
    """Join a pauses table with a GIL intervals table (both as in docs/results.md, "Input tables").

    offset_ns, when given, is added to every pause time to put the pauses on the GIL
    table's clock, and overrides the refusal to join tables from different clocks or boots.
    """
    gil = FrameGil(gil, gil_source or gil.attrs.get("source") or "gil table")
    driven = drive(pauses, gil, MemorySink(), slack_ns=slack_ns, offset_ns=offset_ns, pauses_source=pauses_source)
    tables = driven.out
    return Analysis(pauses=tables["pauses"], gil=gil.frame, gil_free=tables["gil_free"], overlaps=tables["overlaps"],
                    pause_impact=tables["pause_impact"], summary_table=tables["summary"], header=driven.header,
                    stops=tables["stops"])


def analyze(pauses, gil=None, *, slack_ns: int = 0, offset_ns: int | None = None) -> Analysis:
    """`correlate` from a session directory (`analyze(SESSION)`), or from two tables given as
    DataFrames, Parquet paths, JFR recordings (pauses) or GIL probe files (gil)."""
    if gil is None:
        return analyze_session(pauses, slack_ns=slack_ns, offset_ns=offset_ns)
    pauses_source = gil_source = None
    if not isinstance(pauses, pd.DataFrame):
        pauses, pauses_source = pauses_from(tables=[Path(pauses)])
    if not isinstance(gil, pd.DataFrame):
        gil, gil_source = gil_from(paths=[Path(gil)])
    return correlate(pauses, gil, slack_ns=slack_ns, offset_ns=offset_ns, pauses_source=pauses_source, gil_source=gil_source)


def analyze_session(session: str | os.PathLike, *, slack_ns: int = 0, offset_ns: int | None = None) -> Analysis:
    """Every JVM recording and every GIL events file of a `tandem record` session, correlated."""
    pauses, pauses_source = pauses_from(session=Path(session))
    gil, gil_source = gil_from(session=Path(session))
    return correlate(pauses, gil, slack_ns=slack_ns, offset_ns=offset_ns, pauses_source=pauses_source, gil_source=gil_source)


def analyze_to(out: str | os.PathLike, *, session: str | os.PathLike | None = None, jfr=(), gil=(), pauses=(),
               slack_ns: int = 0, offset_ns: int | None = None, progress=None, reference_gil: bool = False):
    """What `tandem analyze -o OUT` does: a SESSION, or the JVM side (jfr/pauses) and the GIL
    side (gil) given apart, correlated into OUT/*.parquet; streamed through the core in bounded
    memory when the GIL side is events files or Parquet tables (or both), else read whole. Every table
    is written into OUT, gil.parquet included, unless REFERENCE_GIL: then a streamed GIL side
    whose files are closed is named by the results instead (docs/results.md, "gil.parquet").
    Returns the summary, the header and the files written
    (engine.analysis.stream.StreamedAnalysis)."""
    session = Path(session) if session is not None else None
    jfr, gil, pauses = [Path(p) for p in jfr], [Path(p) for p in gil], [Path(p) for p in pauses]
    pauses_session = session if not (jfr or pauses) else None  # (the session's JVMs, unless given apart)
    pauses_df, pauses_source = pauses_from(pauses_session, jfr, pauses)
    streamable = streamable_gil(session if not gil else None, gil, copy=not reference_gil)
    if streamable is not None:
        # handed over, not passed: a long session's table is not held here while the drive runs
        # (the drive keeps only the columns it reads)
        table, pauses_df = [pauses_df], None
        try:
            return analyze_streamed(out, table.pop, streamable, slack_ns=slack_ns, offset_ns=offset_ns,
                                    pauses_source=pauses_source, progress=progress)
        except SampledRecords:  # a sampling-backend recording is read whole, below
            # (the first pass finds it, before the table is taken)
            pauses_df = table.pop() if table else pauses_from(pauses_session, jfr, pauses)[0]
    gil_df, gil_source = gil_from(session if not gil else None, gil)
    result = correlate(pauses_df, gil_df, slack_ns=slack_ns, offset_ns=offset_ns,
                       pauses_source=pauses_source, gil_source=gil_source)
    return StreamedAnalysis(result.summary_table, result.header, result.write(out), result.stops)


def load_results(out_dir: str | os.PathLike) -> Analysis:
    """An Analysis read back from results (engine.results.Results: the -o directory of `tandem
    analyze`, `tandem live`'s parts, or a fleet dataset, whose tables carry session_id)."""
    results = Results(out_dir)
    tables = {name: results.table(name) if name in ("summary", "stops") else _required(results, name)
              for name in RESULT_TABLES}
    return Analysis(
        pauses=tables["pauses"], gil=tables["gil"], gil_free=tables["gil_free"], overlaps=tables["overlaps"],
        pause_impact=tables["pause_impact"], summary_table=tables["summary"], header=results.header(), stops=tables["stops"],
    )


def _required(results, name: str) -> pd.DataFrame:
    results.require(name)
    return results.table(name)


__all__ = ["Analysis", "analyze", "analyze_session", "analyze_to", "correlate", "load_results"]
