"""One stop of the world counts once (docs/results.md, "stops.parquet").

A JVM stop of the world is several rows of the pauses table: the safepoint (named by the VM
operation run at it), the GC pause of the collection run there (jdk.GCPhasePause) and the
collection itself (jdk.GarbageCollection). Grouped from the data, per JVM: a `gc_pause`, `gc`
or `vm_operation` row at a safepoint (`at_safepoint` true) lying inside a safepoint's
[start, end] belongs to that safepoint's stop; a `vm_operation` at a safepoint whose safepoint
was not recorded leads the stop itself, so the GC rows inside it belong to it. Every other
pause stands alone (a concurrent collection longer than any safepoint, compilation, ...).
Safepoints of one JVM never overlap (one VM thread runs them), so the stop of a row is the
last leader of its JVM starting at or before it, if that one ends at or after it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


STOP_KEY = ("part_of", "kind", "name")


def jvm_of(pauses: pd.DataFrame) -> np.ndarray:
    if "jvm_pid" not in pauses.columns:
        return np.zeros(len(pauses), np.int64)
    return pauses["jvm_pid"].astype("Int64").fillna(-1).to_numpy(np.int64)


def jvm_threads(pauses: pd.DataFrame) -> list[int]:
    """Every JVM thread the pauses name (their os_thread_id): whose holding the GIL amplifies a
    whole-VM pause."""
    if "os_thread_id" not in pauses.columns:
        return []
    return pauses["os_thread_id"].dropna().unique().astype(np.int64).tolist()


def _inside(leaders: np.ndarray, rows: np.ndarray, start: np.ndarray, end: np.ndarray, jvm: np.ndarray) -> np.ndarray:
    """Per row index: the leader index whose span holds it (same JVM), else -1."""
    out = np.full(rows.size, -1, np.int64)
    for j in np.unique(jvm[rows]):
        mine = leaders[jvm[leaders] == j]
        if not mine.size:
            continue
        mine = mine[np.argsort(start[mine], kind="stable")]
        at = np.flatnonzero(jvm[rows] == j)
        k = np.searchsorted(start[mine], start[rows[at]], "right") - 1
        ok = k >= 0
        ok[ok] = end[mine[k[ok]]] >= end[rows[at[ok]]]
        out[at[ok]] = mine[k[ok]]
    return out


def at_safepoint_of(pauses: pd.DataFrame) -> np.ndarray:
    if "at_safepoint" not in pauses.columns:
        return np.zeros(len(pauses), bool)
    return pauses["at_safepoint"].astype("boolean").fillna(False).to_numpy(bool)


def leader_rows(pauses: pd.DataFrame) -> np.ndarray:
    """Per pause: it may lead a stop (a safepoint, or a vm_operation at a safepoint)."""
    kind = pauses["kind"].astype(str).to_numpy()
    return (kind == "safepoint") | ((kind == "vm_operation") & at_safepoint_of(pauses))


def stop_ids(pauses: pd.DataFrame) -> np.ndarray:
    """Per pause (table order): the pause_id of the pause leading its stop (its own when it leads
    one or stands alone)."""
    if not len(pauses):
        return pauses["pause_id"].to_numpy(np.int64).copy()
    return stop_ids_of(pauses["pause_id"].to_numpy(np.int64), pauses["kind"].astype(str).to_numpy(),
                       pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64), jvm_of(pauses),
                       at_safepoint_of(pauses))


def stop_ids_of(pause_id: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray, jvm: np.ndarray,
                at_safepoint: np.ndarray) -> np.ndarray:
    """stop_ids of pauses given as arrays (jvm: -1 when unknown)."""
    ids = pause_id.copy()
    safepoints = np.flatnonzero(kind == "safepoint")
    operations = np.flatnonzero((kind == "vm_operation") & at_safepoint)
    host = _inside(safepoints, operations, start, end, jvm)
    ids[operations[host >= 0]] = ids[host[host >= 0]]
    leaders = np.sort(np.r_[safepoints, operations[host < 0]])
    gc = np.flatnonzero(np.isin(kind, ("gc_pause", "gc")))
    host = _inside(leaders, gc, start, end, jvm)
    ids[gc[host >= 0]] = ids[host[host >= 0]]
    return ids


def order_stops(table: pd.DataFrame) -> pd.DataFrame:
    """Stop rows (part_of null) most hits first, each followed by its detail rows (most hits first)."""
    table = table.sort_values(["pauses_hit", "total_overlap_ms", "kind", "name"], ascending=[False, False, True, True],
                              ignore_index=True)
    leads = table[table["part_of"].isna()]
    detail = table[table["part_of"].notna()]
    rank = {f"{k}: {n}": i for i, (k, n) in enumerate(zip(leads["kind"], leads["name"]))}
    position = np.r_[np.arange(len(leads), dtype=np.float64) * 2,
                     [2 * rank.get(str(p), len(leads)) + 1 for p in detail["part_of"]]]
    both = pd.concat([leads, detail], ignore_index=True)
    return both.iloc[np.argsort(position, kind="stable")].reset_index(drop=True)


def caused_stops(impact: pd.DataFrame) -> pd.DataFrame:
    """The pauses caused by Python, one row per stop of the world (`stop_id`): the stop's own
    (leading) row when it is caused, else its first caused row. The safepoint, GC pause and
    collection of one System.gc() are one request."""
    caused = impact[impact["caused_by_python"].fillna(False).astype(bool)]
    stop = caused["stop_id"] if "stop_id" in caused.columns else caused["pause_id"]
    leading = (caused["pause_id"] == stop).to_numpy(bool)
    order = np.lexsort((np.arange(len(caused)), ~leading, stop.to_numpy(np.int64)))
    return caused.iloc[order].loc[lambda d: ~stop.iloc[order].duplicated().to_numpy()]
