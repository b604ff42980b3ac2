"""`tandem fleet summary`: the summary table of docs/results.md over a fleet dataset, with DuckDB.

DuckDB reads the hive-partitioned dataset in place (embedded, no server); --since and --host
become filters on the partition columns, so the files of other days and hosts are not opened.
Rates across sessions: hits_per_hour = pauses_hit / the summed span of the sessions selected
(every session of the group, whether or not it had a pause of that kind).
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from engine.errors import TandemError
from engine.fleet.run import require
from engine.report.summary import summary_rich_table
from engine.store import write_table


GROUPINGS = {"all": (), "host": ("host",), "date": ("date",)}


def table_source(root: Path, table: str) -> str:
    """A DuckDB table expression of one dataset table, host and date typed from the path.

    Columns are matched by name (a file of a newer tandem may carry more); no union_by_name,
    which reads every file's schema before the scan and doubled the time over 1 000 sessions."""
    pattern = str(Path(root) / table / "host=*" / "date=*" / "*.parquet").replace("'", "''")
    return (f"read_parquet('{pattern}', hive_partitioning = true, "
            f"hive_types = {{'host': VARCHAR, 'date': DATE}})")


def _filter(since: str | None, host: str | None) -> str:
    conditions = ["true"]
    if since:
        conditions.append(f"date >= DATE '{since}'")
    if host:
        conditions.append("host GLOB '{}'".format(host.replace("'", "''")))
    return " AND ".join(conditions)


def selection_sql(root: Path, since: str | None = None, host: str | None = None) -> list[str]:
    """Statements loading the selected sessions' rows (only the columns the summary reads) into
    temporary tables: the dataset's files are read once for every grouping."""
    where = _filter(since, host)
    return [
        f"""CREATE TEMP TABLE impact AS SELECT session_id, host, date, pause_id, kind, name, overlap_ns, hit_python,
                   near_misses, amplified FROM {table_source(root, 'pause_impact')} WHERE {where}""",
        f"""CREATE TEMP TABLE overlap_rows AS SELECT session_id, host, date, pause_id, pid, tid
                   FROM {table_source(root, 'overlaps')} WHERE {where} AND NOT near_miss""",
        f"CREATE TEMP TABLE session_rows AS SELECT * FROM {table_source(root, 'sessions')} WHERE {where}",
    ]


def summary_sql(by: tuple[str, ...] = ()) -> str:
    """The summary per (by..., kind, name) over the tables of `selection_sql`."""
    keys = "".join(f"{k}, " for k in by)
    hours_join = f"JOIN hours USING ({', '.join(by)})" if by else "CROSS JOIN hours"
    return f"""
    WITH hours AS (SELECT {keys}sum(span_ns) / 3.6e12 AS hours FROM session_rows
                   {'GROUP BY ' + ', '.join(by) if by else ''}),
    affected AS (
        SELECT {''.join(f'i.{k}, ' for k in by)}i.kind, i.name, count(DISTINCT (o.session_id, o.pid, o.tid)) AS threads_affected
        FROM overlap_rows o JOIN impact i ON o.session_id = i.session_id AND o.pause_id = i.pause_id
        GROUP BY ALL),
    per_kind AS (
        SELECT {keys}kind, name,
               count(*) AS pauses,
               count(*) FILTER (WHERE hit_python) AS pauses_hit,
               avg(overlap_ns / 1e6) FILTER (WHERE hit_python) AS mean_overlap_ms,
               quantile_cont(overlap_ns / 1e6, 0.5) FILTER (WHERE hit_python) AS p50_overlap_ms,
               quantile_cont(overlap_ns / 1e6, 0.99) FILTER (WHERE hit_python) AS p99_overlap_ms,
               max(overlap_ns / 1e6) FILTER (WHERE hit_python) AS max_overlap_ms,
               coalesce(sum(overlap_ns / 1e6) FILTER (WHERE hit_python), 0) AS total_overlap_ms,
               count(*) FILTER (WHERE near_misses > 0 AND NOT hit_python) AS pauses_near_miss,
               count(*) FILTER (WHERE amplified) AS pauses_amplified
        FROM impact GROUP BY ALL)
    SELECT {keys}kind, name, pauses, pauses_hit,
           CASE WHEN hours > 0 THEN pauses_hit / hours END AS hits_per_hour,
           mean_overlap_ms, p50_overlap_ms, p99_overlap_ms, max_overlap_ms, total_overlap_ms,
           coalesce(threads_affected, 0) AS threads_affected, pauses_near_miss, pauses_amplified
    FROM per_kind {hours_join} LEFT JOIN affected USING ({keys}kind, name)
    ORDER BY {keys}pauses_hit DESC, total_overlap_ms DESC, kind, name
    """


