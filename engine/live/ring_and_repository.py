"""A JVM's pause ring for latency, reconciled with its JFR repository (docs/live.md): the live
source `SessionWatcher` (engine/live/sources.py) takes for a JVM with a ring."""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.live.pause_ring import PauseRingSource
from engine.live.repository import RepositorySource
from engine.session import REPOSITORY


class _Spans:
    """(start, end) pairs added a batch at a time and searched by start: sorted runs whose sizes
    at least double from the newest to the oldest (two neighbours of comparable size are
    merged), so that adding costs O(log n) a pair amortized and a search O(log n) runs, where
    one sorted array re-sorted at every poll cost O(n) a poll over a long live run."""

    def __init__(self):
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        order = np.argsort(starts, kind="stable")
        self.runs.append((starts[order], ends[order]))
        while len(self.runs) > 1 and self.runs[-2][0].size <= 2 * self.runs[-1][0].size:
            (s1, e1), (s2, e2) = self.runs.pop(-2), self.runs.pop()
            both = np.concatenate([s1, s2])
            order = np.argsort(both, kind="stable")
            self.runs.append((both[order], np.concatenate([e1, e2])[order]))

    def match(self, start: int, end: int, tolerance_ns: int) -> int | None:
        """The start of a pair whose start and end are both within TOLERANCE_NS of these, if any."""
        for starts, ends in self.runs:
            i = int(np.searchsorted(starts, start - tolerance_ns))
            while i < starts.size and starts[i] <= start + tolerance_ns:
                if abs(int(ends[i]) - end) <= tolerance_ns:
                    return int(starts[i])
                i += 1
        return None


