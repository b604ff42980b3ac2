"""A JPype program that makes Python garbage: no tandem-specific code."""
import gc
import threading
import time

import jpype

jpype.startJVM("-Xmx256m")
ArrayList = jpype.JClass("java.util.ArrayList")


class Node:
    def __init__(self, payload):
        self.payload = payload
        self.other = self  # a cycle: only the collector frees it


def churn():
    kept = []
    for round_ in range(40):
        batch = [Node(bytearray(64 * 1024)) for _ in range(400)]  # ~25 MiB in cycles
        kept.append(batch[:40])  # grow a little for good
        del batch
        gc.collect()  # the collector runs here (JPype's callback sees the process grow)
        time.sleep(0.02)


worker = threading.Thread(target=churn, name="churner")
worker.start()
java_list = ArrayList()
for i in range(2000):
    java_list.add(i)
worker.join()
print("done")
