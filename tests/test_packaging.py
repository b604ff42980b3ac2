"""The package as a user gets it: a wheel built from the tracked files alone is complete,
and the CLI answers fast with one-line errors for user mistakes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TANDEM = Path(sys.executable).parent / "tandem"


def _tracked_copy(dest: Path) -> Path:
    """Copy only what git tracks (plus untracked, not ignored files): what a clone has."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from what a clone has."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(tmp / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
        check=True,
    )
    (built,) = (tmp / "dist").glob("tandem-*.whl")
    return built


@pytest.mark.slow
def test_wheel_ships_agent_jar_and_probe(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "engine/_java/tandem-agent.jar" in names
    assert any(n.startswith("engine/probe/_probe.") and n.endswith(".so") for n in names), names
    assert "tandem-probe-autostart.pth" in names  # GIL probe start hook for `tandem record`
    # read at run time: the probe's sources (built per interpreter) and the attach library's
    sources = [p.relative_to(REPO).as_posix() for pattern in ("engine/probe/*.[ch]", "engine/record/*.c")
               for p in REPO.glob(pattern)]
    assert "engine/record/inject.c" in sources and not set(sources) - set(names), set(sources) - set(names)
    jar = zipfile.ZipFile(zipfile.ZipFile(wheel).open("engine/_java/tandem-agent.jar"))
    manifest = jar.read("META-INF/MANIFEST.MF").decode()
    assert "Premain-Class: tandem.agent.Agent" in manifest
    assert "Agent-Class: tandem.agent.Agent" in manifest


# A Python service driving a JVM through JPype: both runtimes record.
JPYPE_SERVICE = r'''
import sys, time
import jpype
jpype.startJVM()
System, ArrayList = jpype.JClass("java.lang.System"), jpype.JClass("java.util.ArrayList")
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    keep = ArrayList()
    for i in range(2000):
        keep.add(jpype.JArray(jpype.JByte)(1024))
    System.gc()
    sum(range(20000))
    time.sleep(0.05)
print("service done", flush=True)
'''

SLEEPER = "import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.01)\n"


class Installed:
    """tandem installed from the wheel into a fresh virtual environment (not editable)."""

    def __init__(self, root: Path, env: dict[str, str], cwd: Path):
        self.root, self.env, self.cwd = root, env, cwd  # cwd: not a checkout, whose engine/ would come first
        self.python, self.tandem = root / "bin" / "python", root / "bin" / "tandem"

    def pip_install(self, *requirements: str) -> None:
        subprocess.run([str(self.python), "-m", "pip", "install", "-q", *requirements], check=True, env=self.env,
                       timeout=900, cwd=self.cwd)

    def run(self, *args: str, expect: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        """`tandem ARGS` from the venv: exits EXPECT, and no traceback on stderr whatever it says."""
        run = subprocess.run([str(self.tandem), *args], capture_output=True, text=True, env=self.env, timeout=timeout,
                             stdin=subprocess.DEVNULL, cwd=self.cwd)
        assert run.returncode == expect, (args, run.returncode, run.stderr[-3000:])
        assert "Traceback" not in run.stderr, (args, run.stderr[-3000:])
        return run


@pytest.mark.slow
def test_every_command_from_the_wheel_in_a_fresh_venv(wheel, tmp_path):
    """As a user installs it: `pip install tandem-*.whl` into a new venv, then each command once."""
    from conftest import default_java_home, python_params
    from test_record_helpers import compile_workload, jdk_env

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = jdk_env(default_java_home(), TANDEM_CACHE=str(tmp_path / "cache"))  # the probe built from the wheel's sources
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    user = Installed(venv, env, tmp_path)
    user.pip_install(str(wheel))
    service = tmp_path / "service.py"
    service.write_text(JPYPE_SERVICE)

    # record: a JVM and a CPython, the command's exit code returned
    session = tmp_path / "S"
    user.run("record", "-o", str(session), "--", str(user.python), str(service), "3")
    assert list(session.glob("jvm-*")) and list(session.glob("py-*")), sorted(p.name for p in session.iterdir())
    out = tmp_path / "OUT"
    user.run("analyze", str(session), "-o", str(out))
    assert (out / "pauses.parquet").exists()
    recordings = sorted(session.glob("jvm-*/**/*.jfr"))
    assert recordings, sorted(str(p) for p in session.rglob("*"))
    user.run("pauses", *map(str, recordings), "-o", str(tmp_path / "PAUSES"))
    assert (tmp_path / "PAUSES" / "pauses.parquet").exists()
    user.run("export", "perfetto", str(out), "-o", str(tmp_path / "trace.pftrace"))
    assert (tmp_path / "trace.pftrace").stat().st_size > 0

    # attach: a running JVM, then a running CPython (the injected library comes from the wheel)
    classes = compile_workload(tmp_path / "classes")
    jvm = subprocess.Popen(["java", "-cp", str(classes), "Workload", "wait"], stdout=subprocess.PIPE, text=True, env=env)
    # the venv's own CPython, and the newest other one (its probe built from the wheel's sources)
    pythons = [user.python] + [param.values[0] for param in python_params()[-1:] if param.values[0] is not None]
    sleepers = [subprocess.Popen([str(python), "-c", SLEEPER], stdout=subprocess.PIPE, text=True, env=env)
                for python in pythons]
    try:
        assert jvm.stdout.readline() == "ready\n"
        user.run("attach", str(jvm.pid), "-o", str(tmp_path / "AJ"), "--duration", "2")
        assert (tmp_path / "AJ" / f"jvm-{jvm.pid}").is_dir()
        for sleeper in sleepers:
            assert sleeper.stdout.readline() == "up\n"
            attached = user.run("attach", str(sleeper.pid), "-o", str(tmp_path / f"AP{sleeper.pid}"), "--duration", "2")
            assert "probe injected through pyinjector" in " ".join(attached.stderr.split()), attached.stderr
            probe = tmp_path / f"AP{sleeper.pid}" / f"py-{sleeper.pid}" / "probe.json"
            assert json.loads(probe.read_text())["state"] == "closed"
            assert sleeper.poll() is None
        assert jvm.poll() is None
    finally:
        for process in [jvm, *sleepers]:
            process.kill()

    user.run("live", "--session", str(tmp_path / "L"), "--roll", "1s", "--", str(user.python), str(service), "3")
    user.run("doctor")
    user.run("demo", "-o", str(tmp_path / "D"), "--seconds", "5")

    # fleet without its extra: one line naming it (with Ray: tests/test_fleet.py; installing Ray
    # and starting a cluster here would add minutes)
    for command in (("analyze", str(session), "--dataset", str(tmp_path / "DS")), ("summary", str(tmp_path / "DS"))):
        missing = user.run("fleet", *command, expect=2)
        assert missing.stderr.strip().splitlines()[-1:] == [
            f"tandem: error: tandem fleet needs {'ray' if command[0] == 'analyze' else 'duckdb'}: pip install 'tandem[fleet]'"]


def test_help_lists_commands():
    out = subprocess.run([str(TANDEM), "--help"], capture_output=True, text=True, check=True).stdout
    assert "doctor" in out and "pauses" in out


def test_user_error_is_one_line_without_traceback(tmp_path):
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "no-jdk"))
    proc = subprocess.run([str(TANDEM), "pauses", str(tmp_path / "x.jfr"), "-o", str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
