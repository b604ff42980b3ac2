"""Spans while `tandem live` runs: received spans figured as the live correlation goes on.

The OTLP receiver hands each request's spans over (`add`, from its own thread); the live loop
hands over the pauses and GIL intervals it reads (`add_rows`), and asks for the spans that
are due (`due`): those whose end the watermark has passed by `due_after_ns` (a stop of the
world still going on at a span's end reaches the live loop once it ends: with the agent's
pause ring within a poll, with the JFR repository alone a re-read later). A due span gets the
same figures `tandem analyze --spans` computes (engine/spans/figures.py, on the pauses and
GIL intervals kept), from the same code; a stop's cause text is what the live pauses name (the
pause ring carries no GC cause, and the Python code that asked for a stop is offline's).

`tandem live SESSION` follows the spans `tandem record` receives into SESSION/spans.binpb
(`tail`): they reach it a poll after the receiver wrote them.

Clock: besides the session's own wall/monotonic pairs (engine/spans/clock.py), tandem live
reads a pair of its own, back to back on the same host, each time spans arrive, so every
span lies between two pairs a few seconds apart.

Kept: GIL intervals `retain_ns` behind the watermark (the figures of a span longer than that
see only its last `retain_ns` of GIL states), stops of the world `PAUSES_KEPT_NS`, and the
figured spans of the last `window_ns` for the requests table (the view's "requests hurt").
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.clock.pair import clock_pair
from engine.correlate.schema import END
from engine.errors import TandemError
from engine.spans.clock import ClockPair, SpanClock, session_pairs, spans_on_monotonic_with
from engine.spans.figures import SpanFigures
from engine.spans.outputs import figured_spans, requests_table

RETAIN_NS = 30_000_000_000
PAUSES_KEPT_NS = 600_000_000_000
WINDOW_NS = 300_000_000_000  # the requests table: spans of the last five minutes
REQUESTS_EVERY_S = 5.0  # the requests table is recomputed at most this often
OWN_PAIR_EVERY_NS = 500_000_000
SESSION_PAIRS_EVERY_S = 5.0
# Due spans are figured together at most this often: a figuring costs tens of ms whatever its
# spans (pandas' per-call costs) and ~5 us a span, so the spans of a few seconds at once.
FIGURE_EVERY_S = 5.0  # the session's own pairs (new processes' GIL files) are re-read at most this often
# How long after a span's end the watermark must be before it is figured: a stop of the world
# reaches the live loop when it ends, from the agent's pause ring within a poll, from the JFR
# repository alone a re-read (5 s) and a flush later.
DUE_AFTER_RING_NS = 1_000_000_000
DUE_AFTER_REPOSITORY_NS = 7_000_000_000
OWN_PAIRS_KEPT = 2_000
# The pause columns a stop of the world's figures read (engine/spans/figures.py's stops table).
PAUSE_COLUMNS = ("pause_id", "kind", "name", "start_ns", "end_ns", "jvm_pid", "at_safepoint", "cause")
# What the requests table reads of a figured span (the window keeps only these).
REQUEST_INPUT_COLUMNS = ("service_name", "endpoint", "duration_ns", "pause_ns", "gil_wait_ns", "lost_ns", "lost_share", "end_ns")


def own_pair() -> ClockPair:
    """(wall, CLOCK_MONOTONIC) read back to back here, as session.json's (clock_pair)."""
    monotonic, wall, error = clock_pair()
    return ClockPair(wall, monotonic, error, "tandem live")


