package tandem.agent;

import java.lang.instrument.Instrumentation;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Flushes JFR's disk repository soon after each stop of the JVM. JFR flushes by itself about
 * once a second; what it has not flushed when the process ends without running the JVM's
 * shutdown hooks is lost. That is how a JNI host ends (jpy, a C program, JPype left by
 * os._exit: no DestroyJavaVM, so no hook), and a System.gc() it called just before would have
 * no pause in the session. A daemon thread reads the JVM's safepoint count and the collectors'
 * counts (a few hundred ns) every POLL_MILLIS and, when one moved, runs JFR's own flush
 * ({@link LivePauses#jfrFlush}), at most once every MIN_GAP_MILLIS, and once more after that
 * (for the events committed just after a stop). Where the safepoint count
 * cannot be read (HotSpot's internal counter, opened to the agent through its
 * Instrumentation), collections alone trigger a flush. Analysis reports the window after the
 * last flush (docs/pauses.md, "Unflushed").
 */
final class PauseFlush {
    static final long POLL_MILLIS = 20;
    /** Bounds the flushes of a service that stops all the time (each costs about 0.2 ms). */
    static final long MIN_GAP_MILLIS = 100;

    private final Runnable flush;
    private final Instrumentation inst;
    private final Thread thread;
    private volatile String problem;

    private PauseFlush(Runnable flush, Instrumentation inst) {
        this.flush = flush;
        this.inst = inst;
        this.thread = new Thread(this::run, "tandem-pause-flush");
        thread.setDaemon(true);
    }

    /** Starts the thread; throws when JFR's flush cannot be reached (no Instrumentation, a JDK that moved it). */
    static PauseFlush start(Instrumentation inst) throws Exception {
        PauseFlush pauseFlush = new PauseFlush(LivePauses.jfrFlush(inst), inst);
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
            MethodHandle safepoints = safepointCount(inst);
            long flushed = stops(safepoints, collectors);
            long lastFlush = System.nanoTime();
            boolean trailing = false;
            while (!Thread.currentThread().isInterrupted()) {
                Thread.sleep(POLL_MILLIS);
                long count = stops(safepoints, collectors);
                long now = System.nanoTime();
                if ((count != flushed || trailing) && now - lastFlush >= MIN_GAP_MILLIS * 1_000_000) {
                    flush.run();
                    // Once more MIN_GAP_MILLIS later: events committed just after the stop (jdk.SystemGC,
                    // which names the thread that called System.gc(), ends when the call returns).
                    trailing = count != flushed;
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

    private static long stops(MethodHandle safepoints, List<GarbageCollectorMXBean> collectors) throws Throwable {
        long sum = safepoints != null ? (long) safepoints.invoke() : 0;
        for (GarbageCollectorMXBean collector : collectors) {
            sum += Math.max(0, collector.getCollectionCount()); // -1: not known for this collector
        }
        return sum;
    }

    /** HotSpot's safepoint count (sun.management's HotspotRuntimeMBean, the sun.rt.safepoints counter), or null. */
    private static MethodHandle safepointCount(Instrumentation inst) {
        try {
            Module management = ManagementFactory.class.getModule();
            if (inst != null && management.isNamed()) {
                inst.redefineModule(management, Set.of(), Map.of("sun.management", Set.of(PauseFlush.class.getModule())),
                        Map.of(), Set.of(), Map.of());
            }
            Class<?> helper = Class.forName("sun.management.ManagementFactoryHelper");
            Object runtime = helper.getMethod("getHotspotRuntimeMBean").invoke(null);
            Class<?> bean = Class.forName("sun.management.HotspotRuntimeMBean");
            MethodHandle count = MethodHandles.lookup().unreflect(bean.getMethod("getSafepointCount")).bindTo(runtime);
            long first = (long) count.invoke(); // (throws where the counters are off: -XX:-UsePerfData)
            return first >= 0 ? count : null;
        } catch (Throwable t) {
            return null;
        }
    }
}
