"""Nothing generated is committed: no recorded session, result or cache in the tree."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The names tandem writes into a session or results directory (docs/session.md, docs/results.md).
GENERATED = re.compile(r"(^|/)(session\.json|probe\.json|jvm\.json|threads\.jsonl|gil\.(events|ring|codes)(\.\d+)?(\.zst)?"
                       r"|recording\.jfr|pauses\.ring|attach-start-\d+\.(py|gdb)|[^/]+\.parquet|[^/]+\.pftrace)$")


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return listing.stdout.splitlines()


def test_no_recorded_session_or_result_is_tracked():
    generated = [path for path in tracked_files() if GENERATED.search(path)]
    assert generated == [], f"recorded or generated files are tracked: {generated[:5]}"


def test_the_pattern_catches_what_tandem_writes():
    for path in ("AS/session.json", "x/py-12/gil.events", "x/jvm-3/recording.jfr", "AS/attach-start-3308.py",
                 "OUT/overlaps.parquet", "demo-out/trace.pftrace"):
        assert GENERATED.search(path), path
    for path in ("engine/session.py", "docs/session.md", "tests/test_record.py"):
        assert not GENERATED.search(path), path
