"""The facts every result file carries (docs/results.md, "Outputs"), typed: what was correlated
(span, processes, counts), what was lost on the way (`Losses`, `JfrLost`), how the two sides were
put on one clock (`alignment`, each side's `ClockFacts`) and where the GIL rows are (`gil_table`).

They are written into every result file's Parquet metadata as the flat JSON object `analysis`
(`AnalysisFacts.as_metadata`) and read back with `AnalysisFacts.from_metadata`: a key a file lacks
(an older tandem's, a fleet summary's) takes its default, a key this version does not know is kept
aside (`more`) and written back as it was.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from engine.clock.facts import ClockFacts


@dataclass(frozen=True)
class JfrLost:
    """What ingest could not read of the JFR files (docs/pauses.md, "Damage")."""

    bytes: int = 0
    pause_events: int | None = 0      # None: some loss could not be counted
    pause_events_at_least: int = 0    # the countable part
    chunks: tuple[str, ...] = ()      # one line per damaged or incomplete chunk

    @classmethod
    def of_sources(cls, sources: list[dict]) -> "JfrLost":
        """From the pauses table's per-recording facts (engine.ingest.jfr: `damage`, `lost_bytes`)."""
        damage = [d for s in sources for d in s.get("damage") or []]
        cut = [s for s in sources if s.get("lost_bytes")]
        counts = [d.get("lost_pause_events") for d in damage] + [None for _ in cut]
        return cls(
            bytes=int(sum(d["lost_bytes"] for d in damage) + sum(s["lost_bytes"] for s in cut)),
            pause_events=None if None in counts else int(sum(counts)),
            pause_events_at_least=int(sum(d.get("lost_pause_events") if d.get("lost_pause_events") is not None
                                          else d.get("lost_pause_events_at_least") or 0 for d in damage)),
            chunks=tuple([f"{s['source']} chunk {d['chunk']}: from byte {d['from_byte']}, {d['lost_bytes']} bytes"
                          for s in sources for d in s.get("damage") or []]
                         + [f"{s['source']}: last {s['lost_bytes']} bytes (incomplete chunk)" for s in cut]),
        )

    def as_metadata(self) -> dict:
        return {"bytes": self.bytes, "pause_events": self.pause_events,
                "pause_events_at_least": self.pause_events_at_least, "chunks": list(self.chunks)}

    @classmethod
    def from_metadata(cls, value: dict | None) -> "JfrLost":
        value = value or {}
        return cls(int(value.get("bytes") or 0), value.get("pause_events", 0),
                   int(value.get("pause_events_at_least") or 0), tuple(value.get("chunks") or ()))


@dataclass(frozen=True)
class Losses:
    """Everything the inputs say was not recorded or not read."""

    dropped_events: int = 0              # GIL probe losses (lanes full)
    drain_lost_events: int = 0           # taken from the ring, not written to the events file
    kept_windows: tuple[dict, ...] = ()  # a flight recorder's GIL window per process (what rotation took before it)
    jfr_lost: JfrLost = JfrLost()
    jvm_unflushed: tuple[dict, ...] = ()  # per JVM that ended without shutting down: the window after its last flush
    duplicate_gil_rows_dropped: int = 0

    @classmethod
    def of_inputs(cls, pause_attrs: dict, gil_attrs: dict, duplicate_gil_rows: int) -> "Losses":
        """From the two input tables' metadata (engine.ingest.jfr's `sources`, engine.ingest.gil's
        `processes`) and the duplicate GIL rows the correlation dropped."""
        processes = gil_attrs.get("processes") or []
        sources = pause_attrs.get("sources") or []
        # Each side's: a result table given again as input keeps its analysis's of that side.
        gil = _results_losses(gil_attrs, "gil") or cls(
            dropped_events=_process_sum(gil_attrs, "dropped"),
            drain_lost_events=_process_sum(gil_attrs, "drain_lost"),
            kept_windows=tuple({"pid": p.get("pid"), **p["kept_window"]} for p in processes if p.get("kept_window")))
        pauses = _results_losses(pause_attrs, "pauses") or cls(
            jfr_lost=JfrLost.of_sources(sources),
            jvm_unflushed=tuple(s["unflushed"] for s in sources if s.get("unflushed")))
        return replace(gil, jfr_lost=pauses.jfr_lost, jvm_unflushed=pauses.jvm_unflushed,
                       duplicate_gil_rows_dropped=gil.duplicate_gil_rows_dropped + int(duplicate_gil_rows))


