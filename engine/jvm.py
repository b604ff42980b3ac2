"""Finding a JDK and starting the one in-process JVM (through JPype) that ingest uses.

One JVM per Python process: JPype cannot restart it, so `start_jvm()` is a lazy
singleton. The agent jar that ships inside the package is always on its class path.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from importlib import resources
from pathlib import Path

from engine.errors import TandemError

MIN_JAVA = 17
_INSTALL_HINT = "install a JDK 17 or newer (e.g. `apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME"


def agent_jar() -> Path:
    jar = Path(str(resources.files("engine") / "_java" / "tandem-agent.jar"))
    if not jar.is_file():
        raise TandemError(f"{jar}: tandem's agent jar is missing; reinstall tandem (`pip install .` builds it)")
    return jar


@lru_cache(maxsize=None)
def find_java_home() -> Path:
    """JAVA_HOME if set, else the JDK of `java` on PATH; must be a JDK 17+ (jdk.jfr)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = Path(home)
        if not (path / "bin" / "java").exists():
            raise TandemError(f"JAVA_HOME={home} has no bin/java; {_INSTALL_HINT}")
    else:
        java = shutil.which("java")
        if not java:
            raise TandemError(f"no Java found (JAVA_HOME unset and no `java` on PATH); {_INSTALL_HINT}")
        path = Path(java).resolve().parent.parent
    version = java_version(path)
    if version < MIN_JAVA:
        raise TandemError(f"{path}: Java {version} is too old; tandem needs {MIN_JAVA}+ for jdk.jfr; {_INSTALL_HINT}")
    return path


@lru_cache(maxsize=None)
def java_version(home: Path) -> int:
    """Feature version (17, 21, 25...) read from the JDK's `release` file, else `java -version`."""
    release = home / "release"
    text = release.read_text(errors="replace") if release.exists() else ""
    match = re.search(r'JAVA_VERSION="(\d+)(?:\.(\d+))?', text)
    if not match:
        out = subprocess.run([str(home / "bin" / "java"), "-version"], capture_output=True, text=True).stderr
        match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
        if not match:
            raise TandemError(f"{home}: cannot tell the Java version; {_INSTALL_HINT}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 else major


def jdk_tool(name: str, home: Path | None = None) -> Path:
    """A JDK command-line tool (`jfr`, `jcmd`, `javac`) of the chosen JDK."""
    tool = (home or find_java_home()) / "bin" / name
    if not tool.exists():
        raise TandemError(f"{tool}: not found; {_INSTALL_HINT}")
    return tool


def _libjvm(home: Path) -> Path:
    for candidate in ("lib/server/libjvm.so", "lib/client/libjvm.so", "jre/lib/amd64/server/libjvm.so"):
        if (home / candidate).exists():
            return home / candidate
    raise TandemError(f"{home}: no libjvm.so found; {_INSTALL_HINT}")


def _without_tandem_agent(options: str) -> str:
    """JAVA_TOOL_OPTIONS without tandem's -javaagent (which may be quoted: paths with spaces)."""
    # Under `tandem record`, JAVA_TOOL_OPTIONS carries our agent so that the user's JVMs
    # record; tandem's own ingest JVM must not record itself.
    import shlex

    try:
        tokens = shlex.split(options)
    except ValueError:  # unbalanced quotes: the JVM would not parse it either; keep it as is
        return options
    return shlex.join(tok for tok in tokens if "tandem-agent" not in tok)


def start_jvm(extra_options: tuple[str, ...] = ()):
    """Start (once) and return the jpype module with the JVM running.

    `extra_options` (JVM flags) apply only if this call is the one that starts the JVM.
    """
    import jpype

    if not jpype.isJVMStarted():
        home = find_java_home()
        saved = os.environ.get("JAVA_TOOL_OPTIONS")
        if saved is not None:
            os.environ["JAVA_TOOL_OPTIONS"] = _without_tandem_agent(saved)
        try:
            jpype.startJVM(
                str(_libjvm(home)),
                "-Xshare:auto",
                "-XX:+UseSerialGC",
                "-Xss4m",
                # Lets the JFR reader take event fields by position (PauseReader.EventValues).
                "--add-opens=jdk.jfr/jdk.jfr.consumer=ALL-UNNAMED",
                # JPype loads its native half from Java: JDK 24+ warns on stderr unless allowed.
                "--enable-native-access=ALL-UNNAMED",
                *extra_options,
                classpath=[str(agent_jar())],
                convertStrings=False,
            )
        finally:
            if saved is not None:
                os.environ["JAVA_TOOL_OPTIONS"] = saved
    return jpype
