import importlib
import pkgutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table


MET = {True: "yes", False: "[red]no[/red]", None: "-"}


def main(argv: list[str]) -> int:
    console = Console(width=max(Console().width, 150))  # the results table is wide
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    rows = []
    for name in names:
        console.rule(name)
        rows.extend(importlib.import_module(f"bench.{name}").main(console))
    table = Table(title="tandem benchmarks (ours vs anchor, same run)")
    for col in ("area", "what", "ours", "anchor", "unit", "ratio", "goal", "met"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.area, r.what, f"{r.ours:.4g}", f"{r.anchor:.4g}", r.unit, f"{r.ratio:.3g}x", r.goal, MET[r.ratio_ok])
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
