"""`tandem analyze`: correlate a pauses table with a GIL intervals table into Parquet results."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

import typer

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
             "h": 3_600_000_000_000}


def parse_duration_ns(text: str) -> int:
    """'50ms', '1.5s', '200us', '700ns', '10m', '2m30s', '1h' or a bare integer of ns, as int ns."""
    compact = text.replace(" ", "")
    if compact.isdigit():
        return int(compact)
    parts = re.findall(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)", compact)
    if not parts or "".join(number + unit for number, unit in parts) != compact:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 50ms, 1.5s, 200us, 700ns, 10m, 2m30s)")
    return round(sum(float(number) * _UNITS_NS[unit] for number, unit in parts))


def analyze(
    session: Optional[Path] = typer.Argument(None, help="A session directory written by `tandem record` / `tandem live`."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Directory for the result tables (replaced if present)."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="A fleet dataset root: write SESSION's tables into "
                                           "ROOT/<table>/host=<host>/date=<day>/<session-id>.parquet (docs/fleet.md)."),
    jfr: List[Path] = typer.Option([], "--jfr", help="JFR recording(s) of the JVM side (repeatable)."),
    gil: List[Path] = typer.Option([], "--gil", help="GIL probe file(s) or Parquet GIL tables (repeatable)."),
    pauses: List[Path] = typer.Option([], "--pauses", help="Parquet table(s) of JVM pauses (docs/results.md); a JFR "
                                      "recording given here is read as with --jfr."),
    slack: str = typer.Option("0", "--slack", help="Also report near misses within this duration, e.g. 50ms."),
    offset: Optional[int] = typer.Option(None, "--offset", help="ns added to pause times to put them on the GIL clock; "
                                                        "overrides the same-clock check."),
    reference_gil: bool = typer.Option(False, "--reference-gil", help="Name the session's closed GIL files in the "
                                       "results instead of copying their intervals into OUT/gil.parquet (faster; OUT "
                                       "then needs the session and tandem to read the GIL table)."),
    copy_gil: bool = typer.Option(False, "--copy-gil", hidden=True, help="The default now (kept for old scripts)."),
    spans: List[Path] = typer.Option([], "--spans", help="OTLP JSON file(s) of the service's OpenTelemetry spans (or a "
                                     "spans.binpb of tandem's receiver): OUT/spans.parquet and requests.parquet, which "
                                     "requests the pauses hurt. Default: SESSION/spans.binpb, the spans tandem record or "
                                     "tandem live --otlp-receiver received, if any."),
) -> None:
    """Find which JVM pauses hit which Python threads; write OUT/*.parquet and print the summary.

    Give a SESSION, or the two sides separately: --jfr/--pauses for the JVM, --gil for Python.
    With --dataset, SESSION's results join a fleet dataset (with or without -o).
    """
    from engine.analysis import analyze_to
    from engine.errors import TandemError, writing_into

    if session is None and not (jfr or pauses) and not gil:
        raise TandemError("nothing to analyze: give a SESSION directory, or --jfr/--pauses and --gil")
    if out is None and dataset is None:
        raise TandemError("where to: give -o OUT, --dataset ROOT, or both")
    if dataset is not None and (session is None or jfr or pauses or gil):
        raise TandemError("--dataset takes one SESSION directory (its session.json names the host and day), "
                          "not --jfr/--pauses/--gil")
    if spans and (out is None or session is None):
        raise TandemError("--spans needs a SESSION (its clock pairs put the spans on CLOCK_MONOTONIC) and -o OUT")
    if reference_gil and (copy_gil or dataset is not None):
        raise TandemError("--reference-gil cannot go with --copy-gil or --dataset (a fleet dataset holds the GIL rows)")
    slack_ns = parse_duration_ns(slack)
    with writing_into(out or dataset, "writing the results"):  # (a full disk, a read-only OUT: one line)
        trim_heap = _tune_allocators()
        with _progress("correlating", each=trim_heap) as advance:
            if out is None:
                from engine.fleet.dataset import analyze_into

                result, _, files = analyze_into(session, dataset, slack_ns=slack_ns)
            else:
                result = analyze_to(out, session=session, jfr=jfr, gil=gil, pauses=pauses, slack_ns=slack_ns,
                                    offset_ns=offset, progress=advance, reference_gil=reference_gil)
                if dataset is not None:
                    from engine.fleet.dataset import write_session
                    from engine.session import Session

                    files = write_session(out, result.header, dataset, Session.open(session))
        result.summary()
        if session is not None and out is not None:  # where the memory went: OUT/memory.parquet, printed under the pauses
            from engine.memory import write_memory
            from engine.report.summary import memory_lines

            for line in memory_lines(write_memory(session, out)):
                typer.echo(line)
        received = _received_spans(session) if not spans and out is not None else None
        if spans or received:
            from engine.report.summary import requests_hurt_lines
            from engine.spans.analyze import analyze_spans

            try:
                _, requests, span_files = analyze_spans(out, session, spans or [received])
            except TandemError as err:
                if spans:
                    raise
                # (the session's own spans, not asked for: the pauses' results stand)
                typer.echo(f"spans not used: {err}")
            else:
                for line in requests_hurt_lines(requests):
                    typer.echo(line)
                result.paths.extend(span_files)
        if out is not None:
            typer.echo(f"results in {out}/: {', '.join(p.name for p in result.paths)}")
        if dataset is not None:
            typer.echo(f"dataset {dataset}: session {files['sessions'].stem} under {files['sessions'].parent.relative_to(dataset / 'sessions')}")


def _received_spans(session: Path | None) -> Path | None:
    """SESSION's spans that tandem record / tandem live received (docs/spans.md), if any arrived."""
    from engine.spans.receiver import SESSION_SPANS

    path = session / SESSION_SPANS if session is not None else None
    return path if path is not None and path.is_file() and path.stat().st_size > 0 else None


# Free bytes glibc's heap may hold before they are given back (below). A short session's blocks
# leave 180-260 MiB free; a long one's stays there while its holes move up the heap, so its RSS
# creeps. Under this, a long session's peak stays near a short session's (docs/join.md, "Allocators").
FREE_HEAP_LIMIT = 192 << 20
# Blocks between two looks at the free heap: the next blocks fault in again the pages a trim gives
# back, a cost at every trim; the creep it holds back is slow.
TRIM_EVERY_BLOCKS = 4


def _tune_allocators():
    """Have glibc's malloc keep the streamed blocks' freed arrays (up to 32 MB each) for the next
    block instead of unmapping them and faulting fresh pages in: this process is tandem's own
    (docs/join.md, "Allocators"); have numpy stop advising huge pages for its large arrays (the
    kernel then zeroes 2 MiB at each first touch: more than half the process's system time); and
    Arrow allocate from jemalloc, where the wheel has it (a lower peak than its default mimalloc on
    long sessions, as fast). Returns what to call after each block: the heap's free pages given
    back once they pass FREE_HEAP_LIMIT, looked at every TRIM_EVERY_BLOCKS blocks."""
    import ctypes
    import ctypes.util
    import itertools

    try:  # (numpy 2; numpy 1.26 has it in numpy.core)
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:  # (gone from a later numpy: its default stands)
            _set_madvise_hugepage = bool  # (a no-op)
    _set_madvise_hugepage(False)

    class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h)
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError):  # (not glibc: its defaults stand)
        libc = None
    if libc is not None and hasattr(libc, "mallinfo2"):  # (glibc 2.33 and later)
        libc.mallinfo2.restype = MallInfo2

        blocks = itertools.count(1)

        def trim() -> None:
            if next(blocks) % TRIM_EVERY_BLOCKS == 0 and libc.mallinfo2().fordblks > FREE_HEAP_LIMIT:
                libc.malloc_trim(0)
    else:
        trim = lambda: None  # noqa: E731
    import pyarrow as pa

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, AttributeError):
        pass
    return trim


class _progress:
    """A rich progress line on stderr (GIL rows correlated so far), gone when done; EACH is called at every step."""

    def __init__(self, what: str, each=lambda: None):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        # (not on a terminal, rich would still write a bare line when it stops: a log gets nothing)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=console, transient=True) if console.is_terminal else None
        self._what = what
        self._each = each  # (called at each step too)

    def __enter__(self):
        if self._progress is None:
            return lambda rows: self._each()
        self._progress.start()
        task = self._progress.add_task(self._what)

        def advance(rows: int) -> None:
            self._progress.update(task, description=f"{self._what}: {rows:,} GIL intervals")
            self._each()
        return advance

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
