"""Damaged JFR files: every loss jdk.jfr suffers is measured by the chunk walk and said (docs/pauses.md, "Damage").

The fuzz test damages real recordings (the third-party ones in shared/recordings and our
own, JDK 17 and 25, one file of two chunks) in four ways and reads every copy in this one
process (one JVM through JPype): no copy may hang past the reading guard, raise anything
but a one-line TandemError, or read fewer pauses than its intact twin without a warning
that names the chunk and the bytes lost (or the events that could not be read), unless the
damage is of a kind docs/pauses.md says no structural check sees: the walks of both files
show which (a renamed type, a type id turned into another declared one, a number inside an
event, a damaged size the walk followed back onto the chain between two checkpoints).
"""
from __future__ import annotations

import random
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import JDK25, SHARED_RECORDINGS, default_java_home
from test_record_helpers import compile_workload, jdk_env, only_jvm_dir, run_tandem

import engine.ingest.jfr as jfr
from engine.clock.chunks import scan_chunks
from engine.errors import TandemError, TandemWarning
from engine.ingest.jfr_chunks import walk_chunks

DAMAGES = ("flip", "zero", "noise", "cut")
CHUNK_AND_BYTES = re.compile(r"chunk \d+.*\b\d+ bytes")


@pytest.fixture(scope="module")
def own_recordings(tmp_path_factory) -> list[Path]:
    """Recordings made here: JDK 17 and JDK 25 (when present), and both concatenated (two chunks, two runs)."""
    base = tmp_path_factory.mktemp("own")
    workload = compile_workload(base / "workload")
    files = []
    homes = [default_java_home()] + ([JDK25] if (JDK25 / "bin" / "java").exists() else [])
    for i, home in enumerate(homes):
        session = base / f"s{i}"
        run = run_tandem("record", "-o", str(session), "--", "java", "-cp", str(workload), "Workload", "alloc", "1.5",
                         env=jdk_env(home), timeout=180)
        assert run.returncode == 0, run.stderr
        files.append(only_jvm_dir(session) / "recording.jfr")
    both = base / "two-runs.jfr"
    both.write_bytes(b"".join(f.read_bytes() for f in files))
    return files + [both]


def third_party() -> list[Path]:
    return sorted(p for p in SHARED_RECORDINGS.glob("*.jfr") if p.name != "9u0.jfr")  # 9u0: format 1.0, always refused


def damaged(data: bytes, kind: str, rng: random.Random) -> bytes:
    out = bytearray(data)
    if kind == "flip":  # 8 single-bit flips
        for _ in range(8):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == "zero":  # a 4 KiB block of zeros
        at = rng.randrange(len(out))
        out[at:at + 4096] = bytes(len(out[at:at + 4096]))
    elif kind == "noise":  # 512 random bytes
        at = rng.randrange(len(out))
        out[at:at + 512] = rng.randbytes(len(out[at:at + 512]))
    else:  # cut anywhere after the first header
        del out[rng.randrange(68, len(out)):]
    return bytes(out)


