"""`tandem doctor`: what this machine allows, in one screen."""
from __future__ import annotations

import typer


def _cpu_flags() -> set[str]:
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _tick_source() -> str:
    """What JFR's ticks will be here, and how tandem pins them to CLOCK_MONOTONIC."""
    from pathlib import Path

    flags = _cpu_flags()
    try:
        clocksource = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    except OSError:
        clocksource = "unknown"
    invariant = {"constant_tsc", "nonstop_tsc"} <= flags
    tsc = "invariant TSC" if invariant else "no invariant TSC"
    return (f"kernel clocksource {clocksource}, {tsc}; JFR ticks are CLOCK_MONOTONIC unless the JVM enables fast "
            f"(TSC) time{' (possible here)' if invariant else ''}; the agent's tandem.ClockSync events pin either kind")


def _probe_rows() -> list[tuple[str, str]]:
    """The GIL probe backends for this interpreter: which `auto` picks and what each can miss."""
    import sys
    import sysconfig

    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return [("GIL probe", f"[red]Python {sys.version.split()[0]} is free-threaded: no GIL to watch[/red]")]
    try:
        from engine.probe import _probe
    except ImportError as err:
        return [("GIL probe", f"[red]native probe not built for Python {sys.version.split()[0]}: {err}[/red]")]
    # What `auto` picks is known only by trying (the precise backend learns the GIL's
    # mutexes at start): start it for an instant on a tiny scratch ring.
    import tempfile

    import engine.probe
    from engine.errors import TandemError

    status = engine.probe.status()
    if not status["running"]:  # (under `tandem record` it is already running: report that)
        with tempfile.TemporaryDirectory(prefix="tandem-doctor-") as tmp:
            try:
                status = engine.probe.start(f"{tmp}/doctor.gil", capacity=64)
                engine.probe.stop()
            except TandemError as err:
                return [("GIL probe", f"[red]{err}[/red]")]
    try:
        inline = all(_probe._find_function(name) for name in ("take_gil", "drop_gil"))
    except Exception:
        inline = False
    picked = status["backend"] + (f" ({status['method']})" if status.get("method") else "")
    rows = [("GIL probe", f"Python {sys.version.split()[0]}: `auto` picks [bold]{picked}[/bold]; misses: {status['misses']}")]
    if status.get("fallback_reasons"):
        rows.append(("probe fallbacks", status["fallback_reasons"]))
    if status.get("method_reason"):
        rows.append(("precise: not the GOT method", status["method_reason"]))
    rows.append(("precise, inline hooks", "[green]possible[/green] (take_gil/drop_gil in .symtab)" if inline
                 else "[yellow]not here (take_gil/drop_gil not in .symtab)[/yellow]"))
    for name, misses in _probe.backends().items():
        rows.append((f"probe backend {name}", f"misses: {misses}"))
    return rows


def _interpreter_rows() -> list[tuple[str, str]]:
    """Every CPython found here and whether `tandem record` will probe it, and how."""
    from engine.probe.build import machine_interpreters, probe_plan

    rows, not_runnable = [], []
    for python in machine_interpreters():
        probed, how = probe_plan(python)
        if how.startswith("cannot run"):  # e.g. a pyenv shim of a version not selected
            not_runnable.append(python)
            continue
        rows.append((f"interpreter {python}", f"[green]probed[/green]: {how}" if probed else f"[red]not probed[/red]: {how}"))
    if not_runnable:
        rows.append(("on PATH, not runnable", ", ".join(not_runnable)))
    rows.append(("interpreters, never", "runs with -I, -E or -S (they skip PYTHONPATH or site), and children of programs "
                 "that clear the environment"))
    return rows


def _attach_rows() -> list[tuple[str, str]]:
    """Whether `tandem attach PID` can inject the probe into a running CPython here, and why not."""
    import ctypes
    import os
    import shutil

    from engine.record import attach_python

    rows = []
    scope = attach_python.ptrace_scope()
    refusal = attach_python.scope_refusal(scope, os.geteuid() == 0)
    rows.append(("attach: ptrace", f"[red]{refusal}[/red]" if refusal else f"[green]allowed[/green] (kernel.yama.ptrace_scope {scope}"
                 f"{', as root' if os.geteuid() == 0 else ''})"))
    missing = attach_python.pyinjector_missing()
    rows.append(("attach: pyinjector", f"[red]{missing}[/red]" if missing else "[green]importable[/green] (the injector used first)"))
    gdb_problem = attach_python.gdb_call_problem() if not refusal else "not tried (ptrace is not allowed)"
    amx = "amx_tile" in _cpu_flags()
    if gdb_problem is None:
        gdb = "[green]present, inferior calls work[/green] (the fallback)"
    else:
        gdb = f"[yellow]no fallback: {gdb_problem}[/yellow]" + (" (this CPU has Intel AMX, which gdb 13 cannot restore)" if amx else "")
    rows.append(("attach: gdb", gdb))
    python = ctypes.PyDLL(None)  # the global scope the injected library's symbols resolve in
    absent = [name for name in ("PyGILState_Ensure", "PyGILState_Release", "PyRun_SimpleString")
              if not hasattr(python, name)]
    rows.append(("attach: interpreter symbols", f"[red]this interpreter does not export {', '.join(absent)}[/red]" if absent
                 else "[green]exported[/green] (PyGILState_Ensure, PyRun_SimpleString: the injected thread runs Python)"))
    compiler = shutil.which("gcc") or shutil.which("cc")
    if not compiler:
        rows.append(("attach: C compiler", "[red]no gcc: the probe and the injected library are built on first use[/red]"))
    works = not refusal and not absent and compiler and (not missing or gdb_problem is None)
    how = "pyinjector" if not missing else "gdb"
    rows.append(("attach to a running CPython", f"[green]works here[/green] (through {how})" if works else "[red]not here[/red] (the lines above say why)"))
    return rows


def doctor() -> None:
    """Show the JDK, the JFR tick source, the GIL probe backends and whether attaching to a running CPython works here."""
    from rich.console import Console
    from rich.table import Table

    from engine import jvm
    from engine.errors import TandemError

    table = Table(title="tandem doctor", show_header=True)
    table.add_column("check")
    table.add_column("result", overflow="fold")
    try:
        home = jvm.find_java_home()
        table.add_row("JDK", f"{home} (Java {jvm.java_version(home)}); jfr, attach: {'yes' if (home / 'bin' / 'jfr').exists() else 'no'}")
        table.add_row("agent jar", str(jvm.agent_jar()))
    except TandemError as err:
        table.add_row("JDK", f"[red]{err}[/red]")
    table.add_row("JFR ticks", _tick_source())
    for check, result in _probe_rows() + _interpreter_rows() + _attach_rows():
        table.add_row(check, result)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
