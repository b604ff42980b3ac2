"""Who grew: per process, the steady growth of its RSS split into the buckets of memory.parquet.

The trend is that of the second half of the process's samples: the rate now, past its
start-up and whatever it did before a leak began. The RSS is cut into windows
(WINDOWS over that half, at least MIN_WINDOW_NS each) and only each window's lowest sample is
kept: the lower envelope, so a sawtooth (a heap between collections, malloc's churn) is no
trend; every bucket is fitted at those same samples, so the split is of one set of points. The growth rate is the
repeated-median slope of those minima (Siegel: for each point the median of its slopes to
all others, then the median of those), which a start-up step at the first points does not
move. The last window is left out: a process frees memory as it exits. A heap leak's rate is
that of the heap after each GC, at each GC's time (jvm_heap_after_gc), less G1's unused
copy buffers (jvm_heap_gc_waste: 5-10% of what a young GC promotes, no live object in them). The unexplained rate is the RSS rate
less the buckets' rates, so the split adds up.

A leak is named when the RSS grows steadily (its minima rise window after window: Kendall's
tau at least STEADY_TAU) by at least LEAK_MIN_BYTES and LEAK_MIN_FRACTION of the process's
RSS over the fitted span; the bucket that grew most is named, with its rate and its share.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engine.memory.table import BUCKETS

WINDOWS = 9  # 8 fitted: the last is left out
MIN_WINDOW_NS = 2_000_000_000
STEADY_TAU = 0.6
LEAK_MIN_BYTES = 16 << 20
LEAK_MIN_FRACTION = 0.10
# What a bucket is made of, to say which part grew.
PARTS = {
    "jvm_native": ("jvm_direct_buffers", "jvm_metaspace_committed", "jvm_code_cache", "jvm_gc_side_tables"),
    "python": ("py_arena_bytes", "py_tracemalloc", "py_tracemalloc_numpy"),
    "native_other": ("malloc_in_use",),
}
PART_NAMES = {"jvm_direct_buffers": "direct buffers", "jvm_metaspace_committed": "metaspace",
              "jvm_code_cache": "code cache", "jvm_gc_side_tables": "G1's side tables (estimated)", "py_arena_bytes": "pymalloc arenas", "py_tracemalloc": "tracemalloc",
              "py_tracemalloc_numpy": "numpy buffers (tracemalloc)",
              "malloc_in_use": "malloc in use"}
BUCKET_NAMES = {"jvm_heap": "JVM heap", "jvm_native": "JVM native", "python": "Python objects",
                "native_other": "native (malloc) outside JVM and Python", "unexplained": "unexplained"}


@dataclass
class Growth:
    """One process's growth over the session (bytes, bytes per second)."""

    pid: int
    comm: str | None
    span_s: float
    rss_first: float                     # at the first sample
    rss_last: float
    rss_peak: float
    rss_rate: float                      # the RSS's trend, bytes/s
    steady: bool                         # its window minima rise steadily (Kendall's tau >= STEADY_TAU)
    rates: dict = field(default_factory=dict)   # bucket -> trend, bytes/s (unexplained: the rest)
    part_rates: dict = field(default_factory=dict)  # a bucket's parts (direct buffers, NMT categories...) -> bytes/s
    leak: str | None = None              # the bucket named, when the RSS growth is leak-like
    leak_rate: float | None = None
    leak_share: float | None = None      # its rate / the RSS rate
    leak_part: str | None = None         # its part that grew most, in words
    fitted_from_ns: int | None = None    # the span the trends are fitted over (CLOCK_MONOTONIC):
    fitted_to_ns: int | None = None      # the second half of the samples, less the last window

    def as_metadata(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def who_grew(table: pd.DataFrame) -> list[Growth]:
    """The growth of every process of a memory table (memory_table), in pid order."""
    return [_growth(int(pid), rows.sort_values("t_ns")) for pid, rows in table.groupby("pid", sort=True)
            if "rss" in rows and rows["rss"].notna().sum() >= 3]


def _growth(pid: int, rows: pd.DataFrame) -> Growth:
    rows = rows[rows["rss"].notna()]
    first_rss = float(rows["rss"].iloc[0])
    first_t, last_t = int(rows["t_ns"].iloc[0]), int(rows["t_ns"].iloc[-1])
    rows = rows[rows["t_ns"] >= first_t + (last_t - first_t) // 2]
    t = rows["t_ns"].to_numpy(np.int64)
    window = max(MIN_WINDOW_NS, (t[-1] - t[0]) // WINDOWS + 1)
    bins = (t - t[0]) // window

    rss_rate, tau, lowest = trend_of(t, rows["rss"].to_numpy(np.float64), bins)

    def trend(column: str) -> float:
        """COLUMN's slope at the RSS's lowest samples: one set of points for every series of the
        split, so that a sample where one series moved before the others (a GC promoting into
        fresh pages while it was read) bends the split at one point, not the windows' choice."""
        if column not in rows:
            return 0.0
        values = rows[column].to_numpy(np.float64)[lowest]
        keep = ~np.isnan(values)
        return repeated_median_slope(t[lowest][keep] / 1e9, values[keep]) if keep.sum() >= 3 else 0.0

    rates = {bucket: trend(bucket) for bucket in BUCKETS if bucket != "unexplained"}
    rates["unexplained"] = rss_rate - sum(rates.values())
    parts = {part: trend(part) for columns in PARTS.values() for part in columns}
    parts.update({column: trend(column) for column in rows.columns if column.startswith("jvm_nmt_")})
    rss = rows["rss"].to_numpy(np.float64)
    growth = Growth(pid, rows["comm"].dropna().iloc[-1] if "comm" in rows and rows["comm"].notna().any() else None,
                    (last_t - first_t) / 1e9, first_rss, rss[-1], float(np.nanmax(rss)), rss_rate, tau >= STEADY_TAU,
                    rates, parts, fitted_from_ns=int(t[0]), fitted_to_ns=int(t[0] + window * bins.max()))
    grown = rss_rate * (t[-1] - t[0]) / 1e9  # over the fitted half
    if growth.steady and grown >= max(LEAK_MIN_BYTES, LEAK_MIN_FRACTION * float(np.median(rss))):
        growth.leak = max(rates, key=rates.get)
        growth.leak_share = rates[growth.leak] / rss_rate
        growth.leak_rate = rates[growth.leak]
        live = _live_heap_rate(rows) if growth.leak == "jvm_heap" else None
        if live is not None:  # a heap leak is what its live set keeps, its RSS share what its pages hold
            growth.leak_rate = live
        candidates = [p for p in PARTS.get(growth.leak, ()) if parts.get(p, 0) > 0]
        if growth.leak == "jvm_native":
            candidates += [c for c in parts if c.startswith("jvm_nmt_") and c != "jvm_nmt_committed" and parts[c] > 0]
        if candidates:
            best = max(candidates, key=parts.get)
            if best == "py_tracemalloc" and parts.get("py_tracemalloc_numpy", 0) >= parts[best] / 2:
                best = "py_tracemalloc_numpy"  # (a part of the total: named when it is most of it)
            growth.leak_part = PART_NAMES.get(best, best.removeprefix("jvm_nmt_").replace("_", " ") + " (NMT)")
    return growth


def _live_heap_rate(rows: pd.DataFrame) -> float | None:
    """The heap's live set's rate (what a heap leak keeps): the repeated-median slope of the heap
    after each GC, less G1's unused copy buffers so far, at that GC's own time (a lower
    envelope already), None with under 3 GCs."""
    if "jvm_heap_after_gc_ns" not in rows:
        return None
    gcs = rows[["jvm_heap_after_gc_ns", "jvm_heap_after_gc"]].assign(
        waste=rows["jvm_heap_gc_waste"].fillna(0.0) if "jvm_heap_gc_waste" in rows else 0.0)
    gcs = gcs.dropna().drop_duplicates("jvm_heap_after_gc_ns", keep="last")
    if len(gcs) < 3:
        return None
    return repeated_median_slope(gcs["jvm_heap_after_gc_ns"].to_numpy(np.float64) / 1e9,
                                 (gcs["jvm_heap_after_gc"] - gcs["waste"]).to_numpy(np.float64))


def trend_of(t_ns: np.ndarray, values: np.ndarray, bins: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(slope in units per second, Kendall's tau, their indices) of the per-window minima of VALUES."""
    keep = np.flatnonzero(~np.isnan(values))
    frame = pd.DataFrame({"bin": bins[keep], "i": keep, "v": values[keep]})
    if frame.empty:
        return 0.0, 0.0, keep
    lowest = frame.loc[frame.groupby("bin")["v"].idxmin(), "i"].to_numpy()[:-1]  # (the last: a process frees memory as it exits)
    x, y = t_ns[lowest].astype(np.float64) / 1e9, values[lowest]
    if len(x) < 3:
        return 0.0, 0.0, lowest
    return repeated_median_slope(x, y), kendall_tau(x, y), lowest


def repeated_median_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Siegel's repeated median of the pairwise slopes (robust to up to half the points)."""
    dx = x[None, :] - x[:, None]
    dy = y[None, :] - y[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.where(dx != 0, dy / dx, np.nan)
    return float(np.nanmedian(np.nanmedian(slopes, axis=1)))


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-a of y against x: 1 when every later point is higher."""
    n = len(x)
    sign = np.sign(x[None, :] - x[:, None]) * np.sign(y[None, :] - y[:, None])
    return float(np.triu(sign, 1).sum() / (n * (n - 1) / 2))
