"""Where the memory goes: capture from outside, inside CPython and in the JVM, memory.parquet, who grew.

The leak tests record a real service (tests/memory_leak_program.py: Python driving a JVM with
JPype, or run by a JVM with Jep) leaking one kind of memory at a known rate under `tandem
record`, and hold tandem's answer to the leak's own count: the right bucket, with >= 90% of
the RSS growth, at the known rate within 10%.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import default_java_home, python_params
from engine.jvm import jdk_tool
from engine.memory.growth import kendall_tau, repeated_median_slope, who_grew
from engine.memory.jvm import read_jvm_memory
from engine.memory.table import memory_table
from engine.record.memory import large_mappings_resident, read_process_memory
from engine.store.parquet import read_metadata
from test_record_helpers import jdk_env
from test_record_interpreters import JEP_JAR, VENV_SITE

ROOT = Path(__file__).resolve().parent.parent
TANDEM = Path(sys.executable).parent / "tandem"
LEAK_PROGRAM = Path(__file__).parent / "memory_leak_program.py"
LEAK_SECONDS = 15
# Large enough to dominate what else grows beside the leak (under 1 MB/s in either service, its
# JVM's heap fixed: _jvm_options).
LEAK_RATE_MB_S = {"jpype": 20, "jep": 40}
# A heap leak reaches the RSS at young collections (promoted into fresh old regions): steps of
# about the young generation's size. Young generations of a second or so of allocation put several
# steps in the fitted half's windows even when a loaded machine slows the service to half speed.
YOUNG_MB = {"jpype": 32, "jep": 64}


def _jvm_options(runtime: str) -> list[str]:
    """The leak service's heap as latency-minded services size it: fixed (-Xms = -Xmx) at room for
    the whole leak, with a fixed young generation, so G1 neither grows its eden into fresh regions
    nor shrinks the heap during the leak (its RSS grows by the leak only)."""
    heap_mb = int(LEAK_RATE_MB_S[runtime] * LEAK_SECONDS * 1.25) + 4 * YOUNG_MB[runtime]
    return [f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", f"-Xmn{YOUNG_MB[runtime]}m"]


def _jep_command(tmp_path: Path) -> list[str]:
    """A JVM running the leak program through Jep, set up as Jep's users do (test_record_interpreters)."""
    classes = tmp_path / "classes"
    subprocess.run(["javac", "--release", "17", "-cp", str(JEP_JAR), "-d", str(classes),
                    str(Path(__file__).parent / "memory_java" / "JepLeak.java")], check=True)
    script = tmp_path / "run-jep.sh"
    script.write_text("#!/bin/sh\n"
                      f"export PYTHONPATH={VENV_SITE}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                      f"export LD_LIBRARY_PATH={sysconfig.get_config_var('LIBDIR')}\n"
                      f"exec java {' '.join(_jvm_options('jep'))} -Djava.library.path={VENV_SITE / 'jep'} "
                      f"-cp {JEP_JAR}:{classes} JepLeak \"$@\"\n")
    script.chmod(0o755)
    return [str(script)]


def _record(tmp_path: Path, kind: str, runtime: str = "jpype") -> tuple[Path, "Kept"]:
    """Records the leak program (Python driving a JVM with JPype, or a JVM running it with Jep);
    returns the session and what it says it kept (Kept)."""
    session = tmp_path / f"session-{kind}"
    if runtime == "jep":
        command = [*_jep_command(tmp_path), kind, str(LEAK_RATE_MB_S[runtime]), str(LEAK_SECONDS), str(LEAK_PROGRAM)]
    else:
        command = [sys.executable, str(LEAK_PROGRAM), kind, str(LEAK_RATE_MB_S[runtime]), str(LEAK_SECONDS),
                   *_jvm_options(runtime)]
    run = subprocess.run([str(TANDEM), "record", "-o", str(session), "--", *command], capture_output=True, text=True,
                         timeout=300, env=jdk_env(default_java_home()))
    assert run.returncode == 0, run.stderr[-2000:]
    return session, _kept(run.stdout)


