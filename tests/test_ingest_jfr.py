"""Ingest of JFR pauses against the JDK's own `jfr print --json` of the same real recordings."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import SHARED_RECORDINGS, default_java_home, jdk_params
from engine.errors import TandemError, TandemWarning
from engine.ingest.jfr import read_pauses
from engine.store import read_table
from test_ingest_witness import COLLECTORS, assert_matches_witness, build_workload, collector_available, record

JDK17 = default_java_home()


@pytest.fixture(scope="session")
def workload_dirs(tmp_path_factory):
    """One compiled workload (and pause settings) per JDK, built on first use."""
    built: dict[Path, Path] = {}

    def get(java_home: Path) -> Path:
        if java_home not in built:
            workdir = tmp_path_factory.mktemp(f"workload-{java_home.name}")
            build_workload(java_home, workdir)
            built[java_home] = workdir
        return built[java_home]

    return get


@pytest.fixture(scope="session")
def recordings(workload_dirs, tmp_path_factory):
    """Fresh recordings, cached for the session: (java_home, collector, sync) -> (path, gc windows)."""
    cache: dict = {}

    def get(java_home: Path, collector: str, sync: bool = True):
        key = (java_home, collector, sync)
        if key not in cache:
            flag = COLLECTORS[collector]
            if not collector_available(java_home, flag):
                pytest.skip(f"{java_home.name} has no {collector}")
            out = tmp_path_factory.mktemp("rec") / f"{java_home.name}-{collector}-{'sync' if sync else 'nosync'}.jfr"
            cache[key] = record(java_home, workload_dirs(java_home), out, flag, sync=sync)
        return cache[key]

    return get


# ---------------------------------------------------------------- fresh recordings, every collector


@pytest.mark.slow
@pytest.mark.parametrize("collector", list(COLLECTORS))
@pytest.mark.parametrize("java_home", jdk_params())
def test_every_kind_matches_jfr_print(java_home, collector, recordings):
    path, windows = recordings(java_home, collector)
    df = read_pauses(path)
    assert len(df) > 0
    expected = assert_matches_witness(df, java_home, path)
    assert len(expected["gc"]) >= 2  # the two System.gc() at least
    if collector != "zgc":  # ZGC safepoints are few and short on 17; elsewhere there are many
        assert len(expected["safepoint"]) > 0
    assert df.attrs["clock_domain"] == "monotonic"
    assert df.attrs["sources"][0]["runs"][0]["clock"]["method"] == "clock_sync"
    _check_gc_windows(df, windows)


def _check_gc_windows(df: pd.DataFrame, windows: list[tuple[int, int]]) -> None:
    """Independent clock witness: the workload read System.nanoTime() right before and after
    each System.gc(); the pauses of those collections must lie inside those windows."""
    explicit = df[(df["kind"] == "gc") & (df["cause"] == "System.gc()")]
    assert len(explicit) >= len(windows) == 2
    error = max(r["clock"]["error_ns"] for s in df.attrs["sources"] for r in s["runs"])
    pauses = df[(df["kind"] == "gc_pause") & df["gc_id"].isin(explicit["gc_id"])]
    for row in pauses.itertuples():
        inside = [lo - error <= row.start_ns and row.end_ns <= hi + error for lo, hi in windows]
        assert any(inside), (row.start_ns, row.end_ns, windows)


def test_g1_default_jdk_fast(recordings):
    """The not-slow smoke test: one fresh JDK-17 G1 recording against the witness."""
    path, windows = recordings(JDK17, "g1")
    df = read_pauses(path)
    assert_matches_witness(df, JDK17, path)
    _check_gc_windows(df, windows)
    sp = df[df["kind"] == "safepoint"]
    assert (sp["time_to_safepoint_ns"] <= sp["duration_ns"]).all()
    assert df["pause_id"].is_unique and df["start_ns"].is_monotonic_increasing
    assert (df["duration_ns"] >= 0).all()
    assert df["jvm_pid"].notna().all()
    assert df.attrs["jvm_vendor"] and "G1" in df.attrs["collector"]


# Every column and count PauseReader hands to Python.
_READER_RESULTS = (
    "kind", "startTicks", "endTicks", "osThreadId", "requesterOsThreadId", "systemGcOsThreadId", "systemGcFrames",
    "safepointId", "gcId", "timeToSafepointTicks", "totalThreads", "jniCriticalThreads", "sumOfPausesNanos",
    "longestPauseNanos", "name", "cause", "operation", "collector", "compiler", "unmatched", "atSafepoint",
    "dictionary", "syncTicks", "syncMonotonicNanos", "eventsSeen", "unreadableEvents", "orphanSafepointEnds",
)


@pytest.mark.parametrize("source", ["fresh-jdk-default", "fresh-jdk25"]
                         + sorted(p.name for p in SHARED_RECORDINGS.glob("*.jfr") if p.name != "9u0.jfr"))
def test_fields_by_position_equal_fields_by_name(source, recordings):
    """PauseReader reads event fields by position inside jdk.jfr's events (tandem's JVM opens
    jdk.jfr.consumer to it): every result equals reading each field by name, jdk.jfr's API."""
    from engine import jvm

    if source.startswith("fresh-"):
        java_home = JDK17 if source == "fresh-jdk-default" else jdk_params()[1].values[0]
        if not (java_home / "bin" / "java").exists():
            pytest.skip(f"{java_home} not present")
        path = recordings(java_home, "g1")[0]
    else:
        path = SHARED_RECORDINGS / source
    reader_class = jvm.start_jvm().JClass("tandem.ingest.PauseReader")
    by_position, by_name = reader_class(), reader_class()
    by_name.readByName()
    by_position.readFile(str(path))
    by_name.readFile(str(path))
    assert by_position.readsByPosition() and not by_name.readsByPosition()
    assert by_position.typesReadByName() == 0  # (a type whose check fails is read by name)
    assert int(by_position.eventsSeen()) > 0
    for result in _READER_RESULTS:
        a, b = getattr(by_position, result)(), getattr(by_name, result)()
        if result == "dictionary":
            a, b = [str(s) for s in a], [str(s) for s in b]
        elif hasattr(a, "__len__"):
            a, b = list(a), list(b)
        else:
            a, b = int(a), int(b)
        assert a == b, result


