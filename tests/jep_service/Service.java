import jep.Interpreter;
import jep.SharedInterpreter;
import jep.SubInterpreter;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;

/**
 * A Java service running Python in three Java threads through Jep (a SharedInterpreter each,
 * or a SubInterpreter with argument "sub"), with a timer forcing GCs while they run. Prints one
 * JSON line: each thread's tid and the monotonic brackets of its sleeps, and the nanoTime
 * bracket of each System.gc(). Used by tests/test_record_interpreters.py.
 */
public class Service {
    static final String PY =
        "import json, threading, time\n" +
        "brackets = []\n" +
        "for i in range(50):\n" +
        "    before = time.monotonic_ns()\n" +
        "    time.sleep(0.010)\n" +
        "    brackets.append((before, time.monotonic_ns()))\n" +
        "    end = time.monotonic_ns() + 2_000_000\n" +
        "    while time.monotonic_ns() < end:\n" +
        "        pass\n" +
        "result = json.dumps({'tid': threading.get_native_id(), 'brackets': brackets})\n";

    public static void main(String[] args) throws Exception {
        boolean sub = args.length > 0 && args[0].equals("sub");
        List<String> results = new ArrayList<>();
        List<Thread> workers = new ArrayList<>();
        CyclicBarrier ready = new CyclicBarrier(4);  // three interpreters up, and the timer
        for (int w = 0; w < 3; w++) {
            Thread t = new Thread(() -> {
                try (Interpreter interp = sub ? new SubInterpreter() : new SharedInterpreter()) {
                    ready.await();
                    interp.exec(PY);
                    String r = (String) interp.getValue("result");
                    synchronized (results) { results.add(r); }
                } catch (Exception e) {
                    e.printStackTrace();
                    System.exit(3);
                }
            }, "py-worker-" + w);
            workers.add(t);
        }
        List<long[]> gcs = new ArrayList<>();
        Thread timer = new Thread(() -> {
            try {
                ready.await();
                while (true) {
                    long before = System.nanoTime();
                    System.gc();
                    long after = System.nanoTime();
                    synchronized (gcs) { gcs.add(new long[] {before, after}); }
                    Thread.sleep(50);
                }
            } catch (InterruptedException e) {
                // the workers are done
            } catch (Exception e) {
                e.printStackTrace();
                System.exit(4);
            }
        }, "gc-timer");
        for (Thread t : workers) t.start();
        timer.start();
        for (Thread t : workers) t.join();
        timer.interrupt();
        timer.join();
        StringBuilder out = new StringBuilder("{\"workers\": [" + String.join(",", results) + "], \"gcs\": [");
        for (int i = 0; i < gcs.size(); i++) {
            out.append(i == 0 ? "" : ",").append("[").append(gcs.get(i)[0]).append(",").append(gcs.get(i)[1]).append("]");
        }
        System.out.println(out.append("]}"));
    }
}