def read(path: Path) -> tuple[int | None, str | None, list[str]]:
    """(rows or None if refused, refusal, warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rows = len(jfr.read_pauses(path))
        except TandemError as err:
            assert "\n" not in str(err) and str(path) in str(err)
            return None, str(err), []
    return rows, None, [str(w.message) for w in caught if issubclass(w.category, TandemWarning)]


def classify(rows: int | None, intact: int, messages: list[str]) -> str:
    if rows is None:
        return "refused"
    if rows >= intact:
        return "complete"
    if any(CHUNK_AND_BYTES.search(m) or UNREADABLE_EVENTS.search(m) for m in messages):
        return "partial with warning"
    return "partial without warning"


UNREADABLE_EVENTS = re.compile(r"\d+ event\(s\) whose fields could not be read were skipped")


def _structure(path: Path) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """Per chunk: the metadata's event types, and the offset and type id of every event the
    walk steps on (independently of what jdk.jfr made of them)."""
    from engine.ingest import jfr_chunks

    buffer = np.fromfile(path, np.uint8)
    out = []
    for chunk in scan_chunks(path).chunks:
        try:
            ids = jfr_chunks.read_event_types(buffer, chunk)
        except jfr_chunks.MetadataError:
            out.append(({}, np.zeros(0, np.int64), np.zeros(0, np.int64)))
            continue
        known = np.zeros(max(ids.values(), default=0) + 2, bool)
        known[list(ids.values())] = True
        known[:2] = True  # metadata and checkpoint events
        offsets, types, _, _ = jfr_chunks._walk(buffer, chunk.offset + 68, chunk.offset + chunk.size, known,
                                                np.ones(known.size, bool))
        out.append((ids, offsets, types))
    return out


def undetectable_kind(intact: Path, copy: Path) -> str | None:
    """Why a copy read fewer pauses than its intact twin without a warning, when the damage is
    of a kind docs/pauses.md ("Damage") says the structural checks cannot see; None when it is
    not (a loss tandem should have said)."""
    before, after = _structure(intact), _structure(copy)
    if len(before) != len(after):
        return None
    for (ids_a, offsets_a, types_a), (ids_b, offsets_b, types_b) in zip(before, after):
        if ids_a != ids_b:
            return "a type renamed or renumbered in the metadata"
        if not np.array_equal(offsets_a, offsets_b):
            checkpoints = set(offsets_a[types_a == 1].tolist())
            if checkpoints - set(offsets_b.tolist()):
                return None  # a checkpoint skipped: the walk checks that
            return "a damaged size followed through whole-looking events back onto the chain"
        if not np.array_equal(types_a, types_b):
            return "a type id changed to another declared type"
    return "a changed number inside an event"


def fuzz(files: list[Path], copies_per_file: int, tmp_path: Path, monkeypatch) -> Counter:
    # The watchdog: far below the production guard, far above a small file's reading time.
    monkeypatch.setattr(jfr, "READ_TIMEOUT_BASE_S", 20.0)
    table, silent, undetectable = Counter(), [], Counter()
    for source in files:
        intact, refusal, _ = read(source)
        assert intact is not None, refusal
        data = source.read_bytes()
        for k in range(copies_per_file):
            kind = DAMAGES[k % len(DAMAGES)]
            copy = tmp_path / f"{source.parent.parent.name}-{source.stem}-{k}-{kind}.jfr"
            copy.write_bytes(damaged(data, kind, random.Random(f"{source.name}/{k}")))
            rows, _, messages = read(copy)
            verdict = classify(rows, intact, messages)
            table[verdict] += 1
            if verdict == "partial without warning":
                kind = undetectable_kind(source, copy)
                if kind is None:
                    silent.append(f"{copy.name}: {rows} of {intact} pauses, warnings {messages}")
                else:
                    undetectable[kind] += 1
            copy.unlink()
    print("\ndamaged copies:", sum(table.values()), dict(table), "; silent, of the kinds no check sees:", dict(undetectable))
    assert not silent, "\n".join(silent)
    return table


def test_intact_files_walk_to_the_end_and_agree_with_jdk_jfr(own_recordings):
    """The walk's event counts equal jdk.jfr's (`jfr summary` is the independent witness), and
    the checkpoints' own chain of deltas is read in every chunk, each of them stepped on."""
    from engine.ingest.jfr_chunks import _checkpoint_chain
    from test_record_helpers import jfr_event_counts

    for path in [*third_party(), *own_recordings[:1]]:
        scan = scan_chunks(path)
        walks = walk_chunks(path, scan.chunks, jfr.PAUSE_EVENT_TYPES)
        assert all(w.problem is None and w.walked_to == w.end for w in walks), path
        buffer = np.fromfile(path, np.uint8)
        assert all(_checkpoint_chain(buffer, c) for c in scan.chunks), path
        walked = Counter()
        for walk in walks:
            names = {v: k for k, v in walk.type_ids.items()}
            walked.update(names[int(t)] for t in walk.event_types)
        summary = jfr_event_counts(default_java_home(), path)
        assert walked == Counter({t: summary[t] for t in jfr.PAUSE_EVENT_TYPES if summary.get(t)}), path


def test_a_damaged_chunk_is_named_and_the_other_chunk_is_read(own_recordings):
    two = own_recordings[-1]
    first_size = own_recordings[0].stat().st_size
    intact = jfr.read_pauses(two)
    second_only = int((intact["chunk"] == 1).sum())
    data = bytearray(two.read_bytes())
    walk = walk_chunks(two, scan_chunks(two).chunks, jfr.PAUSE_EVENT_TYPES)[0]
    # Break one event's size in the middle of chunk 0's pause events.
    at = int(walk.event_offsets[len(walk.event_offsets) // 2])
    data[at:at + 4] = b"\xff\xff\xff\x7f"
    broken = two.with_name("broken.jfr")
    broken.write_bytes(bytes(data))
    with pytest.warns(TandemWarning) as caught:
        table = jfr.read_pauses(broken)
    message = next(str(w.message) for w in caught if "damaged recording" in str(w.message))
    assert "chunk 0 (at byte 0)" in message and f"lost from byte {at}: {first_size - at} bytes" in message
    damage = table.attrs["sources"][0]["damage"]
    assert [(d["chunk"], d["from_byte"], d["lost_bytes"]) for d in damage] == [(0, at, first_size - at)]
    # The walk finds whole events again after the broken one and counts the pause events from
    # there: a lower bound of what the intact chunk holds from the broken event on.
    pause_ids = walk.ids_of(jfr.PAUSE_EVENT_TYPES)
    truly_lost = int(((walk.event_offsets >= at) & np.isin(walk.event_types, pause_ids)).sum())
    assert 0 < damage[0]["lost_pause_events_at_least"] <= truly_lost
    assert f"at least {damage[0]['lost_pause_events_at_least']} pause event(s)" in message
    assert int((table["chunk"] == 1).sum()) == second_only  # the rest of the file is read
    assert len(table) < len(intact)


def test_fuzz_small(own_recordings, tmp_path, monkeypatch):
    """A quick pass of the fuzz test (the full one is slow)."""
    fuzz([own_recordings[0], SHARED_RECORDINGS / "flush_metadata.jfr"], 8, tmp_path, monkeypatch)


@pytest.mark.slow
def test_fuzz_every_recording(own_recordings, tmp_path, monkeypatch):
    files = [*third_party(), *own_recordings]
    per_file = -(-208 // len(files))
    table = fuzz(files, per_file, tmp_path, monkeypatch)
    assert sum(table.values()) >= 200
    assert table["partial with warning"] > 0 and table["complete"] > 0
