"""The GIL probe's code table (docs/ring.md, "Code table") and the code of each release.

A DROP record's `aux` names the Python code the thread was running when it gave the GIL
up: low 32 bits a code id (below FIRST_ID: why there is none), high 32 bits the
instruction offset in code units. `read_code_table` reads the table file written beside
the events; `resolve` turns aux values into (function, file, line).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import TandemError

MAGIC = b"TNDMCODE"
HEADER = struct.Struct("<8sIIQQII24x")   # magic, version, header_size, capacity, used, entries, python_hex
ENTRY = struct.Struct("<IIiIII")         # size, id, firstlineno, qualname_len, filename_len, linetable_len

NOT_RECORDED, NO_FRAME, UNKNOWN, FIRST_ID = 0, 1, 2, 3
# The `function` value of a release without a code of its own (docs/results.md).
NO_FRAME_NAME = "<no Python frame>"
UNKNOWN_NAME = "<unknown>"


@dataclass(frozen=True)
class CodeEntry:
    qualname: str
    filename: str
    firstlineno: int
    linetable: bytes


def read_code_table(path: Path) -> dict[int, CodeEntry]:
    """id -> entry of a code table file; {} when the file does not exist (a recording made
    before the probe named code, or by the sampling backend). Entries are read up to the
    header's committed size, so a table of a killed process reads whole."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if len(data) < HEADER.size:
        raise TandemError(f"{path}: code table shorter than its header ({len(data)} bytes)")
    magic, version, header_size, _capacity, used, _entries, _python = HEADER.unpack_from(data)
    if magic != MAGIC or version != 1 or header_size != HEADER.size:
        raise TandemError(f"{path}: not a tandem code table (magic {magic!r}, version {version})")
    end = min(len(data), header_size + used)
    table, at = {}, header_size
    while at + ENTRY.size <= end:
        size, code_id, firstlineno, qlen, flen, llen = ENTRY.unpack_from(data, at)
        body = at + ENTRY.size
        if size < ENTRY.size or body + qlen + flen + llen > at + size or at + size > end:
            raise TandemError(f"{path}: code table entry at byte {at} is damaged (size {size})")
        qualname = data[body:body + qlen].decode("utf-8", "surrogatepass")
        filename = data[body + qlen:body + qlen + flen].decode("utf-8", "surrogatepass")
        table[code_id] = CodeEntry(qualname, filename, firstlineno, data[body + qlen + flen:body + qlen + flen + llen])
        at += size
    return table


def _varint(table: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = table[i]
        i += 1
        value |= (b & 0x3F) << shift
        shift += 6
        if not b & 0x40:
            return value, i


def line_of(entry: CodeEntry, lasti: int) -> int | None:
    """The line of instruction LASTI (code units) by the code's location table: the format
    of CPython 3.11-3.13 (Objects/locations.md; PyCode_Addr2Line(code, lasti * 2))."""
    table, line, i, unit = entry.linetable, entry.firstlineno, 0, 0
    while i < len(table):
        first = table[i]
        i += 1
        code, length = (first >> 3) & 0x0F, (first & 0x07) + 1
        found = None
        if code == 15:                     # no location
            found = None
        elif code == 14:                   # long form: line delta, end line, columns
            delta, i = _varint(table, i)
            line += -(delta >> 1) if delta & 1 else delta >> 1
            for _ in range(3):
                _, i = _varint(table, i)
            found = line
        elif code == 13:                   # no column: line delta
            delta, i = _varint(table, i)
            line += -(delta >> 1) if delta & 1 else delta >> 1
            found = line
        elif code >= 10:                   # one-line form: delta code - 10, two column bytes
            line += code - 10
            i += 2
            found = line
        else:                              # short form: same line, one column byte
            i += 1
            found = line
        if unit <= lasti < unit + length:
            return found
        unit += length
    return None


def resolve(aux: np.ndarray, table: dict[int, CodeEntry], recorded: bool) -> pd.DataFrame:
    """function, file, line for each aux value. RECORDED: the recording named code (a code
    table exists); otherwise every row is missing."""
    aux = np.asarray(aux, dtype=np.uint64)
    n = len(aux)
    if not (recorded and n):
        return pd.DataFrame({"function": pd.array([pd.NA] * n, dtype="string"),
                             "file": pd.array([pd.NA] * n, dtype="string"), "line": pd.array([pd.NA] * n, dtype="Int64")})
    uniques, inverse = np.unique(aux, return_inverse=True)
    u_function, u_file, u_line = [], [], []
    for value in uniques.tolist():
        code_id, lasti = value & 0xFFFFFFFF, value >> 32
        entry = table.get(code_id) if code_id >= FIRST_ID else None
        if entry is not None:
            u_function.append(entry.qualname)
            u_file.append(entry.filename)
            u_line.append(line_of(entry, lasti))
        else:
            u_function.append(NO_FRAME_NAME if code_id == NO_FRAME else UNKNOWN_NAME if code_id != NOT_RECORDED else None)
            u_file.append(None)
            u_line.append(None)
    function = pd.array(np.array(u_function, dtype=object)[inverse], dtype="string")
    file = pd.array(np.array(u_file, dtype=object)[inverse], dtype="string")
    line = pd.array(np.array(u_line, dtype=object)[inverse], dtype="Int64")
    return pd.DataFrame({"function": function, "file": file, "line": line})
