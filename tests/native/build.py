"""Build and import `_ring_selftest`: the ring's test and benchmark entry points.

`_ring_stress`, `_tsc_selftest` and `_ring_bench` (tests/native/ring_selftest.c) drive the
ring of engine/probe/ring.c with real pthreads. They are for the tests (tests/test_ring.py,
tests/test_ring_fuzz.py) and the benchmark (bench/bench_ring.py) only, so they are not in
the probe extension users install: this module compiles them with gcc, with ring.c and
tsc.c and the probe's own flags (engine.probe.build.COMPILE_FLAGS, so the ring's code is the
shipped one's), into an extension of their own.

The build is cached outside the repository, beside the probe builds of other interpreters:
TANDEM_CACHE/ring-selftest/<key>/_ring_selftest<ext suffix>, the key naming the
interpreter (version, headers, extension suffix) and a digest of the sources and flags. So
it is compiled once (about a second) until a source or the interpreter changes; a build
writes a temporary file and renames it into place, so concurrent builds (pytest-xdist
workers) never see a partial one.

    from native.build import load          # in the tests (pytest puts tests/ on sys.path)
    from tests.native.build import load    # in bench/ (`python -m bench` from the repo root)
    ring_selftest = load()
    ring_selftest._ring_stress(...)

A process of another interpreter (or a child process) imports it as `import _ring_selftest`
with `environment(python)`, which puts its directory on PYTHONPATH.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.probe import build as probe_build
from engine.probe import start_hook

MODULE = "_ring_selftest"
HERE = Path(__file__).resolve().parent
SELFTEST_SOURCE = HERE / "ring_selftest.c"
# The parts of the probe the ring needs (their #includes: ring.h, ring_fast.h, tsc.h).
RING_SOURCES = [probe_build.PROBE_DIR / "ring.c", probe_build.PROBE_DIR / "tsc.c"]


class Unavailable(Exception):
    """No compiler or no Python headers here: the module cannot be built (tests skip)."""


def sources_digest() -> str:
    """Digest of what the module is built from: its sources, the probe's headers, the flags."""
    digest = hashlib.sha256(" ".join(probe_build.COMPILE_FLAGS).encode())
    for path in [SELFTEST_SOURCE, *RING_SOURCES, *sorted(probe_build.PROBE_DIR.glob("*.h"))]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(python: str | os.PathLike | None = None, cache: Path | None = None) -> Path:
    """Compile the module for PYTHON (default: this interpreter) unless already built;
    returns the directory holding it (for sys.path / PYTHONPATH)."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        info = start_hook.interpreter_info()
    else:
        info = probe_build.describe_interpreter(python)
    directory = (cache or probe_build.cache_root()) / "ring-selftest" / start_hook.probe_dir_name(info, sources_digest())
    target = directory / f"{MODULE}{info['ext_suffix']}"
    if not target.exists():
        _compile(info, target)
    return directory


def _compile(info: dict, target: Path) -> None:
    if not Path(info["include"], "Python.h").exists():
        raise Unavailable(f"no headers for Python {info['version']} ({info['include']}/Python.h missing)")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise Unavailable("no C compiler (gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        command = [gcc, "-shared", "-fPIC", *probe_build.COMPILE_FLAGS, f"-I{info['include']}", f"-I{probe_build.PROBE_DIR}",
                   str(SELFTEST_SOURCE), *map(str, RING_SOURCES), "-o", tmp, "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building {MODULE} for Python {info['version']} failed:\n{result.stderr}")
        os.chmod(tmp, 0o755)  # (mkstemp's 0600 otherwise)
        os.replace(tmp, target)  # atomic: a concurrent build replaces it with the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load():
    """The module, built for this interpreter and imported (once per process)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    directory = build()
    spec = importlib.util.spec_from_file_location(MODULE, directory / f"{MODULE}{start_hook.interpreter_info()['ext_suffix']}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def environment(python: str | os.PathLike | None = None, base: dict | None = None) -> dict:
    """BASE (default: os.environ) with the module built for PYTHON first on PYTHONPATH, so
    that PYTHON can `import _ring_selftest`."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(build(python))] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
