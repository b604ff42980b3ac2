"""Rolling Parquet output: one file set per interval (default a minute).

    OUT/part-000001/pauses.parquet     pauses that arrived in the interval
    OUT/part-000001/gil.parquet        GIL intervals that closed in it
    OUT/part-000001/overlaps.parquet   overlaps rows emitted in it (pause_id refers to pauses of any part)
    OUT/part-000001/summary.parquet    the rolling summary over everything up to the part's end
    OUT/part-000001/_done.json         written last: the part is complete

Same schemas as `tandem analyze` (docs/results.md). Every file is written atomically
(engine.store.write_table: temporary file + rename), once, when its interval closes (or at
Ctrl-C/SIGTERM/end), so after a SIGKILL every file present is intact; a part without
`_done.json` was being written when the process died. Read a live session from a notebook:
`pd.concat(pd.read_parquet(p) for p in sorted(glob("OUT/part-*/overlaps.parquet")))`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

from engine.store import write_table

TABLES = ("pauses", "gil", "overlaps", "summary")


class RollingWriter:
    def __init__(self, out: Path, interval_ns: int, header: dict | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.interval_ns = int(interval_ns)
        self.header = dict(header or {})
        self.index = 1 + max((int(p.name.split("-")[1]) for p in self.out.glob("part-*") if p.name.split("-")[1].isdigit()), default=0)
        self.parts_written: list[Path] = []
        self._reset(time.monotonic_ns())

    def _reset(self, now: int) -> None:
        self.opened_ns = now
        self._buffers: dict[str, list[pd.DataFrame]] = {"pauses": [], "gil": [], "overlaps": []}

    def add(self, pauses: pd.DataFrame, gil: pd.DataFrame, overlaps: pd.DataFrame) -> None:
        for name, frame in (("pauses", pauses), ("gil", gil), ("overlaps", overlaps)):
            if frame is not None and len(frame):
                self._buffers[name].append(frame)

    def due(self, now_ns: int | None = None) -> bool:
        now = time.monotonic_ns() if now_ns is None else now_ns
        return now - self.opened_ns >= self.interval_ns

    def roll(self, summary: pd.DataFrame, empty_like: dict[str, pd.DataFrame], now_ns: int | None = None) -> Path:
        """Write the current part (atomically, file by file; _done.json last) and open the next."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        part = self.out / f"part-{self.index:06d}"
        part.mkdir(parents=True, exist_ok=True)
        meta = {"part": self.index, "opened_monotonic_ns": self.opened_ns, "closed_monotonic_ns": now, **self.header}
        counts = {}
        for name in ("pauses", "gil", "overlaps"):
            frames = self._buffers[name]
            table = pd.concat(frames, ignore_index=True) if frames else empty_like[name]
            write_table(table, part / f"{name}.parquet", {"table": name, "live": meta})
            counts[name] = len(table)
        write_table(summary, part / "summary.parquet", {"table": "summary", "live": meta})
        tmp = part / "_done.json.tmp"
        tmp.write_text(json.dumps({**meta, "rows": counts}, default=str) + "\n")
        os.replace(tmp, part / "_done.json")
        self.parts_written.append(part)
        self.index += 1
        self._reset(now)
        return part


def read_parts(out: str | os.PathLike, table: str, complete_only: bool = False) -> pd.DataFrame:
    """One table concatenated over the parts of a live output directory."""
    from engine.store import read_table

    parts = sorted(Path(out).glob("part-*"))
    frames = [read_table(p / f"{table}.parquet") for p in parts
              if (p / f"{table}.parquet").exists() and (not complete_only or (p / "_done.json").exists())]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
