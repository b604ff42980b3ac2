"""`tandem export perfetto RESULTS -o trace.json`: the analysis as a timeline for ui.perfetto.dev."""
from __future__ import annotations

from pathlib import Path

import typer

export_app = typer.Typer(help="Export analysis results to other tools.", no_args_is_help=True)


@export_app.command("perfetto")
def perfetto(
    results: Path = typer.Argument(..., help="the -o directory of `tandem analyze`"),
    output: Path = typer.Option(Path("trace.json"), "-o", "--output", help="trace file to write (Chrome trace-event JSON)"),
) -> None:
    """JVM pauses and every Python thread's GIL state on one timeline (open it in ui.perfetto.dev)."""
    from engine.report.perfetto import export_perfetto

    path = export_perfetto(results, output)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): open it at https://ui.perfetto.dev (Open trace file)")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
