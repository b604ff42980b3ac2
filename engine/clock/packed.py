"""Zstandard-packed JFR chunks (a flight recorder's `jvm-<pid>/packed/<chunk>.jfr.zst`, docs/session.md,
"Flight recorder"): the decompressor with the dictionary beside them, and a packed chunk's span read
from its first decompressed bytes. Ingest decompresses whole files with these (engine/ingest/jfr_input.py);
the session layout and the keeper only need a chunk's start.
"""
from __future__ import annotations

import struct
from pathlib import Path

from engine.clock.chunks import HEADER_SIZE, MAGIC
from engine.errors import TandemError


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A JVM's first finished chunk, packed alone: the Zstandard dictionary (raw content) every
# packed chunk of that JVM is compressed with (the metadata and constant pools each chunk repeats).
PACKED_DICTIONARY = "dictionary.jfr.zst"


def is_zstd(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZSTD_MAGIC
    except OSError:
        return False


def zstandard_module(path: Path):
    try:
        import zstandard
    except ImportError:
        raise TandemError(f"{path}: reading Zstandard-compressed JFR needs the zstandard package (pip install zstandard)") from None
    return zstandard


_DICTIONARIES: dict = {}


def zstd_dictionary(path: Path):
    """The dictionary a packed chunk was compressed with: the JVM's packed/dictionary.jfr.zst
    beside it (docs/session.md, "Flight recorder"), as raw content; None for any other file.
    (A frame compressed without it decompresses the same with it: it only adds history.)"""
    dictionary = path.with_name(PACKED_DICTIONARY)
    if path.name == PACKED_DICTIONARY or not dictionary.is_file():
        return None
    zstandard = zstandard_module(path)
    try:
        stamp = dictionary.stat()
        key = (str(dictionary), stamp.st_ino, stamp.st_mtime_ns)
        if key not in _DICTIONARIES:
            with open(dictionary, "rb") as f:
                content = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
            _DICTIONARIES.clear()  # (one JVM's at a time: chunks are read JVM by JVM)
            _DICTIONARIES[key] = zstandard.ZstdCompressionDict(content, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        return _DICTIONARIES[key]
    except (OSError, zstandard.ZstdError) as err:
        raise TandemError(f"{dictionary}: the dictionary of the packed chunks beside it cannot be read ({err})") from None


def zstd_decompressor(path: Path):
    zstandard = zstandard_module(path)
    dictionary = zstd_dictionary(path)
    return zstandard.ZstdDecompressor(dict_data=dictionary) if dictionary is not None else zstandard.ZstdDecompressor()


def packed_chunk_span(path: Path) -> tuple[int, int] | None:
    """(start, end) on the wall clock (ns since the epoch, as the chunk header says) of a
    Zstandard-compressed chunk, from its first decompressed bytes; None when unreadable."""
    zstandard = zstandard_module(path)
    try:
        with open(path, "rb") as f:
            header = zstd_decompressor(path).stream_reader(f).read(HEADER_SIZE)
    except (OSError, zstandard.ZstdError, TandemError):  # gone or damaged: the reader says so
        return None
    if len(header) < HEADER_SIZE or header[:4] != MAGIC:
        return None
    start_nanos, duration_nanos = struct.unpack_from(">qq", header, 32)
    return start_nanos, start_nanos + duration_nanos
