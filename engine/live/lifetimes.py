"""Thread and process lifetimes of a live session, from /proc (the correlation core's `Lifetimes`).

Offline, a thread's lifetime is inferred from its intervals: it ends with its last one
(docs/results.md, "gil_free"). Live, that end is in the future; /proc says whether the thread
still exists. A snapshot is taken before the GIL rings are read, so that a thread gone in it
has all its events in what is read next.
"""
from __future__ import annotations

import os

import numpy as np

from engine.correlate import END
from engine.correlate.core import GONE, Lifetimes
from engine.session import process_alive


class ProcLifetimes(Lifetimes):
    def __init__(self):
        self._threads: set[tuple[int, int]] = set()
        self._pids: set[int] = set()

    def snapshot(self, pids) -> None:
        threads, alive = set(), set()
        for pid in pids:
            if not process_alive(pid):
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            alive.add(int(pid))
            threads.update((int(pid), int(t)) for t in tids if t.isdigit())
        self._threads, self._pids = threads, alive

    def alive(self, pid: int, tid: int) -> bool:
        return (int(pid), int(tid)) in self._threads

    def thread_ends(self, pid, tid):
        return np.array([END if (int(p), int(t)) in self._threads else GONE for p, t in zip(pid, tid)], np.int64)

    def process_ends(self, pid):
        return np.array([END if int(p) in self._pids else GONE for p in pid], np.int64)
