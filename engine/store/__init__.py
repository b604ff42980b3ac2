"""Tables on disk: Parquet files with tandem's metadata (`write_table`, `TableWriter`, `read_table`)."""
from engine.store.parquet import TableWriter, WriterThread, read_metadata, read_table, write_table

__all__ = ["TableWriter", "WriterThread", "read_metadata", "read_table", "write_table"]
