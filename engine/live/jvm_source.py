"""What `tandem live`'s sources of a JVM's pauses share (engine/live/sources.py): the base of
each (`JvmSource`), and the System.gc() calls its pause ring carries beside the pauses."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from engine.session import pid_from_name


PAUSE_RING_KINDS = {1: "safepoint", 2: "gc_pause", 3: "gc", 4: "vm_operation"}  # java-agent PauseRing.KIND_*
SYSTEM_GC_CALL = 5  # a System.gc() call's record (not a pause: docs/ring.md, "Java writer")


def system_gc_calls(jvm_pid: int = 0, start_ns=(), end_ns=(), tid=(), frames=()) -> pd.DataFrame:
    """System.gc() calls of a JVM (its pause ring's call records): the call's span, its
    thread, its innermost frames (the pauses table's system_gc_frames)."""
    tid = np.asarray(tid, np.int64)
    return pd.DataFrame({
        "jvm_pid": np.full(tid.size, jvm_pid, np.int64),
        "start_ns": np.asarray(start_ns, np.int64),
        "end_ns": np.asarray(end_ns, np.int64),
        "os_thread_id": pd.arrays.IntegerArray(tid, mask=tid == 0),
        "frames": pd.array(list(frames), dtype="string"),
    })


class JvmSource:
    """What the JVM's pause sources share: label, pauses seen, the status line's fields."""

    kind = "jvm"
    how = ""  # where its pauses come from, for the view

    def __init__(self, directory: Path):
        self.directory = directory
        self.pid = pid_from_name(directory.name)
        self.done = False
        self.problem: str | None = None
        self.pauses_seen = 0
        self.clock_error_ns: int | None = None

    @property
    def label(self) -> str:
        return f"jvm-{self.pid}"

    def _seen(self, frame: pd.DataFrame) -> None:
        self.pauses_seen += len(frame)

    def take_calls(self) -> pd.DataFrame:
        """The System.gc() calls read since the last take (a JFR recording's are in its pauses)."""
        return system_gc_calls()

    def status(self) -> dict:
        return {"source": self.label, "kind": self.how, "done": self.done, "problem": self.problem,
                "pauses": self.pauses_seen, "clock_error_ns": self.clock_error_ns}