class RingWithRepositorySource(PauseRingSource):
    """The pause ring for latency, reconciled with the JFR repository (then recording.jfr).

    The ring misses what JFR recorded before the agent's stream started (start-up
    safepoints), and kinds it does not carry (compilation, deoptimization). The repository is
    re-read every REPOSITORY_EVERY_S as RepositorySource does; a pause it has that no
    delivered ring row matches -- same kind, start and end within MATCH_NS -- is delivered
    too, late (the join's late lane pairs it). Times: a pause both sources have keeps the
    ring's (System.nanoTime() through the agent's tightest ClockSync pair; it was delivered
    first); a repository-only pause is moved onto the ring's alignment by the median
    (ring - repository) start difference of the matched pauses (tens of ns). Repository
    pauses of the RING_KINDS ending after the last ring row seen are held back (the ring may
    still bring them), except at the final read. The repository is read on a thread of its
    own (a read takes tenths of a second; ring rows must not wait for it).
    """

    how = "pause ring + JFR repository"
    # Kinds taken from the ring. vm_operation (not at a safepoint) is not: the ring carries
    # some the recording does not (a JFRCheckpoint at stream start-up), so those come from
    # the repository only, late, to stay equal to offline.
    RING_KINDS = ("safepoint", "gc_pause", "gc")
    MATCH_NS = 2_000  # the alignments differ by tens to hundreds of ns (agent clock_error_ns ~300)
    # The repository re-read is for reconciliation only (start-up pauses, kinds the ring does
    # not carry): rarely, so that its reads (tenths of a second, holding the GIL in part) do
    # not delay the ring's rows.
    REPOSITORY_EVERY_S = 5.0
    FIRST_READ_AFTER_S = 2.0
    CLOSING_EVERY_S = 0.2

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.repository = RepositorySource(directory)
        # kind -> the (start_ns, end_ns) of the delivered rows: 16 bytes a pause.
        self._delivered: dict[str, _Spans] = {}
        self._held: pd.DataFrame | None = None
        self._shifts: list[int] = []
        self._last_reconcile = 0.0
        self._ring_done = False
        self._repo_done = False
        self._last_ring_end: int | None = None
        self._thread: threading.Thread | None = None
        self._safepoints: pd.DataFrame | None = None
        self.ring_rows = 0
        self.repository_rows = 0
        self.matched_rows = 0

    def _match(self, kind: str, start: int, end: int) -> int | None:
        known = self._delivered.get(kind)
        return None if known is None else known.match(start, end, self.MATCH_NS)

    def _remember(self, frame: pd.DataFrame) -> None:
        # (plain arrays: this runs at every poll that brings pauses, on the live loop)
        kinds = frame["kind"].astype(str).to_numpy(object)
        starts, ends = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
        safepoint = kinds == "safepoint"
        if safepoint.any():
            sp = pd.DataFrame({"start_ns": starts[safepoint], "end_ns": ends[safepoint],
                               "name": frame["name"].to_numpy(object)[safepoint]})
            sp = pd.concat([self._safepoints, sp], ignore_index=True) if self._safepoints is not None else sp
            self._safepoints = sp.iloc[-4096:].reset_index(drop=True)  # recent ones are enough
        for kind in set(kinds.tolist()):
            mine = kinds == kind
            self._delivered.setdefault(kind, _Spans()).add(starts[mine], ends[mine])

    def _inside_safepoint(self, frame: pd.DataFrame, also: pd.DataFrame | None = None) -> np.ndarray:
        """vm_operation rows lying in a delivered safepoint of the same name: offline folds a VM
        operation at a safepoint into that safepoint (a re-read chunk whose SafepointEnd was
        not flushed yet shows it alone)."""
        out = np.zeros(len(frame), dtype=bool)
        ops = np.flatnonzero(frame["kind"].astype(str).to_numpy() == "vm_operation")
        sp = [self._safepoints] if self._safepoints is not None else []
        if also is not None:
            sp.append(also.loc[also["kind"].astype(str) == "safepoint", ["start_ns", "end_ns", "name"]])
        sp = [f for f in sp if len(f)]
        if not len(ops) or not sp:
            return out
        sp = pd.concat(sp, ignore_index=True)
        for i in ops:
            s, e, name = int(frame["start_ns"].iloc[i]), int(frame["end_ns"].iloc[i]), frame["name"].iloc[i]
            out[i] = bool(((sp["start_ns"] <= s + self.MATCH_NS) & (sp["end_ns"] >= e - self.MATCH_NS) & (sp["name"] == name)).any())
        return out

    def _repository_loop(self) -> None:
        """Re-reads the repository off the live loop (a read takes tenths of a second: the
        ring's rows must not wait for it). Until the repository side is done (its final read
        delivered): not `self.done`, which poll() sets for a moment when the ring closes."""
        # (the first read waits while the JVM starts, unless it is closing: its rows are late
        # anyway, and its read, holding the GIL in part, would stretch the steps that bring the
        # ring's first rows)
        self._hurry.wait(self.FIRST_READ_AFTER_S)
        while True:
            try:
                frame = self.repository.poll()
                self._batches.put((frame, self.repository.done))
            except Exception as err:  # reported as the source's problem; the ring goes on
                self._batches.put((pd.DataFrame(), True))
                self.problem = self.problem or f"reading the JFR repository: {err}"
                return
            if self.repository.done:
                return
            if self._hurry.is_set():  # the JVM is closing: recording.jfr soon, without spinning beside its exit
                time.sleep(self.CLOSING_EVERY_S)
            else:
                self._hurry.wait(self.REPOSITORY_EVERY_S)

    def poll(self) -> pd.DataFrame:
        if not self._ring_done:
            ring = super().poll()  # may set done (producer closed the ring / exited)
            self._ring_done = self.done
            self.done = False
        else:
            ring = pd.DataFrame()
        ring_done = self._ring_done
        if len(ring):
            # An unmatched safepoint (the agent closed its stream before the End, e.g. JFR's own
            # end-of-recording safepoints at exit) comes from the repository / recording.jfr
            # instead, whole or unmatched as offline reads it.
            ring = ring[np.isin(ring["kind"].to_numpy(dtype=object), self.RING_KINDS) & ~ring["unmatched"].to_numpy(bool)]
            keep = np.array([self._match(k, s, e) is None for k, s, e in
                             zip(ring["kind"].astype(str), ring["start_ns"].tolist(), ring["end_ns"].tolist())], dtype=bool)
            ring = ring[keep].reset_index(drop=True)  # a pause the repository delivered first
            self._remember(ring)
            self.ring_rows += len(ring)
            if len(ring):
                self._last_ring_end = max(self._last_ring_end or 0, int(ring["end_ns"].max()))
        frames = [ring]
        if self._thread is None:
            self._batches = queue.Queue()
            self._hurry = threading.Event()
            self._thread = threading.Thread(target=self._repository_loop, name=f"tandem-live-{self.label}-repository", daemon=True)
            self._thread.start()
        if ring_done:
            self._hurry.set()  # the JVM is closing: read recording.jfr as soon as it is there
        batches = []
        while True:
            try:
                batches.append(self._batches.get_nowait())
            except queue.Empty:
                break
        repo_frames = [self._held] if self._held is not None and len(self._held) else []
        for frame, repo_done in batches:
            self._repo_done = self._repo_done or repo_done
            if len(frame):
                repo_frames.append(frame)
        # Final: the ring is closed and the repository side has read recording.jfr (or the
        # last chunks of a JVM gone): nothing more can come from either.
        final = ring_done and self._repo_done
        # Held rows wait for the ring to go past them: look at them again only when something
        # new came from either side (a reconcile costs tens of ms).
        now = time.monotonic()
        if repo_frames and (batches or final or (len(ring) and now - self._last_reconcile >= 1.0)):
            self._last_reconcile = now
            self._held = None
            repo = pd.concat(repo_frames, ignore_index=True) if len(repo_frames) > 1 else repo_frames[0]
            frames.append(self._reconcile(repo, final))
        # Once the ring is closed, done when the repository side is too, or when this JVM has
        # no repository at all (nothing to reconcile).
        self.done = ring_done and (self._repo_done or not (self.directory / REPOSITORY).exists())
        if self.repository.problem and not self.problem:
            self.problem = self.repository.problem
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else ring

    def _reconcile(self, repo: pd.DataFrame, final: bool) -> pd.DataFrame:
        kinds = repo["kind"].astype(str).tolist()
        starts, ends = repo["start_ns"].tolist(), repo["end_ns"].tolist()
        fresh = np.ones(len(repo), dtype=bool)
        for i, (k, s, e) in enumerate(zip(kinds, starts, ends)):
            hit = self._match(k, s, e)
            if hit is not None:
                fresh[i] = False
                self.matched_rows += 1
                if len(self._shifts) < 10_000:
                    self._shifts.append(hit - int(s))
        new = repo[fresh].reset_index(drop=True)
        if len(new):
            new = new[~self._inside_safepoint(new, also=new)].reset_index(drop=True)
        if not final and len(new) and "at_safepoint" in new.columns:
            # A VM operation run at a safepoint this read has not got whole (its Begin/End in
            # another chunk, or not flushed): offline names that safepoint after it. Held until
            # a safepoint containing it is delivered (then dropped) or the final read.
            wait_op = (new["kind"].astype(str).to_numpy() == "vm_operation") & new["at_safepoint"].fillna(False).astype(bool).to_numpy()
            held_ops, new = new[wait_op], new[~wait_op].reset_index(drop=True)
        else:
            held_ops = None
        if not final and len(new):
            last_ring_end = self._last_ring_end
            wait = new["kind"].astype(str).isin(self.RING_KINDS).to_numpy() & (
                True if last_ring_end is None else (new["end_ns"].to_numpy() >= last_ring_end))
            self._held = new[wait].reset_index(drop=True)
            new = new[~wait].reset_index(drop=True)
        if held_ops is not None and len(held_ops):
            self._held = pd.concat([self._held, held_ops], ignore_index=True) if self._held is not None else held_ops.reset_index(drop=True)
        if len(new):
            shift = int(np.median(self._shifts)) if self._shifts else 0
            new["start_ns"] = new["start_ns"] + shift
            new["end_ns"] = new["end_ns"] + shift
            self._remember(new)
            self._seen(new)
            self.repository_rows += len(new)
        return new

    def status(self) -> dict:
        out = super().status()
        out.update(ring_rows=self.ring_rows, repository_rows=self.repository_rows, matched=self.matched_rows)
        return out
