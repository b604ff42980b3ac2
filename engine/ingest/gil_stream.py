"""The GIL side of an offline analysis as a stream of blocks for the correlation core
(engine/analysis/stream.py drives it): what every GIL source gives (`GilSource`, `GilBlock`) and
what they share. One module per format: Parquet gil tables (engine/ingest/gil_parquet.py), the
probe's events files (engine/ingest/gil_events.py), a table already in memory (`FrameGil`,
here), sources of several kinds at once (engine/ingest/gil_merged.py).

Two passes over a source. The first (`first_pass`) learns what the core cannot know from the
past alone: where each later block starts at the earliest (the watermark after each block) and
each thread's inferred lifetime (docs/results.md, "gil_free"). The second (`pushes`) gives the
blocks in the order their intervals start.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.correlate import END, GilRows, kernels
from engine.correlate.inputs import gil_rows_from_frame
from engine.correlate.schema import GIL_CARRIED_COLUMNS, GIL_STATES, to_pandas
from engine.correlate.tables import check_gil


# Rows of a block: what the core takes at a push, and about what a source holds at once. The
# format modules read BLOCK_ROWS and MIN_FILE_BLOCK from here when used (gil_stream.BLOCK_ROWS):
# one value for every format, which tests set smaller.
BLOCK_ROWS = 1 << 20
MIN_FILE_BLOCK = 1 << 12  # rows of a block of one of many files (tables, processes' events files) read side by side
FIRST_PASS_THREADS = 8  # (files or row groups of a first pass read side by side)


class GilSource(Protocol):
    """What the drive reads of a GIL source (docs/pipeline.md, "A GIL source")."""

    source: str              # the name messages and the header use
    attrs: dict              # the table's metadata (clock, processes), complete after first_pass
    carried: list            # Arrow fields of the code columns the rows carry into overlaps
    copy: bool               # the results hold their own gil.parquet (else they name `references`)
    copy_schema: pa.Schema | None
    references: list[str]
    duplicate_rows: int

    def first_pass(self) -> pd.DataFrame:
        """Each thread's lifetime (pid, tid, start_ns, end_ns); inside, each block's watermark."""

    def thread_names(self, keys: np.ndarray) -> dict:
        """Names of the threads KEYS ((pid << 32) | tid) the blocks' rows do not name."""

    def pushes(self) -> Iterator["GilBlock"]:
        """The blocks, in time order."""


