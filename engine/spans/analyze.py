"""`tandem analyze SESSION -o OUT --spans FILE...`: the spans beside the results already in OUT."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.errors import TandemError
from engine.results import Results
from engine.spans.clock import spans_on_monotonic
from engine.spans.outputs import span_results, write_span_results
from engine.spans.source import read_spans


def analyze_spans(out: str | Path, session: str | Path | None, span_files) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """Reads the OTLP JSON SPAN_FILES, puts them on SESSION's CLOCK_MONOTONIC and joins them with
    the pauses, pause_impact and GIL intervals of OUT (written by the analysis); writes
    OUT/spans.parquet and OUT/requests.parquet. Returns (spans, requests, files)."""
    if session is None:
        raise TandemError("--spans needs a SESSION directory: its wall/monotonic clock pairs put the spans' "
                          "wall-clock times on CLOCK_MONOTONIC")
    spans = read_spans(span_files)
    spans, clock = spans_on_monotonic(spans, Path(session))
    results = Results(out)
    for name in ("pauses", "pause_impact", "gil"):
        results.require(name)
    table, requests = span_results(spans, results.table("pauses"), results.table("pause_impact"), results.table("gil"))
    error = int(table["clock_error_ns"].max()) if len(table) else 0
    metadata = {"files": [str(Path(p)) for p in span_files], "spans": len(table), "clock": {**clock, "error_ns": error}}
    return table, requests, write_span_results(out, table, requests, metadata)
