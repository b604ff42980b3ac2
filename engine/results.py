"""One reader for every layout of results tandem writes (docs/results.md):

    analysis  `tandem analyze -o OUT`: OUT/<table>.parquet. gil.parquet may be absent: a
              streamed analysis names the GIL files it read (summary metadata `gil_table`).
    live      `tandem live`: OUT/part-NNNNNN/<table>.parquet; a part is complete once its
              _done.json is written. Its summary is the rolling one of the last part.
    dataset   a fleet dataset: ROOT/<table>/host=*/date=*/<session_id>.parquet, each file one
              session's rows with a session_id column (docs/fleet.md).

Perfetto export, the notebook (`engine.analysis.load_results`), the fleet and `tandem live`'s
readers all go through `Results`: a new layout is one more branch of `files`.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from engine.correlate.schema import RESULT_TABLES, empty_frame
from engine.correlate.tables import check_gil
from engine.errors import TandemError
from engine.facts import AnalysisFacts
from engine.ingest.gil_events import EventsGil
from engine.ingest.inputs import gil_from
from engine.store import not_parquet, read_metadata, read_table


ANALYSIS, LIVE, DATASET = "analysis", "live", "dataset"
BATCH_ROWS = 1 << 16


class Results:
    def __init__(self, path: str | os.PathLike, *, complete_only: bool = False):
        """complete_only: of a live directory, only the parts whose _done.json is written."""
        self.path = Path(path)
        self.complete_only = complete_only
        if (self.path / "summary.parquet").exists() or (self.path / "pauses.parquet").exists():
            self.layout = ANALYSIS
        elif any(self.path.glob("part-*")):
            self.layout = LIVE
        elif any(self.path.glob("sessions/host=*/date=*/*.parquet")):
            self.layout = DATASET
        else:
            raise TandemError(f"{self.path / 'pauses.parquet'}: missing; expected the -o directory of `tandem analyze`, "
                              "the output directory of `tandem live`, or a fleet dataset")

    def _parts(self) -> list[Path]:
        parts = sorted(p for p in self.path.glob("part-*") if p.is_dir())
        return [p for p in parts if (p / "_done.json").exists()] if self.complete_only else parts

    def stored(self, table: str) -> list[Path]:
        """The Parquet files of TABLE in this directory ([] when it has none)."""
        if self.layout == ANALYSIS:
            path = self.path / f"{table}.parquet"
            return [path] if path.exists() else []
        if self.layout == LIVE:
            files = [p / f"{table}.parquet" for p in self._parts()]
            files = [p for p in files if p.exists()]
            return files[-1:] if table == "summary" else files
        return sorted(self.path.glob(f"{table}/host=*/date=*/*.parquet"))

    def named_gil(self) -> list[Path]:
        """The GIL files a streamed analysis names instead of a gil.parquet of its own."""
        if self.layout != ANALYSIS or (self.path / "gil.parquet").exists() or not (self.path / "summary.parquet").exists():
            return []

        named = [Path(p) for p in read_metadata(self.path / "summary.parquet").get("analysis", {}).get("gil_table") or []]
        missing = [p for p in named if not p.exists()]
        if missing:
            raise TandemError(f"{missing[0]}: missing; the GIL intervals of the results in {self.path}")
        return named

    def files(self, table: str) -> list[Path]:
        """Every file holding TABLE's rows: stored here, or (gil) the files a streamed analysis
        names, which may be a probe's events files."""
        return self.stored(table) or (self.named_gil() if table == "gil" else [])

    def require(self, table: str) -> list[Path]:
        files = self.files(table)
        if not files:
            raise TandemError(f"{self.path / (table + '.parquet')}: missing; expected the -o directory of `tandem analyze` "
                              "or the output directory of `tandem live`")
        return files

    def header(self) -> dict:
        """The analysis header (docs/results.md, "Metadata") of the summary; {} where there is none."""
        files = self.stored("summary") or self.stored("overlaps")
        return read_metadata(files[-1]).get("analysis", {}) if files else {}

    def facts(self) -> AnalysisFacts:
        """The header as typed facts (engine.facts)."""
        return AnalysisFacts.from_metadata(self.header())

    def batches(self, table: str, columns: tuple[str, ...] | None = None) -> Iterator:
        """TABLE's rows as Arrow record batches, file after file, with the COLUMNS each file has."""
        import pyarrow.parquet as pq

        for path in self.files(table):
            if path.suffix != ".parquet":  # a probe's events file named by a streamed analysis

                for block in EventsGil([path]).tables():
                    names = block.column_names if columns is None else [c for c in columns if c in block.column_names]
                    yield from block.select(names).to_batches()
                continue
            try:
                handle = pq.ParquetFile(path)
            except (OSError, ValueError) as err:
                raise not_parquet(path, err) from None
            names = None if columns is None else [c for c in columns if c in handle.schema_arrow.names]
            yield from handle.iter_batches(batch_size=BATCH_ROWS, columns=names)

    def rows(self, table: str) -> int:
        """TABLE's row count from the files' footers (0 for files that are not Parquet)."""
        import pyarrow.parquet as pq

        total = 0
        for path in self.files(table):
            try:
                total += pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError):
                pass
        return total

    def table(self, table: str) -> pd.DataFrame:
        """TABLE's rows in one DataFrame (the result table's empty frame when there are none)."""
        named = self.named_gil() if table == "gil" and not self.stored("gil") else []
        if named:
            return check_gil(gil_from(paths=named)[0], ", ".join(map(str, named)))[0]
        frames = [read_table(p) for p in self.stored(table)]
        rows = [f for f in frames if len(f)]
        if len(rows) > 1:
            return pd.concat(rows, ignore_index=True)
        return (rows or frames)[0] if frames else _empty(table)


def _empty(table: str) -> pd.DataFrame:
    return empty_frame(table) if table in RESULT_TABLES else pd.DataFrame()


def worst_window(pause_impact: pd.DataFrame, span: tuple[int, int], margin: float = 3.0) -> tuple[int, int]:
    """[start_ns, end_ns) around the pause that overlapped Python longest (else the longest
    pause), padded by MARGIN times its duration on each side (at least 5 ms); SPAN when there
    is no pause."""
    if pause_impact.empty:
        return span
    key = "overlap_ns" if int(pause_impact["overlap_ns"].max()) > 0 else "duration_ns"
    worst = pause_impact.loc[pause_impact[key].idxmax()]
    pad = max(int(margin * int(worst["duration_ns"])), 5_000_000)
    return int(worst["start_ns"]) - pad, int(worst["end_ns"]) + pad
