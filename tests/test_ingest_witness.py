"""Test support for ingest: real JVM recordings and the JDK's own `jfr print --json` as witness.

Holds no tests itself (named test_ingest_* to stay in ingest's files); imported by tests/test_ingest*.py and tests/test_clock*.py.
"""
from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pandas as pd

# A small allocation-heavy program. With `sync` it also commits tandem.ClockSync events of
# its own (same name and field as the agent's, docs/session.md), and it prints
# System.nanoTime() just before and after each System.gc() so that tests can check where
# those collections land on CLOCK_MONOTONIC.
WORKLOAD_JAVA = r"""
import jdk.jfr.Event;
import jdk.jfr.Name;
import jdk.jfr.StackTrace;

public class Workload {
    @Name("tandem.ClockSync")
    @StackTrace(false)
    static class ClockSync extends Event {
        long monotonicNanos;
    }

    static boolean sync;

    static void sync() {
        if (!sync) return;
        ClockSync event = new ClockSync();
        event.begin();
        event.monotonicNanos = System.nanoTime();
        event.commit();
    }

    static void bracketedGc() {
        long before = System.nanoTime();
        System.gc();
        long after = System.nanoTime();
        System.out.println("gc-window " + before + " " + after);
    }

    public static void main(String[] args) {
        double seconds = Double.parseDouble(args[0]);
        sync = args.length > 1 && args[1].equals("sync");
        sync();
        bracketedGc();
        long end = System.nanoTime() + (long) (seconds * 1e9);
        long nextSync = System.nanoTime() + 200_000_000L;
        Object[] keep = new Object[8192];
        long sum = 0;
        int i = 0;
        while (System.nanoTime() < end) {
            for (int k = 0; k < 1000; k++) {
                byte[] b = new byte[32 + (i % 700)];
                keep[i++ & 8191] = b;
                sum += b.length;
            }
            if (System.nanoTime() > nextSync) {
                sync();
                nextSync += 200_000_000L;
            }
        }
        bracketedGc();
        sync();
        System.out.println("sum " + sum);
    }
}
"""

PAUSE_SETTINGS = [
    "jdk.SafepointBegin#enabled=true", "jdk.SafepointBegin#threshold=0ms",
    "jdk.SafepointEnd#enabled=true", "jdk.SafepointEnd#threshold=0ms",
    "jdk.ExecuteVMOperation#enabled=true", "jdk.ExecuteVMOperation#threshold=0ms",
    "jdk.GCPhasePause#threshold=0ms", "jdk.GarbageCollection#threshold=0ms",
    "jdk.Compilation#threshold=0ms", "jdk.Deoptimization#enabled=true",
    "jdk.SystemGC#enabled=true", "jdk.SystemGC#threshold=0ms", "jdk.SystemGC#stackTrace=true",
]

COLLECTORS = {
    "serial": "-XX:+UseSerialGC",
    "parallel": "-XX:+UseParallelGC",
    "g1": "-XX:+UseG1GC",
    "zgc": "-XX:+UseZGC",
    "shenandoah": "-XX:+UseShenandoahGC",
}


def collector_available(java_home: Path, flag: str) -> bool:
    done = subprocess.run([str(java_home / "bin" / "java"), flag, "-version"], capture_output=True)
    return done.returncode == 0


def build_workload(java_home: Path, workdir: Path) -> Path:
    """Compiles Workload.java with the JDK under test; returns the class directory."""
    classes = workdir / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    source = workdir / "Workload.java"
    source.write_text(WORKLOAD_JAVA)
    subprocess.run([str(java_home / "bin" / "javac"), "-d", str(classes), str(source)], check=True, capture_output=True)
    settings = workdir / "pauses.jfc"
    subprocess.run([str(java_home / "bin" / "jfr"), "configure", *PAUSE_SETTINGS, "--output", str(settings)],
                   check=True, capture_output=True)
    return classes


