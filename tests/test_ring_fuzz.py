"""Fuzzing the ring readers: random bytes, random header and record mutations, truncations.

Every input must give either a clean TandemError or a result that satisfies the format's
invariants; a crash (SIGBUS/SIGSEGV kills pytest), a hang (pytest-timeout) or any other
exception fails the test.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.errors import TandemError
from engine.ring import PAUSE_RECORD_DTYPE, RingTailer, read_events
from engine.ring.layout import (
    CALIB_SLOTS,
    HEADER_SIZE,
    LANE_OFFSET_DROPPED,
    LANE_OFFSET_HEAD,
    LANE_OFFSET_TAIL,
    MAX_POSITION,
    OFFSET_CALIB_SEQ,
    OFFSET_CALIB_TABLE,
    OFFSET_STATE,
    lane_offset,
    records_offset_for,
)
from native import build as native_build

try:
    ring_selftest = native_build.load()
except native_build.Unavailable as err:
    pytest.skip(f"ring self-test module not built: {err}", allow_module_level=True)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, bytes]:
    """A real events file with LOST markers and a real ring, both closed: 4 lanes of 64
    slots, two producer threads."""
    d = tmp_path_factory.mktemp("ring-fuzz")
    ring_selftest._ring_stress(str(d / "gil.ring"), str(d / "gil.events"), 2, 20_000, 256, 5000, lanes=4)
    events = (d / "gil.events").read_bytes()
    ring = (d / "gil.ring").read_bytes()
    assert read_events(d / "gil.events").lost > 0  # markers present, so they get fuzzed too
    return {"events": events, "ring": ring}


def write_temp(data: bytes) -> Path:
    fd, name = tempfile.mkstemp(prefix="tandem-fuzz-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(name)


def check_events_file(data: bytes) -> None:
    path = write_temp(data)
    try:
        got = read_events(path)
    except TandemError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        event("events: rejected")
        return
    finally:
        path.unlink()
    event("events: accepted")
    assert got.records.dtype == got.header.record_dtype
    assert len(got.records) <= (len(data) - got.header.records_offset) // got.header.record_size
    assert 0 <= got.trailing_bytes < got.header.record_size
    assert got.lost >= 0 and got.produced >= len(got.records)
    assert sum(got.lane_records) == len(got.records) and sum(got.lane_lost) == got.lost
    assert (got.records["lane"] < got.header.lane_count).all()


def check_ring_file(data: bytes, polls: list[int]) -> None:
    path = write_temp(data)
    try:
        try:
            tail = RingTailer(path)
        except TandemError as e:
            assert str(path) in str(e) and "\n" not in str(e)
            event("ring: rejected at open")
            return
        with tail:
            for i, limit in enumerate(polls):
                try:
                    batch = tail.poll(limit, producer_gone=i % 2 == 1)
                except TandemError as e:
                    assert str(path) in str(e)
                    event("ring: rejected at poll")
                    return
                assert len(batch) <= min(limit, tail.header.capacity)
                assert batch.dtype == tail.header.record_dtype
                # Whatever the file says, per lane: received + missed == position <= head.
                for lane in range(tail.header.lane_count):
                    assert tail.lane_received[lane] + tail.lane_missed[lane] == tail.lane_position[lane] <= tail.lane_head[lane] < MAX_POSITION
        event("ring: accepted")
    finally:
        path.unlink()


def mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for offset, value in edits:
        out[offset % len(out)] = value
    return bytes(out)


header_offsets = st.integers(0, HEADER_SIZE - 1)
lane_table_offsets = st.integers(HEADER_SIZE, 2 * HEADER_SIZE - 1)
any_offsets = st.integers(0, 1 << 20)
edits = st.lists(st.tuples(st.one_of(header_offsets, lane_table_offsets, any_offsets), st.integers(0, 255)), min_size=1, max_size=8)
counter_values = st.one_of(st.integers(0, 1 << 20), st.integers(0, (1 << 64) - 1))


@FUZZ
@given(data=st.binary(max_size=9000))
def test_random_bytes_as_events_file(data):
    check_events_file(data)


@FUZZ
@given(data=st.binary(max_size=9000), polls=st.lists(st.integers(0, 600), min_size=1, max_size=3))
def test_random_bytes_as_ring_file(data, polls):
    check_ring_file(data, polls)


@FUZZ
@given(edits=edits, cut=st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_mutated_events_file(samples, edits, cut):
    data = mutate(samples["events"], edits)
    check_events_file(data if cut is None else data[:cut])


@FUZZ
@given(edits=edits, cut=st.one_of(st.none(), st.integers(0, 1 << 16)),
       polls=st.lists(st.integers(0, 600), min_size=1, max_size=3))
def test_mutated_ring_file(samples, edits, cut, polls):
    data = mutate(samples["ring"], edits)
    check_ring_file(data if cut is None else data[:cut], polls)


@FUZZ
@given(lane_counters=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([LANE_OFFSET_HEAD, LANE_OFFSET_TAIL, LANE_OFFSET_DROPPED]),
                                        counter_values), min_size=1, max_size=6),
       state=st.integers(0, (1 << 32) - 1),
       seq_edits=st.lists(st.tuples(st.integers(0, 255), counter_values), max_size=6),
       polls=st.lists(st.integers(0, 600), min_size=1, max_size=3))
def test_hostile_ring_counters_and_commit_words(samples, lane_counters, state, seq_edits, polls):
    """The fields a live reader re-reads on every poll (every lane's head, tail, dropped,
    every slot's commit word), set to anything."""
    out = bytearray(samples["ring"])
    for lane, field, value in lane_counters:
        at = lane_offset(lane) + field
        out[at:at + 8] = value.to_bytes(8, "little")
    out[OFFSET_STATE:OFFSET_STATE + 4] = state.to_bytes(4, "little")
    for slot, value in seq_edits:
        at = records_offset_for(4) + 32 * slot
        out[at:at + 8] = value.to_bytes(8, "little")
    check_ring_file(bytes(out), polls)


@FUZZ
@given(lane_count=st.sampled_from([0, 1, 2, 3, 64, 128, 1 << 31]), lane_capacity=st.sampled_from([0, 1, 2, 64, 1 << 26, 1 << 27]),
       records_offset=st.sampled_from([0, 4096, 8192, 16384, 36864, 1 << 40]),
       polls=st.lists(st.integers(0, 600), min_size=1, max_size=2))
def test_hostile_lane_geometry(samples, lane_count, lane_capacity, records_offset, polls):
    """Lane count, lane capacity and records offset that disagree with each other or with
    the file size: a one-line error, never a read outside the mapping."""
    for kind in ("ring", "events"):
        out = bytearray(samples[kind])
        out[168:172] = lane_count.to_bytes(4, "little")
        out[28:32] = lane_capacity.to_bytes(4, "little")
        out[176:184] = records_offset.to_bytes(8, "little")
        if kind == "ring":
            check_ring_file(bytes(out), polls)
        else:
            check_events_file(bytes(out))


def test_unmodified_samples_are_valid(samples):
    """The fuzz inputs start from files the readers accept (else the fuzzing is hollow)."""
    path = write_temp(samples["ring"])
    try:
        with RingTailer(path) as tail:
            assert tail.header.lane_count == 4
            got = tail.poll()
            assert len(got) == 64 * len(set(got["lane"].tolist())) and 0 not in set(got["lane"].tolist())
    finally:
        path.unlink()
    path = write_temp(samples["events"])
    try:
        assert read_events(path).produced == 40_000
    finally:
        path.unlink()


def pause_header(sample: bytes, lane_capacity: int) -> bytearray:
    """The layout of a JVM-pause file (record type 2) as the Java agent will write it: one
    lane (lane 0, written by one thread), so the lane table is one page."""
    header = bytearray(sample[:HEADER_SIZE]) + bytearray(HEADER_SIZE)
    header[20:24] = (2).to_bytes(4, "little")
    header[24:28] = (64).to_bytes(4, "little")
    header[28:32] = lane_capacity.to_bytes(4, "little")
    header[168:172] = (1).to_bytes(4, "little")
    header[176:184] = records_offset_for(1).to_bytes(8, "little")
    return header


def pause_events_file(events_sample: bytes, names: list[bytes], body: bytes) -> bytes:
    """A JVM-pause events file: the sample's header made type 2 / 64-byte records / one
    lane, with a name table, then BODY."""
    header = pause_header(events_sample, 64)
    header[OFFSET_STATE:OFFSET_STATE + 4] = bytes(4)  # not closed: counters not checked
    table = b"".join(n + b"\0" for n in names)
    header[2048:2052] = len(table).to_bytes(4, "little")
    header[2112:2112 + len(table)] = table
    return bytes(header) + body


def test_pause_records_and_names_decode(samples):
    records = np.zeros(3, dtype=PAUSE_RECORD_DTYPE)
    records["seq"] = [1, 2, 3]
    records["start_ns"] = [100, 200, 300]
    records["end_ns"] = [150, 260, 390]
    records["kind"] = [1, 2, 1]
    records["lane"] = 0
    records["id"] = [7, 8, 9]
    records["name_code"] = [1, 1 + len("G1 Young"), 0]
    data = pause_events_file(samples["events"], [b"G1 Young", "Pause Rémark".encode()], records.tobytes())
    path = write_temp(data)
    try:
        got = read_events(path)
    finally:
        path.unlink()
    assert got.header.record_dtype == PAUSE_RECORD_DTYPE
    assert got.header.names == {1: "G1 Young", 10: "Pause Rémark"}
    assert np.array_equal(got.records, records)


@FUZZ
@given(names=st.lists(st.binary(max_size=40), max_size=5), body=st.binary(max_size=2000))
def test_random_pause_files(samples, names, body):
    check_events_file(pause_events_file(samples["events"], names, body))


def test_tailing_a_pause_ring_wraps_and_counts_overwritten(samples):
    """A ring of pause records as the Java agent will lay it out: 16 slots, 20 positions
    claimed, so positions 0-3 were overwritten and 4-19 sit in slots 4..15, 0..3."""
    capacity, head = 16, 20
    header = pause_header(samples["ring"], capacity)
    header[lane_offset(0) + LANE_OFFSET_HEAD:lane_offset(0) + LANE_OFFSET_HEAD + 8] = head.to_bytes(8, "little")
    header[lane_offset(0) + LANE_OFFSET_DROPPED:lane_offset(0) + LANE_OFFSET_DROPPED + 8] = (5).to_bytes(8, "little")
    slots = np.zeros(capacity, dtype=PAUSE_RECORD_DTYPE)
    positions = np.arange(head - capacity, head)
    slots_of = positions % capacity
    slots["seq"][slots_of] = positions + 1
    slots["start_ns"][slots_of] = positions * 1000
    slots["end_ns"][slots_of] = positions * 1000 + 500
    slots["kind"][slots_of] = 1 + positions % 2
    path = write_temp(bytes(header) + slots.tobytes())
    try:
        with RingTailer(path) as tail:
            got = tail.poll()
            assert (tail.received, tail.missed, tail.dropped) == (16, 4, 5)
            assert np.array_equal(got["seq"], positions + 1)
            assert np.array_equal(got["end_ns"] - got["start_ns"], np.full(16, 500))
            assert len(tail.poll()) == 0
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def tsc_ring(tmp_path_factory) -> bytes:
    """A closed TSC-time ring (clock_id 2) with its calibration table, or a skip."""
    d = tmp_path_factory.mktemp("ring-fuzz-tsc")
    try:
        ring_selftest._tsc_selftest(str(d / "tsc.ring"), str(d / "tsc.events"), 3000, 500, 100, 200)
    except OSError as e:
        pytest.skip(str(e))
    return (d / "tsc.ring").read_bytes()


calib_offsets = st.integers(OFFSET_CALIB_SEQ, OFFSET_CALIB_TABLE + 16 * CALIB_SLOTS - 1)


@FUZZ
@given(edits=st.lists(st.tuples(st.one_of(calib_offsets, header_offsets), st.integers(0, 255)), min_size=1, max_size=8),
       words=st.lists(st.tuples(st.integers(0, (OFFSET_CALIB_TABLE + 16 * CALIB_SLOTS - OFFSET_CALIB_SEQ) // 8 - 1), counter_values),
                      max_size=6),
       polls=st.lists(st.integers(0, 600), min_size=1, max_size=3))
def test_hostile_tsc_calibration(tsc_ring, edits, words, polls):
    """A TSC-time ring whose calibration block (seqlock word, pair count, pairs) says
    anything: converted records or a one-line error, never a crash or a hang."""
    out = bytearray(mutate(tsc_ring, edits))
    for word, value in words:
        at = OFFSET_CALIB_SEQ + 8 * word
        out[at:at + 8] = value.to_bytes(8, "little")
    check_ring_file(bytes(out), polls)


def test_tsc_ring_sample_is_valid(tsc_ring):
    path = write_temp(tsc_ring)
    try:
        with RingTailer(path) as tail:
            assert tail.header.clock_id == 2
            got = tail.poll()
            assert len(got) > 0 and (np.diff(got["mono_ns"].astype(np.int64)) >= 0).all()
    finally:
        path.unlink()
