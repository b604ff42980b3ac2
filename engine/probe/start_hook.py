"""tandem's start hook for every CPython a session starts, whatever its prefix or version.

`tandem record` (and `tandem live -- cmd`) copies this file as `sitecustomize.py` into a
directory of its own and puts that directory first on PYTHONPATH; site imports it at every
interpreter start (subprocesses, multiprocessing workers, interpreters embedded in a JVM
with Jep). The `.pth` hook (autostart.py) only reaches interpreters that read tandem's own
site-packages; this one reaches the others. With TANDEM_SESSION set it:

1. describes this interpreter (version, include dir, extension suffix, free-threading),
   in-process: an embedded interpreter has no executable of its own to ask;
2. finds the probe built for exactly that in the cache (TANDEM_CACHE/probe/<key>, the key
   is `probe_dir_name`), or builds it once by running tandem's own Python
   (TANDEM_PROBE_BUILDER) on `engine.probe.build`; a failed build is remembered so later
   starts do not compile again;
3. imports `engine.probe` from there and starts recording into $TANDEM_SESSION/py-<pid>/;
4. runs the next `sitecustomize` on sys.path (the user's own, if any).

An interpreter that cannot be probed is named once per session in
$TANDEM_SESSION/unprobed/ (docs/session.md) with the reason, and runs on unharmed.
Standard library only; must import on every CPython 3 (no syntax newer than 3.6).
"""
import os
import sys

UNPROBED_DIR = "unprobed"
BUILD_TIMEOUT_S = 300


def interpreter_info():
    """What a probe build depends on: version, headers, extension suffix, free-threading.
    (build.py runs this same function in another interpreter to learn its build.) Without
    sysconfig, whose import costs an interpreter's start several ms: the headers of a
    CPython installation are at base_prefix/include/pythonX.Y<abiflags>, as sysconfig's
    posix schemes say; the first extension suffix is the interpreter's own (EXT_SUFFIX;
    _imp's list is importlib.machinery.EXTENSION_SUFFIXES, without importing importlib)."""
    import _imp

    abiflags = getattr(sys, "abiflags", "")
    return {
        "version": sys.version.split()[0],
        "include": os.path.join(sys.base_prefix, "include", "python%d.%d%s" % (sys.version_info[0], sys.version_info[1], abiflags)),
        "ext_suffix": _imp.extension_suffixes()[0],
        "gil_disabled": "t" in abiflags,
    }


def probe_dir_name(info, sources_digest):
    """The cache directory name of the probe built from these sources for this interpreter
    (two 32-bit checksums, not hashlib: loading OpenSSL would cost the start more)."""
    import zlib

    text = (repr(sorted(info.items())) + sources_digest).encode()
    return "py%s-%08x%08x" % (info["version"], zlib.crc32(text), zlib.adler32(text))


def interpreter_name():
    """This interpreter as a user knows it: its executable, or what embeds it."""
    executable = sys.executable or "?"
    name = os.path.basename(executable)
    if name.startswith("python") or name.startswith("pypy"):
        return executable
    return "Python %s embedded in %s (prefix %s)" % (sys.version.split()[0], executable, sys.base_prefix)


