"""JFR files as people have them (issue 15): gzip-compressed recordings read like their
decompressed twin, a recording without pause events is not called damaged, an empty file
is called empty. The witness is always the same file read uncompressed."""
from __future__ import annotations

import gzip
import shutil
import warnings
import zlib

import pandas as pd
import pytest

from conftest import SHARED_RECORDINGS, default_java_home
from engine.errors import TandemError, TandemWarning
from engine.ingest.jfr import read_pauses
from test_ingest_jfr import recordings, workload_dirs  # noqa: F401  (fixtures)


def read(path):
    """(table or the TandemError's text, [warning texts])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = read_pauses(path)
        except TandemError as err:
            result = str(err)
    return result, [str(w.message) for w in caught if issubclass(w.category, TandemWarning)]


def assert_same_as_twin(compressed, twin) -> None:
    """Same rows and the same metadata but for the file name; the same refusal otherwise."""
    got, got_warnings = read(compressed)
    want, want_warnings = read(twin)
    assert [w.replace(str(compressed), str(twin)) for w in got_warnings] == want_warnings
    if isinstance(want, str):
        assert got == want.replace(str(twin), str(compressed))
        return
    assert set(got["source"]) <= {str(compressed)}
    pd.testing.assert_frame_equal(got.drop(columns="source"), want.drop(columns="source"))
    assert str(got.attrs).replace(str(compressed), str(twin)) == str(want.attrs)


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_RECORDINGS.glob("*.jfr")))
@pytest.mark.parametrize("suffix", [".jfr.gz", ".jfr"])
def test_every_shared_recording_gzipped_reads_as_its_twin(name, suffix, tmp_path):
    """Each recording of /work/shared/recordings, gzipped (named .jfr.gz, or .jfr with gzip
    inside as JMC leaves them), gives the rows of the original, or the same refusal."""
    twin = tmp_path / "plain" / name
    twin.parent.mkdir()
    shutil.copyfile(SHARED_RECORDINGS / name, twin)
    compressed = tmp_path / (name[:-4] + suffix)
    with open(twin, "rb") as source, gzip.open(compressed, "wb") as out:
        shutil.copyfileobj(source, out)
    assert_same_as_twin(compressed, twin)


def test_fresh_recording_gzipped_and_cut_short(recordings, tmp_path):
    """A recording made here reads the same gzipped; a gzip stream cut in the middle reads
    like the bytes it still decompresses to (the truncated-file salvage rules: every
    complete chunk), with one more warning naming the .gz."""
    from test_ingest_witness import COLLECTORS

    path, _windows = recordings(default_java_home(), next(iter(COLLECTORS)))
    data = path.read_bytes()
    compressed = tmp_path / "app.jfr.gz"
    compressed.write_bytes(gzip.compress(data))
    twin = tmp_path / "twin" / "app.jfr"
    twin.parent.mkdir()
    twin.write_bytes(data)
    assert_same_as_twin(compressed, twin)

    cut = tmp_path / "cut.jfr.gz"
    cut.write_bytes(compressed.read_bytes()[: int(compressed.stat().st_size * 0.7)])
    prefix = zlib.decompressobj(wbits=31).decompress(cut.read_bytes())
    assert 0 < len(prefix) < len(data)
    twin_cut = tmp_path / "twin" / "cut.jfr"
    twin_cut.write_bytes(prefix)
    got, got_warnings = read(cut)
    want, want_warnings = read(twin_cut)
    assert got_warnings[0].startswith(f"{cut}: the gzip stream is cut short")
    assert [w.replace(str(cut), str(twin_cut)) for w in got_warnings[1:]] == want_warnings
    if isinstance(want, str):
        assert got == want.replace(str(twin_cut), str(cut))
    else:
        pd.testing.assert_frame_equal(got.drop(columns="source"), want.drop(columns="source"))


def test_recording_without_pause_events_names_the_settings_not_damage():
    """openjdk8u292.jfr (a JDK 8 backport's recording) holds no pause event: one warning names
    the missing event types and the settings, and does not call the file damaged."""
    path = SHARED_RECORDINGS / "openjdk8u292.jfr"
    table, texts = read(path)
    assert len(table) == 0
    assert len(texts) == 1 and texts[0].startswith(f"{path}: no pause events (")
    assert "jdk.SafepointBegin" in texts[0] and "jdk.GCPhasePause" in texts[0] and "settings" in texts[0]
    assert "not damaged" in texts[0] and "is damaged" not in texts[0]


def test_empty_files_are_called_empty(tmp_path):
    empty = tmp_path / "empty.jfr"
    empty.touch()
    empty_gz = tmp_path / "empty.jfr.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    for path, what in ((empty, "empty file (0 bytes)"), (empty_gz, "empty file (gzip of 0 bytes)")):
        with pytest.raises(TandemError) as err:
            read_pauses(path)
        assert str(err.value).startswith(f"{path}: {what}") and "\n" not in str(err.value)


def test_fresh_recording_zstd_compressed_reads_as_its_twin_and_damage_is_one_line(recordings, tmp_path):
    """Zstandard inside (the flight recorder's packed chunks, `zstd app.jfr`): the same rows as
    the original; a frame that is not one is refused in one line naming the file."""
    import zstandard

    from test_ingest_witness import COLLECTORS

    path, _windows = recordings(default_java_home(), next(iter(COLLECTORS)))
    data = path.read_bytes()
    compressed = tmp_path / "app.jfr.zst"
    compressed.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
    twin = tmp_path / "twin" / "app.jfr"
    twin.parent.mkdir()
    twin.write_bytes(data)
    assert_same_as_twin(compressed, twin)

    damaged = tmp_path / "damaged.jfr.zst"
    damaged.write_bytes(compressed.read_bytes()[:4] + b"x" * 64)
    got, _ = read(damaged)
    assert isinstance(got, str) and got.startswith(f"{damaged}: Zstandard-compressed, but damaged") and "\n" not in got
    # cut short: what it decompresses to reads as those bytes would (the truncated-file rules), one more warning
    cut = tmp_path / "cut.jfr.zst"
    cut.write_bytes(compressed.read_bytes()[: int(compressed.stat().st_size * 0.7)])
    got, got_warnings = read(cut)
    assert any(w.startswith(f"{cut}: the Zstandard stream is cut short") for w in got_warnings), got_warnings
