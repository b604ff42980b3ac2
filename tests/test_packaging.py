"""The package as a user gets it: a wheel built from the tracked files alone is complete,
and the CLI answers fast with one-line errors for user mistakes."""
from __future__ import annotations

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


@pytest.mark.slow
def test_wheel_ships_agent_jar_and_probe(tmp_path):
    src = _tracked_copy(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("tandem-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "engine/_java/tandem-agent.jar" in names
    assert any(n.startswith("engine/probe/_probe.") and n.endswith(".so") for n in names), names
    assert "tandem-probe-autostart.pth" in names  # GIL probe start hook for `tandem record`
    jar = zipfile.ZipFile(zipfile.ZipFile(wheel).open("engine/_java/tandem-agent.jar"))
    manifest = jar.read("META-INF/MANIFEST.MF").decode()
    assert "Premain-Class: tandem.agent.Agent" in manifest
    assert "Agent-Class: tandem.agent.Agent" in manifest


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
