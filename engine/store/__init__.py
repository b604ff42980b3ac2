"""Tables on disk: Parquet files with tandem's metadata (`write_table`, `read_table`)."""
from engine.store.parquet import read_table, write_table

__all__ = ["read_table", "write_table"]
