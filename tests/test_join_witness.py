"""Test data and the DuckDB witness shared by the join and analysis tests."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

KINDS = ["safepoint", "gc_pause", "vm_operation"]


def pauses_frame(intervals, kinds=None, names=None, os_thread_ids=None) -> pd.DataFrame:
    """Pauses table from (start, end) pairs; pause_id = 100 + position."""
    starts = [int(s) for s, _ in intervals]
    ends = [int(e) for _, e in intervals]
    n = len(starts)
    kinds = kinds or [KINDS[i % len(KINDS)] for i in range(n)]
    frame = pd.DataFrame(
        {
            "pause_id": np.arange(100, 100 + n, dtype=np.int64),
            "kind": pd.array(kinds, dtype="string"),
            "name": pd.array(names or [f"{k}-name" for k in kinds], dtype="string"),
            "start_ns": np.array(starts, dtype=np.int64),
            "end_ns": np.array(ends, dtype=np.int64),
        }
    )
    if os_thread_ids is not None:
        frame["os_thread_id"] = pd.array(os_thread_ids, dtype="Int64")
    return frame


def gil_frame(rows) -> pd.DataFrame:
    """GIL table from (pid, tid, state, start, end) tuples."""
    pid, tid, state, start, end = zip(*rows) if rows else ((), (), (), (), ())
    return pd.DataFrame(
        {
            "pid": np.array(pid, dtype=np.int64),
            "tid": np.array(tid, dtype=np.int64),
            "state": pd.array(list(state), dtype="string"),
            "start_ns": np.array(start, dtype=np.int64),
            "end_ns": np.array(end, dtype=np.int64),
        }
    )


def overlap_frame(pauses: pd.DataFrame, gil: pd.DataFrame, *, slack_ns: int = 0) -> pd.DataFrame:
    """The overlaps rows straight from the pair kernel (engine.join.overlap_pairs), one row per
    pair of the rows given (as SQL: duplicates are rows), in the columns of docs/results.md."""
    from engine.correlate.schema import GIL_CARRIED_COLUMNS
    from engine.join import overlap_pairs

    p_start, p_end = pauses["start_ns"].to_numpy(np.int64), pauses["end_ns"].to_numpy(np.int64)
    g_start, g_end = gil["start_ns"].to_numpy(np.int64), gil["end_ns"].to_numpy(np.int64)
    pause_rows, gil_rows = overlap_pairs(p_start, p_end, g_start, g_end, slack_ns=slack_ns)
    later_start = np.maximum(p_start[pause_rows], g_start[gil_rows])
    earlier_end = np.minimum(p_end[pause_rows], g_end[gil_rows])
    overlapping = later_start < earlier_end
    return pd.DataFrame({
        "pause_id": pauses["pause_id"].to_numpy(np.int64)[pause_rows],
        "pid": gil["pid"].to_numpy(np.int64)[gil_rows],
        "tid": gil["tid"].to_numpy(np.int64)[gil_rows],
        "state": gil["state"].astype("string").array.take(gil_rows),
        "start_ns": np.where(overlapping, later_start, earlier_end),
        "end_ns": np.where(overlapping, earlier_end, later_start),
        "overlap_ns": np.where(overlapping, earlier_end - later_start, 0),
        "slack_ns": np.where(overlapping, 0, later_start - earlier_end),
        "near_miss": ~overlapping,
        **{c: gil[c].array.take(gil_rows) for c in GIL_CARRIED_COLUMNS if c in gil.columns},
    })


def adversarial_tables(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Unsorted, nested, spanning-everything, duplicated, zero-length and touching intervals."""
    rng = np.random.default_rng(seed)
    pauses = [
        (0, 10_000),          # spans everything
        (100, 200), (120, 180), (130, 131),  # nested
        (200, 300),           # touches the previous
        (250, 250),           # zero-length
        (400, 500), (400, 500),  # same interval, two pause ids
        (999, 1000),
    ]
    pauses += [(int(s), int(s + rng.integers(0, 60))) for s in rng.integers(0, 2_000, 40)]
    gil = [
        (1, 11, "released", -5, 20_000),  # spans everything
        (1, 12, "waiting", 200, 200),     # zero-length at a pause edge
        (1, 12, "waiting", 150, 150),     # zero-length inside a pause
        (1, 12, "released", 300, 400),    # touches pauses on both sides
        (1, 13, "released", 450, 460), (1, 13, "released", 450, 460),  # exact duplicate
        (2, 21, "waiting", 100, 200),     # same bounds as a pause
        (2, 21, "released", 1000, 1001),  # touches a pause's end
    ]
    for _ in range(300):
        start = int(rng.integers(0, 2_000))
        gil.append((int(rng.integers(1, 3)), int(rng.integers(10, 14)), str(rng.choice(["released", "waiting"])),
                    start, start + int(rng.integers(0, 40))))
    p = pauses_frame(pauses)
    g = gil_frame(gil)
    return p.sample(frac=1, random_state=seed).reset_index(drop=True), g.sample(frac=1, random_state=seed).reset_index(drop=True)


