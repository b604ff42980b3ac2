"""What `tandem live` reads: the processes of a session as they appear and exit.

- `GilRingSource` (gil_ring.py): one `py-<pid>/gil.ring`.
- `PauseRingSource` (pause_ring.py): `jvm-<pid>/pauses.ring`, the agent's `live=true` output.
  `RingWithRepositorySource` (ring_and_repository.py), what `SessionWatcher` uses when a ring
  exists: the ring for latency, reconciled with the repository (docs/live.md).
- `RepositorySource` (repository.py): otherwise the JVM's JFR disk repository, re-read.
- `SessionWatcher` (here): discovers new `py-*` / `jvm-*` directories and picks the source.

A source has `label`, `kind`, `poll()` (what it has read since the last poll, a gil or pauses
frame), `done`, `problem` and `status()`; a JVM's (engine/live/jvm_source.py) also
`take_calls()`, its System.gc() calls.

A GIL source reports `frontier_ns`: nothing it delivers later starts before it (as far as
the source can tell; the watermark adds a margin, engine/live/watermark.py). Every source is
`done` once its producer has exited and everything was read. Pauses may come late (the core
keeps what they need: engine/correlate/core.py, `retain_ns`).
"""
from __future__ import annotations

import time
from pathlib import Path

from engine.live.gil_ring import GilRingSource
from engine.live.jvm_source import JvmSource
from engine.live.repository import RepositorySource
from engine.live.ring_and_repository import RingWithRepositorySource
from engine.session import AGENT_ERROR, JVM_DIRS, JVM_JSON, PAUSES_RING, PYTHON_DIRS, pid_from_name, process_alive


class SessionWatcher:
    """New `py-*` and `jvm-*` directories of SESSION, each turned into its source once."""

    def __init__(self, session: Path):
        self.session = Path(session)
        self.gil: dict[Path, GilRingSource] = {}
        self.jvm: dict[Path, JvmSource] = {}
        self.events: list[str] = []  # human-readable discoveries and exits, for the view
        self.scanned_ns: int | None = None  # when the last scan began (the watermark's bound for processes not found yet)

    def scan(self) -> None:
        self.scanned_ns = time.monotonic_ns()
        for directory in sorted(self.session.glob(PYTHON_DIRS)):
            if directory.is_dir() and directory not in self.gil:
                self.gil[directory] = GilRingSource(directory)
                self.events.append(f"{directory.name}: Python process found")
        for directory in sorted(self.session.glob(JVM_DIRS)):
            if not directory.is_dir() or directory in self.jvm:
                continue
            # The agent writes jvm.json once it has started, the window of its own start-up's
            # operations in it (asked_by_tandem): until then, even with its ring made, it is
            # still starting (look again next scan), unless it failed or its JVM is gone.
            if not ((directory / JVM_JSON).exists() or (directory / AGENT_ERROR).exists() or _jvm_gone(directory)):
                continue
            source = (RingWithRepositorySource(directory) if (directory / PAUSES_RING).exists()
                      else RepositorySource(directory))
            self.jvm[directory] = source
            self.events.append(f"{directory.name}: JVM found, pauses from its {source.how}")


def _jvm_gone(directory: Path) -> bool:
    """The JVM of a session's jvm-<pid> directory has exited (a directory not so named: not known gone)."""
    pid = pid_from_name(directory.name)
    return pid is not None and not process_alive(pid)
