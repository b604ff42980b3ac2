"""`tandem fleet analyze`: one analysis per session, each a Ray task, into one dataset.

Ray schedules, retries and places the tasks (docs/fleet.md). A task runs in a Ray worker
process, which Ray starts fresh (never forked from the driver), so each worker has a JVM of its
own (JPype cannot share or fork one) that it keeps for the next sessions it analyzes. A session
that cannot be analyzed (bad input) comes back as a failure with its one-line reason, and is
not retried; a worker that dies is retried by Ray up to `retries` times.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import TandemError, TandemWarning
from engine.fleet.dataset import SESSIONS_TABLE, analyze_into
from engine.session import JVM_DIRS, PYTHON_DIRS, SESSION_JSON


# Ray's driver installs Abseil's failure-signal handler over the JVM's own when JPype's JVM
# already runs in this process (a notebook, the test suite); HotSpot's routine SIGSEGVs
# (implicit null checks, safepoint polls) then kill the process. Ray reads this flag when it
# is first imported (ray-project/ray#58984), so it is set before any import of ray here.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

# Filesystems on which a path means the same files on every node: no node affinity for them.
SHARED_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p",
                      "virtiofs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "fuse.alluxio"}


@dataclass
class SessionOutcome:
    source: str
    ok: bool
    error: str | None = None
    session_id: str | None = None
    host: str | None = None
    date: str | None = None
    rows: dict = field(default_factory=dict)
    seconds: float = 0.0  # inside the task: open, analyze, write
    cpu_seconds: float = 0.0  # CPU time of the worker process (every thread, the JVM's too) meanwhile
    warnings: list = field(default_factory=list)
    worker_pid: int | None = None


@dataclass
class Placement:
    """Where one session's files are: a path, and the Ray node holding it (None: any node reads it)."""

    source: str
    path: str
    node_id: str | None


def analyze_one(source: str, path: str, root: str, slack_ns: int) -> SessionOutcome:
    """The body of one task (also runnable without Ray): analyze, write, report."""
    import pyarrow.parquet as pq


    started, cpu_started = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _, identity, files = analyze_into(path, root, slack_ns=slack_ns)
        except TandemError as err:
            return SessionOutcome(source, False, str(err), seconds=time.perf_counter() - started, worker_pid=os.getpid())
        except Exception as err:  # a bug or an input nobody foresaw: reported with the session, the rest go on
            return SessionOutcome(source, False, f"{type(err).__name__}: {err}", seconds=time.perf_counter() - started,
                                  worker_pid=os.getpid())

    return SessionOutcome(
        source, True, session_id=identity.session_id, host=identity.host, date=identity.date,
        rows={name: pq.read_metadata(file).num_rows for name, file in files.items() if name != SESSIONS_TABLE},
        seconds=time.perf_counter() - started, cpu_seconds=time.process_time() - cpu_started, worker_pid=os.getpid(),
        warnings=[str(w.message) for w in caught if issubclass(w.category, TandemWarning)],
    )


def find_sessions(sources: list[str]) -> list[str]:
    """Each SOURCE is a session directory, a directory whose subdirectories are sessions, or
    NODE:PATH (a session on that Ray node's local disk, not visible here)."""
    found = []
    for source in sources:
        if _node_prefix(source):
            found.append(source)
            continue
        path = Path(source)
        if not path.is_dir():
            raise TandemError(f"{source}: no such directory (a session, a directory of sessions, or NODE:PATH)")
        if _is_session(path):
            found.append(str(path.absolute()))
            continue
        inner = sorted(str(p.absolute()) for p in path.iterdir() if p.is_dir() and _is_session(p))
        if not inner:
            raise TandemError(f"{source}: neither a session (session.json, jvm-*/, py-*/) nor a directory of sessions")
        found.extend(inner)
    return list(dict.fromkeys(found))  # a session named twice is analyzed once (two tasks would race on its files)


def _is_session(path: Path) -> bool:
    return (path / SESSION_JSON).is_file() or any(path.glob(JVM_DIRS)) or any(path.glob(PYTHON_DIRS))


def _node_prefix(source: str) -> str | None:
    head, sep, tail = source.partition(":")
    return head if sep and head and "/" not in head and tail.startswith("/") else None


