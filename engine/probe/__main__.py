"""`python -m engine.probe -o FILE [--backend B] -- script.py [args]`

Runs script.py like `python script.py args` (same sys.argv, __main__, sys.path[0]) with the
GIL probe recording into FILE (see engine.probe.start), and stops it at exit.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import engine.probe
from engine.errors import TandemError


def main(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        ours, script_argv = argv[:split], argv[split + 1 :]
    else:
        ours, script_argv = argv, []
    parser = argparse.ArgumentParser(prog="python -m engine.probe", description="Run a script with the GIL probe.")
    parser.add_argument("-o", "--output", required=True, help="events file (FILE.ring, FILE.json next to it)")
    parser.add_argument("--backend", default="auto", choices=engine.probe.BACKENDS)
    parser.add_argument("--sample-period-us", type=int, default=100)
    args = parser.parse_args(ours)
    if not script_argv:
        parser.error("no script: python -m engine.probe -o FILE -- script.py [args]")
    try:
        engine.probe.start(args.output, backend=args.backend, sample_period_us=args.sample_period_us)
    except TandemError as err:
        print(f"tandem: error: {err}", file=sys.stderr)
        return 2
    sys.argv = script_argv
    sys.path[0] = str(Path(script_argv[0]).resolve().parent)
    try:
        runpy.run_path(script_argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        engine.probe.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
