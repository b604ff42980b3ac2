"""The ring's layout is written once, in docs/ring.md; the three implementations are held to it.

The Python reader (engine/ring/layout.py), the C producer and drain (engine/probe/ring.c,
ring_fast.h, ring.h: compiled here with offsetof) and the Java pause writer
(java-agent/.../PauseRing.java) each spell the offsets and kinds in their own language; this
test reads docs/ring.md's tables and checks every one of them against it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.ring import layout

ROOT = Path(__file__).resolve().parents[1]
SPEC = (ROOT / "docs" / "ring.md").read_text()
RING_C = (ROOT / "engine" / "probe" / "ring.c").read_text()
PAUSE_RING_JAVA = (ROOT / "java-agent" / "src" / "tandem" / "agent" / "PauseRing.java").read_text()
# the record kinds: one numbering for the ring and the offline reader
PAUSE_KINDS_JAVA = (ROOT / "java-agent" / "src" / "tandem" / "jfr" / "PauseKinds.java").read_text()


def section(heading: str) -> str:
    """The text of docs/ring.md's section HEADING, up to the next heading."""
    match = re.search(rf"^##+ {re.escape(heading)}.*?$(.*?)(?=^##)", SPEC, re.M | re.S)
    assert match, f"docs/ring.md has no section {heading!r}"
    return match.group(1)


def tables(text: str) -> list[list[list[str]]]:
    """Each markdown table of TEXT as its rows of cells (header row left out)."""
    out, rows = [], None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if rows is None:
                rows = []
            elif not set(line) <= set("|-: "):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows is not None:
            out.append(rows)
            rows = None
    return out


def first_name(cell: str) -> str | None:
    match = re.match(r"`(\w+)`", cell)
    return match.group(1) if match else None


def fields(heading: str, name_column: int = 2) -> dict[str, int]:
    """field -> byte offset, from the section's first table, whose first column is an offset (`+N` in the lane table)."""
    out = {}
    for row in tables(section(heading))[0]:
        offset, name = row[0].lstrip("+"), first_name(row[name_column])
        if name is not None and offset.isdigit():
            out[name] = int(offset)
    return out


HEADER = fields("Header")
LANE = fields("Lane table")
GIL_RECORD = fields("Records", 2)
# The lane fields a ring's lane struct holds; the others are written into events files only.
RING_LANE = {"head", "tail", "dropped", "owner", "drain_lost"}
PAUSE_RECORD = fields("Records", 3)
GIL_KINDS = {row[1]: int(row[0], 0) for row in tables(section("Records"))[1]}
PAUSE_KINDS = {name.strip(): int(number) for number, name in
               re.findall(r"(\d) = ([A-Za-z][A-Za-z ]*[A-Za-z])", re.search(r"`kind`: (1 = [^|]*)", section("Records")).group(1))}


def test_the_spec_tables_parse():
    assert HEADER["magic"] == 0 and HEADER["records_offset"] == 176 and HEADER["names_used"] == 2048
    assert len(HEADER) >= 20 and RING_LANE <= set(LANE)
    assert set(GIL_RECORD) == {"seq", "mono_ns", "tid", "kind", "lane", "aux"}
    assert {"start_ns", "end_ns", "id", "name_code"} <= set(PAUSE_RECORD)
    assert GIL_KINDS == {"DROP": 1, "TAKE_REQUEST": 2, "TAKE_ACQUIRED": 3, "SAMPLE_HELD": 4, "SAMPLE_FREE": 5,
                         "LOST": 0xFF01}
    assert PAUSE_KINDS == {"safepoint": 1, "GC pause": 2, "GC": 3, "VM operation": 4, "System GC call": 5}


def test_python_reader_follows_the_spec():
    dtype_fields = {name: spec[1] for name, spec in layout.HEADER_DTYPE.fields.items()}
    calibration = {"calib_seq": layout.OFFSET_CALIB_SEQ, "calib_total": layout.OFFSET_CALIB_TOTAL,
                   "calib_first_tsc": layout.OFFSET_CALIB_FIRST, "calib_first_mono": layout.OFFSET_CALIB_FIRST + 8,
                   "calib_table": layout.OFFSET_CALIB_TABLE}
    python = {**dtype_fields, **calibration}
    assert {name: python.get(name) for name in HEADER} == HEADER
    assert {name: spec[1] for name, spec in layout.LANE_DTYPE.fields.items()} == LANE
    assert {name: spec[1] for name, spec in layout.GIL_RECORD_DTYPE.fields.items()} == GIL_RECORD
    assert {name: spec[1] for name, spec in layout.PAUSE_RECORD_DTYPE.fields.items()} == PAUSE_RECORD
    kinds = {name: getattr(layout, f"GIL_{name}") for name in GIL_KINDS if name != "LOST"}
    assert {**kinds, "LOST": layout.LOST_MARKER} == GIL_KINDS
    assert layout.GIL_RECORD_DTYPE.itemsize == 32 and layout.PAUSE_RECORD_DTYPE.itemsize == 64


