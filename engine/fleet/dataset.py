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

from engine.session import Session, SessionIdentity

SESSIONS_TABLE = "sessions"
# What of session.json rides in each file's metadata: facts about the run, never the command
# line or environment it holds (docs/session.md, "Who can read a session").
SESSION_FACTS = ("kind", "hostname", "start_monotonic_ns", "start_wall_ns", "end_monotonic_ns", "end_wall_ns",
                 "exit_code")


def dataset_tables() -> tuple[str, ...]:
    from engine.correlate.schema import RESULT_TABLES

    return (*RESULT_TABLES, SESSIONS_TABLE)


def table_path(root: Path, table: str, identity: SessionIdentity) -> Path:
    return Path(root) / table / f"host={identity.host}" / f"date={identity.date}" / f"{identity.session_id}.parquet"


def sessions_row(analysis, identity: SessionIdentity, source: Path) -> pd.DataFrame:
    header = analysis.header
    return pd.DataFrame([{
        "source": str(source),
        "boot_id": identity.boot_id,
        "start_wall_ns": identity.start_wall_ns,
        "span_start_ns": int(header.get("span_start_ns", 0)),
        "span_end_ns": int(header.get("span_end_ns", 0)),
        "span_ns": int(header.get("span_ns", 0)),
        "pauses": int(header.get("pauses", 0)),
        "gil_intervals": int(header.get("gil_intervals", 0)),
        "dropped_events": int(header.get("dropped_events", 0)),
        "python_processes": len(header.get("python_pids", [])),
        "jvm_processes": len(header.get("jvm_pids", [])),
    }]).astype({"source": "string", "boot_id": "string"})


def write_session(analysis, root: str | os.PathLike, session: Session) -> dict[str, Path]:
    """Writes one analyzed session into the dataset; returns the file of each table.

    Every table is first written beside its final name, then all are renamed into place:
    a failure leaves the session's previous files whole, and a reader sees each file old or
    new, never half written."""
    from engine.store import write_table

    root = Path(root)
    identity = session.identity()
    meta_session = {**{k: session.description[k] for k in SESSION_FACTS if k in session.description},
                    **identity.as_metadata()}
    tables = {**analysis.tables(), SESSIONS_TABLE: sessions_row(analysis, identity, session.path)}
    staged: list[tuple[Path, Path]] = []
    try:
        for name, frame in tables.items():
            final = table_path(root, name, identity)
            _private_dirs(final.parent)
            frame = frame.copy(deep=False)
            frame.insert(0, "session_id", pd.Series([identity.session_id] * len(frame), index=frame.index, dtype="string"))
            tmp = write_table(frame, final.with_name(f".{final.name}.staged"),
                              {"table": name, "analysis": analysis.header, "session": meta_session})
            staged.append((tmp, final))
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return {name: final for name, (_, final) in zip(tables, staged)}


def analyze_into(session_path: str | os.PathLike, root: str | os.PathLike, *, slack_ns: int = 0):
    """`tandem analyze SESSION --dataset ROOT`: analyze one session and write it into the dataset."""
    from engine.analysis import analyze_session

    session = Session.open(session_path)
    analysis = analyze_session(session.path, slack_ns=slack_ns)
    return analysis, session.identity(), write_session(analysis, root, session)


def _private_dirs(directory: Path) -> None:
    """Dataset directories are created 0700, like session directories (no planted link, no
    other user's directory): results name hosts, pids and thread names."""
    from engine.probe.private import private_directory

    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        private_directory(path)