def _results_losses(attrs: dict, table: str) -> Losses | None:
    """The losses in the header of a result table TABLE given again as input, else None."""
    if attrs.get("table") != table or not isinstance(attrs.get("analysis"), dict):
        return None
    return AnalysisFacts.from_metadata(attrs["analysis"]).losses


def _process_sum(attrs: dict, key: str) -> int:
    processes = attrs.get("processes")
    if processes:
        return int(sum(p.get(key) or 0 for p in processes))
    return int(attrs.get(key) or 0)


@dataclass(frozen=True)
class AnalysisFacts:
    """The header of one correlation's results."""

    span_start_ns: int = 0
    span_end_ns: int = 0
    python_pids: tuple[int, ...] = ()
    jvm_pids: tuple[int, ...] = ()
    pauses: int = 0
    gil_intervals: int = 0
    losses: Losses = Losses()
    slack_ns: int = 0
    alignment: str | None = None          # same_monotonic_clock or explicit_offset
    offset_ns: int | None = None
    clock: dict[str, ClockFacts] = field(default_factory=dict)  # "pauses", "gil"
    gil_table: tuple[str, ...] | None = None  # the GIL files the results name instead of a gil.parquet
    why: dict | None = None               # the summary's why (engine.analysis.causes.why_facts)
    more: dict = field(default_factory=dict)  # keys of another version, kept as they were

    @property
    def span_ns(self) -> int:
        return self.span_end_ns - self.span_start_ns

    def as_metadata(self) -> dict:
        losses = self.losses
        out = {
            "span_start_ns": self.span_start_ns,
            "span_end_ns": self.span_end_ns,
            "span_ns": self.span_ns,
            "python_pids": list(self.python_pids),
            "jvm_pids": list(self.jvm_pids),
            "pauses": self.pauses,
            "gil_intervals": self.gil_intervals,
            "dropped_events": losses.dropped_events,
            "drain_lost_events": losses.drain_lost_events,
            "kept_windows": list(losses.kept_windows),
            "jfr_lost": losses.jfr_lost.as_metadata(),
            "jvm_unflushed": list(losses.jvm_unflushed),
            "duplicate_gil_rows_dropped": losses.duplicate_gil_rows_dropped,
            "slack_ns": self.slack_ns,
            "alignment": self.alignment,
            "offset_ns": self.offset_ns,
            "clock": {side: facts.as_metadata() for side, facts in self.clock.items()},
        }
        if self.gil_table is not None:
            out["gil_table"] = list(self.gil_table)
        if self.why is not None:
            out["why"] = self.why
        return {**out, **self.more}

    @classmethod
    def from_metadata(cls, header: dict | None) -> "AnalysisFacts":
        header = dict(header or {})
        losses = Losses(
            dropped_events=int(header.pop("dropped_events", 0) or 0),
            drain_lost_events=int(header.pop("drain_lost_events", 0) or 0),
            kept_windows=tuple(header.pop("kept_windows", None) or ()),
            jfr_lost=JfrLost.from_metadata(header.pop("jfr_lost", None)),
            jvm_unflushed=tuple(header.pop("jvm_unflushed", None) or ()),
            duplicate_gil_rows_dropped=int(header.pop("duplicate_gil_rows_dropped", 0) or 0),
        )
        header.pop("span_ns", None)  # (derived)
        gil_table = header.pop("gil_table", None)
        clock = {side: ClockFacts.from_metadata(facts) for side, facts in (header.pop("clock", None) or {}).items()}
        known = {f.name for f in fields(cls)} - {"losses", "clock", "gil_table", "more"}
        values = {name: header.pop(name) for name in list(header) if name in known}
        for name in ("python_pids", "jvm_pids"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values, losses=losses, clock=clock, gil_table=None if gil_table is None else tuple(gil_table),
                   more=header)
