"""Build steps that pyproject.toml cannot express: the Java agent jar and the native GIL probe.

The jar is compiled from java-agent/ with the JDK's own javac/jar (no Maven) and shipped
inside the package as engine/_java/tandem-agent.jar, so an installed tandem never looks
at the source tree.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
JAVA_SRC = ROOT / "java-agent" / "src"
MANIFEST = ROOT / "java-agent" / "MANIFEST.MF"
JAR_IN_TREE = ROOT / "engine" / "_java" / "tandem-agent.jar"


def _jdk_tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / name).exists():
        return str(Path(java_home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        sys.exit(f"tandem build: `{name}` not found; install a JDK 17 or newer (e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME")
    return found


def build_jar() -> Path:
    sources = sorted(str(p) for p in JAVA_SRC.rglob("*.java"))
    classes = ROOT / "build" / "java-classes"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    subprocess.run([_jdk_tool("javac"), "--release", "17", "-Xlint:-options", "-d", str(classes), *sources], check=True)
    JAR_IN_TREE.parent.mkdir(parents=True, exist_ok=True)
    tmp = JAR_IN_TREE.with_suffix(".jar.tmp")
    subprocess.run([_jdk_tool("jar"), "--create", "--file", str(tmp), "--manifest", str(MANIFEST), "-C", str(classes), "."], check=True)
    os.replace(tmp, JAR_IN_TREE)
    return JAR_IN_TREE


class BuildPyWithJar(build_py):
    def run(self):
        build_jar()
        super().run()
        self._write_probe_start_hook()

    def _write_probe_start_hook(self):
        # The GIL probe's process-start hook is a .pth file at the root of site-packages
        # (coverage.py's pattern); the wheel carries it beside the `engine` package.
        from engine.probe.autostart import PTH_LINE, PTH_NAME

        Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)


if __name__ == "__main__" and sys.argv[-1:] == ["jar"]:
    # `python setup.py jar` (used by `make build`): rebuild only the agent jar, in the tree.
    print(build_jar())
    sys.exit(0)

# One list of flags for this build and for engine.probe.build (other interpreters).
sys.path.insert(0, str(ROOT))
from engine.probe.build import COMPILE_FLAGS as PROBE_COMPILE_FLAGS  # noqa: E402

probe = Extension(
    "engine.probe._probe",
    sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "engine" / "probe").glob("*.c")),
    extra_compile_args=PROBE_COMPILE_FLAGS,
    libraries=["pthread"],
)

# The structural walk of JFR chunks (engine/ingest/jfr_chunks.py).
chunkwalk = Extension("engine.ingest._chunkwalk", sources=["engine/ingest/chunkwalk.c"], extra_compile_args=["-O2"])

setup(
    cmdclass={"build_py": BuildPyWithJar},
    ext_modules=([probe] if probe.sources else []) + [chunkwalk],
)
