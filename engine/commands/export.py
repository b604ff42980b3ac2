"""`tandem export perfetto RESULTS -o trace.pftrace`: the analysis as a timeline for ui.perfetto.dev."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

export_app = typer.Typer(help="Export analysis results to other tools.", no_args_is_help=True)


@export_app.command("perfetto")
def perfetto(
    results: Path = typer.Argument(..., help="the -o directory of `tandem analyze`, or the parts directory of `tandem live`"),
    output: Path = typer.Option(Path("trace.pftrace"), "-o", "--output", help="trace file to write"),
    fmt: Optional[str] = typer.Option(None, "--format", help="proto (Perfetto's native TrackEvent protobuf) or json (Chrome "
                                      "trace-event JSON, the legacy format); default: json for a .json OUTPUT, else proto"),
) -> None:
    """JVM pauses and every Python thread's GIL state on one timeline (open it in ui.perfetto.dev)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from engine.errors import writing_into
    from engine.report.perfetto import export_perfetto

    bar = Progress(TextColumn("exporting"), BarColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    task = None

    def progress(done: int, total: int) -> None:  # shown once the inputs were found readable
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("export", total=total)
        bar.update(task, completed=done, total=total)

    try:
        with writing_into(output, "writing the trace"):
            path = export_perfetto(results, output, fmt, progress=progress)
    finally:
        if task is not None:
            bar.stop()
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): open it at https://ui.perfetto.dev (Open trace file)")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
