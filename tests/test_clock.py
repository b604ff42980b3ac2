"""Chunk headers and the tick -> CLOCK_MONOTONIC methods, on real recordings."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_RECORDINGS, default_java_home, jdk_params
from engine.clock import align
from engine.clock.chunks import scan_chunks, split_runs
from engine.ingest.jfr import read_pauses
from test_ingest_witness import COLLECTORS, build_workload, record

JDK17 = default_java_home()


@pytest.fixture(scope="session")
def clock_recordings(tmp_path_factory):
    """(java_home, sync) -> (recording, System.gc() windows), G1, made on first use."""
    cache: dict = {}

    def get(java_home: Path, sync: bool):
        if (java_home, sync) not in cache:
            workdir = tmp_path_factory.mktemp(f"clock-{java_home.name}")
            build_workload(java_home, workdir)
            out = workdir / f"{'sync' if sync else 'nosync'}.jfr"
            cache[(java_home, sync)] = record(java_home, workdir, out, COLLECTORS["g1"], seconds=1.0, sync=sync)
        return cache[(java_home, sync)]

    return get


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_RECORDINGS.glob("*.jfr") if p.name != "9u0.jfr"))
def test_chunk_count_matches_jfr_summary(name):
    path = SHARED_RECORDINGS / name
    summary = subprocess.run([str(JDK17 / "bin" / "jfr"), "summary", str(path)], capture_output=True, text=True,
                             check=True, timeout=120).stdout
    scan = scan_chunks(path)
    assert len(scan.chunks) == int(re.search(r"Chunks: (\d+)", summary).group(1))
    assert scan.format_version == re.search(r"Version: (\S+)", summary).group(1)
    assert scan.lost_bytes == 0 and sum(c.size for c in scan.chunks) == scan.file_size


def _sync_samples(java_home: Path, path: Path) -> list[tuple]:
    """Per tandem.ClockSync event (`jfr print`): its thread, start time and duration, and
    monotonicNanos (to see which sample stretched a stated error)."""
    from test_ingest_witness import jfr_print

    return [(e["values"].get("eventThread", {}).get("javaName") if e["values"].get("eventThread") else None,
             e["values"]["startTime"], e["values"]["duration"], e["values"]["monotonicNanos"])
            for e in jfr_print(java_home, path, ["tandem.ClockSync"])]


@pytest.mark.parametrize("java_home", jdk_params())
def test_sync_and_host_offset_methods_agree(java_home, clock_recordings):
    """Method 1 (tandem.ClockSync) and method 2 (chunk wall clock minus the host's
    REALTIME-MONOTONIC offset) on the same recording agree within their stated errors."""
    path, _ = clock_recordings(java_home, sync=True)
    df = read_pauses(path)
    clock = df.attrs["sources"][0]["runs"][0]["clock"]
    assert clock["method"] == "clock_sync" and clock["domain"] == "monotonic"
    assert clock["samples"] >= 5  # start, every 200 ms, end
    assert 0 <= clock["error_ns"] < 1_000_000, (clock, _sync_samples(java_home, path))

    run = scan_chunks(path).chunks
    by_host = align.choose_alignment(run, os_name="linux", fast_time=0, sync_ticks=np.array([], np.int64),
                                     sync_mono=np.array([], np.int64), same_boot=None)
    assert by_host.method == "wall_minus_host_offset" and by_host.domain == "monotonic"
    # Any tick value: the two conversions must differ by less than the two errors together.
    ticks = np.array([run[0].start_ticks, run[0].end_ticks], dtype=np.int64)
    by_sync = align.ClockAlignment(**{**clock, "anchor_ticks": 0, "anchor_mono": 0})
    diff = align.ticks_to_domain_ns(ticks, run, by_host) - align.ticks_to_domain_ns(ticks, run, by_sync)
    assert np.abs(diff).max() <= clock["error_ns"] + by_host.error_ns, (diff, clock, by_host)


@pytest.mark.parametrize("tps", [1_000_000_000, 2_400_000_000])
def test_a_preempted_sync_sample_counts_by_its_span(tps):
    """A sync sample whose reads were 4 ms apart (the first of a loaded JVM's) neither moves
    the fit nor states 4 ms of error, as its read may lie anywhere in its span; a tight sample
    4 ms off does state it."""
    offset_ns, per_ns = 7_000_000_000, tps / 1e9
    read_ns = np.array([1e9, 1.2e9, 1.4e9, 1.6e9, 1.8e9, 2e9]).astype(np.int64)
    late = np.array([4_000_000, 2_000, 3_000, 1_000, 2_500, 1_500])  # (ns from each start to its read)
    ticks = ((read_ns - late) * per_ns).astype(np.int64)
    span = ((late + 500) * per_ns).astype(np.int64)
    mono = read_ns + offset_ns
    fit = align.fit_clock_sync(ticks, mono, tps, span)
    assert fit.error_ns < 10_000, fit
    converted = align.ticks_to_domain_ns(ticks[1:], [], fit)
    assert np.abs(converted + late[1:] - mono[1:]).max() < 10_000
    # the same samples with no span known: the first one's 4 ms are an error
    assert align.fit_clock_sync(ticks, mono, tps).error_ns > 1_000_000
    # a tight sample 4 ms off the others says the clocks disagree by that much
    off = mono.copy()
    off[3] += 4_000_000
    assert align.fit_clock_sync(ticks, off, tps, span).error_ns > 1_000_000


@pytest.mark.parametrize("java_home", jdk_params())
def test_without_sync_events_host_offset_puts_gc_inside_nanotime_windows(java_home, clock_recordings):
    path, windows = clock_recordings(java_home, sync=False)
    df = read_pauses(path)
    clock = df.attrs["sources"][0]["runs"][0]["clock"]
    assert clock["method"] == "wall_minus_host_offset" and df.attrs["clock_domain"] == "monotonic"
    assert "assumed" in clock["note"]
    explicit = df[(df["kind"] == "gc") & (df["cause"] == "System.gc()")]
    assert len(explicit) == 2
    for row, (lo, hi) in zip(explicit.sort_values("start_ns").itertuples(), sorted(windows)):
        assert lo - clock["error_ns"] <= row.start_ns and row.end_ns <= hi + clock["error_ns"], (row, lo, hi, clock)


def test_agent_boot_id_decides_same_boot(clock_recordings, tmp_path):
    """jvm.json beside the recording (written by tandem's agent) names the boot: another
    boot means the host offset is meaningless -> wall domain; this boot -> verified."""
    source, _ = clock_recordings(JDK17, sync=False)
    here = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for boot_id, domain in (("00000000-0000-0000-0000-000000000000", "wall"), (here, "monotonic")):
        folder = tmp_path / domain
        folder.mkdir()
        (folder / "recording.jfr").write_bytes(source.read_bytes())
        (folder / "jvm.json").write_text(json.dumps({"pid": 4242, "boot_id": boot_id}))
        df = read_pauses(folder / "recording.jfr")
        clock = df.attrs["sources"][0]["runs"][0]["clock"]
        assert df.attrs["clock_domain"] == domain, clock
        if domain == "monotonic":
            assert "verified" in clock["note"]


def test_split_runs_of_concatenated_recordings(clock_recordings, tmp_path):
    a, _ = clock_recordings(JDK17, sync=True)
    b, _ = clock_recordings(JDK17, sync=False)
    both = tmp_path / "both.jfr"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    scan = scan_chunks(both)
    assert len(scan.chunks) == 2 and [len(r) for r in split_runs(scan.chunks)] == [1, 1]
    # Same recording twice in a row is two runs as well (ticks go back).
    twice = tmp_path / "twice.jfr"
    twice.write_bytes(a.read_bytes() * 2)
    assert len(split_runs(scan_chunks(twice).chunks)) == 2


def test_tick_conversion_is_exact_for_non_ns_ticks():
    """full_gc_cms.jfr has 3.4 GHz TSC ticks: integer conversion must not overflow or drift."""
    run = scan_chunks(SHARED_RECORDINGS / "full_gc_cms.jfr").chunks
    tps = run[0].ticks_per_second
    assert tps != 1_000_000_000
    ticks = np.array([run[0].start_ticks, run[0].start_ticks + tps, run[0].start_ticks + 3600 * tps], np.int64)
    wall = align.ticks_to_wall_ns(ticks, run)
    assert (wall - run[0].start_nanos).tolist() == [0, 1_000_000_000, 3600 * 1_000_000_000]
