"""Rolling Parquet output: one file set per interval (default a minute).

    OUT/part-000001/pauses.parquet     pauses read in the interval (their overlaps rows with closed GIL intervals with them)
    OUT/part-000001/gil.parquet        GIL intervals that closed in it
    OUT/part-000001/overlaps.parquet   overlaps rows emitted in it (pause_id refers to pauses of any part)
    OUT/part-000001/pause_impact.parquet  rows of the pauses that became final in it
    OUT/part-000001/gil_free.parquet   gil_free rows that became final in it
    OUT/part-000001/spans.parquet      spans figured in it (`tandem live --otlp-receiver`; only in parts that have some)
    OUT/part-000001/summary.parquet    the rolling summary over everything up to the part's end
    OUT/part-000001/memory.parquet     memory.parquet's rows (docs/results.md) sampled up to the part's
                                       end, not in an earlier part (absent without memory samples)
    OUT/part-000001/_done.json         written last: the part is complete

Same schemas as `tandem analyze` (docs/results.md). Every file is written atomically
(engine.store.write_table: temporary file + rename), once, when its interval closes (or at
Ctrl-C/SIGTERM/end), so after a SIGKILL every file present is intact; a part without
`_done.json` was being written when the process died. Read back with engine.results.Results
(`Results(OUT).table("overlaps")`) or `engine.analysis.load_results(OUT)`.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from pathlib import Path

import pandas as pd

from engine.correlate.schema import ROW_TABLES, empty_frame
from engine.store import write_table

# Tables a part holds only when it has rows of them. spans: docs/spans.md (its Arrow list
# columns are written without pandas' schema metadata, as in `tandem analyze`).
OPTIONAL_TABLES = ("spans",)


class RollingWriter:
    def __init__(self, out: Path, interval_ns: int, header: dict | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.interval_ns = int(interval_ns)
        self.header = dict(header or {})
        self.index = 1 + max((int(p.name.split("-")[1]) for p in self.out.glob("part-*") if p.name.split("-")[1].isdigit()), default=0)
        self.parts_written: list[Path] = []
        # Called with each batch of rows handed to the parts ({table: rows}), on the loop's
        # thread: engine/live/metrics.py counts what the parts get.
        self.observers: list = []
        # Parts are written by a thread of their own (pyarrow releases the GIL while it writes):
        # a roll must not hold up the loop that reads the rings.
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._reset(time.monotonic_ns())

    def _reset(self, now: int) -> None:
        self.opened_ns = now
        self._buffers: dict[str, list[pd.DataFrame]] = {name: [] for name in (*ROW_TABLES, *OPTIONAL_TABLES)}

    def add(self, pauses: pd.DataFrame, gil: pd.DataFrame, overlaps: pd.DataFrame, **more: pd.DataFrame) -> None:
        """Rows for the current part; `more`: pause_impact=..., gil_free=..."""
        batch = {}
        for name, frame in (("pauses", pauses), ("gil", gil), ("overlaps", overlaps), *more.items()):
            if frame is not None and len(frame):
                self._buffers[name].append(frame)
                batch[name] = frame
        for observer in self.observers:
            if batch:
                observer(batch)

    def due(self, now_ns: int | None = None) -> bool:
        now = time.monotonic_ns() if now_ns is None else now_ns
        return now - self.opened_ns >= self.interval_ns

    def roll(self, summary: pd.DataFrame, now_ns: int | None = None, wait: bool = False,
             more: dict[str, pd.DataFrame] | None = None) -> Path:
        """Close the current part and open the next; the part is written (atomically, file by
        file; _done.json last) by the writer thread. wait: return once it is on disk. more:
        other tables of the part, each written where it has rows (memory)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        part = self.out / f"part-{self.index:06d}"
        meta = {"part": self.index, "opened_monotonic_ns": self.opened_ns, "closed_monotonic_ns": now, **self.header}
        tables = {}
        for name in ROW_TABLES:
            tables[name] = self._buffers[name] or [empty_frame(name)]
        tables.update({name: self._buffers[name] for name in OPTIONAL_TABLES if self._buffers[name]})
        tables["summary"] = [summary]
        tables.update({name: [frame] for name, frame in (more or {}).items() if len(frame)})
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="tandem-live-writer", daemon=True)
            self._thread.start()
        done = threading.Event()
        self._queue.put((part, meta, tables, done))
        self.index += 1
        self._reset(now)
        if wait:
            self.flush()
        return part

    def flush(self) -> None:
        """Wait until every part handed over is on disk (raises the writer's error, if any)."""
        if self._thread is not None:
            self._queue.join()
        if self.error is not None:
            raise self.error

    def _write_loop(self) -> None:
        while True:
            part, meta, tables, done = self._queue.get()
            try:
                if self.error is None:
                    self._write(part, meta, tables)
            except BaseException as err:  # reported by flush()
                self.error = err
            finally:
                done.set()
                self._queue.task_done()

    def _write(self, part: Path, meta: dict, tables: dict[str, list[pd.DataFrame]]) -> None:
        part.mkdir(parents=True, exist_ok=True)
        counts = {}
        try:
            for name, frames in tables.items():
                table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                write_table(table, part / f"{name}.parquet", {"table": name, "live": meta},
                            pandas_metadata=name not in OPTIONAL_TABLES)
                if name != "summary":
                    counts[name] = len(table)
            tmp = part / "_done.json.tmp"
            tmp.write_text(json.dumps({**meta, "rows": counts}, default=str) + "\n")
            os.replace(tmp, part / "_done.json")
        except BaseException:  # (a full disk: no part left with some of its tables)
            shutil.rmtree(part, ignore_errors=True)
            raise
        self.parts_written.append(part)
