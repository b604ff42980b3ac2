package tandem.agent;

import java.lang.instrument.Instrumentation;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.List;

/**
 * Flushes JFR's disk repository soon after each garbage collection. JFR flushes by itself
 * about once a second; what it has not flushed when the process ends without running the
 * JVM's shutdown hooks is lost. That is how a JNI host ends (jpy, a C program, JPype left by
 * os._exit: no DestroyJavaVM, so no hook), and a System.gc() it called just before would have
 * no pause in the session. A daemon thread reads the collectors' counts (a few hundred ns)
 * every POLL_MILLIS and, when one moved, runs JFR's own flush ({@link LivePauses#jfrFlush}),
 * at most once every MIN_GAP_MILLIS. Pauses that are not collections still wait for JFR's
 * flush; analysis reports the window after the last flush (docs/pauses.md, "Unflushed").
 */
final class PauseFlush {
    static final long POLL_MILLIS = 20;
    /** Bounds the flushes of a service that collects all the time (each costs about a ms). */
    static final long MIN_GAP_MILLIS = 100;

    private final Runnable flush;
    private final Thread thread;
    private volatile String problem;

    private PauseFlush(Runnable flush) {
        this.flush = flush;
        this.thread = new Thread(this::run, "tandem-pause-flush");
        thread.setDaemon(true);
    }

    /** Starts the thread; throws when JFR's flush cannot be reached (no Instrumentation, a JDK that moved it). */
    static PauseFlush start(Instrumentation inst) throws Exception {
        PauseFlush pauseFlush = new PauseFlush(LivePauses.jfrFlush(inst));
        pauseFlush.thread.start();
        return pauseFlush;
    }

    void stop() {
        thread.interrupt();
    }

    /** Why the thread stopped early, or null. */
    String problem() {
        return problem;
    }

    private void run() {
        try {
            // Here, not in start(): the management classes take 50-80 ms to load, off the JVM's start.
            List<GarbageCollectorMXBean> collectors = ManagementFactory.getGarbageCollectorMXBeans();
            long flushed = collections(collectors);
            long lastFlush = System.nanoTime();
            while (!Thread.currentThread().isInterrupted()) {
                Thread.sleep(POLL_MILLIS);
                long count = collections(collectors);
                long now = System.nanoTime();
                if (count != flushed && now - lastFlush >= MIN_GAP_MILLIS * 1_000_000) {
                    flush.run();
                    flushed = count;
                    lastFlush = now;
                }
            }
        } catch (InterruptedException closing) {
            // the session closes
        } catch (Throwable t) {
            problem = "stopped: " + Agent.describe(t); // JFR's own flush (about 1 s) stays
        }
    }

    private static long collections(List<GarbageCollectorMXBean> collectors) {
        long sum = 0;
        for (GarbageCollectorMXBean collector : collectors) {
            sum += Math.max(0, collector.getCollectionCount()); // -1: not known for this collector
        }
        return sum;
    }
}
