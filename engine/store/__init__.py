"""Tables on disk: Parquet files with tandem's metadata (`write_table`, `TableWriter`, `copy_table` and `TableCopy`,
`read_table`; several published together: `staging_directory`, `publish`)."""
from engine.store.parquet import (TableCopy, TableWriter, WriterThread, copy_table, is_text, not_parquet, pandas_string_type,
                                  publish, read_metadata, read_table, staging_directory, write_table)

__all__ = ["TableCopy", "TableWriter", "WriterThread", "copy_table", "is_text", "not_parquet", "pandas_string_type", "publish",
           "read_metadata", "read_table", "staging_directory", "write_table"]
