"""The flight recorder: GIL events in segments (the probe's drain rotates them), packed by the
keeper of `tandem record --max-size/--max-age`, read by every reader as one recording.

Witnesses: the probe's own counters (probe.json: every position claimed), the segments' bytes
laid end to end as one events file read the way an unsegmented recording is, and `du`-style
disk use sampled every second while a service runs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.errors import TandemError
from engine.ingest import segments
from engine.ingest.gil import read_gil
from engine.record.keeper import PERIOD_S, Keeper, bounds_from, disk_use, parse_duration, parse_size
from engine.ring import read_events
from engine.ring.layout import GIL_RECORD_DTYPE, LANE_OFFSET_BASE_DROPPED, LANE_OFFSET_BASE_HEAD, OFFSET_SEGMENT, lane_offset
from engine.session import gil_segments, read_json
from test_record_helpers import run_tandem

# A service whose threads hand the GIL over all the time (sleep(0) releases it), naming a few
# code objects; records its GIL in segments of SEGMENT_BYTES.
_SERVICE = textwrap.dedent("""
    import os, sys, threading, time
    import engine.probe
    path, seconds, segment_bytes, segment_ms = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    engine.probe.start(path, segment_bytes=segment_bytes, segment_ms=segment_ms, wait_when_full=True)
    def spin(n):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(n):
                time.sleep(0)
            os.getpid()
    threads = [threading.Thread(target=spin, args=(k,), name=f"spin-{k}") for k in (50, 200, 1000)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(engine.probe.stop()["ring"]["claimed"])
""")


def _record(tmp_path: Path, seconds: float = 1.5, segment_bytes: int = 96 << 10, segment_ms: int = 300) -> tuple[Path, int]:
    events = tmp_path / "run.gil"
    run = subprocess.run([sys.executable, "-c", _SERVICE, str(events), str(seconds), str(segment_bytes), str(segment_ms)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return events, int(run.stdout.split()[-1])


def _one_file(events: Path, target: Path) -> Path:
    """The segments laid end to end as one events file: the newest one's header and lane table
    with every base zero and segment 0, then every segment's records in order."""
    parts = [Path(s.path).read_bytes() for s in gil_segments(events)]
    offset = read_events(gil_segments(events)[0].path).header.records_offset
    head = bytearray(parts[-1][:offset])
    head[OFFSET_SEGMENT:OFFSET_SEGMENT + 4] = bytes(4)
    lanes = read_events(gil_segments(events)[-1].path).header.lane_count
    for lane in range(lanes):
        for field in (LANE_OFFSET_BASE_HEAD, LANE_OFFSET_BASE_DROPPED):
            head[lane_offset(lane) + field:lane_offset(lane) + field + 8] = bytes(8)
    drain_lost = sum(read_events(s.path).header.drain_lost for s in gil_segments(events))
    head[1416:1424] = drain_lost.to_bytes(8, "little")
    target.write_bytes(bytes(head) + b"".join(part[offset:] for part in parts))
    for side in (".json", ".codes", ".threads.jsonl"):  # the probe's files beside it: same recording
        Path(str(target) + side).write_bytes(Path(str(events) + side).read_bytes())
    return target


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["tid", "start_ns", "end_ns", "state"]).reset_index(drop=True)


def test_segments_are_whole_files_that_continue_one_another(tmp_path):
    events, claimed = _record(tmp_path)
    found = gil_segments(events)
    assert len(found) >= 3 and not events.exists()
    counts = []
    for number, segment in enumerate(found):
        alone = read_events(segment.path)  # each one readable on its own, every counter checked
        assert alone.closed and alone.header.segment == number
        counts.append(len(alone.records))
    assert sum(counts) == claimed  # the probe's own count of every position claimed: nothing lost, nothing twice
    whole = _one_file(events, tmp_path / "whole.gil")
    assert len(read_events(whole).records) == claimed
    by_segments = read_gil(events)
    pd.testing.assert_frame_equal(_sorted(by_segments), _sorted(read_gil(whole)))
    assert by_segments.attrs["kept_window"]["rotated_out_events"] == 0
    assert by_segments.attrs["kept_window"]["segments"] == len(found)


