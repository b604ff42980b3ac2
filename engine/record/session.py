"""The session directory (docs/session.md) from the recorder's side: create it, describe it."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from engine.errors import TandemError


def create_session(path: Path, description: dict) -> Path:
    """Makes SESSION (absolute) and writes session.json with `description` plus both clocks."""
    path = Path(path).expanduser().absolute()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise TandemError(f"{path}: already exists and is not an empty directory; choose a new -o")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TandemError(f"{path}: cannot create the session directory ({err.strerror})") from None
    start_monotonic_ns, start_wall_ns = clock_pair()
    write_description(path, {
        **description,
        "start_monotonic_ns": start_monotonic_ns,
        "start_wall_ns": start_wall_ns,
        "boot_id": boot_id(),
        "hostname": socket.gethostname(),
        "recorder_pid": os.getpid(),
    })
    return path


def finish_session(path: Path, **fields) -> None:
    """Adds the end (exit code, end time) to session.json."""
    description = read_description(path)
    end_monotonic_ns, end_wall_ns = clock_pair()
    description.update(fields, end_monotonic_ns=end_monotonic_ns, end_wall_ns=end_wall_ns)
    write_description(path, description)


def read_description(path: Path) -> dict:
    try:
        return json.loads((path / "session.json").read_text())
    except (OSError, ValueError):
        return {}


def write_description(path: Path, description: dict) -> None:
    # Through a rename: an analysis started meanwhile never reads half a file.
    tmp = path / "session.json.tmp"
    tmp.write_text(json.dumps(description, indent=2) + "\n")
    os.replace(tmp, path / "session.json")


def clock_pair() -> tuple[int, int]:
    """(CLOCK_MONOTONIC, wall clock) in ns, read back to back; the agent's jvm.json has the same pair."""
    before = time.monotonic_ns()
    wall = time.time_ns()
    after = time.monotonic_ns()
    return before + (after - before) // 2, wall


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
