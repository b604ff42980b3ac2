"""Shared pieces of the agent and record tests: a Java workload, running tandem, reading JFR.

The JDK's own `jfr` tool is the witness here: it reads what the agent wrote without any
tandem code in between. (No tests in this module.)
"""
from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENT_JAR = REPO / "engine" / "_java" / "tandem-agent.jar"

# One Java program for every test; compiled once with --release 17 so JDK 17 and 25 run it.
WORKLOAD_SOURCE = r"""
import java.util.ArrayList;
import java.util.List;

public class Workload {
    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "alloc": {   // alloc SECONDS [EXIT_CODE]: allocate (young GCs), System.gc(), exit
                allocate(Double.parseDouble(args[1]));
                System.gc();
                System.out.println("done");
                if (args.length > 2) System.exit(Integer.parseInt(args[2]));
                break;
            }
            case "wait": {    // wait: say ready, then allocate a little until killed
                System.out.println("ready");
                System.out.flush();
                while (true) { allocate(0.05); Thread.sleep(20); }
            }
            case "sleep": {   // sleep N: N sleeps of 1 ms (below default.jfc's 20 ms ThreadSleep threshold)
                for (int i = 0; i < Integer.parseInt(args[1]); i++) Thread.sleep(1);
                System.out.println(System.getProperty("tandem.test.property", "unset"));
                break;
            }
            default: throw new IllegalArgumentException(args[0]);
        }
    }

    static void allocate(double seconds) {
        long end = System.nanoTime() + (long) (seconds * 1e9);
        List<byte[]> keep = new ArrayList<>();
        while (System.nanoTime() < end) {
            keep.add(new byte[16 * 1024]);
            if (keep.size() > 1000) keep.clear();
        }
    }
}
"""


def compile_workload(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "Workload.java"
    source.write_text(WORKLOAD_SOURCE)
    subprocess.run(["javac", "--release", "17", "-d", str(directory), str(source)], check=True)
    return directory


def jdk_env(java_home: Path, **extra: str) -> dict[str, str]:
    """The environment with this JDK first (JAVA_HOME for tandem, PATH for the command)."""
    env = dict(os.environ)
    env.pop("JAVA_TOOL_OPTIONS", None)
    env.pop("TANDEM_SESSION", None)
    env["JAVA_HOME"] = str(java_home)
    env["PATH"] = f"{java_home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "160"
    env.update(extra)
    return env


def tandem_argv(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "tandem"
    return [str(script), *args] if script.exists() else [sys.executable, "-c", "from engine.commands import main; main()", *args]


def run_tandem(*args: str, env: dict[str, str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(tandem_argv(*args), env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def kill_session_processes(session: Path) -> None:
    """SIGKILL every process a session recorded (its py-PID and jvm-PID folders): a test that
    failed before its command ended leaves none behind to load the machine."""
    import signal

    for directory in [*session.glob("py-*"), *session.glob("jvm-*")]:
        try:
            os.kill(int(directory.name.split("-")[1]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def default_sigint() -> None:
    """preexec_fn: SIGINT back to its default in the child. A shell's background job starts with
    SIGINT ignored and passes that on; a JVM then installs no handler for it and CPython raises no
    KeyboardInterrupt, whatever tandem forwards."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def only_jvm_dir(session: Path) -> Path:
    dirs = sorted(session.glob("jvm-*"))
    assert len(dirs) == 1, f"expected one jvm-* in {session}: {[d.name for d in dirs]}"
    return dirs[0]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def jfr_event_counts(java_home: Path, recording: Path) -> dict[str, int]:
    out = subprocess.run([str(java_home / "bin" / "jfr"), "summary", str(recording)],
                         capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        match = re.match(r"^\s*(\S+)\s+(\d+)\s+\d+\s*$", line)
        if match:
            counts[match.group(1)] = int(match.group(2))
    return counts


def jfr_events(java_home: Path, recording: Path, event_type: str) -> list[dict]:
    out = subprocess.run([str(java_home / "bin" / "jfr"), "print", "--json", "--events", event_type, str(recording)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["recording"]["events"]


def instant_ns(text: str) -> int:
    """'2026-11-29T15:57:03.650263908Z' (jfr print --json) to ns since the epoch, exactly."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", text)
    assert match, f"unexpected timestamp {text!r}"
    seconds = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int((match.group(2) or "0").ljust(9, "0"))


def duration_ns(text: str) -> int:
    """'PT0.000005876S' (ISO-8601, as jfr print --json writes durations) to ns."""
    match = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:\.(\d{1,9}))?S)?", text)
    assert match, f"unexpected duration {text!r}"
    hours, minutes, seconds, fraction = match.groups()
    return ((int(hours or 0) * 60 + int(minutes or 0)) * 60 + int(seconds or 0)) * 1_000_000_000 + int((fraction or "0").ljust(9, "0"))
