"""Alerts: a pause that hit Python for longer than a threshold (`--alert-overlap 20ms`).

Each pause alerts at most once, when it becomes final (its pause_impact row comes out; its
overlaps rows may have come before: engine/correlate, eager_pairs) with pause_impact's
overlap_ns over the threshold. An
alert prints one line, and optionally appends one JSON line to a file (`--alert-jsonl FILE`) and runs a user command
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
        self._threads: dict[int, set[tuple[int, int]]] = {}  # pause not final yet -> threads of its exact overlaps
        self.children: list[subprocess.Popen] = []
        self.count = 0

    def check(self, impact: pd.DataFrame | None, overlaps: pd.DataFrame | None) -> list[dict]:
        """Alerts for pauses that became final (their pause_impact rows) and overlapped Python
        for longer than the threshold; `overlaps`: the rows that came out with them (of these
        pauses or of pauses still to become final). None: no rows."""
        if self.overlap_ns is None:
            return []
        if overlaps is not None and len(overlaps):
            exact = overlaps[~overlaps["near_miss"].to_numpy(bool)]
            for pause_id, pid, tid in zip(*(exact[c].to_numpy(np.int64).tolist() for c in ("pause_id", "pid", "tid"))):
                self._threads.setdefault(pause_id, set()).add((pid, tid))
        alerts = []
        for row in impact.itertuples(index=False) if impact is not None else ():
            threads = self._threads.pop(int(row.pause_id), set())
            if row.overlap_ns > self.overlap_ns and row.pause_id not in self.fired:
                alerts.append(self._alert(row._asdict(), int(row.pause_id), int(row.overlap_ns), threads))
        return alerts

    def _alert(self, pause, pause_id: int, overlap: int, threads: set[tuple[int, int]]) -> dict:
        self.fired.add(pause_id)
        alert = {
            "pause_id": pause_id, "kind": str(pause["kind"]), "name": str(pause["name"]),
            "start_ns": int(pause["start_ns"]), "end_ns": int(pause["end_ns"]),
            "duration_ns": int(pause["end_ns"] - pause["start_ns"]), "overlap_ns": overlap,
            "threshold_ns": int(self.overlap_ns),
            "threads": sorted(threads),
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
