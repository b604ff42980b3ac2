"""Parquet tables with tandem metadata, written atomically with the user's umask.

`TableWriter` writes a table row group by row group as it is produced (peak memory: one row
group); `write_table` writes a DataFrame with it in one go. It writes to a temporary file in the
destination directory and renames it into place (os.replace), so a reader sees the old file
or the new one, never half of one; the file gets the mode a plain `open()` would give
(0666 minus the umask), not mkstemp's 0600. The metadata dict is stored JSON-encoded under
the Parquet key-value key `tandem`, and comes back as `DataFrame.attrs` from `read_table`.
A run writing several tables writes them into a staging directory and publishes them together.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pandas as pd

from engine.errors import TandemError
from engine.session import process_alive

METADATA_KEY = b"tandem"


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # (not thread-safe: only where /proc does not say)
    os.umask(mask)
    return mask


def _temporary(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


def _remove_dead_writers_temporaries(path: Path) -> None:
    """A writer killed mid-write (SIGKILL) leaves its temporary behind, named with its pid; the
    next writer of the same file removes those whose process is gone (a live one's it keeps)."""
    for tmp in _left_by_dead_writers(path.parent, f".{path.name}.", ".tmp"):
        tmp.unlink(missing_ok=True)


def _left_by_dead_writers(directory: Path, prefix: str, suffix: str = "") -> list[Path]:
    """DIRECTORY's PREFIX<pid>.*SUFFIX entries whose writer (that pid) is gone."""
    left = []
    for entry in directory.glob(f"{glob.escape(prefix)}*{suffix}"):
        pid = entry.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            left.append(entry)
    return left


STAGING_PREFIX = ".staging."


def staging_directory(out: Path) -> Path:
    """A directory inside OUT for one run's result files, moved into OUT together once every one
    is written (`publish`): OUT holds one run's results or the next's, never some of each (a disk
    that fills halfway through them). A killed run's directory (named with its pid) goes at the next."""
    for old in _left_by_dead_writers(out, STAGING_PREFIX):
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}.", dir=out))


def publish(staging: Path, files: list[Path], out: Path) -> list[Path]:
    """FILES of STAGING renamed into OUT, STAGING removed; their new paths. (Renames within one
    file system: nothing left that can fail for want of space.)"""
    published = []
    for path in files:
        os.replace(path, out / path.name)
        published.append(out / path.name)
    shutil.rmtree(staging, ignore_errors=True)
    return published


def _encoded(metadata: dict) -> bytes:
    return json.dumps(metadata, default=_json_default).encode()


def write_table(df: pd.DataFrame, path: str | Path, metadata: dict | None = None, *,
                pandas_metadata: bool = True) -> Path:
    """Writes `df` to `path` atomically with `metadata` (default: df.attrs) as JSON under `tandem`.
    pandas_metadata=False leaves out pandas' own schema metadata (pandas cannot read back an Arrow
    list dtype it names there; every reader reads the Parquet list as it is)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    if not pandas_metadata:
        table = table.replace_schema_metadata(None)
    writer = TableWriter(path, table.schema)
    try:
        writer.write(table)
    except BaseException:
        writer.abort()
        raise
    return writer.close(df.attrs if metadata is None else metadata)


def copy_table(source: str | Path, path: str | Path, metadata: dict) -> Path:
    """SOURCE's pages byte for byte into PATH (atomically), its footer made anew with METADATA
    under `tandem` (TableCopy, in one go)."""
    return TableCopy(source, path).close(metadata)


class TableCopy:
    """SOURCE's pages copied byte for byte into a temporary file beside PATH, begun at once in a
    thread of its own; `close(metadata)` adds a footer made anew with METADATA under `tandem` and
    renames the file into place. A large table is copied at disk speed, not decoded and encoded
    again, while the caller goes on (analyze copies a gil.parquet input while it correlates).
    Raises ValueError where the footer cannot be remade (a schema pyarrow would write otherwise)."""

    def __init__(self, source: str | Path, path: str | Path):
        import pyarrow.parquet as pq

        self.source, self.path = str(source), Path(path)
        original = pq.ParquetFile(source)
        self.schema, self.groups = original.schema_arrow, original.metadata
        self._footer({})  # (raises now, before any copying, where it cannot be remade)
        self._tmp = _temporary(self.path)
        self._error: BaseException | None = None
        self._pages = 0
        self._thread = threading.Thread(target=self._copy_pages, name="tandem-table-copy", daemon=True)
        self._thread.start()

    def _footer(self, metadata: dict) -> bytes:
        """A footer-only file's bytes: magic, the row groups' metadata pointing into SOURCE's pages, magic."""
        import io

        import pyarrow.parquet as pq

        kept = {k: v for k, v in (self.schema.metadata or {}).items() if k != METADATA_KEY}
        footer = io.BytesIO()
        try:
            pq.write_metadata(self.schema.with_metadata({**kept, METADATA_KEY: _encoded(metadata)}), footer,
                              metadata_collector=[self.groups])
        except (RuntimeError, OSError) as err:  # (pyarrow: "AppendRowGroups requires equal schemas")
            raise ValueError(f"{self.source}: its footer cannot be remade: {str(err).splitlines()[0]}") from None
        return footer.getvalue()

    def _copy_pages(self) -> None:
        import struct

        try:
            with open(self.source, "rb") as src, open(self._tmp, "wb", buffering=0) as dst:
                src.seek(-8, os.SEEK_END)
                self._pages = src.tell() - struct.unpack("<i", src.read(4))[0]  # where SOURCE's own footer begins
                _copy_range(src.fileno(), dst.fileno(), self._pages, self.source)
        except BaseException as err:  # (raised by close)
            self._error = err

    def close(self, metadata: dict) -> Path:
        self._thread.join()
        try:
            if self._error is not None:
                raise self._error
            with open(self._tmp, "r+b", buffering=0) as dst:
                dst.seek(self._pages)
                dst.write(self._footer(metadata)[4:])
            os.replace(self._tmp, self.path)
        except BaseException:
            Path(self._tmp).unlink(missing_ok=True)
            raise
        return self.path

    def abort(self) -> None:
        self._thread.join()
        Path(self._tmp).unlink(missing_ok=True)


