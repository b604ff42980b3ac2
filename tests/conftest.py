"""Shared fixtures: real JDKs and real CPython interpreters present on this machine."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_RECORDINGS = REPO.parent / "shared" / "recordings"

# JDKs the tests record with: the machine's default JDK, plus JDK 25 where present.
JDK25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64")


def default_java_home() -> Path:
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home)
    return Path(shutil.which("java")).resolve().parent.parent


def jdk_params():
    homes = [pytest.param(default_java_home(), id="jdk-default")]
    if (JDK25 / "bin" / "java").exists():
        homes.append(pytest.param(JDK25, id="jdk25"))
    else:
        homes.append(pytest.param(JDK25, id="jdk25", marks=pytest.mark.skip(reason=f"{JDK25} not present")))
    return homes


# CPython interpreters the GIL probe is tested on.
PYENV = Path("/root/.pyenv/versions")


def python_params():
    params = []
    for minor in ("3.11", "3.12", "3.13"):
        found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}")) if PYENV.exists() else []
        exe = found[-1] if found else shutil.which(f"python{minor}")
        if exe:
            params.append(pytest.param(Path(exe), id=f"py{minor}"))
        else:
            params.append(pytest.param(None, id=f"py{minor}", marks=pytest.mark.skip(reason=f"no python{minor} on this machine")))
    return params


def tsc_usable() -> bool:
    """Whether the GIL probe stamps with the TSC here (invariant TSC and the kernel's
    clocksource tsc), checked independently of the probe's own check."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
        source = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    except (OSError, StopIteration):
        return False
    return {"constant_tsc", "nonstop_tsc"} <= set(flags) and source == "tsc"


@pytest.fixture
def removed_after_scan(monkeypatch):
    """Each recording read_pauses is given removed right after its chunk scan: a file there when
    listed and gone while read (a JVM's exit moves its chunks to recording.jfr)."""
    import engine.ingest.jfr as jfr

    scan = jfr.scan_chunks

    def scanned_then_removed(path, *args, **kwargs):
        out = scan(path, *args, **kwargs)
        Path(path).unlink()
        return out

    monkeypatch.setattr(jfr, "scan_chunks", scanned_then_removed)
