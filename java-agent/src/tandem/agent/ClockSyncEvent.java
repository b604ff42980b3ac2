package tandem.agent;

import jdk.jfr.Category;
import jdk.jfr.Description;
import jdk.jfr.Event;
import jdk.jfr.FlightRecorder;
import jdk.jfr.Label;
import jdk.jfr.Name;
import jdk.jfr.StackTrace;

/**
 * The clock-sync event of docs/session.md: its start ticks and {@code monotonicNanos} are
 * read back to back, which pins JFR ticks to CLOCK_MONOTONIC (System.nanoTime on Linux).
 */
@Name("tandem.ClockSync")
@Label("tandem clock sync")
@Category("tandem")
@Description("System.nanoTime() read between begin() and end(); pairs JFR ticks with CLOCK_MONOTONIC")
@StackTrace(false)
public final class ClockSyncEvent extends Event {
    /** The event's name and its one field, as readers look them up. */
    static final String NAME = "tandem.ClockSync";
    static final String FIELD = "monotonicNanos";

    @Label("Monotonic nanos")
    @Description("System.nanoTime() (CLOCK_MONOTONIC on Linux) taken between begin() and end()")
    public long monotonicNanos;

    /** The JVM's pid: jdk.JVMInformation, which also holds it, is off (it carries the command line). */
    @Label("Process id")
    public long pid = PID;

    private static final long PID = ProcessHandle.current().pid();

    /** Back-to-back tries per sync point; the tightest is committed (see commitNow). */
    private static final int ATTEMPTS = 5;
    /** A tightest try wider than this (the thread was preempted in every try) asks for more. */
    private static final long TIGHT_NANOS = 20_000;
    private static final int MAX_ATTEMPTS = 50;
    private static boolean hookRegistered;

    /**
     * JFR itself commits a sync point at the start and the end of every chunk (the settings
     * give this event period "everyChunk"): that covers the recording's first and last
     * moments, and every chunk a killed JVM leaves behind, in the order JFR writes them.
     */
    static synchronized void registerChunkHook() {
        if (!hookRegistered) {
            FlightRecorder.addPeriodicEvent(ClockSyncEvent.class, ClockSyncEvent::commitNow);
            hookRegistered = true;
        }
    }

    /**
     * Commits one sync point now, safe from any thread. A cold call (the interpreter, after a
     * second of sleep) can take microseconds between begin() and the nanoTime() read, so a
     * few pairs are taken back to back and only the tightest is committed; end() right after
     * the read makes the event's duration bound where nanoTime() fell. On a loaded host every
     * one of the few can be preempted: then tries go on until one is tight, up to a bound.
     */
    static void commitNow() {
        ClockSyncEvent tightest = null;
        long tightestWidth = Long.MAX_VALUE;
        for (int attempt = 0; attempt < MAX_ATTEMPTS && (attempt < ATTEMPTS || tightestWidth > TIGHT_NANOS); attempt++) {
            ClockSyncEvent event = new ClockSyncEvent();
            long before = System.nanoTime();
            event.begin();
            event.monotonicNanos = System.nanoTime();
            event.end();
            long width = System.nanoTime() - before;
            if (width < tightestWidth) {
                tightest = event;
                tightestWidth = width;
            }
        }
        tightest.commit();
    }
}