# ---------------------------------------------------------------- third-party recordings


def test_a_recording_removed_while_read_is_one_error_naming_it(tmp_path, removed_after_scan):
    """A file there when listed and gone while read (a JVM's exit moves its chunks) is refused
    as any unreadable file is, in one line naming it, not with an OSError."""
    import shutil

    path = tmp_path / "chunk.jfr"
    shutil.copy(SHARED_RECORDINGS / "full_gc_cms.jfr", path)
    with pytest.raises(TandemError, match=f"{path}: removed while it was being read"):
        read_pauses(path)


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_RECORDINGS.glob("*.jfr")))
def test_shared_recordings_read_or_refused(name):
    path = SHARED_RECORDINGS / name
    if name == "9u0.jfr":
        with pytest.raises(TandemError) as err:
            read_pauses(path)
        message = str(err.value)
        assert "\n" not in message and str(path) in message
        assert "JFR format 1.0" in message and "9+181" in message
        return
    df = read_pauses(path)
    tps = df.attrs["sources"][0]["runs"][0]["ticks_per_second"]
    # With TSC ticks jdk.jfr converts through a double: allow its rounding.
    assert_matches_witness(df, JDK17, path, tolerance_ns=0 if tps == 1_000_000_000 else 2)
    # None of these was recorded on this host since its boot: wall clock, honestly.
    assert df.attrs["clock_domain"] == "wall"


