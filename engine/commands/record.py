"""`tandem record -o SESSION -- <command ...>`: run a command with every JVM and CPython it starts recording."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def record(
    command: List[str] = typer.Argument(..., metavar="-- COMMAND...", help="The command to run, after `--`."),
    output: Path = typer.Option(..., "-o", "--output", help="Session directory to create (must not exist or be empty)."),
    settings: Optional[Path] = typer.Option(None, "--settings", help="A .jfc file to start from instead of the JDK's default settings."),
    event: List[str] = typer.Option([], "--event", help="Extra JFR event setting, NAME or NAME#setting=value (repeatable)."),
    live: bool = typer.Option(False, "--live", help="Also write JVM pauses into jvm-PID/pauses.ring, for `tandem live SESSION` (low latency)."),
    secret_events: bool = typer.Option(False, "--secret-events", help="Also record the JFR events that carry the "
                                       "environment, system properties and command lines (off by default: docs/session.md)."),
    python: List[str] = typer.Option([], "--python", help="An interpreter the command runs, to build the GIL probe for before it starts "
                                     "(repeatable; others are built on first use)."),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="Flight recorder: keep the session within this much disk "
                                           "(e.g. 500M, 2G), deleting the oldest history first."),
    max_age: Optional[str] = typer.Option(None, "--max-age", help="Flight recorder: keep only this much history (e.g. 30m, 2h)."),
    native_memory: bool = typer.Option(False, "--native-memory", help="JVMs track their native memory by category "
                                       "(NMT summary; in memory.parquet on JDK 20+)."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Sample every process's memory once a second "
                                "(from outside, inside CPython, JFR's memory events): memory.parquet (docs/results.md)."),
) -> None:
    """Run COMMAND; every JVM it starts records JFR pauses into SESSION (and every CPython its GIL states)."""
    import shlex

    from rich.console import Console

    from engine import jvm
    from engine.errors import TandemError
    from engine.record import keeper as keeping, launch, session as sessions
    from engine.record.memory import ProcessMemorySampler

    if settings is not None and not settings.is_file():
        raise TandemError(f"{settings}: settings file not found")
    bounds = keeping.bounds_from(max_size, max_age)
    jar = jvm.agent_jar()
    directory = Path(output).expanduser().absolute()
    options = launch.agent_options(directory, settings.absolute() if settings else None, event, live=live,
                                 secret_events=secret_events, max_bytes=bounds.jfr_max_bytes(), max_age_s=bounds.max_age_s,
                                 memory=memory, keeper=bool(bounds))
    env = launch.recording_environment(directory, jar, options, bounds.probe_environment(), native_memory=native_memory,
                                       memory=memory)
    sessions.create_session(directory, {
        "kind": "record",
        "command": shlex.join(command),
        "argv": list(command),
        "cwd": str(Path.cwd()),
        "agent_options": options,
        "java_tool_options": env["JAVA_TOOL_OPTIONS"],
        **({"flight_recorder": bounds.as_dict()} if bounds else {}),
    })

    console = Console(stderr=True)  # stdout belongs to the command
    with console.status("building the GIL probe for the interpreters found"):
        launch.prebuild_probes(directory, env, python)
    # The command's OpenTelemetry spans, if it exports any (docs/spans.md): into SESSION/spans.binpb
    # (not with the flight recorder's bounds: that file is not rotated).
    from engine.spans.receiver import SESSION_SPANS, OtlpHttpReceiver, exporter_environment

    receiver = None if bounds else OtlpHttpReceiver(0, lambda spans: None, copy_to=directory / SESSION_SPANS)
    if receiver is not None:
        env.update(exporter_environment(receiver, env))
    console.print(f"[dim]tandem: recording `{shlex.join(command)}` into {directory}[/dim]")
    sampler = ProcessMemorySampler(directory).start() if memory else None  # every process below tandem, once a second
    # the flight recorder's keeper: packs GIL segments, keeps the bounds (engine/record/keeper.py)
    keeper = keeping.Keeper(directory, bounds, say=lambda line: console.print(line, highlight=False)).start() if bounds else None
    try:
        pid, exit_code = launch.run_forwarding_signals(command, env)
    except TandemError:
        sessions.finish_session(directory, exit_code=None, error="command did not start")
        raise
    finally:
        if sampler is not None:
            sampler.stop()
        if receiver is not None:
            receiver.close()
        if keeper is not None:
            keeper.stop()
    kept = {"flight_recorder": keeper.summary()} if keeper is not None else {}
    if sampler is not None:  # what the recorder's memory sampling cost (bench/bench_memory.py reads it)
        kept["memory_capture"] = {"samples": sampler.samples, "cpu_s": sampler.cost_ns / 1e9}
    if receiver is not None and receiver.spans:
        console.print(f"[dim]tandem: {receiver.spans} OpenTelemetry span(s) received into {directory / SESSION_SPANS}[/dim]")
    problem = sessions.finish_session(directory, pid=pid, exit_code=exit_code, **kept)
    if problem and not directory.is_dir():
        console.print(f"tandem: {problem}")
        console.print(f"[dim]tandem: `{command[0]}` exited with {exit_code}[/dim]")
        raise typer.Exit(exit_code)
    if problem:
        console.print(f"tandem: {problem}")

    try:
        from engine.record import summary  # (reads JFR: loaded once the command has run, not before it starts)

        with console.status("reading what was captured") as status:
            try:
                jfr_tool = jvm.jdk_tool("jfr")
            except TandemError:
                jfr_tool = None
            captures = summary.collect(directory, jfr_tool, status)
        summary.print_summary(console, directory, captures)
    except Exception as err:  # the command's exit code is what counts; say what went wrong in one line
        console.print(f"[yellow]tandem: could not read all that {directory} captured: {type(err).__name__}: {err}[/yellow]",
                      highlight=False)
    console.print(f"[dim]tandem: `{command[0]}` exited with {exit_code}[/dim]")
    raise typer.Exit(exit_code)


def register(app: typer.Typer) -> None:
    app.command(
        "record",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(record)