def note_unprobed(session, reason, key=None, name=None, say=True):
    """Name an interpreter (NAME, default this one) in SESSION/unprobed/<KEY>.json with
    REASON, once per session and interpreter build (KEY: its probe_dir_name where known);
    the first to name it also says it on stderr (SAY)."""
    import json
    import zlib

    name = name or interpreter_name()
    key = key or "%08x" % zlib.crc32(name.encode())
    directory = os.path.join(session, UNPROBED_DIR)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(directory, key + ".json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # already named (or the session is gone): say nothing again
        return
    with os.fdopen(fd, "w") as f:
        json.dump({"interpreter": name, "pid": os.getpid(), "reason": reason}, f)
    if say:
        sys.stderr.write("tandem: GIL probe not started in %s (pid %d): %s\n" % (name, os.getpid(), reason))


def _built_probe(session, info):
    """The directory holding `engine.probe` built for this interpreter, or None (named as unprobed)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "engine", "probe", "_probe" + info["ext_suffix"])):
        return here  # this hook sits in a probe directory (engine.probe.build.probe_env)
    cache, sources = os.environ.get("TANDEM_CACHE"), os.environ.get("TANDEM_PROBE_SOURCES")
    if not cache or not sources:
        note_unprobed(session, "no probe cache named (TANDEM_CACHE, TANDEM_PROBE_SOURCES unset)")
        return None
    key = probe_dir_name(info, sources)
    root = os.path.join(cache, "probe", key)
    built = os.path.join(root, "engine", "probe", "_probe" + info["ext_suffix"])
    if os.path.exists(built):
        return root
    if info["gil_disabled"]:
        note_unprobed(session, "a free-threaded build of CPython: no GIL to watch", key)
        return None
    if os.path.exists(os.path.join(session, UNPROBED_DIR, key + ".json")):
        return None  # its build failed already in this session
    reason = _build(info, cache)
    if os.path.exists(built):
        return root
    note_unprobed(session, reason or "the probe build left no probe", key)
    return None


def _build(info, cache):
    """Build the probe once with tandem's own Python (an embedded interpreter may have no
    executable to run; concurrent starts wait for one build, build.py locks); returns why
    it failed, or None."""
    import json
    import subprocess

    builder = os.environ.get("TANDEM_PROBE_BUILDER")
    if not builder:
        return "no probe built for it and no builder named (TANDEM_PROBE_BUILDER unset)"
    env = dict(os.environ)
    for name in ("TANDEM_SESSION", "PYTHONPATH", "PYTHONHOME", "JAVA_TOOL_OPTIONS"):
        env.pop(name, None)
    try:
        run = subprocess.run([builder, "-I", "-m", "engine.probe.build", "--info", json.dumps(info), "--cache", cache],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as err:
        return "the probe build could not run: %s" % err
    if run.returncode != 0:
        return (run.stderr.strip().splitlines() or ["the probe build failed"])[-1]
    return None


def _start():
    session = os.environ.get("TANDEM_SESSION")
    if not session:
        return
    probe = sys.modules.get("engine.probe")
    if probe is not None and getattr(probe, "backend", lambda: None)() is not None:
        return  # started already (the .pth hook of tandem's own venv)
    try:
        root = _built_probe(session, interpreter_info())
        if root is None:
            return
        saved, saved_flag = sys.path[:], sys.dont_write_bytecode
        sys.path.insert(0, root)
        sys.dont_write_bytecode = False  # the probe's modules keep their bytecode in the cache (_keep_bytecode)
        try:
            import engine.probe.autostart
            engine.probe.autostart.run()
        finally:
            sys.path[:] = saved  # the service's sys.path stays its own
            sys.dont_write_bytecode = saved_flag
    except Exception as err:  # never break the interpreter being observed
        note_unprobed(session, "%s: %s" % (type(err).__name__, err))


def _keep_bytecode():
    """Compile this hook's bytecode into its __pycache__ once. PYTHONDONTWRITEBYTECODE
    (set in many containers and CI images) would otherwise make every interpreter compile
    the hook and the probe's modules again at every start (~6 ms, docs/probe.md); the
    directories are tandem's own cache, not the user's sources."""
    if not sys.dont_write_bytecode or not __file__.endswith(".py"):
        return  # the import system wrote it already (or will)
    cached = os.path.join(os.path.dirname(__file__), "__pycache__", "%s.%s.pyc" % (
        os.path.basename(__file__)[:-3], sys.implementation.cache_tag))
    if os.path.exists(cached):
        return
    try:
        import py_compile

        py_compile.compile(__file__, cfile=cached, doraise=True)
    except Exception:  # a read-only cache: compile at every start, as before
        pass


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


if __name__ == "sitecustomize":
    _start()
    _keep_bytecode()
    _run_next_sitecustomize()
