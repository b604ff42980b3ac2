"""Build the GIL probe for another CPython interpreter and run that interpreter with it.

The extension in the tree is built by setup.py for the venv's Python only. Tests and users
that want the probe inside another interpreter (3.12, 3.13, a service's own Python) call
`build_probe(python)`: it compiles engine/probe/*.c with gcc against that interpreter's
headers into a cache directory holding a dependency-free copy of the `engine` package root
(engine/__init__.py, engine/errors.py, engine/probe/*.py), and returns that directory:
put it on PYTHONPATH (`probe_env`). Rebuilt only when a source or the interpreter changes.

The directory also holds a `sitecustomize.py` start hook: `.pth` files are only read from
site directories, so an interpreter that gets the probe through PYTHONPATH starts it from
there when TANDEM_SESSION is set (and then runs the next sitecustomize on sys.path, if any).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine.errors import TandemError

PROBE_DIR = Path(__file__).resolve().parent
ENGINE_DIR = PROBE_DIR.parent
# Files an interpreter needs to `import engine.probe` without tandem's dependencies.
_PYTHON_FILES = [ENGINE_DIR / "__init__.py", ENGINE_DIR / "errors.py"] + sorted(PROBE_DIR.glob("*.py"))

# As setup.py compiles the venv's build: only PyInit exported, direct calls inside the .so.
COMPILE_FLAGS = ["-O2", "-std=gnu11", "-Wall", "-fvisibility=hidden", "-fno-semantic-interposition", "-fno-plt"]

_QUERY = (
    "import json, sys, sysconfig; print(json.dumps({"
    "'version': sys.version.split()[0], 'include': sysconfig.get_paths()['include'], "
    "'ext_suffix': sysconfig.get_config_var('EXT_SUFFIX'), "
    "'gil_disabled': bool(sysconfig.get_config_var('Py_GIL_DISABLED')), 'executable': sys.executable}))"
)


_SITECUSTOMIZE = '''"""tandem start hook for interpreters that get engine.probe through PYTHONPATH.

Written by engine/probe/build.py. Starts the GIL probe when TANDEM_SESSION is set, then
imports the next `sitecustomize` on sys.path so that one still runs.
"""
import os
import sys

if os.environ.get("TANDEM_SESSION"):
    import engine.probe.autostart

    engine.probe.autostart.run()


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    this_module = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401  (the next one, if any)
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules:  # none further: site's import must find us
            sys.modules["sitecustomize"] = this_module


_run_next_sitecustomize()
'''


def cache_root() -> Path:
    """$TANDEM_CACHE, else ~/.cache/tandem."""
    return Path(os.environ.get("TANDEM_CACHE") or Path.home() / ".cache" / "tandem")


def describe_interpreter(python: str | os.PathLike) -> dict:
    """Version, include dir, extension suffix and free-threading of PYTHON."""
    try:
        out = subprocess.run([str(python), "-I", "-c", _QUERY], check=True, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        raise TandemError(f"cannot run {python} to learn its build: {err}") from None
    return json.loads(out.stdout)


def build_probe(python: str | os.PathLike, cache: Path | None = None) -> Path:
    """Compile the probe for PYTHON; returns the directory to put on PYTHONPATH."""
    info = describe_interpreter(python)
    if info["gil_disabled"]:
        raise TandemError(f"no GIL to watch: {python} is a free-threaded build of CPython")
    sources = sorted(PROBE_DIR.glob("*.c"))
    headers = sorted(PROBE_DIR.glob("*.h"))
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode())
    digest.update(_SITECUSTOMIZE.encode())
    digest.update(" ".join(COMPILE_FLAGS).encode())  # a flags-only change must rebuild
    for path in sources + headers + _PYTHON_FILES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    root = (cache or cache_root()) / "probe" / f"py{info['version']}-{digest.hexdigest()[:16]}"
    if (root / "engine" / "probe" / f"_probe{info['ext_suffix']}").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    try:
        (staging / "engine" / "probe").mkdir(parents=True)
        for path in _PYTHON_FILES:
            shutil.copy2(path, staging / path.relative_to(ENGINE_DIR.parent))
        (staging / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        gcc = shutil.which("gcc") or shutil.which("cc")
        if gcc is None:
            raise TandemError("no C compiler (gcc) to build the GIL probe")
        command = [gcc, "-shared", "-fPIC", *COMPILE_FLAGS, f"-I{info['include']}",
                   *map(str, sources), "-o", str(staging / "engine" / "probe" / f"_probe{info['ext_suffix']}"), "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise TandemError(f"building the GIL probe for Python {info['version']} failed: {result.stderr.strip().splitlines()[-1:]}")
        try:
            os.rename(staging, root)
        except OSError:  # another process built it at the same time: use theirs
            if not root.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def probe_env(python: str | os.PathLike, base: dict | None = None) -> dict:
    """Environment in which PYTHON can `import engine.probe` (built for it)."""
    env = dict(os.environ if base is None else base)
    root = build_probe(python)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
