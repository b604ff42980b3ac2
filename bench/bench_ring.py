"""The shared-memory ring (issue 4): cost of a stamp, and decoding speed into numpy.

Side by side in one run:
- emit: per event, clock_gettime + cached tid + tandem_ring_emit_gil (ours) vs a bare
  clock_gettime(CLOCK_MONOTONIC) loop (anchor), both in C in the same threads
  (tests/native/ring_selftest.c, compiled with ring.c and the probe's flags by
  tests/native/build.py, as for the tests: not in the shipped probe). The ring's own cost
  is the difference; the issue's bar is 40 ns per event with a ~22 ns clock, so the
  difference must stay <= 18 ns. Measured for format v2's private lanes (ours) and, in the
  same run, for every thread on the shared lane (lanes=1: the CAS claim of format v1), 1
  and 2 threads emitting at once.
- decode: an events file through engine.ring.read_events (validated, markers removed) vs
  np.fromfile of the same bytes; a full live ring through RingTailer.poll (seqlock-checked)
  vs a plain numpy copy of the same mapped records. Bar: >= 50 M events/s.

Figures are the fastest of many short blocks (emit: 20 alternating blocks per round, the
median of the rounds' bests) or the best of a few rounds in process CPU time (decode): the
machine's two cores are shared, and a preempted block is only ever slower.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import Row
from engine.ring import GIL_RECORD_DTYPE, RingTailer, read_events

EMIT_EVENTS_PER_THREAD = 2_000_000
EMIT_ROUNDS = 5
EMIT_CAPACITY = 1 << 19          # 16 MiB of records drained every 500 us (adaptive: down to 100 us when busy)
EMIT_LANES = 4                   # lanes of 128K slots (4 MiB, as the shared lane it is compared with): 3 private + lane 0
RING_ADDED_NS_BAR = 40.0 - 22.0  # issue bar minus the vDSO clock read measured in the notes
DECODE_EVENTS = 4_000_000
DECODE_ROUNDS = 5
DECODE_BAR = 50e6


def _best_cpu_seconds(fn, rounds: int) -> float:
    """Fastest of ROUNDS runs in CPU time of this process: the decoders are single-threaded,
    and CPU time leaves out the time other work on the shared cores preempted us."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _emit_rows(console, ring_selftest, workdir: Path) -> list[Row]:
    rows = []
    for threads in (1, 2):
        # Rounds alternate v2 private lanes and the v1-style shared lane, so both see the
        # same machine load.
        figures = {"lanes": ([], [], [0]), "shared": ([], [], [0])}
        for i in range(EMIT_ROUNDS):
            for kind, lanes, capacity in (("lanes", EMIT_LANES, EMIT_CAPACITY), ("shared", 1, EMIT_CAPACITY // EMIT_LANES)):
                clock, stamp, dropped_rounds = figures[kind]
                ring = workdir / f"emit-{threads}-{kind}-{i}.ring"
                r = ring_selftest._ring_bench(str(ring), threads, EMIT_EVENTS_PER_THREAD, capacity, 500, lanes)
                ring.unlink()
                if r["dropped"]:
                    # A drop skips the write: such a round (drain thread starved by a busy
                    # machine) would flatter the ring. Kept only if every round dropped.
                    dropped_rounds[0] += 1
                    continue
                clock.append(r["clock_ns"])
                stamp.append(r["stamp_ns"])
        medians = {}
        for kind, (clock, stamp, dropped_rounds) in figures.items():
            if not stamp:
                console.print(f"[red]emit ({kind}), {threads} thread(s): every round dropped events; figures not valid[/red]")
                continue
            ours, anchor = statistics.median(stamp), statistics.median(clock)
            medians[kind] = (ours, anchor)
            console.print(
                f"emit ({'v2 private lanes' if kind == 'lanes' else 'shared lane, CAS claim as in v1'}), {threads} thread(s): "
                f"stamp {ours:.1f} ns, bare clock {anchor:.1f} ns, ring adds {ours - anchor:.1f} ns "
                f"(rounds: stamp {[round(x, 1) for x in stamp]}, clock {[round(x, 1) for x in clock]}; "
                f"{dropped_rounds[0]} round(s) with drops left out)"
            )
        suffix = ", 2 threads emitting at once" if threads == 2 else ""
        if "lanes" in medians:
            ours, anchor = medians["lanes"]
            rows.append(Row("ring", "stamp (clock+tid+emit, v2 lane) vs bare clock_gettime" + suffix, ours, anchor, "ns/event",
                            f"ours - anchor <= {RING_ADDED_NS_BAR:.0f} ns", ours - anchor <= RING_ADDED_NS_BAR))
        if "shared" in medians:
            ours, anchor = medians["shared"]
            rows.append(Row("ring", "stamp via shared lane (v1 CAS claim) vs bare clock_gettime" + suffix + " (before, for comparison)",
                            ours, anchor, "ns/event", f"ours - anchor <= {RING_ADDED_NS_BAR:.0f} ns", ours - anchor <= RING_ADDED_NS_BAR))
    return rows


def _decode_rows(console, ring_selftest, workdir: Path) -> list[Row]:
    ring, events = workdir / "decode.ring", workdir / "decode.events"
    capacity = 1 << 20
    # Paced so the drain keeps up: a lossless file, the common case (two threads: two
    # lanes, interleaved in the file batch by batch).
    ring_selftest._ring_stress(str(ring), str(events), 2, DECODE_EVENTS // 2, capacity, 1000, 1000, 50, 4)
    got = read_events(events)
    n_events = len(got.records)
    size = events.stat().st_size

    ours_s = _best_cpu_seconds(lambda: read_events(events), DECODE_ROUNDS)
    anchor_s = _best_cpu_seconds(lambda: np.fromfile(events, dtype=np.uint8), DECODE_ROUNDS)
    console.print(f"events file: {n_events} records ({size / 1e6:.0f} MB, {got.lost} lost): read_events {ours_s * 1e3:.1f} ms, np.fromfile {anchor_s * 1e3:.1f} ms (CPU)")
    rows = [Row("ring", "events file -> numpy: read_events vs np.fromfile", n_events / ours_s, n_events / anchor_s, "events/s", ">= 50 M events/s", n_events / ours_s >= DECODE_BAR)]

    with RingTailer(ring) as tail:
        held = len(tail.poll())

    def tail_everything() -> None:
        with RingTailer(ring) as t:
            t.poll()

    records_offset = got.header.records_offset

    def copy_mapping() -> None:  # both sides map the file afresh each round
        np.array(np.memmap(ring, dtype=np.uint8, mode="r", offset=records_offset, shape=(capacity * GIL_RECORD_DTYPE.itemsize,)))

    ours_s = _best_cpu_seconds(tail_everything, DECODE_ROUNDS)
    anchor_s = _best_cpu_seconds(copy_mapping, DECODE_ROUNDS)
    console.print(f"ring: {held} records: RingTailer.poll {ours_s * 1e3:.1f} ms, numpy copy of the mapping {anchor_s * 1e3:.1f} ms (CPU)")
    rows.append(Row("ring", "live ring -> numpy: RingTailer.poll vs numpy copy of the mapping", held / ours_s, capacity / anchor_s, "events/s", ">= 50 M events/s", held / ours_s >= DECODE_BAR))
    return rows


def main(console) -> list[Row]:
    from tests.native.build import load  # (`python -m bench` from the repo root: tests/ is importable)

    ring_selftest = load()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-ring-") as d:
        workdir = Path(d)
        return _emit_rows(console, ring_selftest, workdir) + _decode_rows(console, ring_selftest, workdir)