def _copy_range(src: int, dst: int, count: int, name: str) -> None:
    """The first COUNT bytes of SRC into DST, in the kernel where it can (copy_file_range), else
    read and written (a kernel or file system without it across file systems)."""
    import errno

    done = 0
    while done < count:
        try:
            copied = os.copy_file_range(src, dst, count - done, done, done)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            chunk = os.pread(src, min(count - done, 8 << 20), done)
            copied = os.pwrite(dst, chunk, done) if chunk else 0
        if copied == 0:
            raise OSError(f"{name}: shorter than its footer says")
        done += copied


class TableWriter:
    """One Parquet file written row group by row group, renamed into place by `close(metadata)`."""

    def __init__(self, path: str | Path, schema, *, text_as_dictionary: bool = False):
        """text_as_dictionary: the text columns of SCHEMA come (or are made) dictionary-encoded
        and are written so, without Arrow's schema in the file: they read back as text. Writing
        a block's few distinct names once with indexes costs half of casting every row to text
        and having Parquet build the dictionary again."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.rows = 0
        self._tmp = _temporary(self.path)
        # (a schema copied from an input table may carry the input's own `tandem` metadata)
        schema = schema.with_metadata({k: v for k, v in (schema.metadata or {}).items() if k != METADATA_KEY})
        if text_as_dictionary:
            schema = pa.schema([f.with_type(pa.dictionary(pa.int32(), pa.string())) if is_text(f.type) else f
                                for f in schema], metadata=schema.metadata)
        self.schema = schema
        self._coerce = text_as_dictionary
        # Dictionary pages for text columns only: for int64 columns of times and ids, building the
        # dictionaries cost more than the rest of the write and saved little (bench/bench_join.py).
        text = [f.name for f in schema if is_text(f.type) or pa.types.is_dictionary(f.type)]
        # Integers (times in ns, ids, counts) delta-encoded: a time column rises by small steps,
        # so its pages are half of PLAIN's after LZ4 and written in half the time (gil_free).
        integers = {f.name: "DELTA_BINARY_PACKED" for f in schema if pa.types.is_integer(f.type)}
        # Min/max statistics for the other columns (times, ids: what a reader prunes row groups
        # by); text statistics cost a quarter of a gil table's write and prune nothing.
        try:
            self._writer = pq.ParquetWriter(self._tmp, schema, compression="lz4", use_dictionary=text,
                                            column_encoding=integers or None,
                                            write_statistics=[f.name for f in schema if f.name not in text],
                                            store_schema=not text_as_dictionary)
        except BaseException:  # (its first bytes did not fit on the disk: no empty temporary left)
            Path(self._tmp).unlink(missing_ok=True)
            raise

    def write(self, table) -> None:
        if table.num_rows:
            self._writer.write_table(_as_dictionary_text(table, self.schema) if self._coerce else table)
            self.rows += table.num_rows

    def close(self, metadata: dict) -> Path:
        try:
            self._writer.add_key_value_metadata({METADATA_KEY: _encoded(metadata)})
            self._writer.close()
            os.replace(self._tmp, self.path)
        except BaseException:  # (metadata that is not JSON, a full disk: the old file stays)
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """The file given up: its temporary file removed, whatever closing it says (on a full
        disk the close fails too)."""
        try:
            self._writer.close()
        except Exception:
            pass
        finally:
            Path(self._tmp).unlink(missing_ok=True)


def is_text(arrow_type) -> bool:
    """An Arrow text type (pandas gives pyarrow large_string)."""
    import pyarrow as pa

    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _as_dictionary_text(table, schema):
    """TABLE with SCHEMA's dictionary-encoded text columns: text encoded, each dictionary made of
    each text once, a null entry of a dictionary a null index. Parquet takes no null in a
    dictionary, and writes a column whose dictionary repeats a value PLAIN, every row's text
    materialized (a producer's dictionary has an entry per code: a function of several lines, a
    thread name in two processes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for field in schema:
        column = table.column(field.name)
        if pa.types.is_dictionary(field.type):
            chunks = []
            for chunk in column.chunks:
                if not pa.types.is_dictionary(chunk.type):
                    chunk = pc.dictionary_encode(chunk)
                elif chunk.dictionary.null_count or pc.count_distinct(chunk.dictionary).as_py() < len(chunk.dictionary):
                    unique = pc.dictionary_encode(chunk.dictionary)  # (a null entry: a null index)
                    chunk = pa.DictionaryArray.from_arrays(unique.indices.take(chunk.indices), unique.dictionary)
                chunks.append(chunk.cast(field.type))
            column = pa.chunked_array(chunks, field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


class WriterThread:
    """Row groups handed to TableWriters are written by one thread of its own (pyarrow releases
    the GIL while it encodes and writes), so the computation goes on meanwhile. `drain()` waits
    for everything handed over and raises the first error the thread met."""

    def __init__(self, depth: int = 2):
        import queue
        import threading

        # bounded: memory stays a couple of row groups (a deeper queue fills only as the writer
        # falls behind bit by bit over a long session: a long session's peak, not a short one's)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tandem-parquet-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    writer, table = job
                    writer.write(table)
            except BaseException as err:  # raised by drain()
                self._error = err
            finally:
                self._queue.task_done()

    def write(self, writer: TableWriter, table) -> None:
        if self._error is not None:
            raise self._error
        if table.num_rows:
            self._queue.put((writer, table))

    def drain(self) -> None:
        self._queue.join()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()


# What a file given where a Parquet table belongs may be instead, by its first bytes (said so in
# the error): JFR's chunk magic (docs/pauses.md), the probe's files (docs/ring.md), gzip.
OTHER_FORMATS = {b"FLR\0": "a JFR recording (tandem reads those given with --jfr)",
                 b"TNDMRING": "a GIL probe events file (give it with --gil, or its session)",
                 b"TNDMPACK": "a packed segment of a session's GIL probe files (give its session)",
                 b"\x1f\x8b": "gzip-compressed (a JFR recording so compressed is read with --jfr)"}


def not_parquet(path: str | Path, err: Exception) -> TandemError:
    """The one-line error for PATH, which Arrow could not read as Parquet (ERR): what the file is
    instead when its first bytes say so."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        head = b""
    for magic, what in OTHER_FORMATS.items():
        if head.startswith(magic):
            return TandemError(f"{path}: not a Parquet table but {what}")
    return TandemError(f"{path}: not a readable Parquet table: {err}")


def read_metadata(path: str | Path) -> dict:
    """The `tandem` metadata of a Parquet file, without reading its rows (`TableWriter` adds it to
    the file's key-value metadata at the end; files written before had it in the Arrow schema's)."""
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_metadata(path).metadata or {}).get(METADATA_KEY)
    except (OSError, ValueError) as err:
        raise not_parquet(path, err) from None
    return json.loads(raw) if raw else {}


def pandas_string_type(arrow_type):
    """pandas' "string" dtype for Arrow text (string or large_string, dictionary-encoded or not:
    pandas 3 would make its `str` of some); None (pandas' own choice) for any other type."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return pd.StringDtype() if is_text(arrow_type) else None


def read_table(path: str | Path) -> pd.DataFrame:
    """Reads a table written by `write_table` or `TableWriter`; its metadata becomes `df.attrs`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:
        raise not_parquet(path, err) from None
    schema_metadata = table.schema.metadata or {}
    raw = schema_metadata.get(METADATA_KEY)
    # Written without pandas' own metadata (TableWriter): strings come back as pandas strings.
    df = table.to_pandas() if b"pandas" in schema_metadata else table.to_pandas(types_mapper=pandas_string_type)
    for field, column in zip(table.schema, table.columns):  # (an integer column with nulls: Int64, not float)
        if pa.types.is_integer(field.type) and column.null_count and pd.api.types.is_float_dtype(df[field.name].dtype):
            df[field.name] = df[field.name].astype("Int64")
    df.attrs = json.loads(raw) if raw else read_metadata(path)
    return df


def _json_default(value):
    # numpy scalars and paths appear in metadata dicts; store them as plain JSON values.
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"metadata value {value!r} is not JSON-serialisable")
