"""A JPype program whose Python threads ask the JVM for collections: one calls
java.lang.System.gc() directly, one calls a Java method that calls it. Writes each thread's
native id and the time.monotonic_ns() bracket of each call to the JSON file argv[2]."""
import json
import sys
import threading
import time

import jpype

jpype.startJVM(classpath=[sys.argv[1]])
System = jpype.JClass("java.lang.System")
GcCaller = jpype.JClass("GcCaller")
calls = []


def direct():
    for _ in range(3):
        before = time.monotonic_ns()
        System.gc()  # the direct call
        calls.append({"thread": "direct-gc", "tid": threading.get_native_id(), "before_ns": before,
                      "after_ns": time.monotonic_ns()})
        time.sleep(0.05)


def through_java():
    for _ in range(3):
        before = time.monotonic_ns()
        GcCaller.collect()  # the call through Java
        calls.append({"thread": "java-gc", "tid": threading.get_native_id(), "before_ns": before,
                      "after_ns": time.monotonic_ns()})
        time.sleep(0.05)


for target, name in ((direct, "direct-gc"), (through_java, "java-gc")):
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
with open(sys.argv[2], "w") as out:
    json.dump(calls, out)
