"""The timeline picture: JVM pauses on one lane, each Python thread's GIL state on its own lane.

Drawn on a bare matplotlib Figure (rendered by Agg), never through pyplot, so it works
headless, in notebooks, and does not touch global matplotlib state.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

KIND_COLORS = {
    "safepoint": "#1f77b4", "gc_pause": "#d62728", "gc": "#ff9896", "vm_operation": "#9467bd",
    "compilation": "#8c564b", "deoptimization": "#e377c2",
}
STATE_COLORS = {"released": "#2ca02c", "waiting": "#ff7f0e"}
HOLDING_COLOR = "#d9d9d9"
MAX_THREAD_LANES = 40


def _in_window(frame: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    return frame[(frame["start_ns"] < end_ns) & (frame["end_ns"] > start_ns)]


def _bars(frame: pd.DataFrame, origin_ns: int, start_ns: int, end_ns: int) -> list[tuple[float, float]]:
    """(x, width) in ms from origin, clipped to the window."""
    lo = np.maximum(frame["start_ns"].to_numpy(np.int64), start_ns)
    hi = np.minimum(frame["end_ns"].to_numpy(np.int64), end_ns)
    return list(zip((lo - origin_ns) / 1e6, np.maximum(hi - lo, 0) / 1e6))


def draw_timeline(analysis, start_ns: int | None = None, end_ns: int | None = None,
                  path: str | os.PathLike | None = None):
    """Figure of the window [start_ns, end_ns) (default: the whole recording); PNG at path if given."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    header = analysis.header
    start_ns = int(header.get("span_start_ns", 0) if start_ns is None else start_ns)
    end_ns = int(header.get("span_end_ns", start_ns + 1) if end_ns is None else end_ns)
    if end_ns <= start_ns:
        raise ValueError(f"empty window: start_ns {start_ns} >= end_ns {end_ns}")

    pauses = _in_window(analysis.pauses, start_ns, end_ns)
    gil = _in_window(analysis.gil, start_ns, end_ns)
    overlaps = _in_window(analysis.overlaps[~analysis.overlaps["near_miss"]], start_ns, end_ns)
    free = _in_window(analysis.gil_free, start_ns, end_ns)
    # The most affected threads first, then the rest, up to MAX_THREAD_LANES lanes.
    hits = overlaps.groupby(["pid", "tid"])["overlap_ns"].sum()
    threads = sorted({(int(p), int(t)) for p, t in zip(gil["pid"], gil["tid"])},
                     key=lambda key: (-hits.get(key, 0), key))[:MAX_THREAD_LANES]
    pids = sorted({pid for pid, _ in threads})
    # One lane per pause kind: a GC pause sits inside its safepoint, inside its collection.
    kinds = [k for k in KIND_COLORS if k in set(pauses["kind"])] + sorted(set(pauses["kind"]) - set(KIND_COLORS))
    names = {}
    if "thread_name" in gil:
        named = gil.dropna(subset=["thread_name"]).drop_duplicates(["pid", "tid"])
        names = {(int(p), int(t)): str(n) for p, t, n in zip(named["pid"], named["tid"], named["thread_name"])}

    def thread_label(pid: int, tid: int) -> str:
        who = f"{names[(pid, tid)]} ({tid})" if (pid, tid) in names else f"tid {tid}"
        return who if len(pids) == 1 else f"pid {pid} {who}"

    lanes = [f"JVM {kind}" for kind in kinds] + [f"GIL free (pid {pid})" for pid in pids] + [thread_label(p, t) for p, t in threads]

    fig = Figure(figsize=(12, 1.2 + 0.35 * len(lanes)), dpi=100)
    ax = fig.add_subplot()
    y = {label: len(lanes) - 1 - i for i, label in enumerate(lanes)}
    height = 0.7

    def lane(label: str, frame: pd.DataFrame, **style) -> None:
        if len(frame):
            ax.broken_barh(_bars(frame, start_ns, start_ns, end_ns), (y[label] - height / 2, height), **style)

    for kind, group in pauses.groupby("kind"):
        lane(f"JVM {kind}", group, facecolors=KIND_COLORS.get(kind, "#7f7f7f"), edgecolor="none")
    for pid in pids:
        lane(f"GIL free (pid {pid})", free[free["pid"] == pid], facecolors="#17becf", edgecolor="none")
    for pid, tid in threads:
        label = thread_label(pid, tid)
        mine = gil[(gil["pid"] == pid) & (gil["tid"] == tid)]
        life = pd.DataFrame({"start_ns": [mine["start_ns"].min()], "end_ns": [mine["end_ns"].max()]})
        lane(label, life, facecolors=HOLDING_COLOR, edgecolor="none")
        for state, color in STATE_COLORS.items():
            lane(label, mine[mine["state"] == state], facecolors=color, edgecolor="none")
        hit = overlaps[(overlaps["pid"] == pid) & (overlaps["tid"] == tid)]
        lane(label, hit, facecolors="none", edgecolor="black", hatch="////", linewidth=0.8)

    ax.set_yticks(list(y.values()), list(y.keys()), fontsize=8)
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.set_xlim(0, (end_ns - start_ns) / 1e6)
    ax.set_xlabel(f"ms since {start_ns} ns (CLOCK_MONOTONIC)")
    shown = [Patch(color=KIND_COLORS.get(k, "#7f7f7f"), label=k) for k in sorted(pauses["kind"].unique())]
    shown += [Patch(color=c, label=s) for s, c in STATE_COLORS.items()]
    shown += [Patch(color=HOLDING_COLOR, label="holding (inferred)"), Patch(color="#17becf", label="GIL free"),
              Patch(facecolor="none", edgecolor="black", hatch="////", label="pause overlap")]
    ax.legend(handles=shown, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    more = len({(int(p), int(t)) for p, t in zip(gil["pid"], gil["tid"])}) - len(threads)
    ax.set_title("JVM pauses and GIL states" + (f" ({more} more threads not shown)" if more > 0 else ""))
    fig.tight_layout()
    if path is not None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    return fig
