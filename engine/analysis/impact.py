"""pause_impact: one row per pause, what it did to the Python threads (docs/results.md, "pause_impact")."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.analysis.gil_state import merge_intervals, thread_lifetimes
from engine.join import overlap_pairs, overlap_totals

# Kinds during which the whole VM is stopped: every thread running Java code waits.
WHOLE_VM_KINDS = ("safepoint", "gc_pause")


def _per_pause(values: pd.Series, pause_ids: pd.Series, fill) -> np.ndarray:
    return values.reindex(pause_ids.to_numpy(), fill_value=fill).to_numpy()


def _holding_per_thread(pauses: pd.DataFrame, gil: pd.DataFrame, exact: pd.DataFrame) -> pd.DataFrame:
    """pause_id, pid, tid, holding_ns: time of each pause during which each living thread held the GIL.

    holding = (pause ∩ lifetime) - (pause ∩ union of the thread's released/waiting intervals).
    """
    lifetimes = thread_lifetimes(gil[gil["end_ns"] > gil["start_ns"]])
    pause_rows, life_rows = overlap_pairs(pauses["start_ns"], pauses["end_ns"], lifetimes["start_ns"], lifetimes["end_ns"])
    alive = pd.DataFrame(
        {
            "pause_id": pauses["pause_id"].to_numpy()[pause_rows],
            "pid": lifetimes["pid"].to_numpy()[life_rows],
            "tid": lifetimes["tid"].to_numpy()[life_rows],
            "alive_ns": np.minimum(pauses["end_ns"].to_numpy()[pause_rows], lifetimes["end_ns"].to_numpy()[life_rows])
            - np.maximum(pauses["start_ns"].to_numpy()[pause_rows], lifetimes["start_ns"].to_numpy()[life_rows]),
        }
    )
    # Union per thread, so that a source with overlapping intervals of one thread is not double-counted.
    covered = merge_intervals(exact, ["pause_id", "pid", "tid"])
    covered = covered.assign(covered_ns=covered.end_ns - covered.start_ns).groupby(["pause_id", "pid", "tid"])["covered_ns"].sum()
    alive = alive.join(covered, on=["pause_id", "pid", "tid"])
    alive["holding_ns"] = (alive["alive_ns"] - alive["covered_ns"].fillna(0).astype(np.int64)).clip(lower=0)
    return alive[["pause_id", "pid", "tid", "holding_ns"]]


def _stopped_holders(pauses: pd.DataFrame, holding: pd.DataFrame) -> pd.Series:
    """Per pause_id, the smallest tid of a GIL-holding thread the JVM (may have) stopped.

    Inferred: the JVM threads tandem knows are the os_thread_id values of the pauses table.
    A thread counts as stopped by a pause if it is that pause's own thread (os_thread_id),
    or if it is any known JVM thread and the pause stops the whole VM (kind safepoint or
    gc_pause, or at_safepoint true).
    """
    if "os_thread_id" not in pauses.columns:
        return pd.Series(dtype="Int64")
    own = pauses["os_thread_id"].astype("Int64")
    jvm_threads = set(own.dropna().astype(np.int64))
    whole_vm = pauses["kind"].isin(WHOLE_VM_KINDS).to_numpy(bool)
    if "at_safepoint" in pauses.columns:
        whole_vm = whole_vm | pauses["at_safepoint"].astype("boolean").fillna(False).to_numpy(bool)
    facts = pd.DataFrame({"pause_id": pauses["pause_id"].to_numpy(), "own_tid": own.to_numpy(), "whole_vm": whole_vm})
    holders = holding[holding["holding_ns"] > 0].merge(facts, on="pause_id")
    own_thread = (holders["tid"] == holders["own_tid"]).fillna(False).to_numpy(bool)
    stopped = own_thread | (holders["whole_vm"].to_numpy(bool) & holders["tid"].isin(jvm_threads).to_numpy())
    return holders[stopped].groupby("pause_id")["tid"].min()


def pause_impact(pauses: pd.DataFrame, gil: pd.DataFrame, overlaps: pd.DataFrame, gil_free: pd.DataFrame) -> pd.DataFrame:
    """One row per pause (in the pauses table's order)."""
    ids = pauses["pause_id"]
    exact = overlaps[~overlaps["near_miss"]]
    out = pauses[["pause_id", "kind", "name", "start_ns", "end_ns", "duration_ns"]].reset_index(drop=True)
    for state in ("released", "waiting"):
        rows = exact[exact["state"] == state]
        threads = rows.drop_duplicates(["pause_id", "pid", "tid"]).groupby("pause_id").size()
        out[f"threads_{state}"] = _per_pause(threads, ids, 0).astype(np.int64)
        out[f"{state}_ns"] = _per_pause(rows.groupby("pause_id")["overlap_ns"].sum(), ids, 0).astype(np.int64)
    union = merge_intervals(exact, ["pause_id"])
    union_ns = (union["end_ns"] - union["start_ns"]).groupby(union["pause_id"]).sum()
    out["overlap_ns"] = _per_pause(union_ns, ids, 0).astype(np.int64)
    out["hit_python"] = out["overlap_ns"] > 0
    out["near_misses"] = _per_pause(overlaps[overlaps["near_miss"]].groupby("pause_id").size(), ids, 0).astype(np.int64)

    holding = _holding_per_thread(pauses, gil, exact)
    holders = holding[holding["holding_ns"] > 0].groupby("pause_id").size()
    out["threads_holding"] = _per_pause(holders, ids, 0).astype(np.int64)
    _, free_ns = overlap_totals(pauses["start_ns"], pauses["end_ns"], gil_free["start_ns"], gil_free["end_ns"])
    out["gil_free_ns"] = free_ns.astype(np.int64)
    out["gil_free"] = out["gil_free_ns"] > 0
    amplifying = _stopped_holders(pauses, holding)
    out["amplifying_tid"] = pd.array(_per_pause(amplifying.astype("Int64"), ids, pd.NA), dtype="Int64")
    out["amplified"] = out["amplifying_tid"].notna().to_numpy(bool)
    return out