def duckdb_overlaps(pauses: pd.DataFrame, gil: pd.DataFrame, slack_ns: int = 0) -> pd.DataFrame:
    """The witness: the overlaps table written as SQL over the same two tables.

    Half-open overlap is `g.start_ns < p.end_ns AND p.start_ns < g.end_ns`; an empty
    interval has an empty intersection with everything, hence the two non-empty conditions
    (without them SQL would pair a zero-length interval lying strictly inside another).
    """
    con = duckdb.connect()
    con.register("p", pauses[["pause_id", "start_ns", "end_ns"]])
    con.register("g", gil[["pid", "tid", "state", "start_ns", "end_ns"]].astype({"state": object}))
    query = f"""
        SELECT p.pause_id, g.pid, g.tid, g.state,
               CASE WHEN overlapping THEN later_start ELSE earlier_end END AS start_ns,
               CASE WHEN overlapping THEN earlier_end ELSE later_start END AS end_ns,
               CASE WHEN overlapping THEN earlier_end - later_start ELSE 0 END AS overlap_ns,
               CASE WHEN overlapping THEN 0 ELSE later_start - earlier_end END AS slack_ns,
               NOT overlapping AS near_miss
        FROM p JOIN g
          ON g.start_ns <= p.end_ns + {slack_ns} AND p.start_ns <= g.end_ns + {slack_ns}
         AND p.start_ns < p.end_ns AND g.start_ns < g.end_ns,
        LATERAL (SELECT greatest(p.start_ns, g.start_ns) AS later_start,
                        least(p.end_ns, g.end_ns) AS earlier_end,
                        g.start_ns < p.end_ns AND p.start_ns < g.end_ns AS overlapping)
        WHERE overlapping OR {slack_ns} > 0
    """
    return con.execute(query).df()


def canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """Overlaps rows in one order with plain dtypes, for comparing multisets of rows."""
    columns = ["pause_id", "pid", "tid", "state", "start_ns", "end_ns", "overlap_ns", "slack_ns", "near_miss"]
    out = frame[columns].copy()
    out["state"] = out["state"].astype(str)
    for column in columns:
        if column not in ("state", "near_miss"):
            out[column] = out[column].astype(np.int64)
    out["near_miss"] = out["near_miss"].astype(bool)
    return out.sort_values(columns).reset_index(drop=True)


def test_witness_on_a_hand_checked_case():
    """The witness itself, against pairs worked out by hand (touching, zero-length, near miss)."""
    pauses = pauses_frame([(10, 20), (30, 30)])
    gil = gil_frame([
        (1, 1, "released", 0, 10),    # touches the pause: gap 0
        (1, 1, "waiting", 12, 15),    # inside: overlap 3
        (1, 2, "released", 15, 25),   # overlaps 5
        (1, 2, "waiting", 23, 24),    # gap 3
        (1, 3, "released", 14, 14),   # zero-length inside: nothing
        (1, 3, "released", 25, 40),   # contains the zero-length pause: nothing
    ])
    exact = canonical(duckdb_overlaps(pauses, gil))
    assert list(zip(exact.tid, exact.start_ns, exact.end_ns, exact.overlap_ns)) == [(1, 12, 15, 3), (2, 15, 20, 5)]
    near = canonical(duckdb_overlaps(pauses, gil, slack_ns=3))
    misses = near[near.near_miss]
    assert list(zip(misses.tid, misses.start_ns, misses.end_ns, misses.slack_ns)) == [(1, 10, 10, 0), (2, 20, 23, 3)]
    assert len(canonical(duckdb_overlaps(pauses, gil, slack_ns=2))) == 3
