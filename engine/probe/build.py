"""Build the GIL probe for another CPython interpreter and run that interpreter with it.

The extension in the tree is built by setup.py for the venv's Python only. For any other
interpreter (3.12, 3.13, a service's own Python, one embedded in a JVM) `build_probe`
compiles engine/probe/*.c with gcc against that interpreter's headers into a cache
directory, TANDEM_CACHE/probe/<key> (key: start_hook.probe_dir_name, from the interpreter's
version, headers, extension suffix and a digest of the sources), holding a dependency-free
copy of the `engine` package root (engine/__init__.py, engine/errors.py, engine/probe/*.py)
and the start hook as `sitecustomize.py`. Rebuilt only when a source or the interpreter
changes; concurrent builds of one key wait for the first (a lock file).

`tandem record` pre-builds for the interpreters it can find (`prebuild`) and puts
`hook_dir()` on PYTHONPATH (`hook_environment`); an interpreter it did not know builds on
first use (start_hook.py runs `python -m engine.probe.build --info JSON`).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.errors import TandemError
from engine.probe import start_hook

PROBE_DIR = Path(__file__).resolve().parent
ENGINE_DIR = PROBE_DIR.parent
# Files an interpreter needs to `import engine.probe` without tandem's dependencies.
_PYTHON_FILES = [ENGINE_DIR / "__init__.py", ENGINE_DIR / "errors.py"] + sorted(PROBE_DIR.glob("*.py"))
_HOOK_SOURCE = Path(start_hook.__file__)

# As setup.py compiles the venv's build: only PyInit exported, direct calls inside the .so.
COMPILE_FLAGS = ["-O2", "-std=gnu11", "-Wall", "-fvisibility=hidden", "-fno-semantic-interposition", "-fno-plt"]

# Run in the other interpreter (-I: nothing of the service's environment), the same code
# the start hook runs in-process.
_QUERY = (inspect.getsource(start_hook.interpreter_info)
          + "import json, os, sys\nprint(json.dumps(interpreter_info()))\n")


def cache_root() -> Path:
    """$TANDEM_CACHE, else ~/.cache/tandem."""
    return Path(os.environ.get("TANDEM_CACHE") or Path.home() / ".cache" / "tandem")


def describe_interpreter(python: str | os.PathLike) -> dict:
    """Version, include dir, extension suffix and free-threading of PYTHON (start_hook.interpreter_info)."""
    try:
        out = subprocess.run([str(python), "-I", "-c", _QUERY], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise TandemError(f"cannot run {python} to learn its build: {err}") from None
    if out.returncode != 0:
        lines = [line.strip() for line in out.stderr.splitlines() if line.strip()] or [f"exit status {out.returncode}"]
        raise TandemError(f"cannot run {python} to learn its build: {lines[-1] if 'Traceback' in lines[0] else lines[0]}")
    return json.loads(out.stdout)


def sources_digest() -> str:
    """Digest of everything a probe build is made of (sources, Python files, flags)."""
    digest = hashlib.sha256(" ".join(COMPILE_FLAGS).encode())  # a flags-only change must rebuild
    for path in sorted(PROBE_DIR.glob("*.c")) + sorted(PROBE_DIR.glob("*.h")) + _PYTHON_FILES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# Oldest CPython the probe knows the GIL of (docs/probe.md).
MIN_VERSION = (3, 11)


def build_probe(python: str | os.PathLike, cache: Path | None = None) -> Path:
    """Compile the probe for PYTHON; returns the directory to put on PYTHONPATH."""
    return build_for(describe_interpreter(python), cache, str(python))


def build_for(info: dict, cache: Path | None = None, name: str | None = None) -> Path:
    """Compile the probe for the interpreter INFO describes (describe_interpreter); returns
    its cache directory. A TandemError says why it cannot be built."""
    name = name or f"Python {info['version']}"
    if info["gil_disabled"]:
        raise TandemError(f"no GIL to watch: {name} is a free-threaded build of CPython")
    if tuple(int(part) for part in info["version"].split(".")[:2]) < MIN_VERSION:
        raise TandemError(f"Python {info['version']} is older than the probe supports (3.11+)")
    root = (cache or cache_root()) / "probe" / start_hook.probe_dir_name(info, sources_digest())
    built = root / "engine" / "probe" / f"_probe{info['ext_suffix']}"
    if built.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key; the others wait and use it
        if not built.exists():
            _compile(info, root)
    return root


def _compile(info: dict, root: Path) -> None:
    if not Path(info["include"], "Python.h").exists():
        raise TandemError(f"no headers for Python {info['version']} ({info['include']}/Python.h missing; "
                          "install the interpreter's -dev package)")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise TandemError("no C compiler (gcc) to build the GIL probe")
    staging = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    try:
        (staging / "engine" / "probe").mkdir(parents=True)
        for path in _PYTHON_FILES:
            (staging / path.relative_to(ENGINE_DIR.parent)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, staging / path.relative_to(ENGINE_DIR.parent))
        shutil.copy2(_HOOK_SOURCE, staging / "sitecustomize.py")
        command = [gcc, "-shared", "-fPIC", *COMPILE_FLAGS, f"-I{info['include']}", *map(str, sorted(PROBE_DIR.glob("*.c"))),
                   "-o", str(staging / "engine" / "probe" / f"_probe{info['ext_suffix']}"), "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise TandemError(f"building the GIL probe for Python {info['version']} failed: "
                              f"{(result.stderr.strip().splitlines() or ['gcc failed'])[-1]}")
        os.rename(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def hook_dir(cache: Path | None = None) -> Path:
    """A directory holding only the start hook as sitecustomize.py (for PYTHONPATH)."""
    text = _HOOK_SOURCE.read_bytes()
    directory = (cache or cache_root()) / "hook" / hashlib.sha256(text).hexdigest()[:16]
    if not (directory / "sitecustomize.py").exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f"sitecustomize.py.{os.getpid()}.tmp"
        tmp.write_bytes(text)
        os.replace(tmp, directory / "sitecustomize.py")
    return directory


def hook_environment(env: dict, cache: Path | None = None) -> dict:
    """ENV plus what the start hook needs: itself first on PYTHONPATH, the cache, the
    sources' digest, and this Python to build probes on first use."""
    cache = cache or cache_root()
    env = dict(env)
    env["PYTHONPATH"] = _prepend_path(hook_dir(cache), env.get("PYTHONPATH"))
    env["TANDEM_CACHE"] = str(cache)
    env["TANDEM_PROBE_SOURCES"] = sources_digest()
    env["TANDEM_PROBE_BUILDER"] = sys.executable
    return env


