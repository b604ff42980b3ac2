"""`tandem demo`: record the built-in hybrid workload, analyze it, and show what tandem sees."""
from __future__ import annotations

from pathlib import Path

import typer


def demo(
    output: Path = typer.Option(Path("demo-out"), "-o", "--output", help="Directory for the session and the results (replaced)."),
    seconds: float = typer.Option(20.0, "--seconds", help="How long the workload runs."),
) -> None:
    """Record a Python "inference server" with an embedded JVM for SECONDS, then analyze it."""
    import shutil
    import subprocess
    import sys
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.errors import TandemError

    console = Console()
    output = output.absolute()
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    session, results = output / "session", output / "results"
    log = output / "workload.log"
    argv = [sys.executable, "-m", "engine", "record", "-o", str(session), "--",
            sys.executable, "-m", "engine.demo.workload", "--seconds", str(seconds), "--markers", str(output / "markers.json"),
            "--otlp-spans"]  # (to tandem record's receiver: SESSION/spans.binpb)
    console.print(f"[bold]tandem demo[/bold]: recording a Python service with an embedded JVM for {seconds:g} s")
    with log.open("w") as sink, Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("recording (JFR + GIL probe)", total=seconds + 3)
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        started = time.monotonic()
        while proc.poll() is None:
            bar.update(task, completed=min(time.monotonic() - started, seconds + 3))
            time.sleep(0.2)
        bar.update(task, completed=seconds + 3)
    if proc.returncode != 0:
        raise TandemError(f"{log}: the demo workload failed (exit {proc.returncode}); see the log")

    from engine.analysis import analyze_session
    from engine.report.perfetto import export_perfetto

    with console.status("analyzing"):
        analysis = analyze_session(session)
        analysis.write(results)
    analysis.summary(console=console)
    from engine.report.summary import requests_hurt_lines
    from engine.spans.analyze import analyze_spans
    from engine.spans.receiver import SESSION_SPANS

    for line in requests_hurt_lines(analyze_spans(results, session, [session / SESSION_SPANS])[1]):
        console.print(line, markup=False, highlight=False)
    picture = output / "timeline.png"
    analysis.timeline(*analysis.worst_window(), path=picture)
    trace = export_perfetto(results, output / "trace.pftrace")
    console.print()
    console.print(f"session      {session}")
    console.print(f"results      {results}/*.parquet")
    console.print(f"timeline     {picture}")
    console.print(f"perfetto     {trace}  (open in https://ui.perfetto.dev)")
    console.print(f"notebook     make notebook   (opens notebooks/explore.ipynb on {results})")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
