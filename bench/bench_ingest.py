"""Ingest speed, side by side with its anchors in one run (issue 2, "Speed").

(a) `read_pauses` in-process with the JVM already up, vs a plain Java program that streams
    the same event types with `EventStream.openFile` and does nothing else (the floor for
    anything built on jdk.jfr). Goal: at most 1.5x its time.
(b) the `tandem pauses` CLI end to end, vs `jfr print --json --events <same types>` followed
    by loading the JSON into pandas (what a Python user does today). Goal: at least 3x faster.

The recording (~100 MB, allocation-heavy, profile settings plus pause events at 0 ms) is
made once and cached in .cache/ (about 70 s on 2 cores). Figures are medians of several
runs on a shared 2-core machine: expect noise of 10-20%. In (a) the anchor's JVM stays up
and its passes alternate with ours, and it must see as many events as read_pauses did
(the check that both subscribe the same types).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import Row

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "bench-ingest"
RECORD_SECONDS = 75
REPEATS = 5     # (b): each pass of `jfr print --json` takes seconds
REPEATS_A = 9   # (a): passes are a fraction of a second; more of them steady the median
# Passes not timed on either side: both JIT-compile the jdk.jfr parser first. read_pauses (a
# larger program: the reader's handlers, in a JVM started through JPype) reaches its steady
# state after five to eight passes, the anchor after two or three (docs/pauses.md, "Speed").
WARMUPS = 6

WORKLOAD = r"""
public class BenchAlloc {
    public static void main(String[] args) {
        long end = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        Object[] keep = new Object[8192];
        long sum = 0;
        int i = 0;
        while (System.nanoTime() < end) {
            byte[] b = new byte[32 + (i % 700)];
            keep[i++ & 8191] = b;
            sum += b.length;
        }
        System.out.println(sum);
    }
}
"""

# The anchor: stream the given event types, read each one's start, nothing more. One pass
# per line read from stdin (so that its passes interleave with ours, in the same moments
# of a shared machine); prints the seconds of the pass and the events it saw.
ANCHOR = r"""
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.file.Path;
import jdk.jfr.consumer.EventStream;

