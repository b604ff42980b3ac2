"""The fleet dataset (docs/fleet.md): ROOT/<table>/host=<host>/date=<yyyy-mm-dd>/<session_id>.parquet.

Every result table of docs/results.md, plus `sessions` (one row per session: its span and
counts, the denominator of rates across sessions). Each file holds one session's rows with a
`session_id` column; host and date are hive partition columns, in the path only. Each file's
Parquet metadata `tandem` is `{"table", "analysis": <header>, "session": <identity, facts of session.json>}`.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from engine.analysis import analyze_to
from engine.correlate.schema import RESULT_TABLES
from engine.facts import AnalysisFacts
from engine.probe.private import private_directory
from engine.results import Results
from engine.session import Session, SessionIdentity
from engine.store import TableWriter, write_table


SESSIONS_TABLE = "sessions"
# What of session.json rides in each file's metadata: facts about the run, never the command
# line or environment it holds (docs/session.md, "Who can read a session").
SESSION_FACTS = ("kind", "hostname", "start_monotonic_ns", "start_wall_ns", "end_monotonic_ns", "end_wall_ns",
                 "exit_code")


def dataset_tables() -> tuple[str, ...]:
    return (*RESULT_TABLES, SESSIONS_TABLE)


def table_path(root: Path, table: str, identity: SessionIdentity) -> Path:
    return Path(root) / table / f"host={identity.host}" / f"date={identity.date}" / f"{identity.session_id}.parquet"


def sessions_row(header: dict, identity: SessionIdentity, source: Path) -> pd.DataFrame:
    facts = AnalysisFacts.from_metadata(header)
    return pd.DataFrame([{
        "source": str(source),
        "boot_id": identity.boot_id,
        "start_wall_ns": identity.start_wall_ns,
        "span_start_ns": int(facts.span_start_ns),
        "span_end_ns": int(facts.span_end_ns),
        "span_ns": int(facts.span_ns),
        "pauses": int(facts.pauses),
        "gil_intervals": int(facts.gil_intervals),
        "dropped_events": int(facts.losses.dropped_events),
        "python_processes": len(facts.python_pids),
        "jvm_processes": len(facts.jvm_pids),
    }]).astype({"source": "string", "boot_id": "string"})


def write_session(results: str | os.PathLike, header: dict, root: str | os.PathLike, session: Session) -> dict[str, Path]:
    """Writes one session's result directory (what `tandem analyze -o` writes) into the dataset;
    returns the file of each table.

    Tables are copied a row group at a time, with the session_id column put first, so that a
    session of any length goes in bounded memory. Every table is first written beside its final
    name, then all are renamed into place: a failure leaves the session's previous files whole,
    and a reader sees each file old or new, never half written."""
    import pyarrow as pa
    import pyarrow.parquet as pq


    results, root = Path(results), Path(root)
    identity = session.identity()
    meta = {"analysis": header,
            "session": {**{k: session.description[k] for k in SESSION_FACTS if k in session.description},
                        **identity.as_metadata()}}
    session_id = pa.scalar(identity.session_id, pa.string())
    stored_tables = Results(results)
    staged: list[tuple[str, Path, Path]] = []
    writers: list[TableWriter] = []
    try:
        for name in dataset_tables():
            final = table_path(root, name, identity)
            _private_dirs(final.parent)
            staging = final.with_name(f".{final.name}.staged")
            if name == SESSIONS_TABLE:
                row = sessions_row(header, identity, session.path)
                row.insert(0, "session_id", pd.Series([identity.session_id], dtype="string"))
                staged.append((name, write_table(row, staging, {"table": name, **meta}), final))
                continue
            stored = stored_tables.stored(name)
            if not stored:  # (gil.parquet of results that name their GIL files instead)
                continue
            with pq.ParquetFile(stored[0]) as file:
                writer = TableWriter(staging, pa.schema([pa.field("session_id", pa.string()), *file.schema_arrow]))
                writers.append(writer)
                for batch in file.iter_batches():
                    table = pa.Table.from_batches([batch]).replace_schema_metadata(None)
                    writer.write(table.add_column(0, "session_id", pa.repeat(session_id, batch.num_rows)))
            staged.append((name, writer.close({"table": name, **meta}), final))
            writers.remove(writer)
        for _, tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for writer in writers:
            writer.abort()
        for _, tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return {name: final for name, _, final in staged}


def analyze_into(session_path: str | os.PathLike, root: str | os.PathLike, *, slack_ns: int = 0):
    """`tandem analyze SESSION --dataset ROOT`: analyze one session, streamed as `tandem analyze
    -o` does (engine.analysis.analyze_to), into a private work directory under ROOT, then write
    it into the dataset. Returns the analysis (summary, header, paths), the session's identity,
    and the dataset file of each table."""
    import shutil


    session = Session.open(session_path)
    identity = session.identity()
    work = Path(root) / ".work" / f"{identity.session_id}.{os.getpid()}"
    _private_dirs(work)
    try:
        analysis = analyze_to(work, session=session.path, slack_ns=slack_ns)  # (gil.parquet copied: a dataset holds its rows)
        return analysis, identity, write_session(work, analysis.header, root, session)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        try:
            work.parent.rmdir()  # unless another session's analysis is using it
        except OSError:
            pass


def _private_dirs(directory: Path) -> None:
    """Dataset directories are created 0700, like session directories (no planted link, no
    other user's directory): results name hosts, pids and thread names."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        private_directory(path)
