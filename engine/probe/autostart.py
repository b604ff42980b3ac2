"""Start the GIL probe in every interpreter of a `tandem record` session.

A one-line `.pth` file in site-packages (the pattern of coverage.py's process-start hook)
runs at interpreter start-up:

    import os; os.environ.get("TANDEM_SESSION") and __import__("engine.probe.autostart").probe.autostart.run()

With TANDEM_SESSION unset this costs one dict lookup (site has already imported os).
With it set, the probe records into $TANDEM_SESSION/py-<pid>/ (docs/session.md); a
failure names the interpreter once in the session (start_hook.note_unprobed) and never
stops the user's program. Interpreters that do not read this site-packages get the probe
through start_hook.py, a `sitecustomize` that `tandem record` puts on PYTHONPATH.

    python -m engine.probe.autostart install [SITE_DIR]   # done by `make build`
    python -m engine.probe.autostart uninstall [SITE_DIR]
"""
from __future__ import annotations

import os
import sys

PTH_NAME = "tandem-probe-autostart.pth"
PTH_LINE = (
    'import os; os.environ.get("TANDEM_SESSION") and '
    '__import__("engine.probe.autostart").probe.autostart.run()\n'
)


def in_sub_interpreter() -> bool:
    """True in a sub-interpreter. Its site runs this hook too (Jep's SubInterpreter, the
    `_interpreters` module), but the probe of the process's main interpreter already sees
    its threads (legacy ones share the main GIL; the GOT method learns an own GIL at its
    first take), and an isolated one cannot even import the probe (single-phase init)."""
    try:
        import _interpreters as interpreters  # 3.13: ids come as (id, whence)
    except ImportError:
        try:
            import _xxsubinterpreters as interpreters  # 3.11, 3.12
        except ImportError:
            return False

    def number(interp) -> int:
        return int(interp[0] if isinstance(interp, tuple) else interp)

    return number(interpreters.get_current()) != number(interpreters.get_main())


_ran = False


def segment_options(environ) -> dict:
    """The flight recorder's segment rotation (TANDEM_PROBE_SEGMENT_BYTES, TANDEM_PROBE_SEGMENT_MS,
    set by `tandem record --max-size/--max-age`), as engine.probe.start takes it; {} when unset."""
    options = {}
    for name, key in (("TANDEM_PROBE_SEGMENT_BYTES", "segment_bytes"), ("TANDEM_PROBE_SEGMENT_MS", "segment_ms")):
        value = environ.get(name, "")
        if value.isdigit():
            options[key] = int(value)
    return options


def run() -> None:
    """Start recording into $TANDEM_SESSION (backend from $TANDEM_PROBE_BACKEND, default auto;
    TANDEM_PROBE_WAIT_WHEN_FULL=1: a thread waits for the drain rather than drop an event;
    segment_options: the flight recorder's rotation); with TANDEM_SPANS, every OpenTelemetry
    TracerProvider adds thread.id to its spans (span_hook.py)."""
    global _ran
    session = os.environ.get("TANDEM_SESSION")
    if _ran or not session or in_sub_interpreter():
        return
    # Once per process: site runs a venv's .pth files twice when the venv's lib64 is a link
    # to lib (both paths are added), and a refusal (disk full) must be said once.
    _ran = True
    try:
        import engine.probe

        if engine.probe.backend() is None:
            engine.probe.start_session(session, backend=os.environ.get("TANDEM_PROBE_BACKEND", "auto"),
                                       wait_when_full=os.environ.get("TANDEM_PROBE_WAIT_WHEN_FULL") == "1",
                                       **segment_options(os.environ))
    except Exception as err:  # never break the interpreter being observed
        from engine.probe.start_hook import note_unprobed

        note_unprobed(session, str(err))
    if os.environ.get("TANDEM_SPANS"):  # tandem receives this command's spans: they say their thread
        from engine.probe import span_hook

        span_hook.install()


def _site_dir(site_dir: str | os.PathLike | None):
    # Imported here, not at the top: run() is on every session interpreter's start path.
    import sysconfig
    from pathlib import Path

    return Path(site_dir or sysconfig.get_paths()["purelib"])


def install(site_dir: str | os.PathLike | None = None):
    """Write the .pth hook into SITE_DIR (default: this interpreter's purelib); returns its path."""
    target = _site_dir(site_dir) / PTH_NAME
    if not target.exists() or target.read_text() != PTH_LINE:
        target.write_text(PTH_LINE)
    return target


def uninstall(site_dir: str | os.PathLike | None = None) -> None:
    (_site_dir(site_dir) / PTH_NAME).unlink(missing_ok=True)


if __name__ == "__main__":
    action = sys.argv[1] if len(sys.argv) > 1 else "install"
    where = sys.argv[2] if len(sys.argv) > 2 else None
    if action == "install":
        print(install(where))
    elif action == "uninstall":
        uninstall(where)
    else:
        sys.exit("usage: python -m engine.probe.autostart install|uninstall [SITE_DIR]")
