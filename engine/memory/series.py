"""The memory series of a process as views draw and export them (Perfetto's counter tracks,
the notebook's plot, `tandem live`'s metrics): which columns of memory.parquet, under what
names, in what order. One place, so every view says the same thing about the same bytes.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd

from engine.memory.growth import BUCKET_NAMES
from engine.memory.table import BUCKETS

# column -> label, in drawing order: the RSS, its split (the buckets), then each runtime's own figures.
SERIES = {
    "rss": "RSS",
    "rss_anon": "RSS anon",
    "rss_file": "RSS file",
    "rss_shmem": "RSS shmem",
    **{bucket: f"RSS: {BUCKET_NAMES[bucket]}" for bucket in BUCKETS},
    "jvm_heap_used": "JVM heap used",
    "jvm_heap_committed": "JVM heap committed",
    "jvm_heap_after_gc": "JVM heap after GC",
    "jvm_metaspace_committed": "JVM metaspace committed",
    "jvm_code_cache": "JVM code cache",
    "jvm_gc_side_tables": "JVM G1 side tables (estimated)",
    "jvm_direct_buffers": "JVM direct buffers",
    "jvm_nmt_committed": "JVM NMT committed",
    "py_pymalloc_bytes": "Python allocated (pymalloc blocks)",
    "py_arena_bytes": "Python pymalloc arenas",
    "py_tracemalloc": "Python traced (tracemalloc)",
    "py_tracemalloc_numpy": "Python traced, numpy's buffers (tracemalloc)",
    "malloc_in_use": "malloc in use",
    "malloc_free": "malloc free, held",
}
NMT_PREFIX = "jvm_nmt_"


def label(column: str) -> str:
    """The name a view gives COLUMN (an NMT category: `JVM NMT: <category>`)."""
    if column in SERIES:
        return SERIES[column]
    return "JVM NMT: " + column.removeprefix(NMT_PREFIX).replace("_", " ")


def columns_of(rows: pd.DataFrame) -> list[str]:
    """The series columns ROWS has a value in, in drawing order (NMT categories after the rest); a
    bucket that is zero throughout is left out (a runtime the process does not have)."""
    present = [c for c in SERIES if c in rows and rows[c].notna().any()
               and not (c in BUCKETS and c != "unexplained" and (rows[c].fillna(0) == 0).all())]  # (no JVM: no JVM buckets)
    nmt = sorted(c for c in rows.columns if c.startswith(NMT_PREFIX) and c not in SERIES and rows[c].notna().any())
    return present + nmt


def process_series(table: pd.DataFrame) -> Iterator[tuple[int, str | None, list[tuple[str, str, np.ndarray, np.ndarray]]]]:
    """Per process of a memory table, in pid order: (pid, comm, [(column, label, t_ns, bytes)]),
    each series its samples with a value (a null is no sample: the series was not read then)."""
    for pid, rows in table.groupby("pid", sort=True):
        rows = rows.sort_values("t_ns", kind="stable")
        comm = rows["comm"].dropna().iloc[-1] if "comm" in rows and rows["comm"].notna().any() else None
        series = []
        for column in columns_of(rows):
            present = rows[rows[column].notna()]
            series.append((column, label(column), present["t_ns"].to_numpy(np.int64),
                           present[column].to_numpy(np.float64)))
        yield int(pid), comm, series


# The JVM's memory as OpenTelemetry's jvm.memory.* names it: (jvm.memory.type, jvm.memory.pool.name,
# used column, committed column). JFR gives the heap as one figure (all its pools together).
JVM_POOLS = (
    ("heap", "Java heap", "jvm_heap_used", "jvm_heap_committed"),
    ("non_heap", "Metaspace", "jvm_metaspace_used", "jvm_metaspace_committed"),
    ("non_heap", "CodeCache", "jvm_code_cache", None),
)


def plot_memory(table: pd.DataFrame, pids: list[int] | None = None):
    """One panel per process (the largest first, at most four unless PIDS): the RSS split
    stacked by bucket (MiB; a negative `unexplained`, runtimes claiming more than the RSS,
    is drawn as 0) and the RSS as a line over it. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    if pids is None:
        pids = table.groupby("pid")["rss"].max().sort_values(ascending=False).index[:4].tolist() if "rss" in table else []
    fig, axes = plt.subplots(len(pids) or 1, 1, figsize=(9, 2.6 * max(len(pids), 1)), squeeze=False)
    for ax, pid in zip(axes[:, 0], pids):
        rows = table[table["pid"] == pid].sort_values("t_ns")
        seconds = (rows["t_ns"] - table["t_ns"].min()).to_numpy(np.float64) / 1e9
        buckets = [b for b in columns_of(rows) if b in BUCKETS]
        stacked = [rows[b].fillna(0).clip(lower=0).to_numpy(np.float64) / (1 << 20) for b in buckets]
        if stacked:
            ax.stackplot(seconds, stacked, labels=[SERIES[b].removeprefix("RSS: ") for b in buckets], alpha=0.8)
        ax.plot(seconds, rows["rss"].to_numpy(np.float64) / (1 << 20), color="black", linewidth=1.2, label="RSS")
        comm = rows["comm"].dropna().iloc[-1] if "comm" in rows and rows["comm"].notna().any() else "?"
        ax.set_title(f"pid {pid} ({comm})", loc="left", fontsize=10)
        ax.set_ylabel("MiB")
        ax.legend(loc="upper left", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("seconds since the first sample")
    fig.tight_layout()
    return fig
