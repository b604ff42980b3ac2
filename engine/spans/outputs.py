"""spans.parquet and requests.parquet (docs/results.md, "spans.parquet"), and the "requests hurt" facts.

`span_results` joins a spans file's spans with an analysis's results: the spans on
CLOCK_MONOTONIC (engine.spans.clock), their figures (engine.spans.figures) and, per endpoint,
latency and the share of it lost to stops of the world and GIL waits.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from engine.spans.figures import SpanFigures, pids_from_threads
from engine.store import write_table


SPANS_FILE, REQUESTS_FILE = "spans.parquet", "requests.parquet"
SPAN_RESULT_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "endpoint", "service_name", "pid",
                       "thread_id", "thread_name", "start_ns", "end_ns", "duration_ns", "start_wall_ns", "end_wall_ns",
                       "clock_error_ns")
TOP_STOPS = 3
# "requests hurt": an endpoint is listed when its slowest 1% lost at least this share of their time.
HURT_SHARE = 0.01


def span_results(spans: pd.DataFrame, pauses: pd.DataFrame, impact: pd.DataFrame | None,
                 gil: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spans.parquet's table, requests.parquet's table) for SPANS on CLOCK_MONOTONIC."""
    figures = SpanFigures(pauses, impact)
    table = figured_spans(spans, figures, gil)
    return table, requests_table(table, figures.stop_overlaps(table))


def figured_spans(spans: pd.DataFrame, figures: SpanFigures, gil: pd.DataFrame) -> pd.DataFrame:
    """spans.parquet's rows for SPANS on CLOCK_MONOTONIC: their columns, FIGURES' and lost_share."""
    table = pids_from_threads(spans.reset_index(drop=True), gil)
    table["duration_ns"] = table["end_ns"] - table["start_ns"]
    table = pd.concat([table[list(SPAN_RESULT_COLUMNS)], figures(table, gil)], axis=1)
    duration = table["duration_ns"].to_numpy(np.int64)
    table["lost_share"] = np.where(duration > 0, table["lost_ns"].to_numpy(np.float64) / np.maximum(duration, 1), 0.0)
    return table


def _p99(values) -> float:
    return float(np.percentile(values, 99)) if len(values) else float("nan")


def requests_table(spans: pd.DataFrame, overlaps: pd.DataFrame) -> pd.DataFrame:
    """Per (service_name, endpoint): count, latency percentiles, lost share, and the stops that cost most.

    `tail_*`: over the endpoint's spans at or above its p99 latency (its slowest 1%), the share
    of their time lost (lost_ns over duration, summed), and of it to stops and to GIL waits."""
    rows = []
    keys = ["service_name", "endpoint"]
    spans = spans.assign(service_name=spans["service_name"].fillna(""))
    stop_cost = overlaps.merge(spans[keys].reset_index(names="span"), on="span") if len(overlaps) else None
    for (service, endpoint), group in spans.groupby(keys, sort=False):
        duration = group["duration_ns"].to_numpy(np.float64)
        p99 = _p99(duration)
        tail = group[duration >= p99]
        tail_time = float(tail["duration_ns"].sum()) or 1.0
        wait = group["gil_wait_ns"].astype("Float64").fillna(0).to_numpy(np.float64)
        top = ""
        if stop_cost is not None:
            mine = stop_cost[(stop_cost["service_name"].fillna("") == service) & (stop_cost["endpoint"] == endpoint)]
            cost = mine.groupby(["stop_id", "cause"], sort=False)["overlap_ns"].sum().sort_values(ascending=False)
            top = " | ".join(f"{cause} (pause {stop_id}): {ns / 1e6:.3g} ms" for (stop_id, cause), ns in cost.head(TOP_STOPS).items())
        rows.append({
            "service_name": service or None, "endpoint": endpoint, "spans": len(group),
            "spans_hit": int((group["pause_ns"] > 0).sum()),
            "p50_latency_ms": float(np.percentile(duration, 50)) / 1e6, "p99_latency_ms": p99 / 1e6,
            "max_latency_ms": float(duration.max()) / 1e6,
            "p99_lost_share": _p99(group["lost_share"].to_numpy(np.float64)),
            "p99_pause_ms": _p99(group["pause_ns"].to_numpy(np.float64)) / 1e6,
            "p99_gil_wait_ms": _p99(wait) / 1e6,
            "tail_lost_share": float(tail["lost_ns"].sum()) / tail_time,
            "tail_pause_share": float(tail["pause_ns"].sum()) / tail_time,
            "tail_gil_wait_share": float(tail["gil_wait_ns"].astype("Float64").fillna(0).sum()) / tail_time,
            "lost_ms": float(group["lost_ns"].sum()) / 1e6,
            "top_stops": top or None,
        })
    table = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    return table.sort_values(["tail_lost_share", "spans"], ascending=[False, False], ignore_index=True)


REQUEST_COLUMNS = ("service_name", "endpoint", "spans", "spans_hit", "p50_latency_ms", "p99_latency_ms", "max_latency_ms",
                   "p99_lost_share", "p99_pause_ms", "p99_gil_wait_ms", "tail_lost_share", "tail_pause_share",
                   "tail_gil_wait_share", "lost_ms", "top_stops")


def write_span_results(out: str | Path, spans: pd.DataFrame, requests: pd.DataFrame, metadata: dict) -> list[Path]:
    """OUT/spans.parquet and OUT/requests.parquet, each atomically, with METADATA under `tandem`."""
    out = Path(out)
    return [_write(spans, out / SPANS_FILE, {"table": "spans", "spans": metadata}),
            _write(requests, out / REQUESTS_FILE, {"table": "requests", "spans": metadata})]


def _write(frame: pd.DataFrame, path: Path, metadata: dict) -> Path:
    """engine.store's writer, without pandas' schema metadata (stop_ids is an Arrow list)."""
    return write_table(frame, path, metadata, pandas_metadata=False)


def hurt_endpoints(requests: pd.DataFrame, limit: int = 5) -> pd.DataFrame:
    """The endpoints whose slowest 1% lost the largest share of their time (at least HURT_SHARE)."""
    hurt = requests[requests["tail_lost_share"] >= HURT_SHARE]
    return hurt.head(limit)
