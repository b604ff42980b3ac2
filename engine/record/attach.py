"""Loading the tandem agent into a JVM that is already running (the Attach API)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from engine.errors import TandemError
from engine.session import JVM_JSON, process_alive, read_json

ATTACH_TIMEOUT_S = 60
# After --duration the agent still writes recording.jfr; allow for a large dump.
CLOSE_TIMEOUT_S = 60


def is_jvm(pid: int) -> bool:
    try:
        return "/libjvm.so" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def check_pid(pid: int) -> None:
    """A running JVM of ours, or a TandemError. The Attach API knocks with SIGQUIT, which
    kills a process that is not a JVM, so we look before we knock."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise TandemError(f"pid {pid}: no such process") from None
    except PermissionError:
        raise TandemError(f"pid {pid}: belongs to another user; attach as that user") from None
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError as err:
        raise TandemError(f"pid {pid}: cannot inspect the process ({err.strerror})") from None
    if "/libjvm.so" not in maps:
        # (`tandem attach` takes a CPython before asking here: this process is neither)
        raise TandemError(f"pid {pid}: not a JVM (no libjvm.so loaded) nor a CPython (no python executable, no libpython3)")


def load_agent(java: Path, jar: Path, pid: int, options: str) -> None:
    """Runs tandem.agent.Attach (jdk.attach) in a small JVM of our own; one-line errors."""
    launcher = [str(java), "-cp", str(jar), "tandem.agent.Attach", str(pid), str(jar), options]
    env = dict(os.environ)
    env.pop("JAVA_TOOL_OPTIONS", None)  # the launcher JVM itself must not record
    try:
        run = subprocess.run(launcher, capture_output=True, text=True, timeout=ATTACH_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise TandemError(f"pid {pid}: attaching did not finish in {ATTACH_TIMEOUT_S} s") from None
    if run.returncode != 0:
        lines = [line for line in run.stderr.splitlines() if line.startswith("tandem-attach:")]
        reason = lines[-1].removeprefix("tandem-attach: ") if lines else (run.stderr.strip() or f"exit code {run.returncode}")
        raise TandemError(f"cannot attach: {reason} (is pid {pid} a JVM 17+ of this user?)")


def jvm_state(jvm_dir: Path) -> str | None:
    return read_json(jvm_dir / JVM_JSON).get("state")


def wait_until_closed(jvm_dir: Path, pid: int, seconds: float, progress=None) -> str:
    """Waits `seconds` (the agent's duration) and then for the agent to close; returns the state.

    Stops waiting early if the JVM exits (its shutdown hook closes the recording too).
    """
    start = time.monotonic()
    task = progress.add_task(f"recording pid {pid}", total=seconds) if progress is not None else None
    deadline = start + seconds + CLOSE_TIMEOUT_S
    while time.monotonic() < deadline:
        state = jvm_state(jvm_dir)
        if state == "closed":
            break
        if not process_alive(pid):
            time.sleep(0.2)  # let a last jvm.json rename land
            break
        if task is not None:
            progress.update(task, completed=min(seconds, time.monotonic() - start))
        time.sleep(0.1)
    if task is not None:
        progress.update(task, completed=seconds)
    return jvm_state(jvm_dir) or "?"


