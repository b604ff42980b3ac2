"""The session directory (docs/session.md) from the recorder's side: create it, describe it.

A session is private to the user who records it: its directories are 0700 and its files
0600 (docs/session.md, "Who can read a session"). tandem's own process creates files with
umask 077 once it starts a session; the command it runs keeps the user's umask.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from engine.clock.pair import clock_pair
from engine.probe.private import private_directory
from engine.probe.start_hook import UNPROBED_DIR
from engine.session import SESSION_JSON, current_boot_id, read_json


_user_umask: int | None = None


def keep_private() -> None:
    """From now on this process creates files 0600 and directories 0700."""
    global _user_umask
    previous = os.umask(0o077)
    if _user_umask is None:
        _user_umask = previous


def user_umask() -> int:
    """The umask the user had before keep_private() (for the command tandem runs), or -1: unchanged."""
    return -1 if _user_umask is None else _user_umask


def create_session(path: Path, description: dict) -> Path:
    """Makes SESSION (absolute, private) and writes session.json with `description` plus both clocks."""
    path = Path(path).expanduser().absolute()
    keep_private()
    private_directory(path, empty=True)
    start_monotonic_ns, start_wall_ns, start_error_ns = clock_pair()
    write_description(path, {
        **description,
        "start_monotonic_ns": start_monotonic_ns,
        "start_wall_ns": start_wall_ns,
        "start_clock_error_ns": start_error_ns,
        "boot_id": current_boot_id(),
        "hostname": socket.gethostname(),
        "recorder_pid": os.getpid(),
    })
    return path


def finish_session(path: Path, **fields) -> str | None:
    """Adds the end (exit code, end time) to session.json; returns why it could not, or None.

    The session directory may have gone or turned read-only while the command ran: that
    is said in one line by the caller, and never changes the command's exit code."""
    if not path.is_dir():
        return f"{path}: the session directory is gone (deleted while recording); nothing to summarize"
    description = read_description(path)
    end_monotonic_ns, end_wall_ns, end_error_ns = clock_pair()
    description.update(fields, end_monotonic_ns=end_monotonic_ns, end_wall_ns=end_wall_ns, end_clock_error_ns=end_error_ns)
    try:
        write_description(path, description)
    except OSError as err:
        return f"{path}: cannot write session.json at the end ({err.strerror}); what was recorded before stays"
    return None


def read_description(path: Path) -> dict:
    return read_json(path / SESSION_JSON)


def write_description(path: Path, description: dict) -> None:
    # Through a rename: an analysis started meanwhile never reads half a file.
    tmp = path / "session.json.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(description, indent=2) + "\n")
        os.replace(tmp, path / SESSION_JSON)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half file left behind (disk full)
        raise


def unprobed_interpreters(session: Path) -> list[dict]:
    """The interpreters that ran without the GIL probe, with the reason (SESSION/unprobed/)."""
    return [entry for entry in map(read_json, sorted((session / UNPROBED_DIR).glob("*.json"))) if entry]
