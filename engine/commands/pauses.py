"""`tandem pauses`: JFR recordings to a table of JVM stop-the-world intervals."""
from __future__ import annotations

from pathlib import Path

import typer

_C1_ONLY_BELOW_BYTES = 256 << 20


def pauses(
    recordings: list[Path] = typer.Argument(..., help="JFR recordings (.jfr) to read; one table for all."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory; the table goes to OUT/pauses.parquet."),
) -> None:
    """Read JFR recordings into OUT/pauses.parquet (schema: docs/pauses.md) and summarise them."""
    from rich.console import Console

    from engine.errors import writing_into
    from engine.ingest.jfr import read_pauses
    from engine.store import write_table

    err_console = Console(stderr=True)
    # A one-shot process: up to a few hundred MB, a JIT that compiles the jdk.jfr parser
    # quickly (C1 only) beats one that compiles it well; beyond that, C2's faster code pays
    # back its compile time.
    total_bytes = sum(p.stat().st_size for p in recordings if p.is_file())
    jvm_options = ("-XX:TieredStopAtLevel=1",) if total_bytes < _C1_ONLY_BELOW_BYTES else ()
    table = read_pauses(recordings, progress=err_console, jvm_options=jvm_options)  # warnings: see main()
    with writing_into(out / "pauses.parquet", "writing the pauses table"):  # (not Arrow's words: the table named)
        target = write_table(table, out / "pauses.parquet")
    _print_summary(Console(), table, target)


def _print_summary(console, table, target: Path) -> None:
    from rich.table import Table

    from engine.correlate.schema import PAUSE_KINDS

    meta = table.attrs
    summary = Table(title=f"{len(table)} intervals -> {target}")
    for column in ("kind", "count", "total ms", "p50 ms", "p99 ms", "max ms"):
        summary.add_column(column, justify="left" if column == "kind" else "right")
    for kind in PAUSE_KINDS:
        durations = table.loc[table["kind"] == kind, "duration_ns"]
        if durations.empty:
            continue
        ms = durations / 1e6
        summary.add_row(kind, str(len(ms)), f"{ms.sum():.2f}", f"{ms.quantile(0.5):.3f}", f"{ms.quantile(0.99):.3f}",
                        f"{ms.max():.3f}")
    console.print(summary)
    errors = [r["clock"]["error_ns"] for s in meta["sources"] for r in s["runs"]]
    console.print(
        f"clock: [bold]{meta['clock_domain']}[/bold] by {meta['clock_method']} "
        f"(estimated error up to {max(errors) / 1000:.1f} us); collector: {meta['collector'] or 'unknown'}"
    )


def register(app: typer.Typer) -> None:
    app.command("pauses")(pauses)