public class StreamPauses {
    public static void main(String[] args) throws Exception {
        String[] types = args[1].split(",");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        while (in.readLine() != null) {
            long[] seen = new long[2];
            long t0 = System.nanoTime();
            try (EventStream stream = EventStream.openFile(Path.of(args[0]))) {
                stream.setOrdered(false);
                for (String type : types) {
                    stream.onEvent(type, e -> { seen[0]++; seen[1] += e.getLong("startTime") & 1; });
                }
                stream.start();
            }
            System.out.println((System.nanoTime() - t0) / 1e9 + " " + seen[0] + " " + seen[1]);
            System.out.flush();
        }
    }
}
"""


def _java_home() -> Path:
    from engine import jvm

    return jvm.find_java_home()


def _compile(name: str, source: str) -> Path:
    """Compiles `source` into the cache; again whenever the source changed."""
    classes = CACHE / "classes"
    src = CACHE / f"{name}.java"
    if not (classes / f"{name}.class").exists() or not src.exists() or src.read_text() != source:
        classes.mkdir(parents=True, exist_ok=True)
        src.write_text(source)
        subprocess.run([str(_java_home() / "bin" / "javac"), "-d", str(classes), str(src)], check=True)
    return classes


def bench_recording(console) -> Path:
    """The cached ~100 MB recording; made on first use."""
    out = CACHE / "alloc-100mb.jfr"
    if out.exists():
        return out
    classes = _compile("BenchAlloc", WORKLOAD)
    jfr = str(_java_home() / "bin" / "jfr")
    settings = CACHE / "bench.jfc"
    subprocess.run([jfr, "configure", "--input", "profile", "jdk.SafepointBegin#threshold=0ms",
                    "jdk.SafepointEnd#enabled=true", "jdk.SafepointEnd#threshold=0ms",
                    "jdk.ExecuteVMOperation#threshold=0ms", "jdk.GCPhasePause#threshold=0ms",
                    "jdk.ObjectAllocationInNewTLAB#enabled=true", "--output", str(settings)],
                   check=True, capture_output=True)
    tmp = out.with_suffix(".tmp.jfr")
    with console.status(f"recording the bench workload for {RECORD_SECONDS} s (cached in {CACHE})"):
        subprocess.run([str(_java_home() / "bin" / "java"), "-Xmx32m", "-Xmn2m",
                        f"-XX:StartFlightRecording=filename={tmp},settings={settings}",
                        "-cp", str(classes), "BenchAlloc", str(RECORD_SECONDS)], check=True, capture_output=True)
    tmp.rename(out)
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main(console) -> list[Row]:
    from engine import jvm
    from engine.ingest.jfr import read_pauses

    rec = bench_recording(console)
    size_mb = rec.stat().st_size / 1e6
    types = [str(t) for t in jvm.start_jvm().JClass("tandem.ingest.PauseReader").EVENT_TYPES]

    # (a) in-process, JVM up, vs the anchor in its own (plain, default-flag) JVM kept warm:
    # the same untimed warm-up passes on both sides, then timed passes taken in pairs, the
    # order within a pair alternating, so that both sides meet the same load.
    anchor_classes = _compile("StreamPauses", ANCHOR)
    anchor = subprocess.Popen([str(_java_home() / "bin" / "java"), "-cp", str(anchor_classes), "StreamPauses", str(rec),
                               ",".join(types)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def anchor_pass() -> tuple[float, int]:
        anchor.stdin.write("pass\n")
        anchor.stdin.flush()
        seconds, events, _ = anchor.stdout.readline().split()
        return float(seconds), int(events)

    def ours_pass():
        t0 = time.perf_counter()
        table = read_pauses(rec)
        return time.perf_counter() - t0, table

    try:
        cold_anchor, anchor_events = anchor_pass()
        for _ in range(WARMUPS):
            ours_pass()
        for _ in range(WARMUPS - 1):
            anchor_pass()
        ours_a, anchor_a = [], []
        for i in range(REPEATS_A):
            if i % 2:
                anchor_a.append(anchor_pass()[0])
                ours_a.append(ours_pass()[0])
            else:
                seconds, table = ours_pass()
                ours_a.append(seconds)
                anchor_a.append(anchor_pass()[0])
    finally:
        anchor.stdin.close()
        anchor.wait()
    ours_events = sum(run["events_seen"] for source in table.attrs["sources"] for run in source["runs"])
    if anchor_events != ours_events:
        raise RuntimeError(f"the anchor saw {anchor_events} events, read_pauses {ours_events}: not the same event types")
    console.print(f"recording: {rec} ({size_mb:.0f} MB, {table.attrs['sources'][0]['chunks']} chunks, {len(table)} rows, "
                  f"{ours_events} events of the {len(types)} types on both sides)")
    console.print(f"(a) read_pauses: {[round(x, 3) for x in ours_a]} s; EventStream.openFile: {[round(x, 3) for x in anchor_a]} s "
                  f"(cold first pass {cold_anchor:.3f} s)")

    # (b) CLI end to end vs jfr print --json + pandas.
    tandem = Path(sys.executable).parent / "tandem"
    ours_b, anchor_b = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            subprocess.run([str(tandem), "pauses", str(rec), "-o", tmp], check=True, capture_output=True)
            ours_b.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _jfr_print_into_pandas(rec, types)
            anchor_b.append(time.perf_counter() - t0)
    console.print(f"(b) tandem pauses: {[round(x, 3) for x in ours_b]} s; jfr print --json + pandas: "
                  f"{[round(x, 3) for x in anchor_b]} s")

    a_ours, a_anchor = _median(ours_a), _median(anchor_a)
    b_ours, b_anchor = _median(ours_b), _median(anchor_b)
    return [
        Row("ingest", f"read_pauses (JVM up) vs EventStream.openFile, {size_mb:.0f} MB", a_ours, a_anchor, "s",
            "<= 1.5x", a_ours <= 1.5 * a_anchor),
        Row("ingest", f"`tandem pauses` CLI vs jfr print --json + pandas, {size_mb:.0f} MB", b_ours, b_anchor, "s",
            ">= 3x faster (ratio <= 0.33)", b_ours * 3 <= b_anchor),
    ]


def _jfr_print_into_pandas(rec: Path, types: list[str]):
    import pandas as pd

    out = subprocess.run([str(_java_home() / "bin" / "jfr"), "print", "--json", "--events", ",".join(types), str(rec)],
                         check=True, capture_output=True, text=True).stdout
    events = json.loads(out)["recording"]["events"]
    return pd.json_normalize(events)
