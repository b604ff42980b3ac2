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
        """Alerts for the pauses among PAUSE_IDS (those whose overlaps just changed)."""
        if self.overlap_ns is None or join.pauses is None or len(pause_ids) == 0:
            return []
        ids = [int(i) for i in pd.unique(pd.Series(pause_ids)) if int(i) not in self.fired]
        if not ids:
            return []
        totals = join.pause_overlap_ns(ids)
        over = totals[totals > self.overlap_ns]
        alerts = []
        pauses = join.pauses.set_index("pause_id")
        for pause_id, overlap in over.items():
            self.fired.add(int(pause_id))
            pause = pauses.loc[pause_id]
            threads = join.overlaps[(join.overlaps["pause_id"] == pause_id) & ~join.overlaps["near_miss"].astype(bool)]
            alert = {
                "pause_id": int(pause_id), "kind": str(pause["kind"]), "name": str(pause["name"]),
                "start_ns": int(pause["start_ns"]), "end_ns": int(pause["end_ns"]),
                "duration_ns": int(pause["end_ns"] - pause["start_ns"]), "overlap_ns": int(overlap),
                "threshold_ns": int(self.overlap_ns),
                "threads": sorted({(int(p), int(t)) for p, t in zip(threads["pid"], threads["tid"])}),
            }
            alerts.append(alert)
            self._fire(alert)
        return alerts

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