def _kept(stdout: str) -> "Kept":
    leaked = re.search(r"leaked (\d+) in ([\d.]+) s", stdout)
    assert leaked, stdout[-2000:]
    kept = np.array(re.findall(r"^kept (\d+) (\d+)$", stdout, re.M), dtype=np.float64).reshape(-1, 2)
    return Kept(kept[:, 0], kept[:, 1], int(leaked.group(1)) / float(leaked.group(2)))


class Kept:
    """What the leak program says it kept: (CLOCK_MONOTONIC ns, bytes so far) at each tick."""

    def __init__(self, t_ns: np.ndarray, kept: np.ndarray, average: float):
        self.t_ns, self.kept, self.average = t_ns, kept, average

    def rate(self, growth) -> float:
        """Bytes/s kept over the span tandem fitted its trends on (a service behind its schedule
        on a busy machine catches up: its rate is not the same over every span)."""
        if growth.fitted_from_ns is None or len(self.t_ns) < 2:
            return self.average
        # (the part of that span the service was leaking in: the fit may begin in its warm-up)
        low, high = max(growth.fitted_from_ns, self.t_ns[0]), min(growth.fitted_to_ns, self.t_ns[-1])
        if high <= low:
            return self.average
        ends = np.interp([low, high], self.t_ns, self.kept)
        return float(ends[1] - ends[0]) / ((high - low) / 1e9)


def _service_growth(session: Path):
    table, _ = memory_table(session)
    growths = who_grew(table)
    service = max(growths, key=lambda g: g.rss_last)  # the JPype process (the recorder's first sample of it may be `tandem`)
    return table, service


LEAK_SHARE_FLOOR = 0.9  # of the RSS growth in the leak's bucket


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["jpype", pytest.param("jep", marks=pytest.mark.skipif(
    JEP_JAR is None or not sysconfig.get_config_var("Py_ENABLE_SHARED"), reason="no Jep, or no libpython to embed"))])
@pytest.mark.parametrize("kind, bucket", [
    ("python", "python"),           # small str objects kept in a list: pymalloc's arenas
    ("numpy", "native_other"),      # numpy buffers kept by Java references (JPype's direct buffers, Jep's PyObjects): malloc
    ("direct", "jvm_native"),       # ByteBuffer.allocateDirect kept
    ("heap", "jvm_heap"),           # Java byte arrays kept
])
def test_a_known_leak_is_named_in_its_bucket_at_its_rate(tmp_path, kind, bucket, runtime):
    session, kept = _record(tmp_path, kind, runtime)
    _, growth = _service_growth(session)
    known_rate = kept.rate(growth)
    detail = f"{kind}: {growth}"
    assert growth.leak == bucket, detail
    assert growth.leak_share >= LEAK_SHARE_FLOOR, detail
    assert abs(growth.leak_rate / known_rate - 1) <= 0.10, f"{detail}; known {known_rate:.0f} B/s"


