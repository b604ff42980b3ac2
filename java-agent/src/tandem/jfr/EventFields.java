package tandem.jfr;

import java.util.List;
import jdk.jfr.consumer.RecordedClass;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedMethod;
import jdk.jfr.consumer.RecordedStackTrace;
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

    /** How many of a System.gc() call's innermost frames are kept (system_gc_frames). */
    public static final int SYSTEM_GC_FRAMES = 5;

    /**
     * A System.gc() call's innermost SYSTEM_GC_FRAMES frames, innermost first, as
     * {@code Class.method:line} joined by "; " (no line when JFR has none); null without a
     * trace. The pauses table and the live pause ring write the same text.
     */
    public static String systemGcCallFrames(RecordedStackTrace trace) {
        if (trace == null) {
            return null;
        }
        StringBuilder out = new StringBuilder();
        List<RecordedFrame> frames = trace.getFrames();
        for (int i = 0; i < frames.size() && i < SYSTEM_GC_FRAMES; i++) {
            RecordedFrame frame = frames.get(i);
            RecordedMethod method = frame.getMethod();
            if (i > 0) {
                out.append("; ");
            }
            RecordedClass type = method == null ? null : method.getType();
            out.append(type == null ? "?" : type.getName().replace('/', '.')).append('.')
                .append(method == null ? "?" : method.getName());
            if (frame.getLineNumber() > 0) {
                out.append(':').append(frame.getLineNumber());
            }
        }
        return out.toString();
    }
}
