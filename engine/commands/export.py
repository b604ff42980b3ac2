"""`tandem export perfetto RESULTS -o trace.pftrace`: the analysis as a timeline for ui.perfetto.dev."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

# A whole export of more GIL intervals than this gets a line first: its trace (~50 bytes an
# interval, docs/perfetto.md) is slow to open in a browser.
LARGE_EXPORT_ROWS = 5_000_000
BYTES_PER_GIL_ROW = 50
export_app = typer.Typer(help="Export analysis results to other tools.", no_args_is_help=True)


@export_app.command("perfetto")
def perfetto(
    results: Path = typer.Argument(..., help="the -o directory of `tandem analyze`, or the parts directory of `tandem live`"),
    output: Path = typer.Option(Path("trace.pftrace"), "-o", "--output", help="trace file to write"),
    fmt: Optional[str] = typer.Option(None, "--format", help="proto (Perfetto's native TrackEvent protobuf) or json (Chrome "
                                      "trace-event JSON, the legacy format); default: json for a .json OUTPUT, else proto"),
    window: Optional[str] = typer.Option(None, "--window", help="only FROM..TO of the results, offsets from their start "
                                         "(10m..12m, 55m.., ..30s; --window=-5m.. for the last five minutes)"),
    worst: bool = typer.Option(False, "--worst", help="only the pause that hit Python longest, with three times its "
                               "length around it"),
) -> None:
    """JVM pauses and every Python thread's GIL state on one timeline (open it in ui.perfetto.dev)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from engine.errors import TandemError, writing_into
    from engine.report.perfetto import WORST, export_perfetto, gil_rows

    if window is not None and worst:
        raise TandemError("--window and --worst: give one")
    part = WORST if worst else _offsets(window) if window is not None else None
    console = Console(stderr=True)
    if part is None:
        from engine.results import Results

        rows = gil_rows(Results(results))
        if rows > LARGE_EXPORT_ROWS:  # (said before the minutes of work, not after)
            console.print(f"[dim]tandem: {rows / 1e6:.1f} M GIL intervals make a trace of about "
                          f"{rows * BYTES_PER_GIL_ROW / 1e6:,.0f} MB, slow to open in a browser; --window FROM..TO or "
                          "--worst exports a part[/dim]", highlight=False)

    bar = Progress(TextColumn("exporting"), BarColumn(), TimeRemainingColumn(), console=console, transient=True)
    task = None

    def progress(done: int, total: int) -> None:  # shown once the inputs were found readable
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("export", total=total)
        bar.update(task, completed=done, total=total)

    try:
        with writing_into(output, "writing the trace"):
            path = export_perfetto(results, output, fmt, progress=progress, window=part)
    finally:
        if task is not None:
            bar.stop()
    size = path.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"
    typer.echo(f"wrote {path} ({shown}): open it at https://ui.perfetto.dev (Open trace file)")


def _offsets(text: str) -> tuple[int | None, int | None]:
    """'FROM..TO' as ns offsets (None: an edge left open; negative: from the end)."""
    from engine.commands.analyze import parse_duration_ns
    from engine.errors import TandemError

    if text.count("..") != 1:
        raise TandemError(f"--window {text!r}: expected FROM..TO, e.g. 10m..12m, 55m.. or ..30s")

    def offset(edge: str) -> int | None:
        edge = edge.strip()
        if not edge:
            return None
        return -parse_duration_ns(edge[1:]) if edge.startswith("-") else parse_duration_ns(edge)

    first, last = text.split("..")
    return offset(first), offset(last)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
