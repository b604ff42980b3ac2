package tandem.jfr;

import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedThread;

/**
 * Reading optional fields of a JFR event by name, shared by the offline reader
 * (tandem.ingest.PauseReader) and the agent's live stream (tandem.agent.LivePauses).
 * A field an event type does not have (it differs between JDK versions) reads as null.
 */
public final class EventFields {
    /** Java-side null for long fields; the same sentinel Python's ingest maps to pandas NA. */
    public static final long NULL = Long.MIN_VALUE;

    private EventFields() {}

    public static long longField(RecordedEvent e, String name) {
        return e.hasField(name) ? e.getLong(name) : NULL;
    }

    public static String stringField(RecordedEvent e, String name) {
        if (!e.hasField(name)) {
            return null;
        }
        Object value = e.getValue(name);
        return value == null ? null : value.toString();
    }

    /** OS thread id of the event's thread, or NULL for events without one (GarbageCollection). */
    public static long osThreadId(RecordedEvent e) {
        RecordedThread thread = e.getThread();
        return thread == null ? NULL : thread.getOSThreadId();
    }
}
