"""Errors a user can act on.

A TandemError is printed by the CLI as one line (`tandem: error: ...`) with exit code 2,
never as a stack trace. Its message names the file (or process) and what is wrong with it.
Anything else escaping is a bug in tandem and keeps its traceback.
"""


class TandemError(Exception):
    """A user-facing error: bad input, missing JDK, unsupported interpreter."""


class TandemWarning(UserWarning):
    """Something was lost or approximated, but results are still produced (e.g. a truncated chunk)."""
