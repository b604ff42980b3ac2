"""`tandem live`: correlate a running session as it runs (docs/live.md).

Responsibilities, one module each:
- sources: the processes of a session as they appear and exit; a GIL ring per Python
  process, a pause ring or the JFR repository per JVM (chosen automatically);
- intervals: GIL events arriving in batches -> released/waiting intervals;
- watermark: how far both streams are complete (the slower one bounds it);
- join: WindowedJoin + a lane for late rows, and the rolling summary;
- writer: rolling Parquet parts, each file atomic;
- view: rich Live (or plain lines without a terminal);
- alerts: `--alert-overlap` lines, JSON lines, user command;
- runner: the loop tying them together.
"""
