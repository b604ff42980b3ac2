"""Workloads the GIL-probe tests run inside real interpreters (3.11, 3.12, 3.13).

Standard library only (the target interpreter has none of tandem's dependencies).
    python probe_workloads.py WORKLOAD EVENTS_FILE BACKEND
records with engine.probe into EVENTS_FILE and prints one JSON line of witnesses: thread
ids from threading.get_native_id() and time.monotonic_ns() brackets.
"""
import json
import sys
import threading
import time

import engine.probe


def sleeper() -> dict:
    """A thread that sleeps 10 ms fifty times, each sleep bracketed by monotonic_ns()."""
    out = {"brackets": []}

    def run():
        out["tid"] = threading.get_native_id()
        for _ in range(50):
            before = time.monotonic_ns()
            time.sleep(0.010)
            out["brackets"].append((before, time.monotonic_ns()))

    thread = threading.Thread(target=run, name="sleeper")
    thread.start()
    thread.join()
    out["main_tid"] = threading.get_native_id()
    return out


def spinners(seconds: float = 0.4, switch_interval: float = 0.001) -> dict:
    """Two CPU-bound threads: the interpreter forces a switch every switch interval."""
    sys.setswitchinterval(switch_interval)
    tids, brackets = {}, {}

    def spin(name):
        tids[name] = threading.get_native_id()
        start = time.monotonic_ns()
        end = start + int(seconds * 1e9)
        x = 0
        while time.monotonic_ns() < end:
            for i in range(200):
                x += i
        brackets[name] = (start, time.monotonic_ns())

    threads = [threading.Thread(target=spin, args=(f"spin-{i}",), name=f"spin-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"tids": tids, "brackets": brackets, "switch_interval": switch_interval}


def jpype_sleep() -> dict:
    """A thread inside a JPype call into Java (java.lang.Thread.sleep(20))."""
    import jpype

    jpype.startJVM()
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        sleep = jpype.JClass("java.lang.Thread").sleep
        before = time.monotonic_ns()
        sleep(20)
        out["bracket"] = (before, time.monotonic_ns())

    thread = threading.Thread(target=run, name="java-caller")
    thread.start()
    thread.join()
    return out


def own_gil_sleeper() -> dict:
    """A thread running in a sub-interpreter with a GIL of its own (3.12+) sleeps 10 ms fifty
    times, each sleep bracketed by monotonic_ns() inside the sub-interpreter; the witnesses
    come back through a pipe. The interpreter is destroyed before the probe stops."""
    import os

    try:
        import _interpreters as interpreters  # 3.13

        interp = interpreters.create("isolated")
    except ImportError:
        import _xxsubinterpreters as interpreters  # 3.12

        interp = interpreters.create(isolated=True)
    read_end, write_end = os.pipe()
    code = (
        "import _thread, json, os, time\n"
        "brackets = []\n"
        "for _ in range(50):\n"
        "    before = time.monotonic_ns()\n"
        "    time.sleep(0.010)\n"
        "    brackets.append((before, time.monotonic_ns()))\n"
        f"os.write({write_end}, json.dumps({{'tid': _thread.get_native_id(), 'brackets': brackets}}).encode())\n"
    )
    thread = threading.Thread(target=interpreters.run_string, args=(interp, code), name="in-subinterpreter")
    thread.start()
    thread.join()
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    interpreters.destroy(interp)
    return json.loads(data)


WORKLOADS = {"sleeper": sleeper, "spinners": spinners, "jpype_sleep": jpype_sleep, "own_gil_sleeper": own_gil_sleeper}

if __name__ == "__main__":
    workload, events_file, backend = sys.argv[1:4]
    status = engine.probe.start(events_file, backend=backend, sample_period_us=100)
    witness = WORKLOADS[workload]()
    final = engine.probe.stop()
    witness["status"] = final
    print(json.dumps(witness))
