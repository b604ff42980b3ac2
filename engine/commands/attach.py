"""`tandem attach PID -o SESSION [--duration S]`: start tandem's recording in a running JVM or CPython."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def attach(
    pid: int = typer.Argument(..., help="Process id of a running JVM (17+, same user) or CPython (3.11+, by injection: pyinjector, else gdb)."),
    output: Path = typer.Option(..., "-o", "--output", help="Session directory to create (must not exist or be empty)."),
    duration: Optional[float] = typer.Option(None, "--duration", min=0.001, help="Record this many seconds, then write the recording (default: until the JVM exits)."),
    settings: Optional[Path] = typer.Option(None, "--settings", help="A .jfc file to start from instead of the JDK's default settings."),
    event: List[str] = typer.Option([], "--event", help="Extra JFR event setting, NAME or NAME#setting=value (repeatable)."),
    secret_events: bool = typer.Option(False, "--secret-events", help="Also record the JFR events that carry the "
                                       "environment, system properties and command lines (off by default: docs/session.md)."),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="Flight recorder (a JVM): JFR keeps its recording within "
                                           "half of this (e.g. 500M), deleting its oldest chunks."),
    max_age: Optional[str] = typer.Option(None, "--max-age", help="Flight recorder (a JVM): JFR keeps only this much history (e.g. 30m)."),
) -> None:
    """Load tandem's agent into the running JVM PID (JFR pauses into SESSION/jvm-PID/), or start the GIL
    probe in the running CPython PID by injecting it (SESSION/py-PID/, until --duration, Ctrl-C or its exit)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from engine import jvm
    from engine.errors import TandemError
    from engine.record import attach as attaching, keeper as keeping, launch, session as sessions, summary
    from engine.session import agent_error_line

    from engine.record import attach_python

    bounds = keeping.bounds_from(max_size, max_age)
    if attach_python.is_cpython(pid) and not attaching.is_jvm(pid):
        if bounds:
            raise TandemError("--max-size/--max-age: not available when attaching to a running CPython; "
                              "start it under `tandem record --max-size/--max-age` instead")
        _attach_python(pid, Path(output).expanduser().absolute(), duration)
        return
    attaching.check_pid(pid)
    if settings is not None and not settings.is_file():
        raise TandemError(f"{settings}: settings file not found")
    jar = jvm.agent_jar()
    directory = Path(output).expanduser().absolute()
    options = launch.agent_options(directory, settings.absolute() if settings else None, event, duration,
                                 secret_events=secret_events, max_bytes=bounds.jfr_max_bytes(), max_age_s=bounds.max_age_s)
    java = jvm.jdk_tool("java")
    sessions.create_session(directory, {"kind": "attach", "target_pid": pid, "duration_s": duration, "agent_options": options})

    console = Console(stderr=True)
    with console.status(f"attaching to pid {pid}"):
        attaching.load_agent(java, jar, pid, options)
    jvm_dir = directory / f"jvm-{pid}"
    if attaching.jvm_state(jvm_dir) is None:
        reason = agent_error_line(jvm_dir) or "that JVM's stderr says why (a `tandem-agent:` line)"
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


def _attach_python(pid: int, directory: Path, duration: float | None) -> None:
    """The GIL probe in a running CPython, started and stopped by injection (attach_python)."""
    import time

    from rich.console import Console

    from engine.errors import Terminated
    from engine.probe.build import cache_root
    from engine.record import attach_python, session as sessions, summary

    attach_python.check_ptrace(pid)
    sessions.create_session(directory, {"kind": "attach", "target_pid": pid, "runtime": "cpython", "duration_s": duration})
    console = Console(stderr=True)
    cache = cache_root()
    with console.status(f"starting the GIL probe in pid {pid}"):
        py_dir, how = attach_python.start(pid, directory, cache)
    console.print(f"tandem: pid {pid}: probe injected through {how}", markup=False, highlight=False)
    until = f"for {duration:g} s" if duration is not None else "until it exits"
    console.print(f"tandem: pid {pid} records into {py_dir} {until} (Ctrl-C stops)")
    deadline = None if duration is None else time.monotonic() + duration
    try:
        while attach_python.is_cpython(pid) and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.1)
    except (KeyboardInterrupt, Terminated):
        console.print("tandem: stopping")
    with console.status(f"stopping the GIL probe in pid {pid}"):
        state = attach_python.stop(pid, directory, cache)
    sessions.finish_session(directory, state=state)
    summary.print_summary(console, directory, summary.collect(directory, None))


def register(app: typer.Typer) -> None:
    app.command("attach")(attach)
