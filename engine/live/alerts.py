"""Alerts: a pause that hit Python for longer than a threshold (`--alert-overlap 20ms`).

Each pause alerts at most once, when the overlap known for it first exceeds the threshold
(its overlaps may arrive over several pushes). An alert prints one line, and optionally
appends one JSON line to a file (`--alert-jsonl FILE`) and runs a user command
(`--alert-exec CMD`, run by the shell with the alert as JSON in TANDEM_ALERT, not waited for).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd


class Alerts:
    def __init__(self, overlap_ns: int | None, jsonl: Path | None = None, command: str | None = None, printer=print):
        self.overlap_ns = overlap_ns
        self.jsonl = Path(jsonl) if jsonl else None
        self.command = command
        self.printer = printer
        self.fired: set[int] = set()
        self.children: list[subprocess.Popen] = []
        self.count = 0

    def check(self, join, pause_ids) -> list[dict]:
        """Alerts for the pending pauses among PAUSE_IDS (those whose overlaps just changed),
        from the overlaps known so far."""
        pending = join.impact.pending
        if self.overlap_ns is None or pending is None or len(pause_ids) == 0:
            return []
        ids = [int(i) for i in pd.unique(pd.Series(pause_ids)) if int(i) not in self.fired]
        if not ids:
            return []
        totals = join.pause_overlap_ns(ids)
        over = totals[totals > self.overlap_ns]
        if over.empty:
            return []
        rows = join.impact.pending_overlaps_frame()
        pauses = pending.set_index("pause_id")
        alerts = []
        for pause_id, overlap in over.items():
            threads = rows[(rows["pause_id"] == pause_id) & ~rows["near_miss"].astype(bool)]
            alerts.append(self._alert(pauses.loc[pause_id], int(pause_id), int(overlap), threads))
        return alerts

    def check_final(self, join, impact: pd.DataFrame) -> list[dict]:
        """Alerts for finalized pauses (pause_impact rows) not alerted yet: their overlap may
        have grown with GIL intervals still open when they ended."""
        if self.overlap_ns is None or not len(impact):
            return []
        over = impact[(impact["overlap_ns"].to_numpy() > self.overlap_ns)
                      & ~np.isin(impact["pause_id"].to_numpy(), list(self.fired))]
        rows = join.impact.last_final_overlaps
        alerts = []
        for row in over.itertuples(index=False):
            threads = rows[(rows["pause_id"] == row.pause_id) & ~rows["near_miss"].astype(bool)] if rows is not None else None
            alerts.append(self._alert(row._asdict(), int(row.pause_id), int(row.overlap_ns), threads))
        return alerts

    def _alert(self, pause, pause_id: int, overlap: int, threads) -> dict:
        self.fired.add(pause_id)
        alert = {
            "pause_id": pause_id, "kind": str(pause["kind"]), "name": str(pause["name"]),
            "start_ns": int(pause["start_ns"]), "end_ns": int(pause["end_ns"]),
            "duration_ns": int(pause["end_ns"] - pause["start_ns"]), "overlap_ns": overlap,
            "threshold_ns": int(self.overlap_ns),
            "threads": sorted({(int(p), int(t)) for p, t in zip(threads["pid"], threads["tid"])}) if threads is not None else [],
        }
        self._fire(alert)
        return alert

    def _fire(self, alert: dict) -> None:
        self.count += 1
        threads = ", ".join(f"{p}/{t}" for p, t in alert["threads"][:6])
        self.printer(f"tandem: ALERT {alert['kind']}: {alert['name']} overlapped Python for "
                     f"{alert['overlap_ns'] / 1e6:.1f} ms (> {alert['threshold_ns'] / 1e6:g} ms; pause "
                     f"{alert['duration_ns'] / 1e6:.1f} ms at {alert['start_ns']} ns; threads pid/tid {threads})")
        line = json.dumps(alert)
        if self.jsonl is not None:
            with open(self.jsonl, "a") as f:
                f.write(line + "\n")
        if self.command:
            env = dict(os.environ, TANDEM_ALERT=line)
            env.pop("TANDEM_SESSION", None)
            self.children = [c for c in self.children if c.poll() is None]
            self.children.append(subprocess.Popen(self.command, shell=True, env=env))
