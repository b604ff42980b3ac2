"""The JVM's memory events of a JFR recording (PauseEvents.java selects them), on CLOCK_MONOTONIC.

Read through jdk.jfr in tandem's own JVM (engine.jvm) by tandem.ingest.MemoryReader, one
handler per event type, so the parser skips every other event, and whole columns back in one
call; ticks go to CLOCK_MONOTONIC with the recording's tandem.ClockSync events
(engine.clock.align, as the pauses do).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from engine import jvm
from engine.clock import align
from engine.clock.chunks import copy_chunks  # (a copy cut at the last flush, marked finished)
from engine.clock.chunks import scan_chunks
from engine.ingest.jfr_input import readable_recordings


# event type -> {column: field}; every value in bytes except the counts.
PERIODIC_FIELDS = {
    "jdk.DirectBufferStatistics": {"jvm_direct_buffers": "memoryUsed", "jvm_direct_buffer_count": "count"},
    "jdk.JavaThreadStatistics": {"jvm_threads": "activeCount"},
    "jdk.GCHeapMemoryUsage": {"jvm_heap_used": "used", "jvm_heap_committed": "committed"},  # JDK 21+
    "jdk.ResidentSetSize": {"jvm_rss": "size"},  # JDK 21+
    "jdk.NativeMemoryUsageTotal": {"jvm_nmt_committed": "committed"},  # JDK 20+, NMT on
    "tandem.NativeMemoryUsageTotal": {"jvm_nmt_committed": "committed"},  # the agent's, JDK 17-19, NMT on
}
AT_GC_FIELDS = {
    "jdk.GCHeapSummary": {"jvm_heap_used": "heapUsed", "jvm_heap_committed": "heapSpace.committedSize",
                          "jvm_heap_start": "heapSpace.start", "jvm_heap_end": "heapSpace.reservedEnd"},
    "jdk.MetaspaceSummary": {"jvm_metaspace_used": "metaspace.used", "jvm_metaspace_committed": "metaspace.committed"},
}
# The event types whose rows are computed rather than read from one field (G1's old-generation
# copying waste, the code heaps, NMT's categories, which collector) are tandem.ingest.MemoryReader's.


def nmt_column(category: str) -> str:
    """The memory.parquet column of an NMT category ("Java Heap" -> jvm_nmt_java_heap)."""
    return "jvm_nmt_" + "".join(c if c.isalnum() else "_" for c in category.lower()).strip("_")


def g1_side_tables_share(java_version: str | None) -> float:
    """Bytes of G1's side tables per byte of committed heap: HotSpot commits them with the heap's
    regions and marking touches them: the marking bitmap (a bit per 8-byte word), the block
    offset table and the card table (a byte per 512); up to JDK 19 a second bitmap and the card
    counts table too. An unknown version gets JDK 20's (the smaller)."""
    major = None
    if java_version:
        head = java_version.split("+")[0].split("-")[0].split(".")
        major = int(head[1] if head[0] == "1" and len(head) > 1 else head[0]) if head[0].isdigit() else None
    return 2 / 64 + 3 / 512 if major is not None and major < 20 else 1 / 64 + 2 / 512


