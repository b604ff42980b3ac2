"""`tandem live`: correlate a running session as it runs (docs/live.md).

The correlation is the core's (engine/correlate), as for `tandem analyze`; this package has
its inputs and outputs, one module each:
- sources: the processes of a session as they appear and exit, each a source of one of
  these kinds: gil_ring, a Python process's GIL ring (its events paired into intervals as
  offline, engine.ingest.gil.Pairing); per JVM (chosen automatically) ring_and_repository,
  its pause ring (pause_ring) reconciled with its JFR repository (repository), or the
  repository alone; jvm_source, what a JVM's share;
- causes: who caused each pause, as the pauses become due;
- watermark: how far the GIL streams are complete;
- lifetimes: which threads and processes still exist (/proc), for the core;
- writer: rolling Parquet parts, each file atomic;
- view: rich Live (or plain lines without a terminal);
- alerts: `--alert-overlap` lines, JSON lines, user command;
- metrics: Prometheus / OpenTelemetry;
- memory: the allocators' settings that keep a long run's memory flat;
- runner: the loop driving the core with them.
"""
from engine.live.memory import arrow_on_system_pool

# pyarrow picks its default memory pool once, when it loads; `tandem live` imports this
# package before anything loads pandas (and with it pyarrow), so this is early enough.
arrow_on_system_pool()