def test_windows_recording_is_wall_domain():
    df = read_pauses(SHARED_RECORDINGS / "Generated_MetadataBaseline_11.jfr")
    run = df.attrs["sources"][0]["runs"][0]
    assert run["os"] == "windows" and run["clock"]["method"] == "chunk_header_wall"
    assert run["jvm_pid"] == 21532 and (df["jvm_pid"] == 21532).all()


def test_pid_from_agent_jvm_json_when_jfr_has_none(tmp_path):
    """jdk21.jfr has no jdk.JVMInformation: the pid comes from the agent's jvm.json, found
    beside the recording or beside the JFR repository that holds a chunk."""
    source = SHARED_RECORDINGS / "jdk21.jfr"
    assert read_pauses(source)["jvm_pid"].isna().all()
    for chunk in (tmp_path / "jvm-77" / "recording.jfr", tmp_path / "jvm-77" / "repository" / "2026_11_29" / "c.jfr"):
        chunk.parent.mkdir(parents=True, exist_ok=True)
        chunk.write_bytes(source.read_bytes())
        (tmp_path / "jvm-77" / "jvm.json").write_text('{"pid": 77, "java_vendor": "Someone"}')
        df = read_pauses(chunk)
        assert (df["jvm_pid"] == 77).all() and df.attrs["jvm_vendor"] == "Someone"


def test_multi_chunk_file_keeps_chunk_index():
    df = read_pauses(SHARED_RECORDINGS / "flush_metadata.jfr")
    assert df.attrs["sources"][0]["chunks"] == 2
    assert set(df["chunk"]) <= {0, 1}


# ---------------------------------------------------------------- several files, concatenation


def test_several_files_one_table(recordings, tmp_path):
    a, _ = recordings(JDK17, "g1")
    b, _ = recordings(JDK17, "serial")
    df = read_pauses([a, b])
    assert df["pause_id"].tolist() == list(range(len(df)))
    assert set(df["source"]) == {str(a), str(b)}
    assert df["jvm_pid"].nunique() == 2
    assert len(df) == len(read_pauses(a)) + len(read_pauses(b))


def test_mixing_clock_domains_is_refused(recordings):
    a, _ = recordings(JDK17, "g1")
    with pytest.raises(TandemError, match="one clock"):
        read_pauses([a, SHARED_RECORDINGS / "jdk21.jfr"])


def test_concatenated_recordings_of_two_jvms(recordings, tmp_path):
    """`cat a.jfr b.jfr` holds two JVM runs: each gets its own clock fit and its own pid."""
    a, _ = recordings(JDK17, "g1")
    b, _ = recordings(JDK17, "parallel")
    both = tmp_path / "both.jfr"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    df = read_pauses(both)
    runs = df.attrs["sources"][0]["runs"]
    assert len(runs) == 2 and all(r["clock"]["method"] == "clock_sync" for r in runs)
    assert df["jvm_pid"].nunique() == 2
    separate = pd.concat([read_pauses(a), read_pauses(b)])
    assert sorted(df["start_ns"]) == sorted(separate["start_ns"])
    assert sorted(df["duration_ns"]) == sorted(separate["duration_ns"])


# ---------------------------------------------------------------- bad input