def test_packed_segments_are_the_same_bytes_and_read_the_same(tmp_path):
    events, claimed = _record(tmp_path)
    before = read_gil(events)
    raw_bytes = packed_bytes = 0
    for segment in gil_segments(events):
        raw = segment.path.read_bytes()
        packed = segment.path.with_name(segment.path.name + ".packed")
        packed.write_bytes(segments.pack(segment.path))
        head, rows = segments.unpack(packed)
        assert head + rows.tobytes() == raw  # lossless, byte for byte
        raw_bytes, packed_bytes = raw_bytes + len(raw), packed_bytes + packed.stat().st_size
        segment.path.unlink()
    assert all(s.packed for s in gil_segments(events))
    after = read_gil(events)
    pd.testing.assert_frame_equal(_sorted(before), _sorted(after))
    assert after.attrs["events"] == claimed
    assert packed_bytes * 5 < raw_bytes, (raw_bytes, packed_bytes)


def _packed(head: bytes, records: np.ndarray, version: int, payload: bytes) -> bytes:
    """A packed segment as docs/ring.md's "Packed segments" lays it out (prefix, one zstd frame)."""
    import zstandard

    times = records["mono_ns"][records["seq"] != 0]
    span = (int(times.min()), int(times.max())) if times.size else (0, 0)
    prefix = (b"TNDMPACK" + version.to_bytes(4, "little") + (32).to_bytes(4, "little") + len(records).to_bytes(8, "little")
              + (len(head) + 32 * len(records)).to_bytes(8, "little") + span[0].to_bytes(8, "little")
              + span[1].to_bytes(8, "little"))
    return prefix + zstandard.ZstdCompressor().compress(payload)


def _v1_payload(head: bytes, records: np.ndarray) -> bytes:
    """Version 1's payload, written here from its spec alone (a loop per row, no engine code):
    the witness that sessions packed before version 2 still read."""
    columns = (("lane", 2), ("kind", 2), ("tid", 4), ("seq", 8), ("mono_ns", 8), ("aux", 8))
    out = bytearray(head)
    for name, width in columns:
        previous: dict[int, int] = {}
        values = []
        for lane, value in zip(records["lane"].tolist(), records[name].tolist()):
            if name in ("tid", "seq", "mono_ns"):
                values.append((value - previous.get(lane, 0)) % (1 << 8 * width))
                previous[lane] = value
            else:
                values.append(value)
        for byte in range(width):
            out += bytes((v >> 8 * byte) & 0xFF for v in values)
    return bytes(out)


def _random_segment(rng: np.random.Generator, rows: int, lanes: int) -> tuple[bytes, np.ndarray]:
    """A real segment's header and lane table, with RECORDS of any values at all: random lanes
    and kinds, times that jump backwards and wrap, any tid, seq (LOST markers among them) and aux."""
    head = bytearray(8192)
    head[:8] = b"TNDMRING"
    head[176:184] = (8192).to_bytes(8, "little")  # records_offset
    records = np.zeros(rows, GIL_RECORD_DTYPE)
    records["lane"] = rng.integers(0, lanes, rows)
    records["kind"] = rng.choice([1, 2, 3, 4, 5, 0xFF01], rows)
    steps = rng.integers(0, 1 << rng.integers(1, 40), rows).astype(np.uint64)
    records["mono_ns"] = np.cumsum(steps, dtype=np.uint64) + np.uint64(rng.integers(0, 1 << 62))
    wild = rng.random(rows) < 0.05
    records["mono_ns"][wild] = rng.integers(0, 2**64 - 1, int(wild.sum()), dtype=np.uint64, endpoint=True)
    records["tid"] = rng.integers(0, 2**32, rows, dtype=np.uint64)
    records["seq"] = np.where(rng.random(rows) < 0.1, 0, rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True))
    records["aux"] = rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True)
    return bytes(head), records


