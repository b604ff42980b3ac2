"""`tandem fleet analyze` and `tandem fleet summary`: many sessions into one dataset (docs/fleet.md)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

fleet_app = typer.Typer(help="Many sessions (hosts x days) into one Parquet dataset, analyzed on Ray, summarised with DuckDB.",
                        no_args_is_help=True)


@fleet_app.command("analyze")
def fleet_analyze(
    sources: List[str] = typer.Argument(..., help="Session directories, directories of sessions, or NODE:PATH "
                                                  "(a session on that Ray node's local disk)."),
    dataset: Path = typer.Option(..., "--dataset", help="The dataset root (docs/fleet.md); sessions already in it are replaced."),
    address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster (e.g. HEAD:6379); default: a "
                                                                  "local cluster on this machine."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="CPUs of the local cluster (default: all)."),
    retries: int = typer.Option(3, "--retries", min=0, help="Times a session is retried when its worker dies."),
    slack: str = typer.Option("0", "--slack", help="Also report near misses within this duration, e.g. 50ms."),
    fresh_workers: bool = typer.Option(False, "--fresh-workers", help="A new worker process (and JVM) for every "
                                       "session, instead of one per worker kept for its next sessions."),
) -> None:
    """Analyze every session into DATASET, one Ray task per session; report the ones that failed."""
    from rich.console import Console

    from engine.commands.analyze import parse_duration_ns
    from engine.fleet.run import run_fleet

    console = Console(stderr=True)
    run = run_fleet(sources, dataset, slack_ns=parse_duration_ns(slack), retries=retries, address=address,
                    workers=workers, fresh_workers=fresh_workers, console=console)
    landed = len(run.outcomes) - len(run.failed)
    for outcome in run.outcomes:
        for warning in outcome.warnings:
            console.print(f"tandem: warning: {outcome.source}: {warning}", markup=False, highlight=False)
    if run.failed:  # one line each, whole: a path and a reason are not to be cut by a table
        console.print(f"{len(run.failed)} of {len(run.outcomes)} sessions failed:", markup=False, highlight=False)
        for outcome in run.failed:
            console.print(f"  {outcome.source}: {outcome.error}", markup=False, highlight=False, soft_wrap=True)
    typer.echo(f"{landed} of {len(run.outcomes)} sessions in {dataset} ({run.seconds:.1f} s); "
               f"`tandem fleet summary {dataset}` summarises them")
    if run.failed:
        raise typer.Exit(1)


@fleet_app.command("summary")
def fleet_summary(
    root: Path = typer.Argument(..., help="The dataset root written by `tandem fleet analyze`."),
    since: Optional[str] = typer.Option(None, "--since", help="Only sessions from this day on (yyyy-mm-dd, UTC)."),
    host: Optional[str] = typer.Option(None, "--host", help="Only hosts matching this glob (e.g. 'web-*')."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Directory for summary*.parquet (default ROOT/_summary)."),
) -> None:
    """The summary table across hosts and days, and per host and per day (DuckDB over the dataset)."""
    from engine.fleet.summary import fleet_summary as summarise, print_fleet_summary

    result = summarise(root, since=since, host=host)
    out = out or root / "_summary"
    result.write(out)
    print_fleet_summary(result)
    typer.echo(f"results in {out}/: {', '.join(f'{name}.parquet' for name in result.tables())}")


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")
