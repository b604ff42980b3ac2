"""`tandem attach PID` for a running CPython: start the GIL probe inside it by injection.

CPython 3.11-3.13 have no way to run code in another process (3.14's sys.remote_exec is
the future path), so a library is loaded into the target with ptrace, as memray's and
pystack's attach do. engine/record/inject.c's library has a constructor that only starts a
thread; that thread takes the GIL like any other, runs a Python file (start or stop the
probe into the session) and exits. Each injection loads a fresh copy of the library (a path
already loaded runs no constructor) with the Python file beside it: `X.so` runs `X.py`.

The library is loaded by pyinjector (kubo/injector: a remote dlopen that saves and
restores only the general registers it changes), in a thread stopped inside a blocking
system call: there it holds no allocator or loader lock and keeps no live vector registers
across the call, so dlopen is safe. gdb is the fallback (pyinjector missing, or no thread
waits in a system call: a CPU-bound single thread); it stops the target at an allocator's
entry and calls dlopen, which needs gdb to restore the extended register state, and that
fails on CPUs with Intel AMX with gdb 13 ("Couldn't write extended state status").
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from engine.errors import TandemError
from engine.probe.build import build_probe
from engine.probe.private import latest_process_directory
from engine.record.session import unprobed_interpreters
from engine.session import PROBE_JSON, process_alive, read_json


INJECT_SOURCE = Path(__file__).with_name("inject.c")
GDB_TIMEOUT_S = 60
# How long pyinjector waits for a thread of the target to block in a system call.
SAFE_POINT_WAIT_S = 5.0
# Safe points for gdb: any thread entering one of these holds no allocator lock.
_BREAKPOINTS = ("malloc", "free", "calloc", "realloc", "PyMem_Malloc", "PyMem_Free", "PyObject_Malloc", "PyObject_Free")
_PTRACE_FIX = ("run tandem as the target's user with ptrace allowed: `sudo sysctl kernel.yama.ptrace_scope=0`, "
               "or as root; in a container, add the capability (`docker run --cap-add=SYS_PTRACE`)")
# System calls a thread waits in, by number: a thread stopped in one of them is inside a libc
# wrapper that holds no lock dlopen takes (unlike mmap or brk, which malloc calls holding its
# arena's lock). futex last: a thread may wait there for a lock another thread holds.
_WAITING_SYSCALLS = {
    "x86_64": {35: "nanosleep", 230: "clock_nanosleep", 7: "poll", 23: "select", 270: "pselect6", 271: "ppoll",
               232: "epoll_wait", 281: "epoll_pwait", 441: "epoll_pwait2", 0: "read", 45: "recvfrom", 47: "recvmsg",
               43: "accept", 288: "accept4", 61: "wait4", 247: "waitid", 34: "pause", 130: "rt_sigsuspend",
               128: "rt_sigtimedwait", 202: "futex"},
    "aarch64": {101: "nanosleep", 115: "clock_nanosleep", 72: "pselect6", 73: "ppoll", 22: "epoll_pwait",
                441: "epoll_pwait2", 63: "read", 207: "recvfrom", 212: "recvmsg", 202: "accept", 242: "accept4",
                260: "wait4", 95: "waitid", 133: "rt_sigsuspend", 137: "rt_sigtimedwait", 98: "futex"},
}


class InjectionFailed(Exception):
    """One way of injecting did not work here (the reason is the message); another may."""


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


def ptrace_scope() -> int:
    """kernel.yama.ptrace_scope (0 where there is no Yama: the ordinary same-user rules)."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return 0


def scope_refusal(scope: int, root: bool) -> str | None:
    """Why kernel.yama.ptrace_scope forbids attaching to a process that is not our child, or None."""
    if scope == 3:
        return "kernel.yama.ptrace_scope is 3: no process may be attached to until reboot; set it lower at boot (sysctl.d)"
    if scope == 2 and not root:
        return "kernel.yama.ptrace_scope is 2: only root may attach; run tandem attach as root"
    if scope == 1 and not root:
        return f"kernel.yama.ptrace_scope is 1: only a parent may attach to its child; {_PTRACE_FIX}"
    return None


def pyinjector_missing() -> str | None:
    """Why pyinjector cannot be used here, or None."""
    try:
        import pyinjector  # noqa: F401  (a dependency of tandem; a broken install falls back to gdb)
    except ImportError as err:
        return f"pyinjector is not importable ({err}); `pip install pyinjector`"
    return None


