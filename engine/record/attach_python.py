"""`tandem attach PID` for a running CPython: start the GIL probe inside it through gdb.

CPython 3.11-3.13 have no way to run code in another process (3.14's sys.remote_exec is
the future path), so a debugger does it, as memray's `attach` does: gdb stops the target at
the entry of an allocator (a safe point: no allocator lock held), loads engine/record/
inject.c's library and calls `tandem_inject_run(FILE)`, which only starts a thread; that
thread takes the GIL like any other, runs the Python FILE (start or stop the probe into the
session) and exits. gdb detaches at once: the target is stopped for a few ms per injection.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from engine.errors import TandemError
from engine.session import PROBE_JSON, process_alive, read_json

INJECT_SOURCE = Path(__file__).with_name("inject.c")
GDB_TIMEOUT_S = 60
# Safe points: any thread entering one of these holds no allocator lock.
_BREAKPOINTS = ("malloc", "free", "calloc", "realloc", "PyMem_Malloc", "PyMem_Free", "PyObject_Malloc", "PyObject_Free")
_PTRACE_FIX = ("run tandem as the target's user with ptrace allowed: `sudo sysctl kernel.yama.ptrace_scope=0`, "
               "or as root; in a container, add the capability (`docker run --cap-add=SYS_PTRACE`)")


def is_cpython(pid: int) -> bool:
    """A CPython process: a python executable, or libpython loaded (an embedding host)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        maps = Path(f"/proc/{pid}/maps").read_text()
    except PermissionError:  # not ours to inspect (check_ptrace says why): its name still shows
        try:
            return Path(f"/proc/{pid}/comm").read_text().startswith("python")
        except OSError:
            return False
    except OSError:
        return False
    return exe.startswith("python") or "/libpython3" in maps


def check_ptrace(pid: int) -> None:
    """Refuse, naming the fix, where this process may not ptrace PID."""
    if shutil.which("gdb") is None:
        raise TandemError("attaching to a running CPython needs gdb (apt-get install gdb)")
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        scope = 0  # no Yama: ordinary same-user rules
    root = os.geteuid() == 0
    if scope == 3:
        raise TandemError(f"pid {pid}: kernel.yama.ptrace_scope is 3: no process may be attached to until reboot; "
                          "set it lower at boot (sysctl.d) to use tandem attach")
    if scope == 2 and not root:
        raise TandemError(f"pid {pid}: kernel.yama.ptrace_scope is 2: only root may attach; run tandem attach as root")
    if scope == 1 and not root:
        raise TandemError(f"pid {pid}: kernel.yama.ptrace_scope is 1: only a parent may attach to its child; {_PTRACE_FIX}")
    owner = os.stat(f"/proc/{pid}").st_uid
    if owner != os.geteuid() and not root:
        raise TandemError(f"pid {pid}: belongs to another user (uid {owner}); attach as that user or as root")
    try:  # the kernel's own ptrace access check (PTRACE_MODE_READ), as gdb would meet it
        os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        raise TandemError(f"pid {pid}: ptrace is not permitted here; {_PTRACE_FIX}") from None
    except OSError:
        raise TandemError(f"pid {pid}: no such process") from None


def _helper(cache: Path) -> Path:
    """The injected library, built once per source (one build serves every CPython)."""
    source = INJECT_SOURCE.read_bytes()
    target = cache / "inject" / f"tandem_inject-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.exists():
        return target
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise TandemError("no C compiler (gcc) to build the injection helper")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    run = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", str(INJECT_SOURCE), "-o", str(tmp),
                          "-lpthread"], capture_output=True, text=True)
    if run.returncode != 0:
        raise TandemError(f"building the injection helper failed: {(run.stderr.strip().splitlines() or ['gcc failed'])[-1]}")
    os.replace(tmp, target)
    return target


def inject(pid: int, script: Path, cache: Path) -> None:
    """Run the Python file SCRIPT in a new thread of PID (see the module's docstring)."""
    helper = _helper(cache)
    quoted = json.dumps(json.dumps(str(script)))  # a Python string literal, inside a gdb string
    commands = ["set pagination off", "set confirm off", "set unwindonsignal on", "set breakpoint pending off"]
    for name in _BREAKPOINTS:
        commands.append(f"break {name}")
    commands += [
        "commands 1-%d" % len(_BREAKPOINTS),
        "  disable breakpoints",
        f'  set $handle = (void *) dlopen("{helper}", 2)',
        '  set $run = (int (*)(const char *)) dlsym($handle, "tandem_inject_run")',
        f"  printf \"tandem-inject: %d\\n\", $run ? $run({quoted}) : -2",
        "  detach",
        "  quit",
        "end",
        "continue",
    ]
    gdb_script = script.with_suffix(".gdb")
    gdb_script.write_text("\n".join(commands) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "TANDEM_SESSION")}
    try:
        run = subprocess.run(["gdb", "-nx", "-q", "-batch", "-p", str(pid), "-x", str(gdb_script)], capture_output=True,
                             text=True, timeout=GDB_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TandemError(f"pid {pid}: gdb did not reach a safe point in {GDB_TIMEOUT_S} s (the process allocates "
                          "nothing: is it blocked?)") from None
    output = run.stdout + run.stderr
    if "ptrace: Operation not permitted" in output:
        raise TandemError(f"pid {pid}: ptrace is not permitted here; {_PTRACE_FIX}")
    result = [line for line in output.splitlines() if line.startswith("tandem-inject: ")]
    if not result or result[-1] != "tandem-inject: 0":
        reason = result[-1] if result else (output.strip().splitlines() or ["gdb said nothing"])[-1]
        raise TandemError(f"pid {pid}: injecting into the process failed ({reason})")


_START = '''
import sys
sys.path.insert(0, {root!r})
try:
    import engine.probe
    engine.probe.start_session({session!r})
except BaseException as err:
    from engine.probe.start_hook import note_unprobed
    note_unprobed({session!r}, "attach: %s" % err, say=False)
finally:
    sys.path.remove({root!r})
'''

_STOP = '''
import engine.probe
engine.probe.stop()
'''


def start(pid: int, session: Path, cache: Path) -> Path:
    """Start the probe in PID into SESSION/py-<pid>/; returns that directory once recording."""
    from engine.probe.build import build_probe
    from engine.record.summary import unprobed_interpreters

    root = build_probe(f"/proc/{pid}/exe", cache)
    script = session / f"attach-start-{pid}.py"
    script.write_text(_START.format(root=str(root), session=str(session)))
    inject(pid, script, cache)
    directory = session / f"py-{pid}"
    _wait_for(lambda: _state(directory) == "recording" or unprobed_interpreters(session) or not process_alive(pid),
              f"pid {pid}: the probe did not start")
    if _state(directory) != "recording":
        reasons = [entry.get("reason") for entry in unprobed_interpreters(session)]
        raise TandemError(f"pid {pid}: the probe did not start: {'; '.join(map(str, reasons)) or 'the process exited'}")
    return directory


def stop(pid: int, session: Path, cache: Path) -> str:
    """Stop the probe in PID (if it is still running); returns probe.json's final state."""
    directory = session / f"py-{pid}"
    if process_alive(pid) and _state(directory) == "recording":
        script = session / f"attach-stop-{pid}.py"
        script.write_text(_STOP)
        inject(pid, script, cache)
        _wait_for(lambda: _state(directory) != "recording" or not process_alive(pid), f"pid {pid}: the probe did not stop")
    return _state(directory) or "?"


def _state(directory: Path) -> str | None:
    return read_json(directory / PROBE_JSON).get("state")


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TandemError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05)
