"""Ground truth for the code of each GIL release (docs/probe.md, "The code of a release").

    python code_workloads.py WORKLOAD EVENTS_FILE [METHOD]

Each workload function gives the GIL up in a known place, marked `# release:NAME` on its
line; a thread runs one of them in a loop (`_loop`) between two time.monotonic_ns()
reads. A forced switch may also take the GIL from the thread at the entry of a function
(its `def` line: RESUME), in the loop or in the caller just after its first clock read (the
check that follows a call into C): those lines are marked `# switch:NAME`. Prints
one JSON line: per thread its tid, bracket, the function's qualified name and the lines
where it may release. Runs inside any interpreter with engine.probe importable; numpy
and JPype only where they are installed (the witness says which ran).
"""
import gc
import json
import os
import sys
import threading
import time
import zlib

import engine.probe

RELEASE_LINES = {}
with open(__file__) as source:
    for number, text in enumerate(source, 1):
        for mark in ("# release:", "# switch:"):
            if mark in text:
                RELEASE_LINES.setdefault(text.split(mark)[1].strip(), []).append(number)


def sleep_here():  # switch:sleep_here
    time.sleep(0)  # release:sleep_here


def zlib_here(data=os.urandom(1 << 12)):  # switch:zlib_here
    return zlib.compress(data, 1)  # release:zlib_here


def numpy_here(a, b):  # switch:numpy_here
    return a @ b  # release:numpy_here


def java_here(nano_time):  # switch:java_here
    return nano_time()  # release:java_here


STOP = False


def spin_here():  # switch:spin_here
    x = 0
    while not STOP:  # release:spin_here
        x += 1  # release:spin_here
    return x


def spin_other():  # switch:spin_other
    x = 0
    while not STOP:  # release:spin_other
        x += 1  # release:spin_other
    return x


def _loop(function, args, count, out, name):  # switch:_loop
    out[name] = {"tid": threading.get_native_id(), "function": function.__qualname__, "lines": RELEASE_LINES[function.__name__],
                 "caller": "_loop", "caller_lines": RELEASE_LINES["_loop"]}
    before = time.monotonic_ns()  # switch:_loop
    for _ in range(count):  # switch:_loop
        function(*args)  # switch:_loop
    out[name]["bracket"] = (before, time.monotonic_ns())


def _spin(function, out, name):
    out[name] = {"tid": threading.get_native_id(), "function": function.__qualname__, "lines": RELEASE_LINES[function.__name__],
                 "caller": "_spin", "caller_lines": RELEASE_LINES["_spin"]}
    before = time.monotonic_ns()  # switch:_spin
    function()  # switch:_spin
    out[name]["bracket"] = (before, time.monotonic_ns())


def releases(count: int) -> dict:
    """One thread per releasing function, all at once, then two spinning threads."""
    global STOP
    out = {}
    jobs = [(sleep_here, ()), (zlib_here, ())]
    try:
        import numpy
        a = numpy.ones((64, 64))
        jobs.append((numpy_here, (a, a)))
    except ImportError:
        pass
    try:
        import jpype
        jpype.startJVM()
        jobs.append((java_here, (jpype.JClass("java.lang.System").nanoTime,)))
    except ImportError:
        pass
    threads = [threading.Thread(target=_loop, args=(f, args, count, out, f.__name__), name=f.__name__) for f, args in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.setswitchinterval(0.0005)
    STOP = False
    spinners = [threading.Thread(target=_spin, args=(f, out, f.__name__), name=f.__name__) for f in (spin_here, spin_other)]
    for t in spinners:
        t.start()
    time.sleep(2.0)
    STOP = True
    for t in spinners:
        t.join()
    return out


def recycled(rounds: int) -> dict:
    """Code objects made, run (a release interns each), freed, and made again: without the
    table's reference, a new function's code would often get a freed one's address."""
    out = {"functions": [], "addresses": []}
    for i in range(rounds):
        namespace = {"time": time}
        # a distinct name and line per round, so a misnamed interval shows
        exec(compile("\n" * i + f"def recycled_{i}():\n    time.sleep(0)\n", "<recycled>", "exec"), namespace)
        function = namespace[f"recycled_{i}"]
        before = time.monotonic_ns()
        function()
        out["functions"].append({"tid": threading.get_native_id(), "function": f"recycled_{i}", "line": i + 2,
                                 "bracket": (before, time.monotonic_ns())})
        out["addresses"].append(id(function.__code__))
        del function, namespace
        gc.collect()  # the function and its globals form a cycle
    # the same, never run (not interned): addresses recycled as the allocator likes
    unnamed = []
    for i in range(rounds):
        namespace = {}
        exec(compile("\n" * i + f"def unnamed_{i}():\n    pass\n", "<unnamed>", "exec"), namespace)
        unnamed.append(id(namespace[f"unnamed_{i}"].__code__))
        del namespace
        gc.collect()
    out["unnamed_addresses"] = unnamed
    return out


if __name__ == "__main__":
    workload, events = sys.argv[1], sys.argv[2]
    engine.probe.start(events, backend="precise")
    result = releases(int(os.environ.get("CODE_WORKLOAD_COUNT", "5000"))) if workload == "releases" else recycled(200)
    status = engine.probe.stop()
    print(json.dumps({"result": result, "status": {k: status.get(k) for k in ("method", "codes", "events")}}))