def check_ptrace(pid: int) -> None:
    """Refuse, naming the fix, where this process may not ptrace PID."""
    if pyinjector_missing() and shutil.which("gdb") is None:
        raise TandemError(f"attaching to a running CPython needs pyinjector (pip install pyinjector) or gdb "
                          f"(apt-get install gdb): {pyinjector_missing()}")
    refusal = scope_refusal(ptrace_scope(), os.geteuid() == 0)
    if refusal:
        raise TandemError(f"pid {pid}: {refusal}")
    owner = os.stat(f"/proc/{pid}").st_uid
    if owner != os.geteuid() and os.geteuid() != 0:
        raise TandemError(f"pid {pid}: belongs to another user (uid {owner}); attach as that user or as root")
    try:  # the kernel's own ptrace access check (PTRACE_MODE_READ), as the injector would meet it
        os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        raise TandemError(f"pid {pid}: ptrace is not permitted here; {_PTRACE_FIX}") from None
    except OSError:
        raise TandemError(f"pid {pid}: no such process") from None


def gdb_call_problem() -> str | None:
    """Why gdb's inferior calls (the fallback's dlopen) fail here, tried on a child `sleep`; None
    when one works. On CPUs with Intel AMX gdb 13 cannot restore the thread's extended state."""
    if shutil.which("gdb") is None:
        return "gdb is not installed (apt-get install gdb)"
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.05)  # past exec: sleep's libc is mapped
        run = subprocess.run(["gdb", "-nx", "-q", "-batch", "-p", str(child.pid), "-ex", "call (int) getpid()"],
                             capture_output=True, text=True, timeout=GDB_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"gdb did not answer in {GDB_TIMEOUT_S} s"
    finally:
        child.kill()
        child.wait()
    if f"= {child.pid}" in run.stdout:
        return None
    output = (run.stdout + run.stderr).splitlines()
    problems = [line for line in output if "rror" in line or "ouldn't" in line or "not permitted" in line]
    return (problems or output or ["gdb said nothing"])[0].strip()


def build_library(cache: Path) -> Path:
    """The injected library, built once per source (one build serves every CPython)."""
    source = INJECT_SOURCE.read_bytes()
    target = cache / "inject" / f"tandem_inject-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.exists():
        return target
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise TandemError("no C compiler (gcc) to build the injection library")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    run = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", str(INJECT_SOURCE), "-o", str(tmp),
                          "-lpthread", "-ldl"], capture_output=True, text=True)
    if run.returncode != 0:
        raise TandemError(f"building the injection library failed: {(run.stderr.strip().splitlines() or ['gcc failed'])[-1]}")
    os.replace(tmp, target)
    return target


def run_in(pid: int, code: str, directory: Path, cache: Path) -> tuple[str, Path]:
    """Run the Python CODE in a new thread of PID. Returns how it was injected (a phrase) and the
    injected library's copy, whose `.py` sibling the target reads (remove both with `forget`
    once the target has acted on it). The copy lives in DIRECTORY, the session, which the target
    writes its probe's files into too."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".attach-{pid}-", suffix=".so")
    library = Path(name)
    try:
        library.with_suffix(".py").write_text(code)
        with os.fdopen(fd, "wb") as copy:
            copy.write(build_library(cache).read_bytes())
        for path in (library, library.with_suffix(".py")):  # as any file tandem writes (mkstemp's is 0600)
            path.chmod(0o644)
        return inject(pid, library), library
    except BaseException:
        forget(library)
        raise


def forget(library: Path) -> None:
    for path in (library, library.with_suffix(".py"), library.with_suffix(".gdb")):
        path.unlink(missing_ok=True)


def inject(pid: int, library: Path) -> str:
    """Load LIBRARY into PID: pyinjector first, gdb if that cannot. Returns how, as a phrase."""
    reason = pyinjector_missing()
    if reason is None:
        try:
            return inject_with_pyinjector(pid, library)
        except InjectionFailed as err:
            reason = str(err)
    if shutil.which("gdb") is None:
        raise TandemError(f"pid {pid}: injecting the probe failed: {reason}; gdb, the fallback, is not installed")
    try:
        inject_with_gdb(pid, library)
    except InjectionFailed as err:
        raise TandemError(f"pid {pid}: injecting the probe failed: {reason}; through gdb: {err}") from None
    return f"gdb, as {reason}"


def _syscall(pid: int, tid: int) -> int | None:
    """The system call TID waits in, or None (running, or in user space)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
    except OSError:
        return None
    if not fields or fields[0] == "running" or int(fields[0]) < 0:
        return None
    return int(fields[0])


