"""Where the memory goes: the memory samples of a session, joined per process on one clock
(memory.parquet, docs/results.md) and who grew (engine.memory.growth)."""
from __future__ import annotations

from pathlib import Path

from engine.memory.growth import who_grew
from engine.memory.table import memory_table
from engine.store.parquet import write_table


MEMORY_TABLE = "memory.parquet"


def write_memory(session: Path, out: Path) -> list:
    """Write OUT/memory.parquet from SESSION's memory samples, with who grew in its metadata;
    returns who grew (engine.memory.growth.Growth per process), [] for a session without samples."""
    table, facts = memory_table(session)
    if table.empty:
        return []
    growths = who_grew(table)
    write_table(table, Path(out) / MEMORY_TABLE, {**facts, "growth": [g.as_metadata() for g in growths]})
    return growths
