"""JFR files as people have them, made readable before ingest looks at their chunks.

- gzip-compressed recordings (`.jfr.gz`, or a `.jfr` that is gzip inside: JMC writes and
  reads both) are decompressed, streamed a block at a time, into a private temporary file;
  jdk.jfr and the chunk scan read that, and every message, warning and `source` value names
  the user's file again (`named`). A gzip stream cut short keeps what it held, and the
  usual salvage rules of a truncated recording apply to it.
- Zstandard-compressed chunks (the flight recorder's `jvm-<pid>/packed/<chunk>.jfr.zst`,
  docs/session.md, or any `.jfr` compressed with `zstd`) are decompressed the same way.
- an empty file is called empty (not "not a JFR recording").
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.clock.chunks import MAGIC as JFR_MAGIC
from engine.clock.packed import ZSTD_MAGIC, is_zstd, zstandard_module, zstd_decompressor
from engine.errors import TandemError, TandemWarning
from engine.session import PACKED_CHUNKS


GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 1 << 20


def is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False  # the chunk scan says what is wrong with it


def looks_like_jfr(path: Path) -> bool:
    """Whether PATH starts as a JFR recording does, plain or compressed as JFR files are (gzip,
    Zstandard): what `--pauses` or the notebook's `analyze(PATH, ...)` were given, read as a
    recording rather than refused as a Parquet table. A name ending in .jfr (.jfr.gz, .jfr.zst)
    is one too, so that a damaged recording gets the JFR reader's word on what is wrong."""
    if path.name.endswith((".jfr", ".jfr.gz", ".jfr.zst")):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False  # (read as a table: its reader names what is wrong with the path)
    return head == JFR_MAGIC or head.startswith(GZIP_MAGIC) or head == ZSTD_MAGIC


def unzstd(path: Path, dest: Path) -> None:
    """Decompress PATH (Zstandard frames, one after another) into DEST a block at a time; a
    stream cut short keeps what it held, with one warning (as gzip), damage is one line."""
    zstandard = zstandard_module(path)
    written, in_frame = 0, False
    decompressor = zstd_decompressor(path).decompressobj()
    try:
        with open(path, "rb") as source, open(dest, "wb") as out:
            while block := source.read(_BLOCK):
                while block:
                    in_frame = True
                    data = decompressor.decompress(block)
                    out.write(data)
                    written += len(data)
                    block = b""
                    if decompressor.eof:  # a frame ended: what follows is the next one
                        block, in_frame = decompressor.unused_data, False
                        decompressor = zstd_decompressor(path).decompressobj()
    except zstandard.ZstdError as err:
        raise TandemError(f"{path}: Zstandard-compressed, but damaged ({err}) after {written} decompressed bytes") from None
    if in_frame and written:
        warnings.warn(f"{path}: the Zstandard stream is cut short after {written} decompressed bytes: reading what it holds",
                      TandemWarning, stacklevel=4)
    if written == 0:
        raise TandemError(f"{path}: Zstandard-compressed, but nothing could be decompressed (empty or cut short)")


