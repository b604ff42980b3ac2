"""The correlation core: one incremental correlator, and the one driver (drive.py) that both
`tandem analyze` (a whole session, block by block) and `tandem live` (live sources) run it with.
See core.py; schemas in schema.py."""
from engine.correlate.core import Correlator, GilRows, KnownLifetimes, Lifetimes, Rows
from engine.correlate.schema import END, RESULT_TABLES

__all__ = ["END", "RESULT_TABLES", "Correlator", "GilRows", "KnownLifetimes", "Lifetimes", "Rows"]
