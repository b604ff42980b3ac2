"""Are the two tables on one clock? Facts from their metadata (df.attrs), and the refusal.

Both sides must be CLOCK_MONOTONIC of the same boot. A table whose metadata says nothing is
taken as CLOCK_MONOTONIC of this boot (docs/results.md, "Input tables"). Mixing domains or
boots is refused, naming both sources, unless the caller gives an explicit offset.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.errors import TandemError

MONOTONIC = "monotonic"
# The clock method of a side a session did not record (a CPython service that started no JVM, a
# JVM with no CPython): the other side is analyzed alone, against an empty table.
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class ClockFacts:
    """What a table's metadata says about its clock (None: not said)."""

    source: str
    domain: str                  # "monotonic" or "wall"; "monotonic" when not said (assumed)
    method: str                  # how its times were put on that clock ("assumed" when not said)
    error_ns: int | None         # worst-case error of its times, when known
    boot_ids: tuple[str, ...]    # boot ids it names (several processes may each name one)

    def as_metadata(self) -> dict:
        return {**asdict(self), "boot_ids": list(self.boot_ids)}  # (as JSON gives it back)

    @classmethod
    def from_metadata(cls, value: dict) -> "ClockFacts":
        return cls(value.get("source") or "", value.get("domain") or MONOTONIC, value.get("method") or "assumed",
                   value.get("error_ns"), tuple(value.get("boot_ids") or ()))


def _nested_clock_errors(attrs: dict) -> list[int]:
    """error_ns of every JVM run of a pauses table (engine.ingest.jfr keeps them per source/run)."""
    errors = []
    for source in attrs.get("sources") or []:
        for run in source.get("runs") or []:
            error = (run.get("clock") or {}).get("error_ns")
            if error is not None:
                errors.append(int(error))
    return errors


def clock_facts(attrs: dict, source: str) -> ClockFacts:
    """Read clock facts from either producer's metadata keys (JFR ingest, GIL ingest, or plain
    keys). A table made of several inputs carries each one's facts (`clock_parts`, below): one
    off the monotonic clock makes the whole table so, named."""
    parts = [ClockFacts(**{**part, "boot_ids": tuple(part.get("boot_ids") or ())}) for part in attrs.get("clock_parts") or []]
    facts = _own_clock_facts(attrs, source)
    if not parts:
        return facts
    off = [f for f in parts if f.domain != MONOTONIC]
    errors = [f.error_ns for f in (facts, *parts) if f.error_ns is not None]
    return ClockFacts(
        source=off[0].source if off else source,
        domain=off[0].domain if off else facts.domain,
        method=facts.method,
        error_ns=max(errors) if errors else None,
        boot_ids=tuple(sorted({b for f in (facts, *parts) for b in f.boot_ids})),
    )


def recorded_clock(attrs: dict, source: str) -> ClockFacts | None:
    """The clock facts of a result table given again as input (OUT/pauses.parquet or
    OUT/gil.parquet: its metadata is the analysis's header, docs/results.md): its side's, as that
    analysis found them; pauses an explicit offset put on the GIL side's clock are on that clock
    since, to within what the offset was worth. None for any other table."""
    analysis, table = attrs.get("analysis"), attrs.get("table")
    if not isinstance(analysis, dict) or table not in ("pauses", "gil"):
        return None
    clocks = analysis.get("clock") if isinstance(analysis.get("clock"), dict) else {}
    moved = table == "pauses" and bool(analysis.get("offset_ns"))
    value = clocks.get("gil" if moved else table)
    if not isinstance(value, dict):
        return None
    facts = ClockFacts.from_metadata({**value, "source": source})
    if moved:
        return ClockFacts(source, facts.domain, f"explicit offset of {analysis['offset_ns']} ns onto {facts.method}",
                          None, facts.boot_ids)
    return facts


def _own_clock_facts(attrs: dict, source: str) -> ClockFacts:
    recorded = recorded_clock(attrs, source)
    if recorded is not None:
        return recorded
    clock = attrs.get("clock") if isinstance(attrs.get("clock"), dict) else {}
    domain = attrs.get("clock_domain") or clock.get("domain") or (attrs.get("clock") if isinstance(attrs.get("clock"), str) else None)
    method = attrs.get("clock_method") or attrs.get("method") or clock.get("method")
    error = attrs.get("error_ns", clock.get("error_ns"))
    errors = _nested_clock_errors(attrs) + ([int(error)] if error is not None else [])
    boots = {attrs.get("boot_id")} | {p.get("boot_id") for p in attrs.get("processes") or []}
    return ClockFacts(
        source=source,
        domain=str(domain or MONOTONIC),
        method=str(method or "assumed"),
        error_ns=max(errors) if errors else None,
        boot_ids=tuple(sorted(b for b in boots if b)),
    )


def check_same_clock(pauses: ClockFacts, gil: ClockFacts, offset_ns: int | None) -> str:
    """Refuse two tables that are not on one clock, unless offset_ns is given; return the alignment used."""
    if offset_ns is not None:
        return "explicit_offset"
    problems = [f"{facts.source} is on the {facts.domain} clock" for facts in (pauses, gil) if facts.domain != MONOTONIC]
    if pauses.boot_ids and gil.boot_ids and not set(pauses.boot_ids) & set(gil.boot_ids):
        problems.append(
            f"{pauses.source} is from boot {', '.join(pauses.boot_ids)} and {gil.source} from boot {', '.join(gil.boot_ids)}"
        )
    if problems:
        raise TandemError(
            f"cannot join {pauses.source} with {gil.source}: {'; '.join(problems)}; both must be CLOCK_MONOTONIC "
            "of one boot (pass --offset NS to shift the pauses onto the GIL clock yourself)"
        )
    return "same_monotonic_clock"


def clock_parts(attrs: list[dict], names: list[str]) -> list[dict]:
    """Each part's clock facts, of a table made of parts (ATTRS: each part's metadata; NAMES:
    where each is from): the clock check refuses a mix with one part off the monotonic clock
    as it refuses that part alone."""
    return [clock_facts(a, name).as_metadata() for a, name in zip(attrs, names)]