def test_truncated_recording_keeps_complete_chunks(recordings, tmp_path):
    a, _ = recordings(JDK17, "g1")
    b, _ = recordings(JDK17, "serial")
    first = read_pauses(a)
    whole = a.read_bytes() + b.read_bytes()
    cuts = [len(a.read_bytes()) + k for k in (1, 40, 68, 1000, len(b.read_bytes()) // 2, len(b.read_bytes()) - 1)]
    for cut in cuts:
        cut_file = tmp_path / f"cut{cut}.jfr"
        cut_file.write_bytes(whole[:cut])
        with pytest.warns(TandemWarning, match=f"last {cut - len(a.read_bytes())} of {cut} bytes"):
            df = read_pauses(cut_file)
        assert len(df) == len(first)
        assert df["duration_ns"].tolist() == first["duration_ns"].tolist()
        assert df.attrs["sources"][0]["lost_bytes"] == cut - len(a.read_bytes())


def test_truncated_first_chunk_is_one_line_error(recordings, tmp_path):
    a, _ = recordings(JDK17, "g1")
    data = a.read_bytes()
    for cut in (2, 10, 68, len(data) // 3, len(data) - 1):
        cut_file = tmp_path / f"cut{cut}.jfr"
        cut_file.write_bytes(data[:cut])
        with pytest.raises(TandemError) as err:
            read_pauses(cut_file)
        assert str(cut_file) in str(err.value) and "\n" not in str(err.value)


def test_not_jfr_is_one_line_error(tmp_path):
    for content, message in ((b"", "empty file"), (b"hello world\n" * 100, "not a JFR recording"),
                             (b"PK\x03\x04" + bytes(200), "not a JFR recording")):
        path = tmp_path / "x.jfr"
        path.write_bytes(content)
        with pytest.raises(TandemError, match=message):
            read_pauses(path)
    with pytest.raises(TandemError, match="cannot read"):
        read_pauses(tmp_path / "missing.jfr")


def test_damaged_events_warn(recordings, tmp_path):
    """Valid headers, event bytes overwritten: jdk.jfr's EventStream swallows its own parse
    error and delivers nothing; ingest must say so (the chunk walk: which chunk, from which byte)
    instead of returning an empty table silently."""
    a, _ = recordings(JDK17, "g1")
    data = bytearray(a.read_bytes())
    data[68:4096] = b"\xff" * (4096 - 68)
    bad = tmp_path / "damaged.jfr"
    bad.write_bytes(bytes(data))
    with pytest.warns(TandemWarning, match=r"damaged recording: .*chunk 0 \(at byte 0\): .*lost from byte 68: "):
        df = read_pauses(bad)
    assert len(df) == 0


def test_java_exception_becomes_tandem_error(tmp_path):
    """A Java exception (here NoSuchFileException from EventStream.openFile) names the user's file."""
    from engine.clock.chunks import scan_chunks
    from engine.ingest.jfr import _Progress, _run_java_reader

    scan = scan_chunks(SHARED_RECORDINGS / "jdk21.jfr")
    with pytest.raises(TandemError) as err:
        _run_java_reader(scan.path, tmp_path / "vanished.jfr", scan.chunks, _Progress(None, 0))
    assert str(scan.path) in str(err.value) and "vanished.jfr" in str(err.value)


# ---------------------------------------------------------------- the CLI


def _tandem(*args, cwd=None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "tandem"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_cli_writes_parquet_equal_to_api(recordings, tmp_path):
    a, _ = recordings(JDK17, "g1")
    done = _tandem("pauses", a, "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    stored = read_table(tmp_path / "out" / "pauses.parquet")
    api = read_pauses(a)
    pd.testing.assert_frame_equal(stored, api)
    assert stored.attrs["clock_domain"] == "monotonic" and stored.attrs["schema"] == "tandem.pauses"
    assert "safepoint" in done.stdout


def test_cli_bad_inputs_one_line(recordings, tmp_path):
    done = _tandem("pauses", SHARED_RECORDINGS / "9u0.jfr", "-o", tmp_path / "out")
    assert done.returncode == 2
    assert done.stderr.startswith("tandem: error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / "pauses.parquet").exists()

    a, _ = recordings(JDK17, "g1")
    cut = tmp_path / "cut.jfr"
    cut.write_bytes(a.read_bytes() + a.read_bytes()[:5000])
    done = _tandem("pauses", cut, "-o", tmp_path / "out2")
    assert done.returncode == 0, done.stderr
    warning_lines = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning_lines) == 1 and "5000 of" in warning_lines[0]
    assert (tmp_path / "out2" / "pauses.parquet").exists()
