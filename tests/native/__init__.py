"""Native code of the tests and benchmarks only, built on demand (build.py), never shipped."""
