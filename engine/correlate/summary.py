"""summary: per pause kind and name, how often and how long pauses hit Python (docs/results.md, "summary")."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.correlate.schema import COLUMNS

NS_PER_MS = 1e6
NS_PER_HOUR = 3.6e12

SUMMARY_COLUMNS = COLUMNS["summary"]


def summary_table(impact: pd.DataFrame, affected: pd.Series, span_ns: int, by: tuple[str, ...] = ("kind", "name")) -> pd.DataFrame:
    """One row per (kind, name), most hits first (or per the columns `by` of impact: the stops
    table groups by ("part_of", "kind", "name"), engine/correlate/stops.py).

    Overlap statistics are over the pauses that hit Python, each pause counting the part of
    it during which at least one Python thread was released or waiting (pause_impact.overlap_ns).
    Percentiles interpolate linearly between ranks (numpy's default, DuckDB's quantile_cont).
    affected: per `by` key, the distinct Python threads with an exact overlap.
    """
    hours = span_ns / NS_PER_HOUR if span_ns > 0 else np.nan
    rows = []
    for key, group in impact.groupby(list(by), sort=True, observed=True):  # (keys may be categories)
        hit_ms = group.loc[group["hit_python"], "overlap_ns"].to_numpy(np.float64) / NS_PER_MS
        rows.append(
            {
                **dict(zip(by, key)),
                "pauses": len(group),
                "pauses_hit": int(group["hit_python"].sum()),
                "hits_per_hour": group["hit_python"].sum() / hours,
                "mean_overlap_ms": hit_ms.mean() if hit_ms.size else np.nan,
                "p50_overlap_ms": np.percentile(hit_ms, 50) if hit_ms.size else np.nan,
                "p99_overlap_ms": np.percentile(hit_ms, 99) if hit_ms.size else np.nan,
                "max_overlap_ms": hit_ms.max() if hit_ms.size else np.nan,
                "total_overlap_ms": hit_ms.sum(),
                "threads_affected": int(affected.get(key, 0)),
                "pauses_near_miss": int(((group["near_misses"] > 0) & ~group["hit_python"]).sum()),
                "pauses_amplified": int(group["amplified"].sum()),
            }
        )
    table = pd.DataFrame(rows, columns=[*(c for c in by if c not in SUMMARY_COLUMNS), *SUMMARY_COLUMNS])
    table = table.astype({c: "string" for c in by} | {"pauses": np.int64, "pauses_hit": np.int64,
                          "threads_affected": np.int64, "pauses_near_miss": np.int64, "pauses_amplified": np.int64})
    return table.sort_values(["pauses_hit", "total_overlap_ms", "kind", "name"], ascending=[False, False, True, True],
                             ignore_index=True)