def _waiting_threads(pid: int, waits: dict[int, str]) -> list[int]:
    """Threads of PID now waiting in one of WAITS, futex waiters last."""
    try:
        tids = sorted(int(task) for task in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    found = [(tid, _syscall(pid, tid)) for tid in tids]
    futex = {number for number, name in waits.items() if name == "futex"}
    return [tid for tid, call in sorted(found, key=lambda item: item[1] in futex) if call in waits]


def inject_with_pyinjector(pid: int, library: Path) -> str:
    """Load LIBRARY in a thread of PID stopped while it waits in a system call (the module's docstring)."""
    import pyinjector

    waits = _WAITING_SYSCALLS.get(platform.machine())
    if waits is None:
        raise InjectionFailed(f"pyinjector's safe point is not known on {platform.machine()}")
    deadline = time.monotonic() + SAFE_POINT_WAIT_S
    while time.monotonic() < deadline:
        if not process_alive(pid):
            raise TandemError(f"pid {pid}: the process exited")
        for tid in _waiting_threads(pid, waits):
            try:
                with pyinjector.attach(tid) as injector:
                    call = _syscall(pid, tid)  # read again while the thread is stopped: no race
                    if call in waits:
                        injector.inject(os.fsencode(library))
                        return f"pyinjector, in thread {tid} stopped in {waits[call]}"
            except pyinjector.api.LinuxInjectorPermissionError:
                raise TandemError(f"pid {pid}: ptrace is not permitted here; {_PTRACE_FIX}") from None
            except pyinjector.PyInjectorError as err:
                if not process_alive(pid):
                    raise TandemError(f"pid {pid}: the process exited") from None
                if not Path(f"/proc/{pid}/task/{tid}").exists():
                    continue  # that thread ended meanwhile
                raise InjectionFailed(f"pyinjector failed ({' '.join(str(err).split())})") from None
        time.sleep(0.01)
    raise InjectionFailed(f"no thread of pid {pid} waited in a system call within {SAFE_POINT_WAIT_S:g} s, "
                          "where pyinjector can load a library safely")


def inject_with_gdb(pid: int, library: Path) -> None:
    """Load LIBRARY in PID through gdb's call of dlopen at an allocator's entry."""
    commands = ["set pagination off", "set confirm off", "set unwindonsignal on", "set breakpoint pending off"]
    for name in _BREAKPOINTS:
        commands.append(f"break {name}")
    commands += [
        "commands 1-%d" % len(_BREAKPOINTS),
        "  disable breakpoints",
        f"  printf \"tandem-inject: %d\\n\", ((void *) dlopen({json.dumps(str(library))}, 2)) != 0",
        "  detach",
        "  quit",
        "end",
        "continue",
    ]
    gdb_script = library.with_suffix(".gdb")
    gdb_script.write_text("\n".join(commands) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "TANDEM_SESSION")}
    try:
        run = subprocess.run(["gdb", "-nx", "-q", "-batch", "-p", str(pid), "-x", str(gdb_script)], capture_output=True,
                             text=True, timeout=GDB_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InjectionFailed(f"gdb did not reach a safe point in {GDB_TIMEOUT_S} s (the process allocates "
                              "nothing: is it blocked?)") from None
    output = run.stdout + run.stderr
    if "ptrace: Operation not permitted" in output:
        raise TandemError(f"pid {pid}: ptrace is not permitted here; {_PTRACE_FIX}")
    result = [line for line in output.splitlines() if line.startswith("tandem-inject: ")]
    if not result or result[-1] != "tandem-inject: 1":
        problems = [line for line in output.splitlines() if "rror" in line or "annot" in line]
        reason = (problems or result or output.strip().splitlines() or ["gdb said nothing"])[-1]
        raise InjectionFailed(f"gdb's call of dlopen failed ({reason.strip()})")


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
from engine.probe import memory
memory.stop()  # joined before the probe says closed: no thread of ours stays
engine.probe.stop()
'''


def start(pid: int, session: Path, cache: Path) -> tuple[Path, str]:
    """Start the probe in PID into SESSION/py-<pid>/; returns that directory once recording, and
    how the probe was injected (a phrase)."""
    root = build_probe(f"/proc/{pid}/exe", cache)
    how, library = run_in(pid, _START.format(root=str(root), session=str(session)), session, cache)
    try:
        _wait_for(lambda: _state(Path(latest_process_directory(session, pid))) == "recording"
                  or unprobed_interpreters(session) or not process_alive(pid), f"pid {pid}: the probe did not start")
    finally:
        forget(library)
    directory = Path(latest_process_directory(session, pid))
    if _state(directory) != "recording":
        reasons = [entry.get("reason") for entry in unprobed_interpreters(session)]
        raise TandemError(f"pid {pid}: the probe did not start: {'; '.join(map(str, reasons)) or 'the process exited'}")
    return directory, how


def stop(pid: int, session: Path, cache: Path) -> str:
    """Stop the probe in PID (if it is still running); returns probe.json's final state."""
    directory = Path(latest_process_directory(session, pid))
    if process_alive(pid) and _state(directory) == "recording":
        _, library = run_in(pid, _STOP, session, cache)
        try:
            _wait_for(lambda: _state(directory) != "recording" or not process_alive(pid),
                      f"pid {pid}: the probe did not stop")
        finally:
            forget(library)
    return _state(directory) or "?"


def _state(directory: Path) -> str | None:
    return read_json(directory / PROBE_JSON).get("state")


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TandemError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05)
