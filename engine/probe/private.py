"""Private directories: created 0700, never through a planted link, never another user's.

Here, in the probe package, because the probe's standalone copy (engine/probe/build.py: an
interpreter that gets engine.probe through PYTHONPATH) needs it for SESSION/py-<pid>/ and
holds nothing of engine but engine.errors and engine.probe. Sessions (engine/record) and
datasets (engine/fleet) use it too; docs/session.md, "Who can read a session". No pathlib:
every interpreter of a session runs this as it starts (engine/probe/__init__.py says why).
"""
from __future__ import annotations

import os
import stat

from engine.errors import TandemError


def private_directory(path: str | os.PathLike, *, empty: bool = False) -> str | os.PathLike:
    """Creates `path` 0700, or accepts an existing real directory (not a symbolic link) of this user.

    Anything else (a link planted where the session goes, a directory another user made) is
    refused: writing into it would hand what we record to whoever controls it. `empty`:
    an existing directory must also be empty (a session directory is never reused).
    Returns PATH as given.
    """
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        pass
    except OSError as err:
        raise TandemError(f"{path}: cannot create the directory ({err.strerror})") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise TandemError(f"{path}: already exists and is not a directory (a symbolic link?); choose a new -o")
    if info.st_uid != os.geteuid():
        raise TandemError(f"{path}: belongs to another user (uid {info.st_uid}); choose a directory of your own")
    if empty and os.listdir(path):
        raise TandemError(f"{path}: already exists and is not an empty directory; choose a new -o")
    os.chmod(path, 0o700, follow_symlinks=False)
    return path


def process_directory(session: str | os.PathLike, pid: int) -> str:
    """SESSION/py-<pid>, made private for this process; when an earlier process with the same
    pid recorded there (pids come round again over a long session: a Spark executor forks
    thousands of workers; a Python process that execs Python keeps its pid), the first of
    py-<pid>.2, py-<pid>.3, ... that holds nothing: never over another process's files."""
    for candidate in _process_directories(session, pid):
        private_directory(candidate)
        if not os.listdir(candidate):
            return candidate


def latest_process_directory(session: str | os.PathLike, pid: int) -> str:
    """The directory process_directory gave the latest process with PID (SESSION/py-<pid> when
    none is there yet)."""
    latest = None
    for candidate in _process_directories(session, pid):
        if not os.path.isdir(candidate):
            return latest or candidate
        latest = candidate


def _process_directories(session: str | os.PathLike, pid: int):
    """SESSION/py-<pid>, then py-<pid>.2, py-<pid>.3, ...: the names of PID's processes in turn."""
    base = os.path.join(os.fspath(session), f"py-{pid}")
    yield base
    n = 2
    while True:
        yield f"{base}.{n}"
        n += 1