@pytest.mark.parametrize("seed", range(6))
def test_packing_any_records_gives_back_the_same_bytes(tmp_path, seed):
    """The packed encoding is lossless for any 32-byte records, not only plausible ones: random
    segments (every field random, times out of order and wrapping) decode byte for byte, in
    version 2 (written) and version 1 (read; encoded here from its spec)."""
    rng = np.random.default_rng(seed)
    rows = [0, 1, 7, 1000, 40_000, 3][seed]
    head, records = _random_segment(rng, rows, [1, 2, 8, 64, 16, 64][seed])
    for version, payload in ((2, segments.encode(head, records)), (1, _v1_payload(head, records))):
        path = tmp_path / f"v{version}.packed"
        path.write_bytes(_packed(head, records, version, payload))
        got_head, got = segments.unpack(path)
        assert got_head == head and got.tobytes() == records.tobytes(), version


def test_a_segment_packed_in_version_1_reads_as_its_raw_self(tmp_path):
    """A real recording's segments packed in version 1 (sessions packed before version 2) read
    as the raw segments do."""
    events, claimed = _record(tmp_path)
    before = read_gil(events)
    for segment in gil_segments(events):
        raw = segment.path.read_bytes()
        offset = read_events(segment.path).header.records_offset
        rows = np.frombuffer(raw, GIL_RECORD_DTYPE, offset=offset)
        segment.path.with_name(segment.path.name + ".packed").write_bytes(_packed(raw[:offset], rows, 1, _v1_payload(raw[:offset], rows)))
        segment.path.unlink()
    after = read_gil(events)
    pd.testing.assert_frame_equal(_sorted(before), _sorted(after))
    assert after.attrs["events"] == claimed


def test_what_rotation_took_is_said_and_the_rest_reads_as_the_full_recording(tmp_path):
    events, claimed = _record(tmp_path)
    full = read_gil(_one_file(events, tmp_path / "whole.gil"))
    found = gil_segments(events)
    gone = found[:2]
    gone_events = sum(len(read_events(s.path).records) + read_events(s.path).lost for s in gone)
    for segment in gone:
        segment.path.unlink()
    kept = read_gil(events)
    window = kept.attrs["kept_window"]
    assert window["first_segment"] == 2 and window["rotated_out_events"] == gone_events
    assert kept.attrs["events"] == claimed - gone_events
    # Per thread, the kept window's intervals are the full recording's from the thread's first
    # kept event on (an interval whose first event was rotated out is not made up).
    first_kept = {}
    for segment in found[2:]:
        records = read_events(segment.path).records
        for tid in np.unique(records["tid"]).tolist():
            first_kept.setdefault(tid, int(records["mono_ns"][records["tid"] == tid].min()))
    expected = full[full["start_ns"] >= full["tid"].map(first_kept).fillna(np.inf)].copy()
    # ...and where the code of an interval is that of a DROP rotated out (a thread's intervals
    # before its first kept DROP), it is said to be unknown, not made up.
    first_drop = {}
    for segment in found[2:]:
        records = read_events(segment.path).records
        drops = records[records["kind"] == 1]
        for tid in np.unique(drops["tid"]).tolist():
            first_drop.setdefault(tid, int(drops["mono_ns"][drops["tid"] == tid].min()))
    unknown = expected["start_ns"] < expected["tid"].map(first_drop).fillna(np.inf)  # (none when every thread's first kept event is a DROP)
    expected.loc[unknown, "function"] = "<unknown>"
    expected.loc[unknown, ["file", "line"]] = None
    pd.testing.assert_frame_equal(_sorted(kept), _sorted(expected), check_dtype=False)


def test_a_missing_middle_segment_or_a_damaged_packed_one_is_one_clear_error(tmp_path):
    events, _ = _record(tmp_path)
    found = gil_segments(events)
    packed = found[-1].path.with_name(found[-1].path.name + ".packed")
    packed.write_bytes(segments.pack(found[-1].path)[:-20])
    found[-1].path.unlink()
    with pytest.raises(TandemError, match="packed segment"):
        read_gil(events)
    packed.unlink()
    found[1].path.unlink()
    with pytest.raises(TandemError, match="a segment is missing"):
        read_gil(events)


