"""What keeps `tandem live`'s memory flat over a long run: the allocators' settings.

Measured over 5-minute soaks (docs/live.md, "Memory"): the structures the loop keeps are
bounded, and RSS still grew because allocators kept freed memory. Each setting here is one
of those findings; `arrow_on_system_pool` must run before pyarrow is first imported (this
package's `__init__` calls it), `bound_allocator` before the process's other threads start.
"""
from __future__ import annotations

import functools
import os
import sys


@functools.lru_cache(maxsize=None)  # two names: malloc_trim (every roll), mallopt (once)
def _glibc_function(name: str):
    """glibc's allocator function NAME, or None where libc.so.6 or the function is missing."""
    try:
        import ctypes

        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc keeps them, arena by arena,
    after pandas' short-lived buffers: RSS would creep up over a long run)."""
    malloc_trim = _glibc_function("malloc_trim")
    if malloc_trim:
        malloc_trim(0)


M_ARENA_MAX, M_MMAP_THRESHOLD = -8, -3   # glibc's mallopt parameters (malloc.h)


def bound_allocator() -> None:
    """Keep glibc's heap from growing over a long run; call before other threads start.

    With the bytes in use flat, the arenas grow with free space inside them: freed numpy and
    pandas buffers raise glibc's dynamic mmap threshold, after which buffers of hundreds of
    KiB come from the arenas and fragment them, and each thread gets an arena of its own. A
    fixed threshold (128 KiB: larger buffers are mmapped and given back whole when freed) and
    two arenas keep them flat."""
    mallopt = _glibc_function("mallopt")
    if mallopt:
        mallopt(M_MMAP_THRESHOLD, 128 * 1024)
        mallopt(M_ARENA_MAX, 2)


ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_on_system_pool() -> None:
    """pyarrow's default pool becomes the system allocator (glibc, bounded above).

    pandas' "string" columns live in Arrow buffers, so every frame of the loop, the writer,
    the finalization and the repository reads allocates there, from four threads. The wheels'
    default pool (mimalloc) holds tens of MiB resident for the few MiB pyarrow has allocated,
    and wanders by as much within a minute. pyarrow reads the variable once, when it
    loads, and `pyarrow.set_memory_pool` moves only the Python-level default (pandas' string
    arrays still came from mimalloc): hence before the import. The variable is restored at
    once, so the command `tandem live` runs does not inherit it; a user's own choice wins."""
    if "pyarrow" in sys.modules or ARROW_POOL_VARIABLE in os.environ:
        return
    os.environ[ARROW_POOL_VARIABLE] = "system"
    try:
        import pyarrow  # noqa: F401  (loading it fixes the default pool)
    except ImportError:
        pass
    finally:
        del os.environ[ARROW_POOL_VARIABLE]