@dataclass
class FleetSummary:
    summary: pd.DataFrame  # docs/results.md's summary over every selected session
    by_host: pd.DataFrame  # the same per host (column `host` first)
    by_date: pd.DataFrame  # the same per day (column `date` first)
    sessions: pd.DataFrame  # the `sessions` rows selected
    header: dict

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"summary": self.summary, "summary_by_host": self.by_host, "summary_by_date": self.by_date}

    def write(self, out: str | os.PathLike) -> list[Path]:
        out = Path(out)
        return [write_table(frame, out / f"{name}.parquet", {"table": name, "fleet": self.header})
                for name, frame in self.tables().items()]


def fleet_summary(root: str | os.PathLike, since: str | None = None, host: str | None = None) -> FleetSummary:
    duckdb = require("duckdb")
    root = Path(root)
    if since:
        try:
            pd.Timestamp(since)
        except ValueError:
            raise TandemError(f"--since {since!r}: not a date (yyyy-mm-dd)") from None
    if not any((root / "sessions").glob("host=*/date=*/*.parquet")):
        raise TandemError(f"{root}: no sessions in this dataset (write some with `tandem fleet analyze --dataset {root}`)")
    hosts = sorted(p.name.partition("=")[2] for p in (root / "sessions").glob("host=*"))
    if host and not any(fnmatch.fnmatchcase(h, host) for h in hosts):
        raise TandemError(f"--host {host!r}: matches none of the dataset's hosts ({', '.join(hosts)})")
    connection = duckdb.connect()
    try:
        for statement in selection_sql(root, since, host):
            connection.execute(statement)
        sessions = connection.sql("SELECT * FROM session_rows ORDER BY host, date, session_id").df()
        if sessions.empty:
            raise TandemError(f"{root}: no session matches --since {since} --host {host}")
        frames = {name: _typed(connection.sql(summary_sql(by)).df()) for name, by in GROUPINGS.items()}
    except duckdb.Error as err:
        raise TandemError(f"{root}: cannot read the dataset: {str(err).splitlines()[0]}") from None
    finally:
        connection.close()
    header = {
        "root": str(root), "since": since, "host": host,
        "sessions": len(sessions), "hosts": sorted(sessions["host"].unique()),
        "dates": sorted(str(d)[:10] for d in sessions["date"].unique()),
        "span_ns": int(sessions["span_ns"].sum()), "pauses": int(sessions["pauses"].sum()),
        "gil_intervals": int(sessions["gil_intervals"].sum()), "dropped_events": int(sessions["dropped_events"].sum()),
    }
    for frame in frames.values():
        if "date" in frame:
            frame["date"] = frame["date"].astype(str).str[:10].astype("string")
    return FleetSummary(frames["all"], frames["host"], frames["date"], sessions, header)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """DuckDB's result with the dtypes of the per-session summary table."""
    import numpy as np

    ints = ("pauses", "pauses_hit", "threads_affected", "pauses_near_miss", "pauses_amplified")
    floats = ("hits_per_hour", "mean_overlap_ms", "p50_overlap_ms", "p99_overlap_ms", "max_overlap_ms", "total_overlap_ms")
    types = {c: np.int64 for c in ints} | {c: np.float64 for c in floats} | {"kind": "string", "name": "string"}
    if "host" in frame:
        types["host"] = "string"
    return frame.astype(types)


def header_line(header: dict) -> str:
    dates = header["dates"]
    days = f"{dates[0]} .. {dates[-1]}" if len(dates) > 1 else dates[0]
    return (f"{header['sessions']} sessions on {len(header['hosts'])} hosts over {len(dates)} days ({days}); "
            f"recorded {header['span_ns'] / 3.6e12:.3g} h; {header['pauses']} pauses, {header['gil_intervals']} GIL "
            f"intervals; dropped events {header['dropped_events']}")


def per_group_table(frame: pd.DataFrame, sessions: pd.DataFrame, key: str, title: str):
    """One row per host (or day): sessions, recorded hours, pauses, hits, hits/h, the kind that hit most."""
    from rich import box
    from rich.table import Table

    sessions = sessions.assign(date=sessions["date"].astype(str).str[:10])
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for label, justify in ((key, "left"), ("sessions", "right"), ("hours", "right"), ("pauses", "right"),
                           ("hit", "right"), ("hits/h", "right"), ("most hits", "left")):
        table.add_column(label, justify=justify)
    for group, rows in frame.groupby(key, sort=True):
        mine = sessions[sessions[key].astype(str) == str(group)]
        hours = mine["span_ns"].sum() / 3.6e12
        hits = int(rows["pauses_hit"].sum())
        top = rows.iloc[0]
        table.add_row(str(group), str(len(mine)), f"{hours:.3g}", str(int(rows["pauses"].sum())), str(hits),
                      f"{hits / hours:.3g}" if hours > 0 else "-", f"{top['kind']}: {top['name']}" if hits else "-")
    return table


def print_fleet_summary(result: FleetSummary, console=None) -> None:
    from rich.console import Console


    console = console or Console()
    console.print(header_line(result.header), markup=False, highlight=False)
    console.print(summary_rich_table(result.summary, {}))
    console.print(per_group_table(result.by_host, result.sessions, "host", "per host"))
    console.print(per_group_table(result.by_date, result.sessions, "date", "per day"))
