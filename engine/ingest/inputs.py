"""Turning what a user points `tandem analyze` at into the two input tables (or the GIL side
as a stream of blocks, `streamable_gil`); new input kinds are added here.

The inputs, any mix of which can be given: a session directory (`tandem record -o`), JFR
recordings, GIL probe files (events files, rings, `py-<pid>` directories), and Parquet
tables of either side brought from elsewhere (docs/results.md, "Input tables").
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import pandas as pd

from engine.clock.facts import MONOTONIC, NOT_RECORDED, clock_parts
from engine.correlate.schema import empty_frame
from engine.errors import TandemError
from engine.ingest.gil import _events_files, read_gil
from engine.ingest.gil_events import EventsGil
from engine.ingest.gil_merged import MergedGil
from engine.ingest.gil_parquet import ParquetGil, gil_parts_attrs
from engine.ingest.jfr import read_pauses
from engine.ingest.jfr_input import looks_like_jfr
from engine.session import Session
from engine.store import read_table


def read_input_table(path: str | os.PathLike) -> pd.DataFrame:
    """A pauses or GIL table from a Parquet file; its tandem metadata (if any) becomes df.attrs.
    Columns are checked later, against the table's role (engine.correlate.tables), naming this path."""
    path = Path(path)
    if not path.is_file():
        raise TandemError(f"{path}: no such file")
    return read_table(path)


def pauses_from(session: Path | None = None, jfr: Iterable[Path] = (), tables: Iterable[Path] = ()) -> tuple[pd.DataFrame, str]:
    """The pauses table of a session's JVMs, of JFR recordings, or of Parquet tables (a JFR
    recording given as a table is read as one)."""
    recordings, parquet = list(jfr), []
    for table in map(Path, tables):  # (each file's first bytes read once)
        (recordings if looks_like_jfr(table) else parquet).append(table)
    names = [str(p) for p in recordings]
    if session is not None:
        for source in Session.open(session).jvms:
            recordings.extend(source.recordings)
        names.append(f"{session} (JVMs)")
    frames, frame_names = [], []
    if recordings:
        frames.append(read_pauses(recordings))
        frame_names.append(", ".join(names))
    for table in parquet:
        frames.append(read_input_table(table))
        names.append(str(table))
        frame_names.append(str(table))
    if not frames:
        if session is None:
            raise TandemError("no pauses given (a SESSION, --jfr or --pauses)")
        return unrecorded_side("pauses"), f"{session} (no JVM recorded)"
    return _concat_pauses(frames, frame_names), ", ".join(names)


def gil_from(session: Path | None = None, paths: Iterable[Path] = ()) -> tuple[pd.DataFrame, str]:
    """The gil table of a session's interpreters, of probe files, or of Parquet tables."""
    frames, names = [], []
    if session is not None and not paths and not Session.open(session).pythons:
        return unrecorded_side("gil"), f"{session} (no CPython recorded)"
    if session is not None:
        frames.append(read_gil(session))
        names.append(f"{session} (Python)")
    for path in paths:
        frames.append(read_input_table(path) if Path(path).suffix == ".parquet" else read_gil(path))
        names.append(str(path))
    if not frames:
        raise TandemError(f"{session}: no GIL events in this session" if session else "no GIL intervals given (a SESSION or --gil)")
    return _concat(frames, names), ", ".join(names)


def unrecorded_side(name: str) -> pd.DataFrame:
    """The empty pauses or gil table of a side the session did not record."""
    table = empty_frame(name)
    table.attrs = {"clock": {"domain": MONOTONIC, "method": NOT_RECORDED, "error_ns": 0}}
    return table


def _concat(frames: list[pd.DataFrame], names: list[str]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    out.attrs = gil_parts_attrs([f.attrs for f in frames], names)
    return out


def _concat_pauses(frames: list[pd.DataFrame], names: list[str]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    sources = [s for f in frames for s in f.attrs.get("sources") or []]  # (each JVM run's facts)
    attrs = {**frames[0].attrs, **({"sources": sources} if sources else {}),
             "clock_parts": clock_parts([f.attrs for f in frames], names)}
    offset = 0
    renumbered = []
    for frame in frames:  # pause_id must stay unique across the parts
        frame = frame.copy()
        frame["pause_id"] = frame["pause_id"].astype("int64") + offset
        offset = int(frame["pause_id"].max()) + 1 if len(frame) else offset
        renumbered.append(frame)
    out = pd.concat(renumbered, ignore_index=True)
    out.attrs = dict(attrs)
    return out


def streamable_gil(session: Path | None, gil: list[Path], copy: bool = False):
    """The GIL side as a stream: Parquet tables (read as one: their columns' union), events files
    (a session's, or given as paths), or both (MergedGil, always copied); None for what is read
    whole (rings). COPY: the results hold a gil.parquet of their own instead of naming these files."""
    if any(p.suffix == ".ring" for p in gil):
        return None
    tables = [p for p in gil if p.suffix == ".parquet"]
    probe_files = [p for p in gil if p.suffix != ".parquet"] or ([session] if session is not None and not gil else [])
    sources = [ParquetGil(tables, copy=copy)] if tables else []
    try:
        files = [f for p in probe_files for f in _events_files(Path(p))]
    except TandemError:  # (reported by the whole-table path, which reads the same inputs)
        return None
    if files:
        sources.append(EventsGil(files, copy=copy))
    if len(sources) > 1:  # (the kind named first, first: the facts' parts in about the order given)
        return MergedGil(sources[::-1] if gil[0].suffix != ".parquet" else sources, ", ".join(str(p) for p in gil))
    return sources[0] if sources else None