def _check_not_empty(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError:
        return  # missing or unreadable: the chunk scan says so
    if size == 0:
        raise TandemError(f"{path}: empty file (0 bytes): no recording in it (was the JVM still starting, or killed before JFR wrote?)")


def _gunzip(path: Path, dest: Path) -> None:
    """Decompress PATH into DEST a block at a time (the members of a multi-member gzip in
    turn); a stream cut short or damaged keeps what it held up to there, with one warning."""
    written, problem, in_member = 0, None, False
    decompressor = zlib.decompressobj(wbits=31)
    with open(path, "rb") as source, open(dest, "wb") as out:
        while problem is None and (block := source.read(_BLOCK)):
            while block:
                in_member = True
                try:
                    data = decompressor.decompress(block)
                except zlib.error as err:
                    problem = f"damaged gzip data ({err})"
                    break
                out.write(data)
                written += len(data)
                block = b""
                if decompressor.eof:  # a member ended: what follows is the next one
                    block, in_member = decompressor.unused_data, False
                    decompressor = zlib.decompressobj(wbits=31)
    if problem is None and in_member:
        problem = "the gzip stream is cut short"
    if problem and written == 0:
        raise TandemError(f"{path}: gzip-compressed, but nothing could be decompressed ({problem})")
    if problem:
        warnings.warn(f"{path}: {problem} after {written} decompressed bytes: reading what it holds",
                      TandemWarning, stacklevel=4)
    if written == 0:
        raise TandemError(f"{path}: empty file (gzip of 0 bytes): no recording in it")


@contextlib.contextmanager
def readable_recordings(paths: list[Path]) -> Iterator[tuple[list[Path], Callable[[str], str]]]:
    """(paths jdk.jfr can read, named): gzip and Zstandard files decompressed into a private
    temporary directory kept for the block; `named(text)` puts the user's file names back in a text.

    A flight recorder's packed chunks and the rest of the same JVM's recording that follows
    them in PATHS (docs/session.md, "Flight recorder") are laid end to end into one file, as
    the JVM's recording.jfr would hold them: a safepoint that JFR's chunk rotation split across
    two chunks (its begin in one, its end in the next) is then read whole, as from a full
    recording; the file is named `<jvm dir>/packed/*.jfr.zst + <the rest>`."""
    for path in paths:
        _check_not_empty(path)
    compressed = {path: _gunzip for path in paths if is_gzip(path)} | {path: unzstd for path in paths if is_zstd(path)}
    if not compressed:
        yield paths, lambda text: text
        return
    with tempfile.TemporaryDirectory(prefix="tandem-unpack-") as tmp:
        names: dict[str, str] = {}
        readable = []
        for index, path in enumerate(paths):
            if path in compressed:
                stem = path.name.removesuffix(".gz").removesuffix(".zst")
                dest = Path(tmp) / f"{index}-{stem}"
                compressed[path](path, dest)
                names[str(dest)] = str(path)
                path = dest
            readable.append(path)
        readable = _one_file_per_flight_recorder(paths, readable, Path(tmp), names)

        def named(text: str) -> str:
            for temporary, original in sorted(names.items(), key=lambda item: -len(item[0])):
                text = text.replace(temporary, original)
            return text

        yield readable, named


def _one_file_per_flight_recorder(paths: list[Path], readable: list[Path], tmp: Path, names: dict[str, str]) -> list[Path]:
    """READABLE with each run of one JVM's files that starts with its packed chunks laid end to end
    into one file (NAMES gets its name)."""
    def jvm_of(path: Path) -> Path | None:
        for parent in path.parents:
            if parent.name.startswith("jvm-"):
                return parent
        return None

    out: list[Path] = []
    at = 0
    while at < len(paths):
        jvm = jvm_of(paths[at]) if paths[at].parent.name == PACKED_CHUNKS else None
        end = at + 1
        while jvm is not None and end < len(paths) and jvm_of(paths[end]) == jvm:
            end += 1
        if end - at == 1:
            out.append(readable[at])
        else:
            joined = tmp / f"{at}-joined.jfr"
            with open(joined, "wb") as target:
                for part in readable[at:end]:
                    with open(part, "rb") as source:
                        shutil.copyfileobj(source, target, _BLOCK)
            rest = [p.name for p in paths[at:end] if p.parent.name != PACKED_CHUNKS]
            names[str(joined)] = f"{jvm / PACKED_CHUNKS}/*.jfr.zst" + (f" + {' + '.join(rest)}" if rest else "")
            out.append(joined)
        at = end
    return out


def named_everywhere(value, named: Callable[[str], str]):
    """VALUE (metadata: dicts, lists, strings) with `named` applied to every string in it."""
    if isinstance(value, str):
        return named(value)
    if isinstance(value, dict):
        return {key: named_everywhere(item, named) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(named_everywhere(item, named) for item in value)
    return value
