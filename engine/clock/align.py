"""Putting raw JFR ticks on CLOCK_MONOTONIC (or, failing that, on the wall clock).

Three methods, best first (docs/pauses.md, "Clock"):

1. `clock_sync`: tandem.ClockSync events pair raw ticks with System.nanoTime()
   (CLOCK_MONOTONIC). With 1e9 ticks per second the offset is the median of
   `monotonicNanos - ticks`; otherwise (TSC ticks) a least-squares line
   `mono = a * ticks + b`. Each event's duration brackets where its nanoTime() read fell:
   the fit takes the tight samples (a wide one was preempted between the two reads). The
   error is the largest deviation of a tight sample from the fit, or of a wide one's bracket.
2. `wall_minus_host_offset`: a Linux recording with OS ticks and no sync events, made on
   this host since its last boot. Ticks go to the wall clock with each chunk's header,
   then to CLOCK_MONOTONIC by subtracting (CLOCK_REALTIME - CLOCK_MONOTONIC) sampled now.
   Valid only on the same boot and if the wall clock was not stepped in between.
3. `chunk_header_wall`: anything else (Windows/macOS, another host or boot): the wall
   clock from each chunk's header. Domain `wall`; a later join refuses to mix domains.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.clock.chunks import Chunk
from engine.clock.pair import clock_pair

NS_PER_S = 1_000_000_000
MONOTONIC = "monotonic"
WALL = "wall"

# A single sync sample says nothing about its own jitter; JDK 17 showed 1-2.5 us (jfr.md).
_SINGLE_SAMPLE_ERROR_NS = 10_000
# A sync sample whose two reads lay further apart than this was preempted between them (the
# agent commits the tightest of its tries, a few us; a cold or loaded first one can take ms).
TIGHT_SPAN_NS = 50_000


@dataclass
class ClockAlignment:
    """How one JVM run's ticks were put on a clock, and how far to trust it."""

    domain: str                 # "monotonic" or "wall"
    method: str                 # "clock_sync", "wall_minus_host_offset" or "chunk_header_wall"
    offset_ns: int              # clock_sync: mono - ticks (at the first sample for a fit);
                                # wall_minus_host_offset: the (REALTIME - MONOTONIC) subtracted; else 0
    error_ns: int               # estimated worst-case error of the converted times
    samples: int = 0            # sync events used (clock_sync) or chunk headers used
    slope: float | None = None  # ns per tick of the linear fit (clock_sync with non-1e9 ticks)
    note: str = ""              # why this method, in words
    # Fit anchor for the linear case: mono = anchor_mono + slope * (ticks - anchor_ticks).
    anchor_ticks: int = field(default=0, repr=False)
    anchor_mono: int = field(default=0, repr=False)

    def as_metadata(self) -> dict:
        meta = asdict(self)
        meta.pop("anchor_ticks")
        meta.pop("anchor_mono")
        return meta


# ---------------------------------------------------------------- ticks to wall clock


def chunk_of_ticks(ticks: np.ndarray, run: list[Chunk]) -> np.ndarray:
    """Index (into `run`) of the chunk each tick value falls in; ticks of one run only.

    An event that began before a chunk rotation is committed into the next chunk; it maps
    to the earlier chunk here, whose header is of the same run and agrees to within the
    wall clock's slew between the two headers.
    """
    starts = np.array([c.start_ticks for c in run], dtype=np.int64)
    return np.clip(np.searchsorted(starts, ticks, side="right") - 1, 0, len(run) - 1)


def ticks_to_wall_ns(ticks: np.ndarray, run: list[Chunk]) -> np.ndarray:
    """Wall-clock ns since the epoch with each chunk's own (startNanos, startTicks) pair, exact in integers."""
    ticks = np.asarray(ticks, dtype=np.int64)
    which = chunk_of_ticks(ticks, run)
    start_ticks = np.array([c.start_ticks for c in run], dtype=np.int64)[which]
    start_nanos = np.array([c.start_nanos for c in run], dtype=np.int64)[which]
    tps = run[0].ticks_per_second
    return start_nanos + _ticks_to_ns(ticks - start_ticks, tps)


def _ticks_to_ns(delta_ticks: np.ndarray, tps: int) -> np.ndarray:
    if tps == NS_PER_S:
        return delta_ticks
    # Split so that no intermediate product overflows int64 (remainder * 1e9 < 2^63 for tps < 9.2e9).
    whole_seconds, rest = np.divmod(delta_ticks, tps)
    return whole_seconds * NS_PER_S + rest * NS_PER_S // tps


def tickspan_to_ns(span_ticks: np.ndarray, tps: int) -> np.ndarray:
    """A duration in ticks as ns (floor), exact in integers."""
    return _ticks_to_ns(np.asarray(span_ticks, dtype=np.int64), tps)


# ---------------------------------------------------------------- the three methods


