"""`tandem doctor`: what this machine allows, in one screen."""
from __future__ import annotations

import typer


def doctor() -> None:
    """Show the JDK, the JFR tick source and the GIL probe backends available here."""
    from rich.console import Console
    from rich.table import Table

    from engine import jvm
    from engine.errors import TandemError

    table = Table(title="tandem doctor", show_header=True)
    table.add_column("check")
    table.add_column("result")
    try:
        home = jvm.find_java_home()
        table.add_row("JDK", f"{home} (Java {jvm.java_version(home)})")
    except TandemError as err:
        table.add_row("JDK", f"[red]{err}[/red]")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
