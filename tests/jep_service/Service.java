import jep.Interpreter;
import jep.SharedInterpreter;
import jep.SubInterpreter;
import java.util.ArrayList;
import java.util.List;

/** A Java service running Python in three Java threads through Jep, with a timer forcing GCs. */
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
        for (int w = 0; w < 3; w++) {
            Thread t = new Thread(() -> {
                try (Interpreter interp = sub ? new SubInterpreter() : new SharedInterpreter()) {
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
                Thread.sleep(200);
                while (true) {
                    long before = System.nanoTime();
                    System.gc();
                    long after = System.nanoTime();
                    synchronized (gcs) { gcs.add(new long[] {before, after}); }
                    Thread.sleep(50);
                }
            } catch (InterruptedException e) {
                // done
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
