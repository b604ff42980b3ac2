"""Spans' wall-clock times on CLOCK_MONOTONIC, with an error bound, from the session's own clock pairs.

OpenTelemetry stamps spans with the wall clock (CLOCK_REALTIME); tandem's pauses and GIL
states are on CLOCK_MONOTONIC. A session holds several (wall, monotonic) pairs read back to
back on its host and boot:

- every GIL events file's (and ring's) header: `sync_realtime_ns` read between two
  CLOCK_MONOTONIC reads whose midpoint is `sync_monotonic_ns` and whose distance is
  `sync_uncertainty_ns` (docs/ring.md): its error is at most half that distance;
- session.json's start and end (`start_wall_ns`/`start_monotonic_ns`, `end_...`, written by
  `tandem record`) and each jvm.json's start: read the same way, the tightest of a few tries,
  with half the distance as `start_clock_error_ns` (`end_clock_error_ns`); files written before
  tandem recorded it are assumed UNRECORDED_PAIR_ERROR_NS (three clock reads through the vDSO,
  not preempted between them).

A pair whose error is larger than another pair's error plus MAX_SLEW_PPM of the time between
them is left out (a read preempted between its clock reads, on a loaded machine): the better
pair bounds the offset there more tightly on its own.

The wall clock minus CLOCK_MONOTONIC (the offset) changes only when the wall clock is slewed
(NTP, at most MAX_SLEW_PPM) or stepped. A span's offset is interpolated linearly between the
two pairs around its start in time; its error bound is the larger error of those two pairs
plus how much the offset moved between them (the offset is taken to have moved one way
between two pairs: a step and a step back between them would not be seen). Before the first
pair or after the last, the nearest pair's error plus MAX_SLEW_PPM of the distance to it (a
step there is not seen either).

Refused with one line: no pair of the session's boot, spans of another host (`host.name`),
spans that lie outside the session.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import TandemError
from engine.ring.reader import EventsBlocks  # (the ring reader's numpy setup, only when spans are read)
from engine.session import GIL_EVENTS, GIL_RING, JVM_DIRS, JVM_JSON, PYTHON_DIRS, SESSION_JSON, read_json


UNRECORDED_PAIR_ERROR_NS = 20_000
MAX_SLEW_PPM = 500  # the kernel's largest NTP frequency correction (adjtimex MAXFREQ)
# Spans this far outside the session's pairs are not its spans.
OUTSIDE_SESSION_NS = 60_000_000_000


@dataclass(frozen=True)
class ClockPair:
    wall_ns: int
    monotonic_ns: int
    error_ns: int
    source: str  # where the pair was read, for messages and the metadata


@dataclass
class SpanClock:
    """The session's clock pairs, sorted by wall time; converts wall ns to CLOCK_MONOTONIC."""

    pairs: list[ClockPair]

    def __post_init__(self):
        if not self.pairs:
            raise TandemError("no wall/monotonic clock pair: spans cannot be put on CLOCK_MONOTONIC")
        self.pairs = _undominated(sorted(self.pairs, key=lambda p: p.wall_ns))
        self._wall = np.array([p.wall_ns for p in self.pairs], np.int64)
        self._offset = np.array([p.wall_ns - p.monotonic_ns for p in self.pairs], np.int64)
        self._error = np.array([p.error_ns for p in self.pairs], np.int64)

    def to_monotonic(self, wall_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(CLOCK_MONOTONIC ns, error bound ns) of each wall-clock time."""
        wall_ns = np.asarray(wall_ns, np.int64)
        first, last = self._wall[0], self._wall[-1]
        # Offsets relative to the first pair's keep the interpolation exact in float64.
        base = self._offset[0]
        offset = base + np.rint(np.interp((wall_ns - first).astype(np.float64), (self._wall - first).astype(np.float64),
                                          (self._offset - base).astype(np.float64))).astype(np.int64)
        after = np.clip(np.searchsorted(self._wall, wall_ns, side="right"), 1, len(self._wall) - 1) if len(self._wall) > 1 else None
        if after is None:
            error = self._error[0] + _slew_ns(np.abs(wall_ns - first))
        else:
            before = after - 1
            inside = np.maximum(self._error[before], self._error[after]) + np.abs(self._offset[after] - self._offset[before])
            error = np.where(wall_ns < first, self._error[0] + _slew_ns(first - wall_ns),
                             np.where(wall_ns > last, self._error[-1] + _slew_ns(wall_ns - last), inside))
        return wall_ns - offset, error.astype(np.int64)

    def as_metadata(self) -> dict:
        return {"method": "session_clock_pairs", "pairs": [
            {"source": p.source, "wall_ns": p.wall_ns, "monotonic_ns": p.monotonic_ns, "error_ns": p.error_ns}
            for p in self.pairs]}


def _undominated(pairs: list[ClockPair]) -> list[ClockPair]:
    """PAIRS (sorted by wall time) without those another pair bounds better at their own time:
    its error plus the slew over the time between them is smaller than theirs. One sweep each
    way (tandem live holds thousands of pairs): the best bound from an earlier pair is
    min(error_i - slew_i) + slew_j, from a later one min(error_i + slew_i) - slew_j, with slew
    the slew since the first pair."""
    slew = np.array([p.wall_ns - pairs[0].wall_ns for p in pairs], np.float64) * (MAX_SLEW_PPM / 1e6)
    error = np.array([p.error_ns for p in pairs], np.float64)
    earlier = np.minimum.accumulate(np.r_[np.inf, (error - slew)[:-1]]) + slew
    later = np.minimum.accumulate(np.r_[(error + slew)[1:], np.inf][::-1])[::-1] - slew
    keep = error <= np.minimum(earlier, later) + 1  # (1 ns: _slew_ns rounds up)
    return [p for p, kept in zip(pairs, keep.tolist()) if kept]


def _slew_ns(distance_ns: np.ndarray) -> np.ndarray:
    return (np.asarray(distance_ns, np.int64) * MAX_SLEW_PPM + 999_999) // 1_000_000


def session_pairs(session: Path) -> tuple[list[ClockPair], dict]:
    """The clock pairs of SESSION's boot, and session.json (its hostname and boot id)."""
    session = Path(session)
    description = read_json(session / SESSION_JSON, strict=True)
    boot = description.get("boot_id")
    pairs: list[ClockPair] = []

    def add(facts: dict, prefix: str, source: str) -> None:
        wall, monotonic = facts.get(f"{prefix}_wall_ns"), facts.get(f"{prefix}_monotonic_ns")
        error = facts.get(f"{prefix}_clock_error_ns")
        if wall is not None and monotonic is not None and (boot is None or facts.get("boot_id", boot) == boot):
            pairs.append(ClockPair(int(wall), int(monotonic), int(error) if error is not None else UNRECORDED_PAIR_ERROR_NS,
                                   source))

    add(description, "start", f"{SESSION_JSON} start")
    add(description, "end", f"{SESSION_JSON} end")
    for directory in sorted(session.glob(JVM_DIRS)):
        add({"boot_id": boot, **read_json(directory / JVM_JSON)}, "start", f"{directory.name}/{JVM_JSON}")
    for directory in sorted(session.glob(PYTHON_DIRS)):
        for name in (GIL_EVENTS, GIL_RING):
            path = directory / name
            if not path.is_file():
                continue
            try:
                header = EventsBlocks(path).header if name == GIL_EVENTS else None
            except TandemError:
                continue  # (a damaged file says so where the analysis reads it)
            if header is None or not header.sync_realtime_ns or (boot and header.boot_id and header.boot_id != boot):
                continue
            pairs.append(ClockPair(header.sync_realtime_ns, header.sync_monotonic_ns,
                                   header.sync_uncertainty_ns // 2 + 1, f"{directory.name}/{name}"))
            break
    return pairs, description


def spans_on_monotonic(spans, session: Path):
    """SPANS (engine.spans.source's table) with start_ns, end_ns on CLOCK_MONOTONIC and
    clock_error_ns added, and the clock's metadata; refused with one line when the session
    holds no pair of its boot, the spans name another host, or lie outside the session."""
    pairs, description = session_pairs(session)
    if not pairs:
        raise TandemError(f"{session}: no wall/monotonic clock pair of the session's boot (session.json, jvm.json, "
                          "GIL events headers): the spans' wall-clock times cannot be put on CLOCK_MONOTONIC")
    return spans_on_monotonic_with(spans, SpanClock(pairs), description.get("hostname"), session)


def spans_on_monotonic_with(spans, clock: SpanClock, hostname: str | None, session: Path):
    """spans_on_monotonic with CLOCK (the session's pairs, and any read since on its host)."""
    hosts = set(spans["host_name"].dropna().unique()) if "host_name" in spans else set()
    if hostname and hosts - {hostname}:
        raise TandemError(f"{session}: spans of host {sorted(hosts - {hostname})[0]}, the session was recorded on "
                          f"{hostname}: no clock pair for that host")
    spans = spans.copy()
    start, start_error = clock.to_monotonic(spans["start_wall_ns"].to_numpy(np.int64))
    end, end_error = clock.to_monotonic(spans["end_wall_ns"].to_numpy(np.int64))
    first, last = clock.pairs[0].wall_ns, clock.pairs[-1].wall_ns
    if len(spans) and (spans["end_wall_ns"].max() < first - OUTSIDE_SESSION_NS
                       or spans["start_wall_ns"].min() > last + OUTSIDE_SESSION_NS):
        raise TandemError(f"{session}: the spans (wall clock {int(spans['start_wall_ns'].min())} to "
                          f"{int(spans['end_wall_ns'].max())} ns) lie outside the session ({first} to {last} ns)")
    spans["start_ns"], spans["end_ns"] = start, np.maximum(end, start)
    spans["clock_error_ns"] = np.maximum(start_error, end_error)
    return spans, clock.as_metadata()
