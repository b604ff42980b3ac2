"""Errors a user can act on.

A TandemError is printed by the CLI as one line (`tandem: error: ...`) with exit code 2 (or
its own), never as a stack trace. Its message names the file (or process) and what is wrong
with it. An OSError (the machine's answer: a full disk, a file that cannot be opened) is one
line too (`os_error_line`); anything else escaping is a bug in tandem and keeps its traceback.
"""
import os  # (only os: every interpreter tandem records imports this module as it starts)


class TandemError(Exception):
    """A user-facing error: bad input, missing JDK, unsupported interpreter. EXIT_CODE: the
    command's (2, but a command that `tandem record` cannot start gets a shell's 127 or 126)."""

    def __init__(self, *args, exit_code: int = 2):
        super().__init__(*args)
        self.exit_code = exit_code


class Terminated(BaseException):
    """SIGTERM (a `timeout`, a service manager), raised where the command is, so that what undoes
    its work on the way out (temporary files; a probe injected into a process: `tandem attach`
    catches it with Ctrl-C's KeyboardInterrupt) runs. Not a KeyboardInterrupt: typer turns
    that into a silent exit 130."""

    exit_code = 128 + 15


class TandemWarning(UserWarning):
    """Something was lost or approximated, but results are still produced (e.g. a truncated chunk)."""


def os_error_line(err: OSError, path=None, doing: str = "") -> str:
    """An OSError met DOING into PATH, in one line: the file Python's own I/O names; else PATH,
    for a write (Arrow's writers name no file, and their short writes, "N requested and M
    written", carry no errno: the file system took part of it, as a full one does, and
    Python's own writes to an open file name none); else the error's own words (Arrow's
    readers name the file)."""
    import errno  # (here: this module imports only os at start)

    if err.filename:
        return f"{err.filename}: {err.strerror or err}"
    if path is None or ("writ" not in str(err) and err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)):
        return str(err)
    if err.errno:
        reason = os.strerror(err.errno)
    elif " requested and " in str(err):
        reason = f"no room left: {err}"
    else:
        reason = str(err)
    return f"{path}: {reason} ({doing})"


class writing_into:
    """`with writing_into(PATH, DOING):` an OSError met inside (a full disk, a read-only
    directory) leaves as a TandemError of one line (`os_error_line`); anything else as it is.
    (A class, not contextlib: this module imports only os.)"""

    def __init__(self, path, doing: str):
        self.path, self.doing = path, doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, traceback) -> bool:
        if isinstance(err, OSError):
            raise TandemError(os_error_line(err, self.path, self.doing)) from None
        return False
