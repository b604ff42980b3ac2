"""The `tandem` command line: one module per command, registered here.

Command modules import only typer and the standard library at module level, so that
`tandem --help` stays fast; heavy libraries (JPype, numba, pandas) load inside commands.
"""
from __future__ import annotations

import gc
import signal
import sys

import typer

app = typer.Typer(
    name="tandem",
    help="JVM pauses and CPython GIL states on one clock.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



@app.callback()
def _root() -> None:
    """JVM pauses and CPython GIL states on one clock."""


# Each module exposes `register(app)`. Order here is the order in `tandem --help`.
_COMMAND_MODULES = ["demo", "record", "attach", "dump", "live", "analyze", "fleet", "pauses", "export", "doctor"]


def _register_all() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"engine.commands.{name}").register(app)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """TandemWarnings (something was lost or approximated) as one line, like errors."""
    from engine.errors import TandemWarning

    if issubclass(category, TandemWarning):
        print(f"tandem: warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


# Allocations of container objects between collections of the youngest generation (CPython's
# default: 700). tandem's own work makes many containers (its imports, pandas' objects) and few
# cycles: at the default an analysis runs hundreds of collections and walks every imported
# module's objects in several full ones.
GC_THRESHOLD = 20_000


def _terminated(_signum, _frame) -> None:
    """SIGTERM ends a command as Ctrl-C does (`tandem record` and `tandem live` forward it to
    their command instead while it runs)."""
    from engine.errors import Terminated

    raise Terminated()


def main() -> None:
    import warnings

    from engine.errors import TandemError, TandemWarning, Terminated, os_error_line

    if sys.argv[1:2] == ["dump"]:  # (before the commands load: a dump's every step runs on what the service leaves)
        from engine.commands.dump import yield_to_the_service

        yield_to_the_service()

    gc.set_threshold(GC_THRESHOLD)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    global _default_showwarning
    _default_showwarning = warnings.showwarning
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", TandemWarning)  # each loss is worth its own line
    _register_all()
    try:
        app()
    except TandemError as err:
        print(f"tandem: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except Terminated:
        print("tandem: terminated", file=sys.stderr)
        sys.exit(Terminated.exit_code)
    except KeyboardInterrupt:
        print("tandem: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as err:  # (the machine's answer, a full disk or a file that cannot be opened: one line)
        print(f"tandem: error: {os_error_line(err)}", file=sys.stderr)
        sys.exit(2)
    finally:
        # The interpreter's exit collects every generation more than once, walking all of pandas',
        # numba's and Arrow's objects (a quarter second after an analysis). Nothing of tandem's
        # waits on that collection: its files and writers are closed, the JVM stops in atexit.
        gc.freeze()
