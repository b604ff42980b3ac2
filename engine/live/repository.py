"""A JVM's JFR disk repository as a live source (engine/live/sources.py): re-read with
`engine.ingest.jfr.read_pauses` (it reads an unfinished chunk up to its last flush) about once a
second, keeping the pauses not seen before; once the JVM has closed, its `recording.jfr` is read
one last time the same way."""
from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from engine.clock.packed import is_zstd
from engine.errors import TandemError
from engine.ingest.jfr import read_pauses
from engine.ingest.jfr_input import unzstd
from engine.live.jvm_source import JvmSource
from engine.session import (JVM_JSON, PACKED_CHUNK_SUFFIX, RECORDING, agent_error_line, jvm_recordings, packed_chunks,
                            process_alive, raw_chunks, read_json)


class RepositorySource(JvmSource):
    """Fallback: the JVM's JFR disk repository, re-read as it grows (then recording.jfr)."""

    how = "JFR repository (re-read)"

    def __init__(self, directory: Path):
        super().__init__(directory)
        self._stamps: dict[str, tuple[str, int, int]] = {}  # chunk name -> (its file now, size, mtime) when read
        self._seen_keys = np.zeros(0, np.int64)  # sorted hashes of the pauses taken: 8 bytes each
        self._offset_ns: int | None = None  # ticks -> CLOCK_MONOTONIC, locked at the first read
        self._final_read = False
        self._last_error: str | None = None
        # chunk -> safepoint ids it left unmatched (Begin there, End in the next chunk: JFR
        # splits the safepoint of a chunk rotation, e.g. JFRCheckpoint, across two chunks)
        self._split: dict[str, set[int]] = {}

    def _read(self, paths: list[Path]) -> pd.DataFrame | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unfinished chunks are expected here
            try:
                frame = read_pauses(paths)
            except TandemError as err:
                # Typically a chunk JFR has just started and not flushed yet, or one removed
                # while read (the JVM's exit, the keeper packing it): read it again later (where
                # it went); said only if it is still unreadable once the JVM is gone.
                self._last_error = str(err)
                return None
        runs = [run for source in frame.attrs.get("sources", []) for run in source.get("runs", [])]
        clock = runs[-1]["clock"] if runs else {}
        offset = clock.get("offset_ns") if clock.get("method") == "clock_sync" and clock.get("slope") is None else None
        if offset is not None:
            if self._offset_ns is None:
                self._offset_ns = int(offset)
            shift = self._offset_ns - int(offset)
            # Times on the locked alignment: one pause keeps the same times across re-reads.
            frame["start_ns"] = frame["start_ns"] + shift
            frame["end_ns"] = frame["end_ns"] + shift
            frame["clock_offset_ns"] = np.int64(self._offset_ns)
            self.clock_error_ns = abs(shift) + int(clock.get("error_ns") or 0)
        return frame

    def _new(self, frame: pd.DataFrame, final: bool = False) -> pd.DataFrame:
        if not final and "unmatched" in frame.columns:
            # A SafepointBegin whose End is not flushed yet: it comes back matched (with its
            # real end) in a later read, so it is not taken now.
            frame = frame[~frame["unmatched"].astype(bool)]
        keys = list(zip(frame["kind"].tolist(), frame["name"].fillna("").tolist(), frame["start_ns"].tolist(),
                        frame["end_ns"].tolist(), frame["safepoint_id"].fillna(-1).tolist(), frame["gc_id"].fillna(-1).tolist()))
        keys = np.array([hash(k) for k in keys], dtype=np.int64)
        at = np.searchsorted(self._seen_keys, keys)
        seen = (at < len(self._seen_keys)) & (self._seen_keys[np.minimum(at, max(len(self._seen_keys) - 1, 0))] == keys) \
            if len(self._seen_keys) else np.zeros(len(keys), bool)
        fresh = ~seen
        self._seen_keys = np.union1d(self._seen_keys, keys)
        new = frame[fresh].drop(columns=["pause_id"]).reset_index(drop=True)
        self._seen(new)
        return new

    def _note_split(self, chunk: str, frame: pd.DataFrame) -> None:
        unmatched = frame["unmatched"].astype(bool) & (frame["kind"].astype(str) == "safepoint") if len(frame) else []
        ids = set(frame.loc[unmatched, "safepoint_id"].dropna().astype(int).tolist()) if len(frame) else set()
        if ids:
            self._split[chunk] = ids
        else:
            self._split.pop(chunk, None)

    def _chunks(self) -> dict[str, Path]:
        """The JVM's chunks by name, wherever each is now: JFR's repository, the agent's links
        (.chunks/), or packed by the flight recorder's keeper, which moves a finished chunk
        away while it is followed (the raw file first: a packed chunk is the same, finished)."""
        packed = {p.name.removesuffix(PACKED_CHUNK_SUFFIX): p for p in packed_chunks(self.directory)}
        return dict(sorted((packed | raw_chunks(self.directory)).items()))

    def _join_split_chunks(self, chunks: dict[str, Path]) -> list[pd.DataFrame]:
        """The safepoints a chunk left unmatched, read whole from that chunk and the next one
        (a JFR file may hold several chunks, and jdk.jfr pairs a Begin and End across them), as
        soon as the next chunk has their End: not at the final read, which for a long session
        is later than the GIL rows the core keeps for a late pause."""
        frames = []
        names = sorted(self._stamps)
        for name, following in zip(names, names[1:]):
            ids = self._split.get(name)
            if not ids or name not in chunks or following not in chunks:
                continue
            with tempfile.TemporaryDirectory(prefix="tandem-live-") as tmp:
                joined = Path(tmp) / name
                try:
                    with open(joined, "wb") as out:
                        for part in (chunks[name], chunks[following]):
                            if is_zstd(part):
                                unzstd(part, Path(tmp) / "part")
                                part = Path(tmp) / "part"
                            with open(part, "rb") as src:
                                shutil.copyfileobj(src, out)
                    if (self.directory / JVM_JSON).exists():  # the JVM's pid etc., as for its chunks
                        shutil.copy(self.directory / JVM_JSON, Path(tmp) / JVM_JSON)
                except (OSError, TandemError):
                    continue  # removed meanwhile (clean exit: recording.jfr follows), or packed half-written: next time
                frame = self._read([joined])
            if frame is None:
                continue
            whole = frame[(frame["kind"].astype(str) == "safepoint") & ~frame["unmatched"].astype(bool)]
            found = set(whole["safepoint_id"].dropna().astype(int).tolist()) & ids
            if found:
                frame = frame.assign(source=str(chunks[name]))
                taken = (frame["kind"].astype(str) == "safepoint") & frame["safepoint_id"].isin(list(found)).fillna(False)
                frames.append(self._new(frame[taken.to_numpy(bool)]))
            if found == ids:
                del self._split[name]
            else:
                self._split[name] = ids - found
        return frames

    def poll(self) -> pd.DataFrame:
        gone = not process_alive(self.pid)
        state = read_json(self.directory / JVM_JSON).get("state")
        recording = self.directory / RECORDING
        frames = []
        if (state == "closed" or gone) and recording.exists() and recording.stat().st_size > 0:
            # What offline reads (links left beside recording.jfr too: an exit cut short), less
            # the packed chunks, followed already.
            frame = self._read(jvm_recordings(self.directory, packed=False)[0])
            if frame is not None:
                frames.append(self._new(frame, final=True))
            self._final_read = True
        else:
            if gone:
                self._stamps.clear()  # the last read of every chunk keeps its unmatched safepoints
            chunks = self._chunks()
            for name, chunk in chunks.items():
                try:
                    st = chunk.stat()
                except OSError:
                    continue  # JFR removed it (clean exit: recording.jfr follows), or the keeper packed it: next time
                stamp = (str(chunk), st.st_size, st.st_mtime_ns)  # (a chunk packed meanwhile is read once more, finished)
                if self._stamps.get(name) == stamp or st.st_size == 0:
                    continue
                frame = self._read([chunk])
                if frame is not None:
                    self._stamps[name] = stamp
                    if not gone:
                        self._note_split(name, frame)
                    frames.append(self._new(frame, final=gone))
            if not gone:
                frames.extend(self._join_split_chunks(chunks))
            if gone:
                self._final_read = True
                if not recording.exists():
                    self.problem = "exited without closing its recording (killed?): read its repository up to the last flush"
        if self._final_read:
            self.done = True
            if not recording.exists() and self._last_error and not self.pauses_seen:
                self.problem = self._last_error
        agent_error = agent_error_line(self.directory)
        if agent_error:
            self.problem = agent_error
            self.done = self.done or not frames
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