class ThreadHulls:
    """The hull of each thread's non-empty intervals (its inferred lifetime), block by block:
    key (pid << 32 | tid), start_ns, end_ns."""

    def __init__(self):
        self.numbers = kernels.DenseNumbers()
        self.lo, self.hi = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def add(self, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> "ThreadHulls":
        index, new = self.numbers.number(tid, high=pid)  # (pid << 32) | tid
        if new.size:
            self.lo = np.concatenate([self.lo, np.full(new.size, END, np.int64)])
            self.hi = np.concatenate([self.hi, np.full(new.size, -END, np.int64)])
        kernels.group_bounds(index, start, end, self.lo, self.hi)
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """key, start_ns, end_ns per thread (a frame is made once, of every part: lifetimes_of)."""
        return self.numbers.keys, self.lo, self.hi


def thread_lifetimes(gil: pd.DataFrame) -> pd.DataFrame:
    """pid, tid, start_ns, end_ns: each thread's lifetime in a whole GIL table (the hull of its
    non-empty intervals), as a streamed session's first pass gives it."""
    columns = (gil[c].to_numpy(np.int64) for c in ("pid", "tid", "start_ns", "end_ns"))
    return lifetimes_of([ThreadHulls().add(*columns).arrays()])


def lifetimes_of(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> pd.DataFrame:
    """pid, tid, start_ns, end_ns of each thread from the hulls of PARTS (ThreadHulls.arrays)."""
    threads = pd.DataFrame({name: np.concatenate([np.zeros(0, np.int64), *(part[k] for part in parts)])
                            for k, name in enumerate(("key", "start_ns", "end_ns"))})
    threads = threads[threads.end_ns > threads.start_ns].groupby("key", as_index=False).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    key = threads["key"].to_numpy(np.int64)
    threads["pid"], threads["tid"] = key >> 32, key & 0xFFFFFFFF
    return threads[["pid", "tid", "start_ns", "end_ns"]]


class FrameGil:
    """A gil table already in memory (a DataFrame) as one block: the notebook's `correlate`. It is
    checked (engine.correlate.tables.check_gil) by the first pass; its duplicate rows dropped there."""

    copy, copy_schema, references = True, None, []  # (the table is the caller's: results keep it, name no file)

    def __init__(self, gil: pd.DataFrame, source: str):
        self.frame, self.source, self.attrs = gil, source, gil.attrs
        carried = [c for c in GIL_CARRIED_COLUMNS if c in gil.columns]
        self.carried = list(pa.Schema.from_pandas(gil[carried], preserve_index=False)) if carried else []
        self.duplicate_rows = 0

    def first_pass(self) -> pd.DataFrame:
        self.frame, self.duplicate_rows = check_gil(self.frame, self.source)
        return thread_lifetimes(self.frame)

    def thread_names(self, keys: np.ndarray) -> dict:
        return {}  # (the blocks' rows name their threads)

    def pushes(self):
        frame = self.frame
        yield GilBlock(gil_rows_from_frame(frame), END, len(frame), frame_of=lambda mask: frame[mask])


def merged_before(runs: list[GilRows], watermark: int) -> tuple[list[np.ndarray], list[GilRows]]:
    """The rows of RUNS (each sorted by start, then pid, tid) that start before WATERMARK, merged
    in that order (rows equal in it: the earlier run's first), as the arrays pid, tid, state,
    start_ns, end_ns and carried_key (what each run's rows carry along: their code's number, or
    where they were read); and what is left of the runs. A run left with less than half its
    arrays is copied out of them (each row copied a few times at most): a block read is not kept
    whole for its last rows."""
    cuts = [int(np.searchsorted(r.start_ns, watermark, "left")) for r in runs]
    names = ("pid", "tid", "state", "start_ns", "end_ns", "carried_key")
    parts = [[getattr(r, n)[:cut] for n in names] for r, cut in zip(runs, cuts) if cut]
    left = []
    for r, cut in zip(runs, cuts):
        if cut < len(r):
            rest = [getattr(r, n)[cut:] for n in names]
            if 2 * (len(r) - cut) < (r.start_ns.base if r.start_ns.base is not None else r.start_ns).size:
                rest = [a.copy() for a in rest]
            left.append(GilRows(*rest[:5], None, rest[5]))
    if not parts:
        arrays = [getattr(GilRows.empty(), n) for n in names[:5]] + [np.zeros(0, np.int64)]
    elif len(parts) == 1:
        arrays = parts[0]
    else:
        # Only the rows up to the other runs' last start need merging: the run reaching furthest
        # goes on alone after them (one process: its last block past the few rows left of the one before).
        last = [int(p[3][-1]) for p in parts]
        furthest = int(np.argmax(last))
        cut = int(np.searchsorted(parts[furthest][3], max(last[:furthest] + last[furthest + 1:]), "right"))
        heads = [p if k != furthest else [a[:cut] for a in p] for k, p in enumerate(parts)]
        merged = [np.concatenate(column) for column in zip(*heads)]
        tails = [tail[cut:] for tail in parts[furthest]]
        arrays = [np.empty(a.size + t.size, a.dtype) for a, t in zip(merged, tails)]
        bounds = np.cumsum([0, *(h[3].size for h in heads)]).astype(np.int64)
        pid, tid, state, start, end, key = merged
        kernels.merge_runs(bounds, start, pid, tid, state, end, key, *(arrays[k] for k in (3, 0, 1, 2, 4, 5)))
        for a, t in zip(arrays, tails):
            a[a.size - t.size:] = t
    return arrays, left


@dataclass
class GilBlock:
    """One push's GIL side: the rows, the watermark after them, the rows pushed so far; `copy`:
    the rows of gil.parquet (when copied); `table_of(mask)`: some rows as read_gil's table;
    `frame_of(mask)`: some rows of a table already in memory."""

    rows: GilRows
    watermark_ns: int
    rows_so_far: int
    copy: pa.Table | None = None
    table_of: Callable[[np.ndarray | None], pa.Table] | None = None
    frame_of: Callable[[np.ndarray], pd.DataFrame] | None = None


def rows_frame(block: GilBlock, mask: np.ndarray) -> pd.DataFrame:
    """Some rows of a block as a gil-table DataFrame (with thread names and code when known)."""
    if block.frame_of is not None:
        return block.frame_of(mask)
    if block.table_of is not None:
        return to_pandas(block.table_of(mask))
    rows, taken = block.rows, np.flatnonzero(mask)  # (a few rows of a million: taken, not filtered)
    frame = pd.DataFrame({"pid": rows.pid[taken], "tid": rows.tid[taken],
                          "state": pd.Categorical.from_codes(rows.state[taken], categories=list(GIL_STATES)),
                          "start_ns": rows.start_ns[taken], "end_ns": rows.end_ns[taken]})
    if rows.carried is not None:  # (as Python values: pandas' conversion costs a millisecond a call)
        for name, column in zip(rows.carried.column_names, rows.carried.take(pa.array(taken)).columns):
            frame[name] = pd.Series(column.to_pylist(), dtype=object)
    return frame
