"""`tandem live SESSION` / `tandem live -- COMMAND...`: correlate a running session as it runs (docs/live.md)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer


def live(
    args: List[str] = typer.Argument(..., metavar="SESSION | -- COMMAND...",
                                     help="A session directory being recorded, or, after `--`, a command to run and watch."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Directory for the rolling Parquet parts (default SESSION/live)."),
    session_dir: Optional[Path] = typer.Option(None, "--session", help="With a command: the session directory to create "
                                               "(default ./tandem-live-<time>)."),
    roll: str = typer.Option("60s", "--roll", help="Length of each Parquet part, e.g. 60s, 10s."),
    slack: str = typer.Option("0", "--slack", help="Also report near misses within this duration, e.g. 50ms."),
    alert_overlap: Optional[str] = typer.Option(None, "--alert-overlap", help="Alert when a pause overlaps Python longer than this, e.g. 20ms."),
    alert_jsonl: Optional[Path] = typer.Option(None, "--alert-jsonl", help="Append each alert as a JSON line to this file."),
    alert_exec: Optional[str] = typer.Option(None, "--alert-exec", help="Run this shell command per alert (alert JSON in $TANDEM_ALERT)."),
    secret_events: bool = typer.Option(False, "--secret-events", help="Also record the JFR events that carry the "
                                       "environment, system properties and command lines (off by default: docs/session.md)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus metrics on this port at /metrics "
                                               "(docs/metrics.md); 0: any free port."),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="Address the metrics server listens on."),
    metrics_linger: str = typer.Option("0", "--metrics-linger", help="At the end, keep /metrics up until one scrape has read the "
                                       "final values, at most this long, e.g. 15s."),
    otlp: Optional[str] = typer.Option(None, "--otlp", help="Push the same metrics with OTLP/HTTP to this URL, "
                                       "e.g. http://collector:4318/v1/metrics."),
    otlp_interval: str = typer.Option("10s", "--otlp-interval", help="How often to push with --otlp."),
    service: str = typer.Option("", "--service", help="Service name for the metrics (label `service`, OTel service.name)."),
    python: List[str] = typer.Option([], "--python", help="With a command: an interpreter it runs, to build the GIL probe for "
                                     "before it starts (repeatable; others are built on first use)."),
    otlp_receiver: Optional[int] = typer.Option(None, "--otlp-receiver", help="With a command: receive its OpenTelemetry "
                                                "spans over OTLP/HTTP on this port (the command's SDK is pointed at it) "
                                                "into SESSION/spans.binpb, for `tandem analyze --spans` (docs/spans.md)."),
    pause_ring: bool = typer.Option(True, "--pause-ring/--no-pause-ring", hidden=True,
                                    help="With a command: JVM pauses from the agent's pause ring (default) or the JFR repository only "
                                    "(for bench/bench_live.py's before/after)."),
) -> None:
    """Watch a session live: rolling summary, latest pauses that hit Python, alerts, rolling Parquet files."""
    import shlex
    import signal
    import threading
    import time

    from rich.console import Console

    from engine import jvm
    from engine.commands.analyze import parse_duration_ns
    from engine.errors import TandemError, os_error_line, writing_into
    from engine.live.alerts import Alerts
    from engine.live.memory import bound_allocator
    from engine.live.runner import LiveRun
    from engine.live.view import View

    command_mode = "--" in sys.argv[1:]
    console = Console(stderr=True)  # stdout belongs to the command
    view = View(console, live=console.is_terminal)
    alerts = Alerts(parse_duration_ns(alert_overlap) if alert_overlap else None, alert_jsonl, alert_exec, printer=view.say)
    roll_ns, slack_ns = parse_duration_ns(roll), parse_duration_ns(slack)
    if roll_ns <= 0:
        raise typer.BadParameter("--roll must be positive")
    metrics = None
    if metrics_port is not None or otlp:
        from engine.live.metrics import LiveMetrics

        try:
            metrics = LiveMetrics(port=metrics_port, addr=metrics_addr, otlp_url=otlp, service=service,
                                  otlp_interval_s=parse_duration_ns(otlp_interval) / 1e9)
        except OSError as err:
            raise TandemError(f"--metrics-port {metrics_port}: cannot listen on {metrics_addr}: {err.strerror or err}") from None
        if metrics.prometheus is not None:
            console.print(f"[dim]tandem: metrics at http://{metrics_addr}:{metrics.prometheus.port}/metrics[/dim]")
    bound_allocator()  # before the JVM's and our threads exist
    # The in-process JVM that reads JFR: started here, in the main thread, before any signal
    # handler of ours; -Xrs keeps it from handling SIGINT/SIGTERM itself. A small heap: the
    # default (1/64 of RAM) is touched page by page as the repository re-reads allocate, and
    # RSS climbs for minutes; reading a chunk needs far less than the bound.
    # -XX:+AlwaysPreTouch: the 24 MiB heap is resident from the start instead of page by page
    # over the first minutes as the tenured generation fills (docs/live.md, "Memory over a
    # long run"): same memory, no ramp in a soak's RSS.
    jvm.start_jvm(extra_options=("-Xrs", "-Xms24m", "-Xmx512m", "-XX:+AlwaysPreTouch"))

    if not command_mode:
        from engine.record.session import keep_private

        keep_private()  # the parts written into SESSION/live are as private as the session
        if len(args) != 1:
            raise TandemError("give one SESSION directory, or `-- COMMAND...` to run one")
        if otlp_receiver is not None:
            raise TandemError("--otlp-receiver goes with a command (`-- COMMAND...`): its SDK is pointed at the receiver")
        session = Path(args[0]).expanduser().absolute()
        if not session.is_dir():
            raise TandemError(f"{session}: not a session directory")
        from engine.spans.live import LiveSpans
        from engine.spans.receiver import SESSION_SPANS
        from engine.spans.source import BinpbTail

        # The spans `tandem record` receives (docs/spans.md), figured as they come (the file may
        # appear after tandem live starts, or never: then only the GIL rows of the last 30 s are kept for them).
        spans = LiveSpans(session, tail=BinpbTail(session / SESSION_SPANS))
        run = LiveRun(session, output or session / "live", roll_ns=roll_ns, slack_ns=slack_ns, alerts=alerts, view=view,
                      follow_recorder=True, spans=spans)
        _observe(run, metrics)

        def stop(signum, _frame):
            run.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, stop)
        console.print(f"[dim]tandem: watching {session}; parts in {run.writer.out} (Ctrl-C stops; "
                      "stops by itself once its recorder has finished)[/dim]")
        with view, writing_into(run.writer.out, "writing the live parts"):  # (the session is the recorder's, unharmed)
            run.run()
        _close(metrics, metrics_linger, console)
        console.print(f"[dim]tandem: {len(run.writer.parts_written)} part(s) in {run.writer.out}[/dim]")
        return

    from engine.record import launch, session as sessions

    command = list(args)
    directory = (session_dir or Path(f"tandem-live-{time.strftime('%Y%m%d-%H%M%S')}")).expanduser().absolute()
    jar = jvm.agent_jar()
    options = launch.agent_options(directory, live=pause_ring, secret_events=secret_events)
    env = launch.recording_environment(directory, jar, options)
    sessions.create_session(directory, {
        "kind": "live", "command": shlex.join(command), "argv": command, "cwd": str(Path.cwd()),
        "agent_options": options, "java_tool_options": env["JAVA_TOOL_OPTIONS"],
    })
    with console.status("building the GIL probe for the interpreters found"):
        launch.prebuild_probes(directory, env, python)
    receiver = live_spans = None
    if otlp_receiver is not None:
        from engine.spans.live import LiveSpans
        from engine.spans.receiver import SESSION_SPANS, OtlpHttpReceiver, exporter_environment

        # Figured as the run goes (the view, the metrics, the parts' spans.parquet) and kept for tandem analyze --spans.
        live_spans = LiveSpans(directory)
        receiver = OtlpHttpReceiver(otlp_receiver, live_spans.add, copy_to=directory / SESSION_SPANS)
        env.update(exporter_environment(receiver, env))
    run = LiveRun(directory, output or directory / "live", roll_ns=roll_ns, slack_ns=slack_ns, alerts=alerts, view=view,
                  spans=live_spans)
    _observe(run, metrics)
    console.print(f"[dim]tandem: running `{shlex.join(command)}` live into {directory}[/dim]")
    from engine.record.memory import ProcessMemorySampler

    sampler = ProcessMemorySampler(directory).start()  # every process below tandem, once a second (as tandem record)
    with view:
        loop = threading.Thread(target=_run_reporting, args=(run,), name="tandem-live", daemon=True)
        loop.start()
        try:
            # Signals reach tandem in this (main) thread and are forwarded to the command; once it
            # exits, the loop reads what is left, flushes and closes every file.
            pid, exit_code = launch.run_forwarding_signals(command, env, on_signal=lambda _signum: run.command_done.set())
        except TandemError:
            sampler.stop()
            run.stop.set()
            loop.join()
            sessions.finish_session(directory, exit_code=None, error="command did not start")
            raise
        sampler.stop()
        sessions.finish_session(directory, pid=pid, exit_code=exit_code)
        run.command_done.set()
        while loop.is_alive():
            loop.join(0.2)
    if receiver is not None:
        receiver.close()
        console.print(f"[dim]tandem: {receiver.spans} span(s) received into {directory / SESSION_SPANS}; {live_spans.figured} "
                      f"figured; span intake took {receiver.cpu_s + live_spans.cpu_s:.3f} s CPU (receiver "
                      f"{receiver.cpu_s:.3f} s, figures {live_spans.cpu_s:.3f} s)[/dim]")
    _close(metrics, metrics_linger, console)
    if isinstance(run.error, OSError):  # (a full disk: the command ran on, its session has it all)
        console.print(f"tandem: live parts stopped: {os_error_line(run.error, run.writer.out, 'writing the live parts')}; "
                      f"{directory} holds the whole recording (`tandem analyze {directory}`)", highlight=False)
        console.print(f"[dim]tandem: `{command[0]}` exited with {exit_code}[/dim]")
        raise typer.Exit(exit_code)
    if run.error is not None:
        raise run.error
    console.print(f"[dim]tandem: {len(run.writer.parts_written)} part(s) in {run.writer.out}; "
                  f"`{command[0]}` exited with {exit_code}[/dim]")
    raise typer.Exit(exit_code)


def _run_reporting(run) -> None:
    """The loop's thread: its error stays in run.error, for the command to say once it has
    waited for the command (not a traceback from this thread)."""
    try:
        run.run()
    except BaseException:
        pass


def _observe(run, metrics) -> None:
    if metrics is not None:
        from engine.live.metrics import run_state

        metrics.bind(run_state(run))
        run.writer.observers.append(metrics.rows)


def _close(metrics, linger: str, console) -> None:
    if metrics is not None:
        from engine.commands.analyze import parse_duration_ns

        metrics.close(parse_duration_ns(linger) / 1e9)
        console.print(f"[dim]tandem: {metrics.cost()}[/dim]")


def register(app: typer.Typer) -> None:
    # Options may follow SESSION (`tandem live S --roll 10s`); a command goes after `--`,
    # where click takes everything as arguments.
    app.command("live", context_settings={"allow_interspersed_args": True})(live)