def test_sizes_and_durations_parse_or_say_what_is_expected():
    assert parse_size("500M") == 500 << 20 and parse_size("2g") == 2 << 30 and parse_size("1048576") == 1 << 20
    assert parse_duration("90s") == 90 and parse_duration("30m") == 1800 and parse_duration("2h") == 7200
    for bad in ("", "-1M", "lots", "5X"):
        with pytest.raises(TandemError, match="--max-size"):
            parse_size(bad)
    with pytest.raises(TandemError, match="--max-age"):
        parse_duration("soon")


def test_the_keeper_packs_closed_segments_and_keeps_the_bounds(tmp_path):
    session = tmp_path / "s"
    directory = session / "py-1"
    directory.mkdir(parents=True)
    events, claimed = _record(tmp_path, seconds=2.0, segment_bytes=16 << 20, segment_ms=300)
    for segment in gil_segments(events):
        os.rename(segment.path, directory / segment.path.name.replace("run.gil", "gil.events"))
    keeper = Keeper(session, bounds_from(None, None))
    keeper.step()
    found = gil_segments(directory / "gil.events")
    assert found and all(s.packed for s in found) and keeper.packed == len(found)
    assert read_gil(session).attrs["events"] == claimed
    # an age bound: every segment whose first event is older goes, whole (segments are ~300 ms
    # apart: the bound falls 150 ms before the first event of the third one from the end)
    assert len(found) >= 4
    cut_ns = segments.packed_span(found[-3].path)[0] - 150_000_000
    age = (time.monotonic_ns() - cut_ns) / 1e9 + 2 * PERIOD_S  # (the keeper looks two rounds ahead)
    Keeper(session, bounds_from(None, f"{age:.3f}s")).step()
    assert [s.number for s in gil_segments(directory / "gil.events")] == [s.number for s in found[-3:]]
    # a size bound under what is left: nothing of the GIL history can stay
    Keeper(session, bounds_from("1K", None), say=lambda line: None).step()
    assert gil_segments(directory / "gil.events") == []