def _filesystem_type(path: Path) -> str:
    """The type of the mount holding `path` (/proc/mounts, longest prefix)."""
    path = path.resolve()
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            mount = parts[1].replace("\\040", " ")
            if (path == Path(mount) or Path(mount) in path.parents) and len(mount) > len(best):
                best, kind = mount, parts[2]
    return kind


def place(sources: list[str], nodes: list[dict], local_node_id: str) -> list[Placement]:
    """Node affinity: NODE:PATH runs on that node (matched by address or host name); a path on a
    local disk of this machine runs on this node; a path on a shared filesystem runs anywhere."""
    by_name = {}
    for node in nodes:
        if node.get("Alive", True):
            for key in ("NodeManagerAddress", "NodeManagerHostname", "NodeName"):
                if node.get(key):
                    by_name[node[key]] = node["NodeID"]
    placements = []
    for source in sources:
        node = _node_prefix(source)
        if node:
            if node not in by_name:
                raise TandemError(f"{source}: no live Ray node named {node} (known: {', '.join(sorted(by_name)) or 'none'})")
            placements.append(Placement(source, source.partition(":")[2], by_name[node]))
        elif _filesystem_type(Path(source)) in SHARED_FILESYSTEMS:
            placements.append(Placement(source, source, None))
        else:
            placements.append(Placement(source, source, local_node_id))
    return placements


@dataclass
class FleetRun:
    outcomes: list[SessionOutcome]
    seconds: float  # wall time from the first submission to the last result
    tasks_seconds: float  # summed time inside the tasks

    @property
    def failed(self) -> list[SessionOutcome]:
        return [o for o in self.outcomes if not o.ok]


def require(module: str):
    """Imports an optional dependency of `tandem fleet`, or says how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TandemError(f"tandem fleet needs {module}: pip install 'tandem[fleet]'") from None


def connect(address: str | None, workers: int | None) -> bool:
    """ray.init: a local cluster of `workers` CPUs (default: this machine's), or join `address`.
    Returns whether this call started Ray (and so should shut it down)."""
    import logging

    ray = require("ray")

    if ray.is_initialized():
        return False
    options = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, configure_logging=True)
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(num_cpus=workers or os.cpu_count(), **options)
    return True


def run_fleet(sources: list[str], root: str | os.PathLike, *, slack_ns: int = 0, retries: int = 3,
              address: str | None = None, workers: int | None = None, fresh_workers: bool = False, console=None,
              progress: bool = True) -> FleetRun:
    """Analyze every session of `sources` into the dataset at `root`, one Ray task each."""
    ray = require("ray")
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sessions = find_sessions(sources)
    root = str(Path(root).absolute())
    started_ray = connect(address, workers)
    try:
        placements = place(sessions, ray.nodes(), ray.get_runtime_context().get_node_id())
        task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=False,
                          max_calls=1 if fresh_workers else 0)(analyze_one)
        pending = {}
        started = time.perf_counter()
        for placement in placements:
            strategy = (NodeAffinitySchedulingStrategy(placement.node_id, soft=True) if placement.node_id else "DEFAULT")
            ref = task.options(scheduling_strategy=strategy).remote(placement.source, placement.path, root, slack_ns)
            pending[ref] = placement.source
        outcomes = _collect(pending, retries, console, progress)
        seconds = time.perf_counter() - started
    finally:
        if started_ray:
            ray.shutdown()
    order = {source: i for i, source in enumerate(sessions)}
    outcomes.sort(key=lambda o: order[o.source])
    return FleetRun(outcomes, seconds, sum(o.seconds for o in outcomes))


def _collect(pending: dict, retries: int, console, show: bool) -> list[SessionOutcome]:
    import ray
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    outcomes = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not show, transient=False) as bar:
        job = bar.add_task("analyzing sessions", total=len(pending))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                source = pending.pop(ref)
                try:
                    outcomes.append(ray.get(ref))
                except ray.exceptions.RayError as err:  # the worker died on every try
                    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    outcomes.append(SessionOutcome(source, False, f"worker died {retries + 1} times: {reason}"))
                failed = sum(not o.ok for o in outcomes)
                bar.update(job, advance=1, description=f"analyzing sessions ({failed} failed)" if failed else "analyzing sessions")
    return outcomes