def record(java_home: Path, workdir: Path, out: Path, gc_flag: str, seconds: float = 1.5, sync: bool = True,
           extra: tuple[str, ...] = ()) -> tuple[Path, list[tuple[int, int]]]:
    """Runs the workload under JFR; returns the recording and the printed System.gc() windows."""
    classes = workdir / "classes"
    cmd = [
        str(java_home / "bin" / "java"), gc_flag, "-Xmx128m", *extra,
        f"-XX:StartFlightRecording=filename={out},settings={workdir / 'pauses.jfc'}",
        "-cp", str(classes), "Workload", str(seconds), "sync" if sync else "nosync",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    windows = [tuple(int(x) for x in line.split()[1:3]) for line in done.stdout.splitlines() if line.startswith("gc-window")]
    return out, windows


# ---------------------------------------------------------------- the witness: jfr print --json


def jfr_print(java_home: Path, path: Path, types) -> list[dict]:
    """The events of `types` in `path` as the JDK's own `jfr print --json` shows them."""
    done = subprocess.run([str(java_home / "bin" / "jfr"), "print", "--json", "--events", ",".join(types), str(path)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["recording"]["events"]


_DURATION = re.compile(r"^PT(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?$")


def iso_duration_ns(text: str) -> int:
    """'PT0.000123S', 'PT1M2.5S' -> ns, exactly."""
    match = _DURATION.match(text)
    assert match, text
    hours, minutes, seconds = match.groups()
    total = Decimal(hours or 0) * 3600 + Decimal(minutes or 0) * 60 + Decimal(seconds or 0)
    return int(total * 1_000_000_000)


def iso_instant_ns(text: str) -> int:
    """'2026-11-29T15:52:55.033523337Z' -> ns since the epoch, exactly."""
    main, _, fraction = text.rstrip("Z").partition(".")
    seconds = int(datetime.fromisoformat(main).replace(tzinfo=timezone.utc).timestamp())
    return seconds * 1_000_000_000 + int((fraction + "000000000")[:9])


def expected_pauses(events: list[dict]) -> dict:
    """What the table must contain, per kind, computed from `jfr print --json` events alone."""
    by_type: dict[str, list[dict]] = {}
    for e in events:
        v = dict(e["values"])
        v["_start"] = iso_instant_ns(v["startTime"])
        v["_duration"] = iso_duration_ns(v["duration"]) if "duration" in v else 0
        by_type.setdefault(e["type"], []).append(v)
    ends = {v["safepointId"]: v["_start"] + v["_duration"] for v in by_type.get("jdk.SafepointEnd", [])}
    ops = by_type.get("jdk.ExecuteVMOperation", [])
    op_by_safepoint = {v["safepointId"]: v["operation"] for v in ops if v.get("safepoint")}
    begins = {v["safepointId"]: v for v in by_type.get("jdk.SafepointBegin", [])}
    gcs = {v["gcId"]: v for v in by_type.get("jdk.GarbageCollection", [])}

    safepoints = {}
    for sid, v in begins.items():
        matched = sid in ends
        safepoints[sid] = {
            "start": v["_start"],
            "duration": (ends[sid] - v["_start"]) if matched else v["_duration"],
            "time_to_safepoint": v["_duration"],
            "unmatched": not matched,
            "operation": op_by_safepoint.get(sid),
            "total_threads": v.get("totalThreadCount"),
        }
    return {
        "safepoint": safepoints,
        "gc_pause": sorted(
            (v["gcId"], v["name"], v["_start"], v["_duration"], gcs.get(v["gcId"], {}).get("name"))
            for v in by_type.get("jdk.GCPhasePause", [])
        ),
        "gc": {
            gid: (v["name"], v["cause"], v["_start"], v["_duration"], iso_duration_ns(v["sumOfPauses"]),
                  iso_duration_ns(v["longestPause"]))
            for gid, v in gcs.items()
        },
        "vm_operation": sorted(
            (v["operation"], v["_start"], v["_duration"])
            for v in ops if not v.get("safepoint") or v["safepointId"] not in begins
        ),
        "compilation": sorted((v["_start"], v["_duration"]) for v in by_type.get("jdk.Compilation", [])),
        "deoptimization": len(by_type.get("jdk.Deoptimization", [])),
    }


def assert_matches_witness(df, java_home: Path, path: Path, tolerance_ns: int = 0) -> dict:
    """Checks every kind's count and durations (and start times, up to one constant per chunk)
    against `jfr print --json` of the same file. Returns the expected dict for further checks."""
    events = jfr_print(java_home, path, [
        "jdk.SafepointBegin", "jdk.SafepointEnd", "jdk.ExecuteVMOperation", "jdk.GCPhasePause",
        "jdk.GarbageCollection", "jdk.Compilation", "jdk.Deoptimization",
    ])
    expected = expected_pauses(events)
    df = df[df["source"] == str(path)]
    kinds = df["kind"].value_counts().to_dict()
    counts = {
        "safepoint": len(expected["safepoint"]), "gc_pause": len(expected["gc_pause"]), "gc": len(expected["gc"]),
        "vm_operation": len(expected["vm_operation"]), "compilation": len(expected["compilation"]),
        "deoptimization": expected["deoptimization"],
    }
    assert {k: kinds.get(k, 0) for k in counts} == counts

    # Start times: ours are on another clock (and per chunk), the witness's on the wall clock
    # of the first chunk; within one chunk they must differ by one constant.
    offsets: dict[int, set[int]] = {}

    def note_offset(chunk: int, ours: int, theirs: int) -> None:
        offsets.setdefault(int(chunk), set()).add(theirs - ours)

    sp = df[df["kind"] == "safepoint"]
    for row in sp.itertuples():
        exp = expected["safepoint"][row.safepoint_id]
        assert abs(row.duration_ns - exp["duration"]) <= tolerance_ns, (row, exp)
        assert abs(row.time_to_safepoint_ns - exp["time_to_safepoint"]) <= tolerance_ns
        assert row.unmatched == exp["unmatched"]
        assert (None if pd.isna(row.operation) else row.operation) == exp["operation"]
        if exp["total_threads"] is not None:
            assert row.total_threads == exp["total_threads"]
        assert row.end_ns == row.start_ns + row.duration_ns
        note_offset(row.chunk, row.start_ns, exp["start"])

    gcp = df[df["kind"] == "gc_pause"]
    ours = sorted(zip(gcp.gc_id, gcp.name, gcp.duration_ns, gcp.collector.astype(object).where(gcp.collector.notna(), None)))
    theirs = sorted((g, n, d, c) for g, n, _, d, c in expected["gc_pause"])
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a[0] == b[0] and a[1] == b[1] and a[3] == b[3] and abs(a[2] - b[2]) <= tolerance_ns, (a, b)

    gc = df[df["kind"] == "gc"]
    for row in gc.itertuples():
        name, cause, start, duration, total, longest = expected["gc"][row.gc_id]
        assert (row.name, row.cause) == (name, cause)
        assert abs(row.duration_ns - duration) <= tolerance_ns
        assert abs(row.sum_of_pauses_ns - total) <= tolerance_ns and abs(row.longest_pause_ns - longest) <= tolerance_ns
        note_offset(row.chunk, row.start_ns, start)

    vm = df[df["kind"] == "vm_operation"]
    ours_vm = sorted(zip(vm.operation, vm.duration_ns))
    theirs_vm = sorted((op, d) for op, _, d in expected["vm_operation"])
    assert [o for o, _ in ours_vm] == [o for o, _ in theirs_vm]
    assert all(abs(a[1] - b[1]) <= tolerance_ns for a, b in zip(ours_vm, theirs_vm))

    comp = df[df["kind"] == "compilation"]
    assert sorted(comp.duration_ns) == sorted(d for _, d in expected["compilation"]) or tolerance_ns > 0

    for chunk, spread in offsets.items():
        assert max(spread) - min(spread) <= 2 * tolerance_ns, (chunk, sorted(spread)[:3], sorted(spread)[-3:])
    return expected
