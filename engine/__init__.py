"""tandem: JVM pauses and CPython GIL states on one clock.

The package root stays light on purpose: `tandem --help` must answer fast, and the GIL
probe (`engine.probe`) is imported inside services whose interpreter may have none of
tandem's dependencies. Public API names are resolved lazily.
"""
__version__ = "0.1.0"

_LAZY = {
    "read_pauses": "engine.ingest.jfr",
    "read_gil": "engine.ingest.gil",
    "analyze": "engine.analysis",
    "load_results": "engine.analysis",
    "TandemError": "engine.errors",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