@pytest.mark.slow
def test_record_with_bounds_never_exceeds_them(tmp_path):
    """`tandem record --max-size --max-age` on a busy service: the session's disk use sampled every
    second stays within --max-size, the history kept within --max-age, and what is kept reads."""
    session = tmp_path / "s"
    script = textwrap.dedent("""
        import threading, time
        def spin():
            end = time.monotonic() + 20
            while time.monotonic() < end:
                time.sleep(0)
        threads = [threading.Thread(target=spin) for _ in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    """)
    max_size, max_age = 48 << 20, 8.0
    proc = subprocess.Popen([sys.executable, "-m", "engine", "record", "--max-size", "48M", "--max-age", "8s",
                             "-o", str(session), "--", sys.executable, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = []
    while proc.poll() is None:
        time.sleep(1)
        if session.is_dir():
            samples.append(disk_use(session))
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert max(samples) <= max_size, samples
    description = read_json(session / "session.json")
    kept = description["flight_recorder"]
    assert kept["deleted_segments"] > 0 and kept["problem"] is None, kept
    gil = read_gil(session)
    window = gil.attrs["kept_window"]
    assert window["rotated_out_events"] > 0
    assert (window["last_ns"] - window["first_ns"]) / 1e9 <= max_age


@pytest.mark.slow
def test_dump_of_a_running_session_is_analyzable_and_keeps_the_last_window(tmp_path):
    """`tandem dump` while the demo service (Python with an embedded JVM) records: the snapshot
    holds the JVM's chunks as JFR had flushed them (up to about a second before the dump, each
    finished) and the GIL segments of the last --last seconds, and analyzes; the service runs
    on to its own end."""
    session, snapshot = tmp_path / "s", tmp_path / "snap"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "record", "--max-size", "500M", "--max-age", "10m",
                             "-o", str(session), "--", sys.executable, "-m", "engine.demo.workload", "--seconds", "25"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, first_closed = time.monotonic() + 120, None
    # segments close at 5 s or 4 MiB, whichever comes first: once the first one has been closed
    # for more than --last (6 s), the dump must leave it out
    while time.monotonic() < deadline:
        if first_closed is None and list(session.glob("py-*/gil.events.000001*")):
            first_closed = time.monotonic()
        if first_closed is not None and time.monotonic() - first_closed > 8 and list(session.glob("py-*/gil.events.000002*")):
            break
        time.sleep(0.25)
    dumped = run_tandem("dump", str(session), "-o", str(snapshot), "--last", "6s", env=dict(os.environ))
    out, err = proc.communicate(timeout=300)
    assert dumped.returncode == 0, dumped.stderr
    assert proc.returncode == 0, err
    dump = read_json(snapshot / "session.json")["dump"]
    assert dump["last_s"] == 6
    from engine.clock.chunks import scan_chunks
    from engine.ingest.jfr import read_pauses
    from engine.session import Session

    jvms = Session.open(snapshot).jvms
    assert len(jvms) == 1 and jvms[0].recordings
    assert all(scan_chunks(path).unfinished is None for path in jvms[0].recordings if path.suffix == ".jfr")
    pauses = read_pauses(jvms[0].recordings)
    # the demo calls System.gc() every 2 s: the JVM's events reach the dump's time less JFR's flush period
    assert pauses["end_ns"].max() >= dump["at_monotonic_ns"] - 4_000_000_000, (pauses["end_ns"].max(), dump)
    gil = read_gil(snapshot)
    window = gil.attrs["kept_window"]
    assert window["first_segment"] >= 1 and window["rotated_out_events"] > 0  # (older segments left out)
    # whole segments reaching 6 s back: at most one segment (5 s) more
    assert (window["last_ns"] - window["first_ns"]) / 1e9 <= 6 + 5 + 1
    analyzed = run_tandem("analyze", str(snapshot), "-o", str(tmp_path / "out"), env=dict(os.environ))
    assert analyzed.returncode == 0, analyzed.stderr
    assert "flight recorder: pid" in analyzed.stdout + analyzed.stderr and "rotated out" in analyzed.stdout + analyzed.stderr
    assert "unfinished" not in analyzed.stdout + analyzed.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_full_disk_stops_the_recording_with_one_line_never_the_service(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # room for the ring (32 MiB) and about 2 MiB of events: the first segment fills it
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=34m", "tmpfs", str(disk)], check=True)
    try:
        script = textwrap.dedent("""
            import threading, time
            def spin():
                end = time.monotonic() + 4
                while time.monotonic() < end:
                    time.sleep(0)
            threads = [threading.Thread(target=spin) for _ in range(3)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            print("service done")
        """)
        run = subprocess.run([sys.executable, "-m", "engine", "record", "--max-size", "1G", "-o", str(disk / "s"), "--",
                              sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == "service done\n", run.stderr
        lines = [line for line in run.stderr.splitlines() if "flight recorder:" in line]
        assert len(lines) == 1 and "disk is full" in lines[0], run.stderr
        assert "Traceback" not in run.stderr
        gil = read_gil(disk / "s")  # what was written before reads
        assert gil.attrs["drain_lost"] > 0 and len(gil) > 0
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_attach_to_a_jvm_with_bounds_gives_jfr_its_maxsize_and_maxage(tmp_path):
    """JFR keeps the JVM's side within the bounds itself: the agent sets them on its recording
    (a JFC-independent witness: `jfr summary` of the result and jvm.json's own report)."""
    from conftest import default_java_home
    from test_record_helpers import compile_workload, jdk_env

    java_home = default_java_home()
    env = jdk_env(java_home)
    workload = compile_workload(tmp_path / "workload")
    target = subprocess.Popen([str(java_home / "bin" / "java"), "-cp", str(workload), "Workload", "wait"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        session = tmp_path / "s"
        run = run_tandem("attach", str(target.pid), "-o", str(session), "--duration", "2", "--max-size", "64M",
                         "--max-age", "90s", env=env)
        assert run.returncode == 0, run.stderr
        description = read_json(session / f"jvm-{target.pid}" / "jvm.json")
        assert description["max_size_bytes"] == 32 << 20 and description["max_age_s"] == 90
        assert description["state"] == "closed" and (session / f"jvm-{target.pid}" / "recording.jfr").stat().st_size > 0
        bad = run_tandem("attach", str(target.pid), "-o", str(tmp_path / "bad"), "--max-size", "lots", env=env)
        assert bad.returncode == 2 and "--max-size 'lots'" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        target.kill()
        target.wait()


@pytest.mark.slow
def test_the_jvm_side_is_packed_within_max_age_and_reads_as_the_raw_chunks(tmp_path):
    """The demo service (an embedded JVM) for 45 s under --max-age 20s: the keeper packs each
    finished JFR chunk (jvm-*/packed/) and the JVM's history kept, as the JDK's own `jfr summary`
    reads it (packed chunks decompressed, then recording.jfr, end to end), spans no more than
    20 s; every pause read from the session equals the pauses of the same chunks as JFR wrote
    them (the witness: hard links to every repository chunk, made by this test as JFR creates
    them); the agent keeps no link to a packed chunk; and a `tandem dump` taken mid-run holds
    every chunk from its oldest to JFR's current one (to its last flush), reading as the
    witness's do."""
    import re
    import threading

    import zstandard

    from conftest import default_java_home
    from engine.ingest.jfr import read_pauses
    from engine.session import jvm_recordings

    session, witness = tmp_path / "s", tmp_path / "witness"
    witness.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "record", "--max-age", "20s", "-o", str(session), "--",
                             sys.executable, "-m", "engine.demo.workload", "--seconds", "45"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def link_chunks() -> None:
        while proc.poll() is None:
            for chunk in session.glob("jvm-*/repository/*/*.jfr"):
                try:
                    os.link(chunk, witness / chunk.name)
                except (FileExistsError, FileNotFoundError):
                    pass
            time.sleep(0.1)

    linker = threading.Thread(target=link_chunks)
    linker.start()
    deadline = time.monotonic() + 120
    while len(list(session.glob("jvm-*/packed/2*.jfr.zst"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.25)
    assert proc.poll() is None  # (the dump is of a running JVM)
    # Chunks of 5 s (a third of --max-age at most, 5 s at least) packed about 1 s after they
    # end and deleted once they begin more than --max-age ago: a packed chunk lives ~14 s here,
    # and every one present both before and after the dump must be in it.
    packed_before = {p.name for p in session.glob("jvm-*/packed/2*.jfr.zst")}
    dumped = run_tandem("dump", str(session), "-o", str(tmp_path / "snap"), env=dict(os.environ))
    packed_through = packed_before & {p.name for p in session.glob("jvm-*/packed/2*.jfr.zst")}
    _out, err = proc.communicate(timeout=600)
    linker.join()
    assert proc.returncode == 0, err
    assert dumped.returncode == 0, dumped.stderr
    (jvm_dir,) = session.glob("jvm-*")
    packed = sorted((jvm_dir / "packed").glob("*.jfr.zst"))
    kept = read_json(session / "session.json")["flight_recorder"]
    assert packed and kept["jfr_packed_chunks"] >= len(packed) and kept["jfr_deleted_chunks"] > 0, kept
    assert kept["jfr_packed_bytes"] * 2 < kept["jfr_raw_bytes_packed"], kept
    assert not list(jvm_dir.glob(".chunks/*.jfr"))
    files, closed = jvm_recordings(jvm_dir)
    assert closed and files[-1].name == "recording.jfr" and len(files) >= 2
    # decompressed as docs/session.md says, with zstandard alone: the JVM's dictionary (its first
    # chunk, packed alone) as raw content
    first = zstandard.ZstdDecompressor().stream_reader((jvm_dir / "packed" / "dictionary.jfr.zst").read_bytes()).read()
    dictionary = zstandard.ZstdCompressionDict(first, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    history = tmp_path / "history.jfr"
    with open(history, "wb") as out:
        for file in files:
            data = file.read_bytes()
            out.write(zstandard.ZstdDecompressor(dict_data=dictionary).stream_reader(data).read() if file.suffix == ".zst" else data)
    summary = subprocess.run([str(default_java_home() / "bin" / "jfr"), "summary", str(history)],
                             capture_output=True, text=True, check=True).stdout
    duration_s = int(re.search(r"Duration: (\d+) s", summary).group(1))
    assert 5 <= duration_s <= 20, summary
    # the witness: the chunks JFR wrote from the oldest kept one on, end to end, as a full
    # recording holds them (a safepoint split across two chunks then reads whole)
    def full_recording(chunks: list[Path], name: str) -> Path:
        target = tmp_path / name
        target.write_bytes(b"".join(chunk.read_bytes() for chunk in chunks))
        return target

    oldest = files[0].name.removesuffix(".zst")
    raw = full_recording(sorted(p for p in witness.glob("*.jfr") if p.name >= oldest), "kept-window.jfr")
    _same_pauses(read_pauses(files), read_pauses(raw))
    # the snapshot: packed chunks (and the dictionary), finished links, the repository's chunks
    from engine.clock.chunks import scan_chunks
    from engine.clock.packed import packed_chunk_span

    def starts(path: Path) -> list[int]:
        return [packed_chunk_span(path)[0]] if path.suffix == ".zst" else [c.start_nanos for c in scan_chunks(path).chunks]

    (snap_jvm,) = (tmp_path / "snap").glob("jvm-*")
    snap_files, _closed = jvm_recordings(snap_jvm)
    snap_starts = sorted(start for file in snap_files for start in starts(file))
    # (each chunk once; packed ones and JFR's current one: how many packed ones are still within
    # --max-age when the dump runs depends on how long it takes to start)
    assert len(snap_starts) >= 2 and len(set(snap_starts)) == len(snap_starts)
    assert any(f.suffix == ".jfr" for f in snap_files) and packed_through, (snap_files, packed_before)
    witness_chunks = {starts(p)[0]: p for p in witness.glob("*.jfr")}
    # (by start: a chunk the dump found raw too, its link or the repository's file, is read raw)
    assert {starts(witness / name.removesuffix(".zst"))[0] for name in packed_through} <= set(snap_starts), \
        (snap_files, packed_through)
    expected = sorted(start for start in witness_chunks if snap_starts[0] <= start <= snap_starts[-1])
    assert snap_starts == expected
    # The snapshot's newest chunk is JFR's current one as it had flushed it: the witness's whole
    # chunk holds more.
    _same_pauses(read_pauses(snap_files), read_pauses(full_recording([witness_chunks[start] for start in expected],
                                                                       "snapshot-window.jfr")))


def _same_pauses(ours: pd.DataFrame, theirs: pd.DataFrame) -> None:
    """The same pauses up to 2 s before the earlier of the two ends (a snapshot ends at JFR's
    last flush; the witness's links may miss the chunk JFR writes and deletes as the JVM exits;
    each side's clock is fitted on its own sync events and extrapolated past the last one):
    times within 10 us, every other column equal."""
    ours = ours.drop(columns=["source"]).sort_values("start_ns", ignore_index=True)
    theirs = theirs.drop(columns=["source"]).sort_values("start_ns", ignore_index=True)
    cutoff = min(ours["end_ns"].max(), theirs["end_ns"].max()) - 2_000_000_000
    ours = ours[ours["end_ns"] <= cutoff].reset_index(drop=True)
    theirs = theirs[theirs["end_ns"] <= cutoff].reset_index(drop=True)
    assert len(ours) > 0 and len(ours) == len(theirs), (len(ours), len(theirs))
    times = [c for c in ours.columns if c.endswith("_ns") and c != "duration_ns"]
    for column in times:
        a, b = ours[column].astype("float64"), theirs[column].astype("float64")
        assert (a.isna() == b.isna()).all() and ((a - b).abs().fillna(0) <= 10_000).all(), column
    pd.testing.assert_frame_equal(ours.drop(columns=times), theirs.drop(columns=times))
