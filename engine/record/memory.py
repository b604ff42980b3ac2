"""The memory of every process of a session, sampled from outside by tandem's own recording process.

A daemon thread of `tandem record` reads, once a second, /proc/PID/status (RSS split into
anonymous, file-backed and shared memory; swap; threads) and the resident part of each large
anonymous mapping (/proc/PID/maps and pagemap: where a JVM's heap is) of each process below tandem (the command and everything it starts), and appends one JSON
line per process to SESSION/memory/<pid>.jsonl, stamped with CLOCK_MONOTONIC
(docs/results.md, "memory.parquet", names the fields). Nothing runs inside the service. Not smaps_rollup: it walks the page tables of the whole
process (a JVM's) at every read, holding the service's mmap lock.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from engine.session import PROCESS_MEMORY_DIR

PERIOD_S = 1.0
LARGE_MAPPING_BYTES = 32 << 20
PAGEMAP_BUDGET_PAGES = 1 << 19  # 4 MiB of pagemap read per process and sample at most (2 GiB of mappings read whole)
WHOLE_READ_PAGES = 1 << 16  # one pread of pagemap where every block is read
BLOCK_PAGES = 1024
CONSISTENT_BYTES = 1 << 20  # the RSS may move this much while a sample's mappings are read
SAMPLE_TRIES = 3
PAGE_SHIFT = 12
# /proc/PID/status lines kept (kB), under the names the samples use.
_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file", "RssShmem": "rss_shmem",
                  "VmSwap": "swap", "VmHWM": "rss_peak"}


def read_process_memory(pid: int) -> dict | None:
    """One sample of PID's memory (bytes) and thread count, or None when it has gone."""
    sample: dict = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
    except OSError:
        return None
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in _STATUS_FIELDS:
            sample[_STATUS_FIELDS[key]] = int(value.split()[0]) * 1024
        elif key == "Threads":
            sample["threads"] = int(value)
        elif key == "Name":
            sample["comm"] = value.strip()
    return sample if "rss" in sample else None  # (none: a zombie, without memory, or a kernel thread)


def large_mappings_resident(pid: int, budget_pages: int = PAGEMAP_BUDGET_PAGES) -> list[list[int]]:
    """[start, end, resident bytes] of PID's large private anonymous writable mappings (a JVM's
    committed heap, malloc's arenas), from /proc/PID/pagemap's present bits; past BUDGET_PAGES
    in all, evenly spaced blocks are read and the count scaled. (A heap's resident part runs
    ahead of what its GC calls used: G1 takes eden from fresh regions of its committed memory.)"""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read().split(b"\n")
        pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        return []
    mappings = []
    for line in maps:
        fields = line.split()
        if len(fields) == 5 and fields[1].startswith(b"rw") and fields[4] == b"0":  # anonymous: no path, inode 0
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            if end - start >= LARGE_MAPPING_BYTES:
                mappings.append((start, end))
    found = []
    try:
        total = sum(end - start for start, end in mappings) >> PAGE_SHIFT
        step = max(1, -(-total // budget_pages))  # read one block in every STEP
        block = BLOCK_PAGES if step > 1 else WHOLE_READ_PAGES
        for start, end in mappings:
            pages, present, read = (end - start) >> PAGE_SHIFT, 0, 0
            for first in range(0, pages, block * step):
                count = min(block, pages - first)
                entries = np.frombuffer(os.pread(pagemap, count * 8, ((start >> PAGE_SHIFT) + first) * 8), np.uint64)
                present += int(np.count_nonzero(entries >> np.uint64(63)))
                read += len(entries)
            found.append([start, end, (present * pages // read if read else 0) << PAGE_SHIFT])
    except OSError:
        pass
    finally:
        os.close(pagemap)
    return found


def consistent_sample(pid: int) -> tuple[int, dict | None]:
    """(time, sample) of PID: its status and its large mappings' resident bytes, read again when
    the RSS moved by more than CONSISTENT_BYTES while the mappings were read (a GC promoting
    into fresh pages meanwhile would put its step in the heap's pages and not in the RSS, or the
    reverse); after SAMPLE_TRIES the last read is kept."""
    for _ in range(SAMPLE_TRIES):
        now = time.monotonic_ns()
        sample = read_process_memory(pid)
        if sample is None:
            return now, None
        sample["large_mappings"] = large_mappings_resident(pid)
        after = read_process_memory(pid)
        if after is None or abs(after["rss"] - sample["rss"]) <= CONSISTENT_BYTES:
            break
    return now, sample


def descendants(pid: int) -> list[int]:
    """The processes below PID (children of any of its threads, and theirs), from /proc."""
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            pending.extend(children)
    return found


class ProcessMemorySampler:
    """Samples every process below this one into SESSION/memory/ until stopped."""

    def __init__(self, session: Path, period_s: float = PERIOD_S):
        self.directory = Path(session) / PROCESS_MEMORY_DIR
        self.period_s = period_s
        self._stop = threading.Event()
        self._files: dict[int, object] = {}
        self._thread = threading.Thread(target=self._run, name="tandem-memory", daemon=True)
        self.cost_ns = 0  # CPU time of this thread, read at stop (the capture's cost, docs/results.md)
        self.samples = 0

    def start(self) -> "ProcessMemorySampler":
        self.directory.mkdir(mode=0o700, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                self.sample_once()
                if self._stop.wait(self.period_s):
                    break
            self.sample_once()  # the last moment (the command has exited: its children may still run)
        except OSError:  # the session deleted or its disk full: stop sampling, never fail the recording
            pass
        finally:
            self.cost_ns = time.thread_time_ns()
            for f in self._files.values():
                try:
                    f.close()
                except OSError:
                    pass

    def sample_once(self) -> None:
        for pid in descendants(os.getpid()):
            now, sample = consistent_sample(pid)
            if sample is None:
                continue
            out = self._files.get(pid)
            if out is None:
                out = self._files[pid] = open(self.directory / f"{pid}.jsonl", "a", buffering=1)
            out.write(json.dumps({"t": now, "pid": pid, **sample}) + "\n")
            self.samples += 1
