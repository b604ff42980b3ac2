"""Running the user's command so that everything it starts records into the session.

JVMs pick the agent up from JAVA_TOOL_OPTIONS (every JVM start honours it, embedded ones
too: JPype's startJVM, JNI hosts); CPython interpreters start the GIL probe when
TANDEM_SESSION is set: tandem's own through the `.pth` hook, every other (another prefix or
version, embedded with Jep) through the `sitecustomize` start hook put first on PYTHONPATH
(engine/probe/start_hook.py), with probes pre-built for the interpreters we can find.
docs/session.md is the contract.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from engine.errors import TandemError
from engine.probe.build import hook_environment, interpreters_to_prebuild, prebuild
from engine.record import session


SESSION_VARIABLE = "TANDEM_SESSION"
MEMORY_VARIABLE = "TANDEM_MEMORY"  # "0": the GIL probe starts no memory sampler (engine/probe/__init__.py)
# NAME, or NAME#setting=value, as `jfr configure` takes them (e.g. jdk.ObjectAllocationSample#throttle=100/s).
_EVENT_SETTING = re.compile(r"^[A-Za-z_][\w.$]*(#\w+=[^,;\"']+)?$")
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def agent_options(session: Path, settings: Path | str | None = None, events: Sequence[str] = (),
                  duration_s: float | None = None, live: bool = False, secret_events: bool = False,
                  max_bytes: int | None = None, max_age_s: float | None = None, memory: bool = True,
                  keeper: bool = False) -> str:
    """The option string after `tandem-agent.jar=` (parsed by java-agent's AgentOptions).
    MAX_BYTES, MAX_AGE_S: the flight recorder's bounds of each JVM's JFR recording (JFR's own
    maxsize/maxage: it deletes its oldest chunks). MEMORY False: no memory events. KEEPER: a
    keeper (engine/record/keeper.py) packs the chunks and keeps their history within the bounds;
    JFR keeps only the newest."""
    _check_option_path("session directory", session)
    parts = [f"session={session}"]
    if settings:
        _check_option_path("settings file", settings)
        parts.append(f"settings={settings}")
    for event in events:
        if not _EVENT_SETTING.match(event):
            raise TandemError(f"--event {event!r}: expected NAME or NAME#setting=value, e.g. jdk.SafepointBegin#threshold=0ms")
    if events:
        parts.append("events=" + ";".join(events))
    if duration_s is not None:
        parts.append(f"duration={duration_s:g}")
    if live:
        parts.append("live=true")  # also write pauses into jvm-PID/pauses.ring (docs/live.md)
    if secret_events:
        parts.append("secret_events=true")  # keep JFR's environment, properties, command lines
    if not memory:
        parts.append("memory=false")  # leave the JFR memory events to the base settings
    if max_bytes is not None:
        parts.append(f"maxsize={int(max_bytes)}")
    if max_age_s is not None:
        parts.append(f"maxage={max_age_s:g}")
    if keeper:
        parts.append("keeper=true")
    return ",".join(parts)


def java_tool_options(existing: str | None, jar: Path, options: str) -> str:
    """JAVA_TOOL_OPTIONS with the agent appended to what the user already had."""
    if "=" in str(jar) or '"' in str(jar):
        raise TandemError(f"{jar}: the agent jar's path must not contain '=' or '\"'; reinstall tandem elsewhere")
    agent = f"-javaagent:{jar}={options}"
    if any(ch.isspace() for ch in agent):
        # The JVM splits JAVA_TOOL_OPTIONS at white space but honours double quotes.
        agent = f'"{agent}"'
    return f"{existing.strip()} {agent}" if existing and existing.strip() else agent


def recording_environment(session: Path, jar: Path, options: str, probe: dict[str, str] | None = None,
                          native_memory: bool = False, memory: bool = True) -> dict[str, str]:
    """The command's environment; PROBE: more variables for the GIL probe (the flight
    recorder's segment rotation, engine/record/keeper.py); NATIVE_MEMORY: the JVMs track their
    native memory by category (NMT summary: JFR's jdk.NativeMemoryUsage on JDK 20+); MEMORY
    False: the probes sample no memory."""
    env = hook_environment(os.environ)
    existing = env.get("JAVA_TOOL_OPTIONS")
    if native_memory:
        existing = f"{existing or ''} -XX:NativeMemoryTracking=summary".strip()
    env["JAVA_TOOL_OPTIONS"] = java_tool_options(existing, jar, options)
    env[SESSION_VARIABLE] = str(session)
    if memory:
        env.pop(MEMORY_VARIABLE, None)
    else:
        env[MEMORY_VARIABLE] = "0"
    env.update(probe or {})
    return env


def prebuild_probes(session: Path, env: dict[str, str], pythons: Sequence[str] = ()) -> dict[str, Path | str]:
    """Build the GIL probe now for the interpreters the command will likely run (tandem's,
    `python3` on the command's PATH, PYTHONS from --python); python -> probe directory, or
    why it cannot be probed (also named in SESSION/unprobed/). Others build on first use."""
    for python in pythons:
        if not os.access(python, os.X_OK):
            raise TandemError(f"--python {python}: not an executable file")
    return prebuild(interpreters_to_prebuild(list(pythons), env.get("PATH", "")), session)


def run_forwarding_signals(argv: Sequence[str], env: dict[str, str], on_signal=None) -> tuple[int, int]:
    """Runs argv with our stdin/stdout/stderr; returns (pid, exit code as a shell reports it).

    SIGTERM and SIGHUP sent to tandem are passed to the command. So is SIGINT, except when
    it came from the terminal: then the terminal already sent it to the whole foreground
    process group, the command included, and a second one would cut its clean-up short.
    `on_signal(signum)`, if given, is called first for each of these signals (`tandem live`
    winds down on it).
    """
    try:
        # The command keeps the user's umask: tandem's own (077, keep_private) is not its business.
        child = subprocess.Popen(list(argv), env=env, umask=session.user_umask())
    except FileNotFoundError:  # (a shell's exit codes: a script sees what it would see without tandem)
        raise TandemError(f"{argv[0]}: command not found", exit_code=127) from None
    except PermissionError:
        raise TandemError(f"{argv[0]}: permission denied", exit_code=126) from None

    def forward(signum, _frame):
        if on_signal is not None:
            on_signal(signum)
        if signum == signal.SIGINT and _in_terminal_foreground():
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED_SIGNALS}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A command killed by signal N exits, as a shell says, with 128 + N.
    return child.pid, returncode if returncode >= 0 else 128 - returncode


def _in_terminal_foreground() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _check_option_path(what: str, path: Path | str) -> None:
    # The agent's options are comma-separated key=value pairs and JAVA_TOOL_OPTIONS is quoted
    # with double quotes: paths holding these characters cannot be passed through.
    bad = sorted(set(str(path)) & {",", '"', "'", ";"})
    if bad:
        raise TandemError(f"{path}: a {what} path must not contain {' '.join(bad)} (the agent's options are comma-separated)")
