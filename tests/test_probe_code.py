"""The Python code of each GIL release (docs/probe.md, "The code of a release"), against
ground truth in real interpreters: functions that give the GIL up on known lines
(tests/code_workloads.py), and code objects freed and made again at recycled addresses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import python_params
from engine.ingest.codes import CodeEntry, line_of
from engine.ingest.gil import read_gil
from engine.probe.build import probe_env

WORKLOADS = Path(__file__).with_name("code_workloads.py")


def run(python: Path, workload: str, tmp_path: Path, count: int = 0) -> tuple[dict, object]:
    events = tmp_path / f"{workload}.gil"
    env = probe_env(python)
    env["CODE_WORKLOAD_COUNT"] = str(count)
    proc = subprocess.run([str(python), str(WORKLOADS), workload, str(events)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), read_gil(events)


def in_bracket(df, tid: int, bracket) -> object:
    return df[(df["tid"] == tid) & (df["start_ns"] >= bracket[0]) & (df["end_ns"] <= bracket[1])]


def wrong_names(rows, thread: dict) -> object:
    """Rows named neither by the thread's function at a line where it releases nor by the
    caller (the loop, or the spinner's one call) at one of its lines (the interpreter may
    switch the thread out there: a forced switch)."""
    return rows[~(named_by_function(rows, thread) | named_by_caller(rows, thread))]


def named_by_function(rows, thread: dict):
    return (rows["function"] == thread["function"]) & rows["line"].isin(thread["lines"])


def named_by_caller(rows, thread: dict):
    return (rows["function"] == thread["caller"]) & rows["line"].isin(thread["caller_lines"])


@pytest.mark.slow
@pytest.mark.parametrize("python", [*python_params(), pytest.param(Path(sys.executable), id="venv-numpy-jpype")])
def test_every_interval_is_named_by_the_function_and_line_that_released(python, tmp_path):
    """sleep_here (time.sleep), zlib_here (a C extension releasing around its work),
    numpy_here (a matrix product) and java_here (a JPype call into Java) where installed,
    each in its thread: every released interval in the thread's bracket is named by its
    function and the line of the releasing call, every waiting interval too (the thread
    asks the GIL back in the same place); two threads spinning against each other: every
    forced switch (released then waiting) is named by the spinning function and a line of
    its loop. A thread may also be switched out (forced) in the loop that calls its
    function: such intervals must be named by that loop. 0 wrong of >= 100 000 intervals
    per interpreter (numpy and JPype in the venv's, where they are installed)."""
    witness, df = run(python, "releases", tmp_path, count=60_000)
    result = witness["result"]
    assert witness["status"]["method"] == "got"
    checked, wrong = 0, []
    for name, thread in result.items():
        rows = in_bracket(df, thread["tid"], thread["bracket"])
        released = rows[rows["state"] == "released"]
        minimum = 60_000 if name not in ("spin_here", "spin_other") else 5
        assert len(released) >= minimum, (name, len(released))
        if name in ("spin_here", "spin_other"):
            assert (rows["state"] == "waiting").sum() >= 5, name
        bad = wrong_names(rows, thread)
        assert named_by_caller(rows, thread).sum() <= len(rows) // 100 + 5, name  # switched out now and then only
        wrong.append(bad.assign(expected=name))
        checked += len(rows)
    wrong = [w for w in wrong if len(w)]
    assert not wrong, wrong[0][["tid", "state", "start_ns", "end_ns", "function", "file", "line", "expected"]].head(10).to_string()
    assert checked >= 100_000, checked
    if python == Path(sys.executable):  # the venv: numpy and JPype installed
        assert {"numpy_here", "java_here"} <= set(result), set(result)


@pytest.mark.parametrize("python", python_params())
def test_a_recycled_code_address_never_names_another_function(python, tmp_path):
    """200 functions made by exec, each run once (its sleep interns its code) and freed: the
    table keeps each interned code alive, so none of their addresses is reused and each
    release is named by its own function and line. The control: the same functions never
    run (not interned) do get recycled addresses in this interpreter, so without the
    table's reference the reuse would happen."""
    witness, df = run(python, "recycled", tmp_path)
    result = witness["result"]
    assert len(set(result["unnamed_addresses"])) < len(result["unnamed_addresses"]), "control: no address was reused"
    assert len(set(result["addresses"])) == len(result["addresses"])
    named = 0
    for function in result["functions"]:
        rows = in_bracket(df, function["tid"], function["bracket"])
        released = rows[rows["state"] == "released"]
        assert len(released) >= 1, function
        assert (released["function"] == function["function"]).all(), (function, released["function"].tolist())
        assert (released["line"] == function["line"]).all(), (function, released["line"].tolist())
        assert (released["file"] == "<recycled>").all()
        named += len(released)
    assert named >= 200
    assert witness["status"]["codes"]["refused"] == 0


def test_line_table_reader_agrees_with_cpython():
    """engine.ingest.codes.line_of against the interpreter's own co_lines() for every
    instruction of every function of a few standard modules (the format of 3.11-3.13)."""
    import argparse
    import json as json_module
    import pathlib

    checked = 0
    for module in (argparse, json_module.decoder, pathlib):
        codes = [c for f in vars(module).values() for c in _codes_of(f)]
        for code in codes:
            entry = CodeEntry(code.co_qualname, code.co_filename, code.co_firstlineno, code.co_linetable)
            for start, end, line in code.co_lines():
                for offset in range(start, end, 2):
                    assert line_of(entry, offset // 2) == line, (code, offset)
                    checked += 1
    assert checked > 10_000


def _codes_of(obj) -> list:
    found = []
    code = getattr(obj, "__code__", None)
    if code is not None:
        stack = [code]
        while stack:
            c = stack.pop()
            found.append(c)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    if isinstance(obj, type):
        for value in vars(obj).values():
            found.extend(_codes_of(getattr(value, "__func__", value)))
    return found
