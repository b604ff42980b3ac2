"""`tandem attach PID -o SESSION [--duration S]`: start tandem's recording in a running JVM."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def attach(
    pid: int = typer.Argument(..., help="Process id of a running JVM (17+, same user)."),
    output: Path = typer.Option(..., "-o", "--output", help="Session directory to create (must not exist or be empty)."),
    duration: Optional[float] = typer.Option(None, "--duration", min=0.001, help="Record this many seconds, then write the recording (default: until the JVM exits)."),
    settings: Optional[Path] = typer.Option(None, "--settings", help="A .jfc file to start from instead of the JDK's default settings."),
    event: List[str] = typer.Option([], "--event", help="Extra JFR event setting, NAME or NAME#setting=value (repeatable)."),
    secret_events: bool = typer.Option(False, "--secret-events", help="Also record the JFR events that carry the "
                                       "environment, system properties and command lines (off by default: docs/session.md)."),
) -> None:
    """Load tandem's agent into the running JVM PID; it records JFR pauses into SESSION/jvm-PID/."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from engine import jvm
    from engine.errors import TandemError
    from engine.record import attach as attaching, launch, session as sessions, summary

    attaching.check_pid(pid)
    if settings is not None and not settings.is_file():
        raise TandemError(f"{settings}: settings file not found")
    jar = jvm.agent_jar()
    directory = Path(output).expanduser().absolute()
    options = launch.agent_options(directory, settings.absolute() if settings else None, event, duration,
                                 secret_events=secret_events)
    java = jvm.jdk_tool("java")
    sessions.create_session(directory, {"kind": "attach", "target_pid": pid, "duration_s": duration, "agent_options": options})

    console = Console(stderr=True)
    with console.status(f"attaching to pid {pid}"):
        attaching.load_agent(java, jar, pid, options)
    jvm_dir = directory / f"jvm-{pid}"
    if attaching.jvm_state(jvm_dir) is None:
        reason = summary.agent_error_line(jvm_dir) or "that JVM's stderr says why (a `tandem-agent:` line)"
        raise TandemError(f"pid {pid}: the agent loaded but did not start recording: {reason}")
    if duration is None:
        console.print(f"tandem: pid {pid} records into {jvm_dir} until it exits")
        return

    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        state = attaching.wait_until_closed(jvm_dir, pid, duration, progress)
    sessions.finish_session(directory, state=state)
    with console.status("reading what was captured") as status:
        captures = summary.collect(directory, jvm.jdk_tool("jfr"), status)
    summary.print_summary(console, directory, captures)
    if state != "closed":
        raise TandemError(f"pid {pid}: the recording did not close (state {state}); what was captured is in {jvm_dir}")


def register(app: typer.Typer) -> None:
    app.command("attach")(attach)
