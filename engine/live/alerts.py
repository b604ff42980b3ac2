"""Alerts: a pause that hit Python for longer than a threshold (`--alert-overlap 20ms`).

Each pause alerts at most once, when it becomes final (engine/correlate: its overlaps rows and
pause_impact row come out together) with pause_impact's overlap_ns over the threshold. An
alert prints one line, and optionally appends one JSON line to a file (`--alert-jsonl FILE`) and runs a user command
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

    def check(self, impact: pd.DataFrame, overlaps: pd.DataFrame) -> list[dict]:
        """Alerts for pauses that became final (their pause_impact rows, with the overlaps rows
        made final with them) and overlapped Python for longer than the threshold."""
        if self.overlap_ns is None or not len(impact):
            return []
        over = impact[(impact["overlap_ns"].to_numpy() > self.overlap_ns) & ~impact["pause_id"].isin(self.fired).to_numpy()]
        exact = overlaps[~overlaps["near_miss"].to_numpy(bool)] if len(over) else overlaps
        alerts = []
        for row in over.itertuples(index=False):
            threads = exact[exact["pause_id"].to_numpy() == row.pause_id]
            alerts.append(self._alert(row._asdict(), int(row.pause_id), int(row.overlap_ns), threads))
        return alerts

    def _alert(self, pause, pause_id: int, overlap: int, threads) -> dict:
        self.fired.add(pause_id)
        alert = {
            "pause_id": pause_id, "kind": str(pause["kind"]), "name": str(pause["name"]),
            "start_ns": int(pause["start_ns"]), "end_ns": int(pause["end_ns"]),
            "duration_ns": int(pause["end_ns"] - pause["start_ns"]), "overlap_ns": overlap,
            "threshold_ns": int(self.overlap_ns),
            "threads": sorted({(int(p), int(t)) for p, t in zip(threads["pid"], threads["tid"])}),
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
