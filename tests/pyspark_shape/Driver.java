import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.util.ArrayList;
import java.util.List;

/**
 * The PySpark / Py4J process shape: a JVM starts `python3 -m worker_daemon OUT`, which forks a
 * long-lived child per task it is sent; the JVM forces GCs meanwhile. Prints one JSON line
 * with the nanoTime bracket of each System.gc(). Used by tests/test_record_interpreters.py.
 */
public class Driver {
    public static void main(String[] args) throws Exception {
        String python = args[0], out = args[1];
        int tasks = Integer.parseInt(args[2]);
        ProcessBuilder builder = new ProcessBuilder(python, "-m", "worker_daemon", out);
        builder.redirectError(ProcessBuilder.Redirect.INHERIT);
        Process daemon = builder.start();
        BufferedReader fromDaemon = new BufferedReader(new InputStreamReader(daemon.getInputStream()));
        Writer toDaemon = new OutputStreamWriter(daemon.getOutputStream());
        fromDaemon.readLine();  // "ready": the daemon's interpreter is up
        for (int i = 0; i < tasks; i++) {
            toDaemon.write("task " + i + "\n");
        }
        toDaemon.flush();
        List<long[]> gcs = new ArrayList<>();
        for (int i = 0; i < tasks; i++) {
            fromDaemon.readLine();  // "started PID"
        }
        while (gcs.size() < 50) {
            long before = System.nanoTime();
            System.gc();
            gcs.add(new long[] {before, System.nanoTime()});
            Thread.sleep(40);
            if (fromDaemon.ready()) break;  // "done": every child has finished
        }
        toDaemon.close();
        int code = daemon.waitFor();
        StringBuilder line = new StringBuilder("{\"daemon_exit\": " + code + ", \"gcs\": [");
        for (int i = 0; i < gcs.size(); i++) {
            line.append(i == 0 ? "" : ",").append("[").append(gcs.get(i)[0]).append(",").append(gcs.get(i)[1]).append("]");
        }
        System.out.println(line.append("]}"));
    }
}