@pytest.mark.slow
def test_a_service_without_a_leak_names_none_and_analyze_prints_it(tmp_path):
    """Python and Java garbage made and dropped (a sawtooth heap): no leak; the CLI writes
    memory.parquet and prints the memory lines under the pause summary."""
    session, _ = _record(tmp_path, "none")
    table, growth = _service_growth(session)
    assert growth.leak is None, str(growth)
    # The heap did saw (GCs came and went) while the rows stayed one per process and sample.
    assert table["jvm_heap_after_gc"].notna().any()
    assert not table.duplicated(["pid", "t_ns"]).any()

    out = tmp_path / "out"
    run = subprocess.run([str(TANDEM), "analyze", str(session), "-o", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"memory of pid {growth.pid}" in run.stdout and "no leak-like growth" in run.stdout, run.stdout
    written = pd.read_parquet(out / "memory.parquet")
    assert len(written) == len(table)
    meta = read_metadata(out / "memory.parquet")
    assert meta["schema"] == "tandem.memory" and any(g["pid"] == growth.pid for g in meta["growth"])


@pytest.mark.slow
def test_the_jvm_series_equal_jfr_print(tmp_path):
    """The JFR reader's direct buffers and heap summaries against `jfr print --json` (its witness)."""
    session, _ = _record(tmp_path, "direct")
    recording = next(session.glob("jvm-*/recording.jfr"))
    ours, facts = read_jvm_memory([recording])
    assert facts["clock"]["method"] == "clock_sync"
    printed = json.loads(subprocess.run(
        [str(jdk_tool("jfr")), "print", "--json", "--events", "jdk.DirectBufferStatistics,jdk.GCHeapSummary",
         str(recording)], capture_output=True, text=True, check=True).stdout)["recording"]["events"]
    direct = [e["values"]["memoryUsed"] for e in printed if e["type"] == "jdk.DirectBufferStatistics"]
    heap = [e["values"]["heapUsed"] for e in printed if e["type"] == "jdk.GCHeapSummary"]
    assert ours[ours["column"] == "jvm_direct_buffers"]["value"].astype(int).tolist() == direct
    assert sorted(ours[ours["column"] == "jvm_heap_used"]["value"].astype(int)) == sorted(heap)
    assert max(direct) >= LEAK_RATE_MB_S["jpype"] * 1e6 * LEAK_SECONDS * 0.8  # the leak is in them
    # On the recorder's clock: every JVM sample falls inside the session's recorded span, give or take
    # a sample period (the JVM may sample before the recorder's first once-a-second sample of it).
    table, _ = memory_table(session)
    assert table["t_ns"].min() - 2e9 <= ours["t_ns"].min() and ours["t_ns"].max() <= table["t_ns"].max() + 2e9


def test_outside_sampling_reads_a_process_that_touched_known_memory():
    """/proc status and the pagemap residency of a child that mapped 256 MiB and touched 96 MiB of it."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import mmap, sys
        m = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for offset in range(0, 96 << 20, 4096):
            m[offset] = 1
        print("ready", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        sample = read_process_memory(child.pid)
        assert sample["rss_anon"] >= 96 << 20 and sample["rss"] == pytest.approx(
            sample["rss_anon"] + sample["rss_file"] + sample["rss_shmem"], rel=0.01)
        mappings = [m for m in large_mappings_resident(child.pid) if m[1] - m[0] == 256 << 20]
        assert len(mappings) == 1 and mappings[0][2] == 96 << 20
        sampled = [m for m in large_mappings_resident(child.pid, budget_pages=8192) if m[1] - m[0] == 256 << 20]
        assert sampled[0][2] == pytest.approx(96 << 20, rel=0.15)  # every 8th block read, scaled
    finally:
        child.communicate("")


def test_the_python_sampler_counts_small_objects_in_pymalloc_arenas(tmp_path):
    """engine.probe.memory inside a real CPython: 100 MB of small objects show in the arenas."""
    script = textwrap.dedent(f"""
        import sys, time
        from engine.probe import memory
        memory.start({str(tmp_path)!r}, period_s=0.2)
        time.sleep(0.5)
        kept = ["%0400d" % i for i in range(220_000)]  # 449-byte str objects: 98.8 MB
        time.sleep(0.7)
        print(sum(map(sys.getsizeof, kept)))
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    kept = int(run.stdout)
    samples = [json.loads(line) for line in (tmp_path / "memory.jsonl").read_text().splitlines()]
    assert len(samples) >= 4 and all(s["t"] < t["t"] for s, t in zip(samples, samples[1:]))
    grown = samples[-1]["arena_bytes"] - samples[0]["arena_bytes"]
    assert kept <= grown <= kept * 1.1  # pymalloc's 464-byte class and its pools' headers
    assert max(s["blocks"] for s in samples) - samples[0]["blocks"] >= 220_000  # (the last, at exit, after some frees)
    assert samples[-1]["malloc_in_use"] > 0 and "tracemalloc" not in samples[-1]


@pytest.mark.parametrize("python", python_params())
def test_the_python_samplers_thread_has_ended_when_the_interpreter_is_torn_down(python, tmp_path):
    """A program that ends as the sampler starts: by the time the interpreter is torn down (after
    the atexit callbacks; one registered before the sampler's runs after it) the sampler's thread
    has ended, its last sample written. A daemon thread still running then (importing at its
    start) crashed CPython 3.12 at exit."""
    script = textwrap.dedent(f"""
        import atexit, threading
        atexit.register(lambda: print(sorted(t.name for t in threading.enumerate())))
        from engine.probe import memory
        memory.start({str(tmp_path)!r}, period_s=0.2)
        """)
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "['MainThread']"
    assert (tmp_path / "memory.jsonl").read_text().strip()  # (written by the exit's last sample at least)


def test_numpy_buffers_are_counted_apart_when_the_service_traces_with_tracemalloc(tmp_path):
    """With tracemalloc on (the user's choice), numpy's buffers (its own tracemalloc domain) are
    a series of their own: 40 MB of arrays kept show there, inside the traced total."""
    script = textwrap.dedent(f"""
        import time, tracemalloc
        import numpy as np
        from engine.probe import memory
        tracemalloc.start()
        memory.NUMPY_PERIOD_S = 0.2
        memory.start({str(tmp_path)!r}, period_s=0.2)
        time.sleep(0.5)
        kept = [np.ones(1 << 17) for _ in range(40)]  # 40 x 1 MiB of float64
        small = ["%0400d" % i for i in range(20_000)]  # traced, not numpy's
        time.sleep(0.9)
        print(sum(a.nbytes for a in kept))
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    kept = int(run.stdout)
    samples = [json.loads(line) for line in (tmp_path / "memory.jsonl").read_text().splitlines()]
    assert all("tracemalloc_numpy" in s for s in samples)
    grown = samples[-1]["tracemalloc_numpy"] - samples[0]["tracemalloc_numpy"]
    assert kept <= grown <= kept * 1.01
    assert samples[-1]["tracemalloc"] - samples[0]["tracemalloc"] >= grown + 20_000 * 400


def test_the_trend_is_robust_to_a_start_up_step_and_blind_to_a_sawtooth():
    x = np.arange(12.0)
    line = 5.0 * x + 100
    stepped = line.copy()
    stepped[:2] = 0  # the process before its runtime started
    assert repeated_median_slope(x, stepped) == pytest.approx(5.0)
    assert kendall_tau(x, line) == 1.0
    table = pd.DataFrame({"t_ns": (np.arange(60) * 0.5e9).astype(np.int64), "pid": 1, "comm": "svc",
                          "rss": 500e6 + 40e6 * (np.arange(60) % 6)})  # a 3 s sawtooth, flat underneath
    for bucket in ("jvm_heap", "jvm_native", "python", "native_other", "unexplained"):
        table[bucket] = 0.0
    (growth,) = who_grew(table)
    assert growth.leak is None and abs(growth.rss_rate) < 1e6


JDK_25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64")


@pytest.mark.slow
@pytest.mark.parametrize("jdk", [pytest.param(None, id="jdk17"), pytest.param(JDK_25, id="jdk25", marks=pytest.mark.skipif(
    not (JDK_25 / "bin" / "java").exists(), reason="needs JDK 25 (NMT and RSS as JFR events)"))])
def test_a_jvm_alone_with_native_memory_tracking(tmp_path, jdk):
    """A JVM with no Python in it keeping DirectByteBuffers, recorded with --native-memory: JVM
    native memory named at the known rate; NMT's categories are columns (its "Other" holds direct
    buffers, counted apart by JFR's buffer statistics: two witnesses of one leak). JDK 20+ has
    NMT as JFR events; on JDK 17 the agent reads VM.native_memory itself, without a safepoint of
    its own. JDK 25's own RSS reading (jdk.ResidentSetSize) agrees with the recorder's /proc one."""
    jdk = jdk or default_java_home()
    classes = tmp_path / "classes"
    subprocess.run([str(jdk / "bin" / "javac"), "-d", str(classes), str(Path(__file__).parent / "memory_java" /
                                                                         "DirectLeak.java")], check=True)
    session = tmp_path / "session"
    env = jdk_env(jdk)
    run = subprocess.run([str(TANDEM), "record", "--native-memory", "-o", str(session), "--", str(jdk / "bin" / "java"),
                          "-cp", str(classes), "DirectLeak", str(LEAK_RATE_MB_S["jpype"]), "20"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    leaked = re.search(r"leaked (\d+) in ([\d.]+) s", run.stdout)
    known_rate = int(leaked.group(1)) / float(leaked.group(2))
    table, growth = _service_growth(session)
    detail = str(growth)
    assert growth.leak == "jvm_native" and growth.leak_share >= 0.9, detail
    assert abs(growth.leak_rate / known_rate - 1) <= 0.10, f"{detail}; known {known_rate:.0f} B/s"
    assert abs(growth.part_rates["jvm_nmt_other"] / known_rate - 1) <= 0.10, detail
    rows = table[table["pid"] == growth.pid]
    assert rows["jvm_nmt_committed"].notna().sum() >= 10 and rows["jvm_nmt_java_heap"].notna().sum() >= 10
    jvm_json = json.loads(next(session.glob("jvm-*/jvm.json")).read_text())
    if "jvm_rss" in table:
        both = rows[rows["jvm_rss"].notna()]
        assert len(both) >= 10
        # (the JVM samples its RSS up to a second before or after the recorder: at 20 MB/s, 20 MB apart at most)
        assert (both["jvm_rss"] - both["rss"]).abs().median() <= 25e6
        assert jvm_json["native_memory_events"] == "JFR's own jdk.NativeMemoryUsage"
    else:
        assert jvm_json["native_memory_events"] == "tandem.NativeMemoryUsage"
        # Reading the summary is no VM operation: no pause of tandem's making once a second.
        recording = next(session.glob("jvm-*/recording.jfr"))
        printed = subprocess.run([str(jdk_tool("jfr", jdk)), "print", "--events", "jdk.ExecuteVMOperation", str(recording)],
                                 capture_output=True, text=True, check=True).stdout
        operations = re.findall(r'operation = "([^"]+)"', printed)
        assert operations.count("NMTDCmd") + operations.count("NativeMemoryTracking") < 5, sorted(set(operations))


@pytest.mark.slow
def test_tandem_live_names_a_leak_with_its_rate(tmp_path):
    """`tandem live -- CMD` on the Python-objects leak: the live view says the leak-like growth,
    in its bucket, at the leak's known rate within 10% (the same who grew as offline, over the
    samples tandem live has followed)."""
    run = subprocess.run([str(TANDEM), "live", "--session", str(tmp_path / "session"), "--roll", "5s", "--",
                          sys.executable, str(LEAK_PROGRAM), "python", str(LEAK_RATE_MB_S["jpype"]), str(LEAK_SECONDS),
                          *_jvm_options("jpype")],
                         capture_output=True, text=True, timeout=300, env=jdk_env(default_java_home()))
    assert run.returncode == 0, run.stderr[-2000:]
    _, growth = _service_growth(tmp_path / "session")  # (offline, over the same samples: the span the fit covers)
    known_rate = _kept(run.stdout).rate(growth)
    said = re.findall(r"leak-like growth: RSS \+[\d.]+ \w+/s, (\d+)% of it Python objects \(pymalloc arenas\) at \+([\d.]+) (\w+)/s",
                      run.stderr)
    assert said, run.stderr[-3000:]
    share, rate, unit = said[-1]  # (the final view's)
    assert int(share) >= 100 * LEAK_SHARE_FLOOR
    rate = float(rate) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    assert abs(rate / known_rate - 1) <= 0.10, f"{said}; known {known_rate:.0f} B/s"


def test_no_memory_records_no_samples(tmp_path):
    """`tandem record --no-memory`: no recorder samples, no sampler in CPython (its process
    has no tandem-memory thread), and the agent is told memory=false; on by default."""
    program = "import threading; print(sorted(t.name for t in threading.enumerate()))"
    env = jdk_env(default_java_home())
    runs = {}
    for flag in ([], ["--no-memory"]):
        session = tmp_path / f"session{len(runs)}"
        run = subprocess.run([str(TANDEM), "record", *flag, "-o", str(session), "--", sys.executable, "-c",
                              f"import time; time.sleep(1.5); {program}"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        runs[bool(flag)] = (session, run.stdout)
    on, off = runs[False], runs[True]
    assert list((on[0] / "memory").glob("*.jsonl")) and list(on[0].glob("py-*/memory.jsonl"))
    assert "tandem-memory" in on[1]
    assert not (off[0] / "memory").exists() and not list(off[0].glob("py-*/memory.jsonl"))
    assert "tandem-memory" not in off[1]
    from engine.record.launch import agent_options

    assert agent_options(tmp_path, memory=False).split(",")[1:] == ["memory=false"] and agent_options(tmp_path).split(",")[1:] == []