def interpreters_to_prebuild(extra: list[str] = (), path: str | None = None) -> list[str]:
    """The interpreters tandem can find before a command starts: its own, `python3` on PATH,
    and those the user named (--python); each named once (by real path)."""
    found = [sys.executable, shutil.which("python3", path=path if path is not None else os.environ.get("PATH")), *extra]
    seen, result = set(), []
    for python in filter(None, found):
        real = os.path.realpath(python)
        if real not in seen:
            seen.add(real)
            result.append(str(python))
    return result


def machine_interpreters(path: str | None = None) -> list[str]:
    """tandem's Python and every `python3` / `python3.N` on PATH (by real path, once each)."""
    import re

    candidates = [sys.executable]
    for directory in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        try:
            names = sorted(os.listdir(directory or "."))
        except OSError:
            continue
        candidates += [os.path.join(directory, name) for name in names if re.fullmatch(r"python3(\.\d+t?)?", name)]
    return interpreters_to_prebuild(candidates[1:], path="")


def probe_plan(python: str, cache: Path | None = None) -> tuple[bool, str]:
    """Whether PYTHON will be probed under `tandem record`, and how (or why not); compiles nothing."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return True, "tandem's own interpreter: in-tree build, started by the .pth hook"
    try:
        info = describe_interpreter(python)
    except TandemError as err:
        return False, str(err)
    if info["gil_disabled"]:
        return False, f"Python {info['version']}: free-threaded, no GIL to watch"
    if tuple(int(part) for part in info["version"].split(".")[:2]) < MIN_VERSION:
        return False, f"Python {info['version']}: older than the probe supports (3.11+)"
    root = (cache or cache_root()) / "probe" / start_hook.probe_dir_name(info, sources_digest())
    if (root / "engine" / "probe" / f"_probe{info['ext_suffix']}").exists():
        return True, f"Python {info['version']}: probe built ({root}), started by the sitecustomize hook"
    if not Path(info["include"], "Python.h").exists():
        return False, f"Python {info['version']}: no headers ({info['include']}/Python.h) to build the probe"
    if not (shutil.which("gcc") or shutil.which("cc")):
        return False, f"Python {info['version']}: no C compiler (gcc) to build the probe"
    return True, f"Python {info['version']}: probe built at `tandem record` start or on first use (~2 s, once)"


def prebuild(pythons: list[str], session: Path | None = None, cache: Path | None = None) -> dict[str, Path | str]:
    """Build (or find) the probe of each of PYTHONS, in parallel: python -> its directory, or
    why it cannot be probed (then also named in SESSION/unprobed/, as the start hook would)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(python: str) -> Path | str:
        key = None
        try:
            info = describe_interpreter(python)
            key = start_hook.probe_dir_name(info, sources_digest())
            return build_for(info, cache, python)
        except TandemError as err:
            # tandem's own interpreter has its in-tree build (the .pth hook): only another
            # interpreter on its prefix would miss this one, and it names itself on first use.
            if session is not None and python != sys.executable:
                start_hook.note_unprobed(str(session), str(err), key, name=python, say=False)
            return str(err)

    with ThreadPoolExecutor(max_workers=max(1, min(len(pythons), os.cpu_count() or 1))) as pool:
        return dict(zip(pythons, pool.map(one, pythons)))


def probe_env(python: str | os.PathLike, base: dict | None = None) -> dict:
    """Environment in which PYTHON can `import engine.probe` (built for it)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = _prepend_path(build_probe(python), env.get("PYTHONPATH"))
    return env


def _prepend_path(directory: Path, existing: str | None) -> str:
    return os.pathsep.join([str(directory)] + ([existing] if existing else []))


def main(argv: list[str]) -> int:
    """`python -m engine.probe.build --info JSON [--cache DIR]`: the start hook's build on first use."""
    parser = argparse.ArgumentParser(prog="python -m engine.probe.build")
    parser.add_argument("--info", required=True, help="the interpreter's start_hook.interpreter_info(), as JSON")
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        print(build_for(json.loads(args.info), args.cache))
    except TandemError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
