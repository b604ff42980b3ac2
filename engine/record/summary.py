"""What a session captured, per process: files, sizes, and JFR event counts."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engine.clock.chunks import scan_chunks
from engine.clock.packed import is_zstd
from engine.errors import TandemError
from engine.ingest.jfr import unflushed
from engine.ingest.jfr_input import readable_recordings
from engine.record.session import unprobed_interpreters
from engine.session import JVM_DIRS, JVM_JSON, PROBE_JSON, PYTHON_DIRS, agent_error_line, jvm_recordings, read_json


# The event types a user of tandem looks for first; the rest are summed up as "events".
KEY_EVENTS = {
    "jdk.SafepointEnd": "safepoints",
    "jdk.GCPhasePause": "GC pauses",
    "tandem.ClockSync": "syncs",
}
_SUMMARY_LINE = re.compile(r"^\s*(\S+)\s+(\d+)\s+\d+\s*$")


@dataclass
class ProcessCapture:
    kind: str  # "jvm" or "python"
    directory: Path
    description: dict
    files: list[Path]
    event_counts: dict[str, int] = field(default_factory=dict)
    problem: str | None = None
    unflushed: str | None = None  # what a JVM whose host exited without shutting it down lost

    @property
    def pid(self) -> str:
        return self.directory.name.split("-", 1)[-1]

    @property
    def state(self) -> str:
        if self.kind == "python":
            return "probe"
        return self.description.get("state", "no agent")


def jfr_event_counts(jfr_tool: Path, files: list[Path]) -> tuple[dict[str, int], str | None]:
    """Event counts per type over `files`, read by the JDK's `jfr summary` (an independent reader)."""
    counts: dict[str, int] = {}
    # The jfr tool is a JVM: under an outer `tandem record` it would record itself.
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    files = [file for file in files if file.exists()]  # (gone since listed: print_summary names it)
    with _one_recording(files) as recordings:
        for file in recordings:
            run = subprocess.run([str(jfr_tool), "summary", str(file)], capture_output=True, text=True, env=env)
            if run.returncode != 0:
                return counts, (run.stderr.strip().splitlines() or ["jfr summary failed"])[-1]
            for line in run.stdout.splitlines():
                match = _SUMMARY_LINE.match(line)
                if match:
                    counts[match.group(1)] = counts.get(match.group(1), 0) + int(match.group(2))
    return counts, None


@contextlib.contextmanager
def _one_recording(files: list[Path]):
    """FILES as jdk.jfr's tool reads them: a flight recorder's packed chunks decompressed and
    laid end to end with the rest into one file (chunks end to end are a recording), so the
    tool starts once, not once per chunk."""
    if not any(is_zstd(file) for file in files):
        yield files
        return
    with contextlib.ExitStack() as stack:
        try:
            readable, _named = stack.enter_context(readable_recordings(files))
        except TandemError:
            readable = None  # (the tool then says what is wrong, in its words)
        if readable is None:
            yield files
            return
        joined = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tandem-summary-"))) / "recording.jfr"
        with open(joined, "wb") as out:
            for file in readable:
                with open(file, "rb") as part:
                    shutil.copyfileobj(part, out)
        yield [joined]


def collect(session: Path, jfr_tool: Path | None, status=None) -> list[ProcessCapture]:
    """Every jvm-*/ and py-*/ of the session. `status`: a rich Status to narrate slow steps.

    Files may vanish while we look (a short-lived JVM's repository is deleted at its exit):
    such a file is left out, and the reading goes on."""
    captures = []
    for directory in sorted(session.glob(JVM_DIRS)):
        description = read_json(directory / JVM_JSON)
        try:
            files, _closed = jvm_recordings(directory)
        except OSError:  # its repository went away while we listed it
            files = []
        capture = ProcessCapture("jvm", directory, description, files)
        agent_error = agent_error_line(directory)
        if agent_error:
            capture.problem = agent_error
        elif not description:
            capture.problem = "no jvm.json: the agent did not start (see the JVM's stderr for `tandem-agent:`)"
        if files and jfr_tool is not None:
            if status is not None:
                status.update(f"counting JFR events of {directory.name}")
            capture.event_counts, unreadable = jfr_event_counts(jfr_tool, files)
            capture.problem = capture.problem or unreadable
        if files and description.get("state") == "recording":
            capture.unflushed = _unflushed_line(files[-1])
        captures.append(capture)
    for directory in sorted(d for d in session.glob(PYTHON_DIRS) if d.is_dir()):
        try:
            files = sorted(p for p in directory.iterdir() if p.is_file())
        except OSError:
            files = []
        captures.append(ProcessCapture("python", directory, read_json(directory / PROBE_JSON), files))
    return captures