class LiveSpans:
    def __init__(self, session: Path, *, due_after_ns: int = DUE_AFTER_RING_NS, retain_ns: int = RETAIN_NS,
                 window_ns: int = WINDOW_NS, tail=None):
        self.session = Path(session)
        self.tail = tail  # engine.spans.source.BinpbTail: spans another process receives (`tandem live SESSION`)
        self.due_after_ns = int(due_after_ns)
        self.retain_ns, self.window_ns = int(retain_ns), int(window_ns)
        self._lock = threading.Lock()
        self._arrived: list[pd.DataFrame] = []
        self._own_pairs: list[ClockPair] = []
        self._session_pairs: tuple[list[ClockPair], dict] | None = None
        self._session_pairs_at = 0.0
        self._pending: pd.DataFrame | None = None  # on CLOCK_MONOTONIC, not due yet
        self._gil: list[tuple[int, pd.DataFrame]] = []  # (latest end, GIL rows) per batch read
        self._pauses = pd.DataFrame()
        self._window: list[tuple[pd.DataFrame, pd.DataFrame, int]] = []  # (figured spans, their stop overlaps, latest end)
        self._requests: pd.DataFrame | None = None
        self._requests_at = -REQUESTS_EVERY_S
        self._figured_at = -FIGURE_EVERY_S
        self.received = self.figured = self.refused = 0
        self.cpu_s = 0.0  # CPU of the live loop's thread in due() and requests(): clock, figures, requests table
        self.problem: str | None = None  # why spans were refused (said once by the view)

    # ---- input -------------------------------------------------------------------------------

    def add(self, spans: pd.DataFrame) -> None:
        """A received request's spans (engine.spans.source's table, wall clock); any thread."""
        pair = own_pair()
        with self._lock:
            self._arrived.append(spans)
            if not self._own_pairs or pair.monotonic_ns - self._own_pairs[-1].monotonic_ns >= OWN_PAIR_EVERY_NS:
                self._own_pairs.append(pair)
                del self._own_pairs[:-OWN_PAIRS_KEPT]
            self.received += len(spans)

    def add_rows(self, pauses: pd.DataFrame | None, gil: pd.DataFrame | None) -> None:
        """Pauses and closed GIL intervals the live loop read."""
        if gil is not None and len(gil):
            self._gil.append((int(gil["end_ns"].max()), gil[["pid", "tid", "state", "start_ns", "end_ns"]]))
        if pauses is not None and len(pauses):
            columns = [c for c in PAUSE_COLUMNS if c in pauses]
            self._pauses = pd.concat([self._pauses, pauses[columns]], ignore_index=True) if len(self._pauses) else pauses[columns]

    # ---- spans due -----------------------------------------------------------------------------

    def due(self, watermark_ns: int, open_gil=None) -> pd.DataFrame | None:
        """The spans whose end the watermark has passed by due_after_ns, figured (spans.parquet's
        rows), or None; at most every FIGURE_EVERY_S but at the end (the watermark at END).
        OPEN_GIL: a function returning the GIL intervals open now (pid, tid, state, start_ns),
        taken to last until the watermark; called only when spans are figured."""
        if watermark_ns < END and time.monotonic() - self._figured_at < FIGURE_EVERY_S:
            return None
        self._figured_at = time.monotonic()
        began = time.thread_time()
        try:
            return self._due(watermark_ns, open_gil)
        finally:
            self.cpu_s += time.thread_time() - began

    def _due(self, watermark_ns: int, open_gil) -> pd.DataFrame | None:
        self._take_arrived()
        if self._pending is None or not len(self._pending):
            self._prune(watermark_ns)
            return None
        ready = self._pending["end_ns"].to_numpy(np.int64) + self.due_after_ns <= watermark_ns
        if not ready.any():
            return None
        spans, self._pending = self._pending[ready], self._pending[~ready]
        gil = self._gil_rows(open_gil() if open_gil is not None else None, watermark_ns, int(spans["start_ns"].min()))
        figures = SpanFigures(self._pauses_around(int(spans["start_ns"].min()), int(spans["end_ns"].max())))
        table = figured_spans(spans, figures, gil)
        slim = table[list(REQUEST_INPUT_COLUMNS)]
        self._window.append((slim, figures.stop_overlaps(table), int(table["end_ns"].max())))
        self.figured += len(table)
        self._prune(watermark_ns)
        return table

    def _take_arrived(self) -> None:
        if self.tail is not None:
            try:
                spans = self.tail.poll()
            except Exception as err:  # (a damaged file: said once, the run goes on without spans)
                self.problem, self.tail = f"{self.tail.path}: {err}", None
                spans = None
            if spans is not None:
                self.add(spans)
        with self._lock:
            arrived, self._arrived = self._arrived, []
            own = list(self._own_pairs)
        if not arrived:
            return
        spans = pd.concat(arrived, ignore_index=True) if len(arrived) > 1 else arrived[0]
        try:
            if self._session_pairs is None or time.monotonic() - self._session_pairs_at >= SESSION_PAIRS_EVERY_S:
                self._session_pairs, self._session_pairs_at = session_pairs(self.session), time.monotonic()
            pairs, description = self._session_pairs
            spans, _ = spans_on_monotonic_with(spans, SpanClock([*pairs, *own]), description.get("hostname"), self.session)
        except TandemError as err:
            self.refused += len(spans)
            self.problem = str(err)
            return
        self._pending = spans if self._pending is None else pd.concat([self._pending, spans], ignore_index=True)

    def _gil_rows(self, open_gil: pd.DataFrame | None, watermark_ns: int, since_ns: int) -> pd.DataFrame:
        """The kept GIL rows of the batches reaching past SINCE_NS, and the open ones (until the watermark)."""
        frames = [rows for end, rows in self._gil if end >= since_ns]
        if open_gil is not None and len(open_gil):
            frames.append(open_gil.assign(end_ns=np.maximum(open_gil["start_ns"].to_numpy(np.int64), watermark_ns)))
        if not frames:
            return pd.DataFrame({"pid": [], "tid": [], "state": [], "start_ns": [], "end_ns": []}).astype(
                {"pid": np.int64, "tid": np.int64, "start_ns": np.int64, "end_ns": np.int64})
        gil = pd.concat(frames, ignore_index=True)
        gil["state"] = gil["state"].astype(str)
        return gil

    def _pauses_around(self, start_ns: int, end_ns: int) -> pd.DataFrame:
        """The kept pauses that may belong to a stop overlapping [START_NS, END_NS] (a stop's
        pauses lie inside its safepoint: within the longest pause of it), sorted by start."""
        if not len(self._pauses):
            return pd.DataFrame({c: [] for c in ("pause_id", "kind", "name", "start_ns", "end_ns")})
        start, end = self._pauses["start_ns"].to_numpy(np.int64), self._pauses["end_ns"].to_numpy(np.int64)
        longest = int((end - start).max())
        near = (end >= start_ns - longest) & (start <= end_ns + longest)
        return self._pauses[near].sort_values(["start_ns", "end_ns"], kind="stable", ignore_index=True)

    def _prune(self, watermark_ns: int) -> None:
        horizon = watermark_ns - self.retain_ns
        while self._gil and self._gil[0][0] < horizon:  # (batches come in reading order: the oldest first)
            self._gil.pop(0)
        if len(self._pauses):
            keep = self._pauses["end_ns"].to_numpy(np.int64) >= watermark_ns - PAUSES_KEPT_NS
            if not keep.all():
                self._pauses = self._pauses[keep].reset_index(drop=True)
        newest = max((end for _, _, end in self._window), default=0)
        while self._window and self._window[0][2] < newest - self.window_ns:
            self._window.pop(0)

    # ---- the requests table --------------------------------------------------------------------

    def requests(self, force: bool = False) -> pd.DataFrame | None:
        """requests.parquet's table over the spans figured in the last window_ns (recomputed at
        most every REQUESTS_EVERY_S unless FORCE), or None before the first span."""
        now = time.monotonic()
        if not self._window:
            return self._requests
        if force or now - self._requests_at >= REQUESTS_EVERY_S:
            self._requests_at = now
            began = time.thread_time()
            tables, overlaps, offset = [], [], 0
            for table, stop_rows, _ in self._window:
                tables.append(table)
                overlaps.append(stop_rows.assign(span=stop_rows["span"].to_numpy(np.int64) + offset))
                offset += len(table)
            self._requests = requests_table(pd.concat(tables, ignore_index=True), pd.concat(overlaps, ignore_index=True))
            self.cpu_s += time.thread_time() - began
        return self._requests
