"""`tandem pauses`: JFR recordings to a table of JVM stop-the-world intervals."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
