"""`tandem live`: correlate a running session as it runs (docs/live.md).

Responsibilities, one module each:
- sources: the processes of a session as they appear and exit; a GIL ring per Python
  process, a pause ring or the JFR repository per JVM (chosen automatically);
- intervals: GIL events arriving in batches -> released/waiting intervals;
- watermark: how far both streams are complete (the slower one bounds it);
- join: the windowed join (offline pair code) + a lane for late rows;
- impact: pause_impact, gil_free and the rolling summary, finalized as the watermark passes;
- writer: rolling Parquet parts, each file atomic;
- view: rich Live (or plain lines without a terminal);
- alerts: `--alert-overlap` lines, JSON lines, user command;
- memory: the allocators' settings that keep a long run's memory flat;
- runner: the loop tying them together.
"""
from engine.live.memory import arrow_on_system_pool

# pyarrow picks its default memory pool once, when it loads; `tandem live` imports this
# package before anything loads pandas (and with it pyarrow), so this is early enough.
arrow_on_system_pool()
