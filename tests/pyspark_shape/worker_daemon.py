"""The PySpark daemon shape (pyspark/daemon.py): read tasks from stdin, fork a child per task;
each child runs Python for a while and ends with os._exit, as PySpark's workers do."""
import json
import os
import sys
import threading
import time


def task(out):
    brackets = []
    for _ in range(100):
        before = time.monotonic_ns()
        time.sleep(0.010)
        brackets.append((before, time.monotonic_ns()))
        sum(range(20_000))  # some Python between sleeps
    with open(os.path.join(out, "%d.json" % os.getpid()), "w") as f:
        json.dump({"tid": threading.get_native_id(), "brackets": brackets}, f)


def main():
    out = sys.argv[1]
    print("ready", flush=True)
    children = []
    for line in sys.stdin:
        if not line.startswith("task"):
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                task(out)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
        print("started", pid, flush=True)
        if len(children) == 3:
            break
    codes = [os.waitpid(pid, 0)[1] for pid in children]
    print("done", flush=True)
    sys.exit(1 if any(codes) else 0)


if __name__ == "__main__":
    main()