def c_name(field: str) -> str:
    return re.sub(r"_NS$", "", field.upper())


def test_c_header_offsets_follow_the_spec():
    defines = {name: int(value) for name, value in re.findall(r"^#define OFF_(\w+) (\d+)", RING_C, re.M)}
    spelled = {field: defines.get(c_name(field)) for field in HEADER}
    assert {field: offset for field, offset in spelled.items() if offset is not None} == \
        {field: HEADER[field] for field, offset in spelled.items() if offset is not None}
    # every field the C side writes or reads is spelled there (the name table is the Java writer's)
    assert {field for field, offset in spelled.items() if offset is None} <= {"name_table"}


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
def test_c_structs_and_kinds_follow_the_spec(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "ring_fast.h"', "int main(void) {"]
    lines += [f'printf("lane {f} %zu\\n", offsetof(ring_lane, {f}));' for f in RING_LANE]
    lines += [f'printf("record {f} %zu\\n", offsetof(ring_gil_record, {f}));' for f in GIL_RECORD]
    lines += [f'printf("kind {k} %d\\n", (int)TANDEM_GIL_{k});' for k in GIL_KINDS if k != "LOST"]
    lines += ['printf("kind LOST %u\\n", (unsigned)TANDEM_RING_LOST_MARKER);',
              'printf("size lane %zu\\nsize record %zu\\n", sizeof(ring_lane), sizeof(ring_gil_record));', "return 0; }"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines))
    compiler = shutil.which("gcc") or shutil.which("cc")
    subprocess.run([compiler, "-std=c11", "-I", str(ROOT / "engine" / "probe"), str(source), "-o", str(tmp_path / "layout")],
                   check=True)
    seen: dict[str, dict[str, int]] = {}
    for line in subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.splitlines():
        what, name, value = line.split()
        seen.setdefault(what, {})[name] = int(value)
    assert seen["lane"] == {f: LANE[f] for f in RING_LANE} and seen["record"] == GIL_RECORD and seen["kind"] == GIL_KINDS
    assert seen["size"] == {"lane": layout.LANE_STRIDE, "record": 32}


def java_constants(prefix: str) -> dict[str, int]:
    return {name: int(value) for name, value in
            re.findall(rf"static final (?:int|long) {prefix}(\w+) = (\d+);", PAUSE_RING_JAVA)}


def test_java_pause_writer_follows_the_spec():
    header = java_constants("OFF_")
    assert header, "PauseRing.java spells no header offsets"
    spec = {field.upper(): offset for field, offset in HEADER.items()}
    assert {name: spec.get(name) for name in header} == header
    name_table = re.search(r"^\| (\d+)\.\.\d+ \| bytes \| name table", section("Header"), re.M)
    assert java_constants("NAME_TABLE_")["START"] == int(name_table.group(1))
    assert {name.lower(): offset for name, offset in java_constants("LANE_OFF_").items()} == \
        {field: LANE[field] for field in ("head", "tail", "dropped")}
    record = {name.lower(): offset for name, offset in java_constants("REC_OFF_").items()}
    assert record == {field: PAUSE_RECORD[field] for field in record} and set(record) == set(PAUSE_RECORD)
    codes = {name: int(value) for name, value in re.findall(r"static final int (\w+) = (\d+);", PAUSE_KINDS_JAVA)}
    kinds = dict(re.findall(r"static final int KIND_(\w+) = PauseKinds\.(\w+);", PAUSE_RING_JAVA))
    assert {name: codes[kind] for name, kind in kinds.items()} == \
        {name.upper().replace(" ", "_"): value for name, value in PAUSE_KINDS.items()}
    # the writer uses its names, not numbers: no literal offset is added to a record's position
    assert not re.search(r"\bat \+ \d", PAUSE_RING_JAVA)
