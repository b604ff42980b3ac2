"""A service that leaks one kind of memory at a known rate (or none): no tandem-specific code.

    python memory_leak_program.py KIND RATE_MB_S SECONDS [JVM_OPTION...]  # Python driving a JVM (JPype)
    java [JVM_OPTION...] JepLeak KIND RATE_MB_S SECONDS memory_leak_program.py  # a JVM running it (Jep)

KIND: python (small Python objects kept in a list), numpy (numpy arrays kept alive by Java
references in a Java list: JPype's direct buffers over them, Jep's PyObjects), direct (Java DirectByteBuffers kept),
heap (Java byte arrays kept), none (Python and Java garbage made and dropped: a sawtooth
heap, no growth). The tests size its JVM's heap as latency-minded services do (fixed, with a fixed
young generation: tests/test_memory.py, _jvm_options) so that G1 neither grows its eden into fresh
regions nor shrinks the heap while the service leaks. The service warms up first (JVM started, the garbage loop
running ten times faster than it will, until the young collections have cycled eden twice and the
RSS has stayed flat for FLAT_S), then leaks for SECONDS; it prints the bytes it kept per second, as the leak's own accounting
counts them, as its last line: `leaked BYTES in SECONDS s`; before it, a line `kept T_NS BYTES` at
each tick (CLOCK_MONOTONIC, bytes kept so far): its rate over any span, if the service fell
behind its schedule on a busy machine and caught up.
"""
import sys
import time

import numpy as np

KIND, RATE, SECONDS, JVM_OPTIONS = sys.argv[1], float(sys.argv[2]) * 1e6, float(sys.argv[3]), sys.argv[4:]
WARM_UP_S = 3.0
FLAT_S, FLAT_BYTES = 3.0, 2 << 20  # steady: the RSS grew less than FLAT_BYTES over the last FLAT_S
MAX_WARM_UP_S = 20.0
TICK_S = 0.05

try:
    import _jep  # noqa: F401  (present only inside a JVM: Java runs this with Jep, tests/memory_java/JepLeak.java)
except ImportError:
    import jpype
    import jpype.nio

    jpype.startJVM(*JVM_OPTIONS)
    ArrayList = jpype.JClass("java.util.ArrayList")
    ByteBuffer = jpype.JClass("java.nio.ByteBuffer")
    ManagementFactory = jpype.JClass("java.lang.management.ManagementFactory")
    JBytes = jpype.JArray(jpype.JByte)

    def held_by_java(array):
        """A Java direct buffer over the array's memory: JPype keeps the array alive while it lives."""
        return jpype.nio.convertToDirectBuffer(array)
else:
    import jep
    from java.lang.management import ManagementFactory
    from java.nio import ByteBuffer
    from java.util import ArrayList

    def JBytes(length):
        return jep.jarray(length, jep.JBYTE_ID)

    class Holder:
        def __init__(self, array):
            self.array = array

    def held_by_java(array):
        """Jep hands a Python object Java has no type for to Java as a PyObject, which keeps it alive."""
        return Holder(array)

java_kept = ArrayList()
python_kept = []


def garbage():
    """What a service makes and drops every tick, leak or not: Java and Python garbage."""
    for _ in range(20):
        JBytes(16384)
    [str(i) * 3 for i in range(2000)]


def leak_once(budget: float) -> int:
    """Keep about BUDGET bytes of this kind; returns the bytes kept."""
    kept = 0
    if KIND == "python":
        while kept < budget:
            item = "%0415d" % len(python_kept)  # one str object of 464 bytes: one of pymalloc's size classes
            python_kept.append(item)
            kept += sys.getsizeof(item)
    elif KIND == "numpy":
        while kept < budget:
            array = np.ones(1 << 17)  # 1 MiB of float64, touched
            java_kept.add(held_by_java(array))
            kept += array.nbytes
    elif KIND == "direct":
        while kept < budget:
            java_kept.add(ByteBuffer.allocateDirect(1 << 20))  # zeroed by the JVM: touched
            kept += 1 << 20
    elif KIND == "heap":
        while kept < budget:
            java_kept.add(JBytes(16384))
            kept += 16384 + 16  # the array and its header
    return kept


def young_collections() -> int:
    return sum(int(gc.getCollectionCount()) for gc in ManagementFactory.getGarbageCollectorMXBeans()
               if "Old" not in str(gc.getName()) and "MarkSweep" not in str(gc.getName()))


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def steady(history: list[tuple[float, int]], now: float) -> bool:
    recent = [value for t, value in history if t >= now - FLAT_S]
    return history[0][0] <= now - FLAT_S and max(recent) - min(recent) < FLAT_BYTES


def warm_up() -> None:
    """Garbage ten times the leak phase's until the young collections have cycled eden twice and
    the RSS has stayed flat for FLAT_S (MAX_WARM_UP_S at most)."""
    history: list[tuple[float, int]] = []
    start, gcs = time.monotonic(), young_collections()
    while (now := time.monotonic()) - start < MAX_WARM_UP_S:
        history.append((now, rss()))
        if now - start >= WARM_UP_S and young_collections() - gcs >= 2 and steady(history, now):
            return
        for _ in range(10):
            garbage()
        time.sleep(TICK_S)


warm_up()

leaked, due = 0, 0.0
begin = time.monotonic()
while (now := time.monotonic()) - begin < SECONDS:
    garbage()
    due = RATE * (now - begin) if KIND != "none" else 0.0
    if due > leaked:
        leaked += leak_once(due - leaked)
        print(f"kept {time.monotonic_ns()} {leaked}")
    time.sleep(TICK_S)
elapsed = time.monotonic() - begin
print(f"leaked {leaked} in {elapsed:.3f} s", flush=True)
