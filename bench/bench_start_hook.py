"""The start hook (issue 15): what `tandem record` adds to an interpreter's start.

Side by side in one run, alternating, for a CPython outside tandem's venv (3.12 or 3.13 from
pyenv where present, else the system python3) and for tandem's own:
- anchor: `python -c pass` in the environment the command would have without tandem;
- ours: the same start under `tandem record`'s environment (launch.recording_environment:
  the sitecustomize hook first on PYTHONPATH, TANDEM_SESSION set), the probe pre-built as
  `tandem record` does before the command starts. It includes starting the probe (its ring
  and drain thread) and stopping it at exit: the whole cost a process pays.
- rows without a bar: the hook on PYTHONPATH with TANDEM_SESSION unset; and the floor
  under the bar: the same plain start that only loads the probe's extension (dlopen and
  module init of `_probe`, no probe started), what no start hook can avoid.

Bar: at most 50 ms added (ours minus anchor, medians of ROUNDS wall-clock starts).
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import Row

ROUNDS = 30
ADDED_MS_BAR = 50.0


def _start_ms(python: str, env: dict, code: str = "pass") -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, check=True)
    return (time.perf_counter() - t0) * 1e3


def _load_extension_code(probe_root: Path) -> str:
    """`python -c` code that loads the probe's extension alone, as a top-level module."""
    return f"import sys; sys.path.insert(0, {str(probe_root / 'engine' / 'probe')!r}); import _probe"


def _outside_python() -> str | None:
    for version in ("3.12", "3.13"):
        found = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
        if found:
            return str(found[-1])
    return shutil.which("python3", path="/usr/bin")


def main(console) -> list[Row]:
    from engine.probe.build import hook_environment, prebuild

    rows = []
    pythons = [p for p in (_outside_python(), sys.executable) if p]
    with tempfile.TemporaryDirectory(prefix="tandem-bench-hook-") as tmp:
        session = Path(tmp) / "session"
        session.mkdir()
        plain = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") and k != "PYTHONPATH"}
        hooked = hook_environment(plain) | {"TANDEM_SESSION": str(session)}
        idle = hook_environment(plain)
        built = prebuild(pythons)
        for python in pythons:
            if not isinstance(built[python], Path) and python != sys.executable:
                console.print(f"[yellow]{python}: no probe ({built[python]}); skipped[/yellow]")
                continue
            root = built[python] if isinstance(built[python], Path) else Path(__file__).resolve().parent.parent
            runs = (("plain", plain, "pass"), ("hooked", hooked, "pass"), ("idle", idle, "pass"),
                    ("floor", plain, _load_extension_code(root)))
            figures = {name: [] for name, _, _ in runs}
            for name, env, code in runs:
                _start_ms(python, env, code)  # warm the page cache
            for _ in range(ROUNDS):
                for name, env, code in runs:
                    figures[name].append(_start_ms(python, env, code))
                for directory in session.glob("py-*"):  # 32 MiB ring each: do not fill the disk
                    shutil.rmtree(directory, ignore_errors=True)
            median = {name: statistics.median(values) for name, values in figures.items()}
            fastest = {name: min(values) for name, values in figures.items()}
            recorded = len(list(session.glob("unprobed/*")))
            label = "tandem's venv" if python == sys.executable else Path(python).name
            added = median["hooked"] - median["plain"]
            console.print(f"{label}: medians of {ROUNDS}: plain {median['plain']:.1f} ms, under tandem record "
                          f"{median['hooked']:.1f} ms (+{added:.1f} ms), hook idle {median['idle']:.1f} ms; fastest: plain "
                          f"{fastest['plain']:.1f} ms, under tandem record {fastest['hooked']:.1f} ms "
                          f"(+{fastest['hooked'] - fastest['plain']:.1f} ms), hook idle {fastest['idle']:.1f} ms; "
                          f"floor (plain + the extension loaded) median {median['floor']:.1f} ms "
                          f"(+{median['floor'] - median['plain']:.1f} ms); unprobed entries: {recorded}")
            rows.append(Row("start hook", f"{label} start under tandem record (probe pre-built) vs plain",
                            median["hooked"], median["plain"], "ms", f"+<= {ADDED_MS_BAR:.0f} ms",
                            added <= ADDED_MS_BAR and recorded == 0))
            rows.append(Row("start hook", f"{label} start, hook on PYTHONPATH, no session vs plain",
                            median["idle"], median["plain"], "ms", "-", None))
            rows.append(Row("start hook", f"{label} floor: start loading the probe's extension (no probe) vs plain",
                            median["floor"], median["plain"], "ms", "-", None))
    return rows
