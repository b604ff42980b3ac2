"""Tables on disk: Parquet files with tandem's metadata (`write_table`, `TableWriter`, `copy_table` and `TableCopy`, `read_table`)."""
from engine.store.parquet import TableCopy, TableWriter, WriterThread, copy_table, is_text, read_metadata, read_table, write_table

__all__ = ["TableCopy", "TableWriter", "WriterThread", "copy_table", "is_text", "read_metadata", "read_table", "write_table"]