def _unflushed_line(chunk: Path) -> str | None:
    """A JVM still "recording" once its command ended: what it lost after its last JFR flush
    (docs/pauses.md, "Unflushed"), or None while it runs on."""
    try:
        window = unflushed(scan_chunks(chunk))
    except (OSError, TandemError):  # (never flushed, or gone: the analysis says so)
        return None
    return window["line"] if window else None


def print_summary(console, session: Path, captures: list[ProcessCapture]) -> None:
    """A table of processes and event counts, then the files, one per line (paths are long)."""
    from rich.table import Table

    for entry in unprobed_interpreters(session):
        console.print(f"[yellow]not probed: {entry.get('interpreter')}: {entry.get('reason')}[/yellow]", highlight=False)
    if not captures:
        console.print(f"[yellow]nothing was captured in {session}: no JVM and no Python interpreter recorded[/yellow]")
        return
    table = Table(title=f"captured in {session}", title_justify="left")
    table.add_column("process", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    for column in (*KEY_EVENTS.values(), "events"):
        table.add_column(column, justify="right", no_wrap=True)
    sizes = {file: _file_size(file) for capture in captures for file in capture.files}
    vanished = [file for file, size in sizes.items() if size is None]
    for capture in captures:
        capture.files = [file for file in capture.files if sizes[file] is not None]
    shown, folded = _shown(captures, sizes)
    for capture in shown:
        size = _size(sum(sizes[f] for f in capture.files)) if capture.files else "-"
        counts = capture.event_counts
        numbers = [str(counts.get(name, 0)) if counts else "-" for name in KEY_EVENTS]
        numbers.append(str(sum(counts.values())) if counts else "-")
        table.add_row(capture.directory.name, capture.state, size, *numbers)
    folded_files = [f for capture in folded for f in capture.files]
    if folded:
        table.add_row(f"{len(folded)} more", "probe", _size(sum(sizes[f] for f in folded_files)), *["-"] * (len(KEY_EVENTS) + 1))
    console.print(table)
    for capture in shown:
        for file in capture.files:
            console.print(f"  {file.relative_to(session)} [dim]({_size(sizes[file])})[/dim]", highlight=False)
    if folded:
        console.print(f"  {len(folded_files)} files of {len(folded)} more Python processes "
                      f"({folded[0].directory.name} ... {folded[-1].directory.name})", highlight=False)
    for capture in captures:
        for problem in (capture.problem, capture.unflushed):
            if problem:
                console.print(f"[yellow]{capture.directory.name}: {problem}[/yellow]")
    if vanished:
        console.print(f"[yellow]{len(vanished)} file(s) went away before they could be read (a process cleaned up at its exit): "
                      f"{', '.join(str(f.relative_to(session)) for f in vanished)}[/yellow]", highlight=False)


# Python processes given a row each; more (a Spark executor's workers: thousands) share one row.
PYTHON_ROWS = 20


def _shown(captures: list[ProcessCapture], sizes: dict) -> tuple[list[ProcessCapture], list[ProcessCapture]]:
    """The captures given a row (every JVM, the PYTHON_ROWS largest Python processes, in the
    captures' order) and the Python ones folded into one row."""
    python = [c for c in captures if c.kind == "python"]
    if len(python) <= PYTHON_ROWS:
        return captures, []
    largest = sorted(python, key=lambda c: -sum(sizes[f] for f in c.files))[:PYTHON_ROWS]
    kept = {id(c) for c in largest}
    return ([c for c in captures if c.kind != "python" or id(c) in kept],
            [c for c in python if id(c) not in kept])


def _file_size(file: Path) -> int | None:
    try:
        return file.stat().st_size
    except OSError:
        return None


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