def fit_clock_sync(sync_ticks: np.ndarray, sync_mono: np.ndarray, tps: int,
                   sync_span: np.ndarray | None = None) -> ClockAlignment:
    """Method 1: align with tandem.ClockSync samples (ticks, System.nanoTime(), and the event's
    duration in ticks: nanoTime() was read within it; none given: zero)."""
    ticks = np.asarray(sync_ticks, dtype=np.int64)
    mono = np.asarray(sync_mono, dtype=np.int64)
    span = np.zeros(len(ticks), np.int64) if sync_span is None else np.asarray(sync_span, dtype=np.int64).clip(0)
    n = len(ticks)
    span_ns = _ticks_to_ns(span, tps)
    tight = span_ns <= TIGHT_SPAN_NS
    if not tight.any():  # (every sample preempted: the fit is what they give, and the error says so)
        tight[:] = True
    if tps == NS_PER_S:
        offsets = mono - ticks
        offset = int(np.median(offsets[tight]))
        error = _bracket_error(offsets - offset, span_ns, tight) if n > 1 else _SINGLE_SAMPLE_ERROR_NS
        return ClockAlignment(MONOTONIC, "clock_sync", offset, error, n,
                              note="median of monotonicNanos - ticks over tandem.ClockSync events")
    anchor_ticks, anchor_mono = int(ticks[0]), int(mono[0])
    x = (ticks - anchor_ticks).astype(np.float64)
    y = (mono - anchor_mono).astype(np.float64)
    if tight.sum() > 1 and np.ptp(x[tight]) > 0:
        slope, intercept = np.polyfit(x[tight], y[tight], 1)
        error = _bracket_error(y - (slope * x + intercept), slope * span, tight)
        note = "least-squares line mono = a * ticks + b over tandem.ClockSync events (ticks are not ns)"
    else:
        slope, intercept = NS_PER_S / tps, 0.0
        error = _SINGLE_SAMPLE_ERROR_NS
        note = "one tandem.ClockSync event: nominal ticks per second from the chunk header"
    anchor_mono += int(round(intercept))
    return ClockAlignment(MONOTONIC, "clock_sync", anchor_mono - anchor_ticks, error, n, slope=float(slope),
                          note=note, anchor_ticks=anchor_ticks, anchor_mono=anchor_mono)


def _bracket_error(residual: np.ndarray, span_ns: np.ndarray, tight: np.ndarray) -> int:
    """The farthest a sample lies from the fit (ns, rounded up): a tight sample by its
    RESIDUAL; a wide one (preempted between its reads, its read falling up to SPAN_NS after its
    start) by the distance from the fit to [residual - span, residual], where it may lie."""
    below, above = residual - span_ns, residual
    far = np.where(tight, np.abs(residual), np.where(below > 0, below, np.where(above < 0, -above, 0)))
    return int(np.ceil(far.max())) if far.size else 0


def host_wall_minus_monotonic() -> tuple[int, int]:
    """(CLOCK_REALTIME - CLOCK_MONOTONIC) now, and the half-width of the tightest bracketing read."""
    monotonic, wall, error = clock_pair(tries=20)
    return wall - monotonic, error


def header_spread_ns(run: list[Chunk]) -> int:
    """How much the chunk headers of a run disagree about wall - ticks (wall clock slew or steps)."""
    tps = run[0].ticks_per_second
    offsets = [c.start_nanos - int(_ticks_to_ns(np.int64(c.start_ticks - run[0].start_ticks), tps)) for c in run]
    return int(max(offsets) - min(offsets))


def choose_alignment(
    run: list[Chunk],
    *,
    os_name: str | None,
    fast_time: int,
    sync_ticks: np.ndarray,
    sync_mono: np.ndarray,
    same_boot: bool | None,
    sync_span: np.ndarray | None = None,
) -> ClockAlignment:
    """Picks the best method this run's recording allows (see the module docstring).

    `same_boot`: True when the agent's jvm.json names this host's current boot, False when it
    names another, None when unknown (then the recording's time span decides plausibility).
    """
    tps = run[0].ticks_per_second
    if len(sync_ticks) > 0:
        alignment = fit_clock_sync(sync_ticks, sync_mono, tps, sync_span)
        if os_name not in ("linux", None):
            # System.nanoTime() is CLOCK_MONOTONIC only on Linux (docs/session.md).
            alignment.note += f"; recorded on {os_name}: System.nanoTime() there is that host's own monotonic clock"
        return alignment

    spread = header_spread_ns(run)
    wall_only = ClockAlignment(WALL, "chunk_header_wall", 0, spread, len(run))
    if os_name != "linux":
        wall_only.note = f"recorded on {os_name or 'an unknown OS'}: its ticks are not this host's CLOCK_MONOTONIC"
        return wall_only
    if tps != NS_PER_S or fast_time == 1:
        wall_only.note = "Linux recording with TSC ticks and no tandem.ClockSync events"
        return wall_only
    if same_boot is False:
        wall_only.note = "the agent's jvm.json names another boot of this host"
        return wall_only

    host_offset, read_error = host_wall_minus_monotonic()
    boot_wall_ns = host_offset  # wall-clock time at which CLOCK_MONOTONIC was 0
    last = run[-1]
    start_wall, end_wall = run[0].start_nanos, last.start_nanos + last.duration_nanos
    if start_wall < boot_wall_ns or end_wall > time.time_ns() + NS_PER_S:
        wall_only.note = "recorded before this host's current boot (or on another host)"
        return wall_only
    verified = "verified by the agent's boot id" if same_boot else "assumed (the recording does not name its boot)"
    return ClockAlignment(
        MONOTONIC, "wall_minus_host_offset", host_offset, read_error + spread + 1_000, len(run),
        note=f"chunk-header wall clock minus (REALTIME - MONOTONIC) sampled now; same boot {verified}; "
             "wrong if the wall clock was stepped since",
    )


def ticks_to_domain_ns(ticks: np.ndarray, run: list[Chunk], alignment: ClockAlignment) -> np.ndarray:
    """Raw ticks of one run as int64 ns on the alignment's domain."""
    ticks = np.asarray(ticks, dtype=np.int64)
    if alignment.method == "clock_sync":
        if alignment.slope is None:
            return ticks + alignment.offset_ns
        delta = (ticks - alignment.anchor_ticks).astype(np.float64)
        return alignment.anchor_mono + np.rint(alignment.slope * delta).astype(np.int64)
    wall = ticks_to_wall_ns(ticks, run)
    if alignment.method == "wall_minus_host_offset":
        return wall - alignment.offset_ns
    return wall