def read_jvm_memory(recordings: list[Path], flushed: bool = False, java_version: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Long table (t_ns, column, value, after_gc) of one JVM's memory events, and what was
    left out and why (an unfinished chunk: a killed JVM's last seconds). flushed: read an
    unfinished chunk up to its last flush instead (a running JVM's repository: `tandem live`).
    With G1, jvm_gc_side_tables: its side tables, estimated from the committed heap (JAVA_VERSION:
    the JVM's, jvm.json's java_version)."""
    with readable_recordings(list(recordings)) as (readable, named):  # (packed chunks decompressed)
        table, facts = _read_jvm_memory(readable, flushed)
        facts["skipped_recordings"] = [named(path) for path in facts["skipped_recordings"]]
    is_g1 = (table["column"] == "jvm_g1").to_numpy(bool)
    if is_g1.any():
        committed = table[(table["column"] == "jvm_heap_committed").to_numpy(bool)]
        side = committed.assign(column="jvm_gc_side_tables", value=committed["value"] * g1_side_tables_share(java_version))
        table = pd.concat([table[~is_g1], side], ignore_index=True).sort_values("t_ns", kind="stable", ignore_index=True)
    return table, facts


def _read_jvm_memory(recordings: list[Path], flushed: bool) -> tuple[pd.DataFrame, dict]:
    rows: list[tuple] = []  # per file: (ticks, column, value, after_gc) arrays
    syncs: list[np.ndarray] = []  # per file: its tandem.ClockSync samples (_read_file)
    skipped = []
    tps = None
    for path in recordings:
        scan = scan_chunks(path)
        if (scan.unfinished is not None and not flushed) or not scan.chunks:
            skipped.append(str(path))  # jdk.jfr would wait for the rest of an unfinished chunk
            continue
        tps = scan.chunks[0].ticks_per_second
        if scan.unfinished is None:
            syncs.append(_read_file(path, rows))
            continue

        with tempfile.TemporaryDirectory(prefix="tandem-memory-") as tmp:
            syncs.append(_read_file(copy_chunks(path, scan.chunks, Path(tmp) / "flushed.jfr"), rows))
    facts = {"skipped_recordings": skipped}
    sync_ticks, sync_mono, sync_span = np.concatenate(syncs, axis=1) if syncs else np.zeros((3, 0), np.int64)
    if not rows or not sync_ticks.size or tps is None:
        facts["note"] = "no memory events" if not rows else "no tandem.ClockSync events: the JVM's memory is left out"
        return pd.DataFrame({"t_ns": pd.Series(dtype="int64"), "column": pd.Series(dtype="string"),
                             "value": pd.Series(dtype="float64"), "after_gc": pd.Series(dtype="bool")}), facts
    alignment = align.fit_clock_sync(sync_ticks, sync_mono, tps, sync_span)
    ticks, column, value, after_gc = (np.concatenate(part) for part in zip(*rows))
    table = pd.DataFrame({"t_ns": align.ticks_to_domain_ns(ticks, [], alignment),
                          "column": pd.array(column, dtype="string"), "value": value, "after_gc": after_gc})
    facts["clock"] = alignment.as_metadata()
    return table.sort_values("t_ns", kind="stable", ignore_index=True), facts


def _read_file(path: Path, rows: list) -> np.ndarray:
    """PATH's memory events through tandem.ingest.MemoryReader (one Java call: the GIL is free
    while it reads), appended to ROWS as (ticks, column, value, after_gc) columns; returns its
    clock-sync samples as three rows: start ticks, CLOCK_MONOTONIC ns, span in ticks."""
    jpype = jvm.start_jvm()
    reader = jpype.JClass("tandem.ingest.MemoryReader")()
    for fields, at_gc in ((PERIODIC_FIELDS, False), (AT_GC_FIELDS, True)):
        for event_type, mapping in fields.items():
            for column, name in mapping.items():
                reader.field(event_type, column, name, at_gc)
    try:
        reader.readFile(str(path))
    finally:
        jpype.java.lang.Thread.detach()  # (JPype attached this thread and would keep it attached)
    prefix = str(reader.NMT_PREFIX)
    names = np.array([nmt_column(n[len(prefix):]) if n.startswith(prefix) else n
                      for n in map(str, reader.columnNames())], dtype=object)
    if len(names):
        rows.append((np.asarray(reader.ticks(), np.int64), names[np.asarray(reader.columns(), np.int64)],
                     np.asarray(reader.values(), np.int64).astype(np.float64), np.asarray(reader.afterGc(), np.int32) != 0))
    return np.array([np.asarray(samples(), np.int64)
                     for samples in (reader.syncTicks, reader.syncMonotonicNanos, reader.syncSpanTicks)], np.int64).reshape(3, -1)
