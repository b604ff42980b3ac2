package tandem.jfr;

import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Safepoints from their events, for both readers of pauses (the offline reader of JFR files and
 * the agent's live stream): jdk.SafepointBegin opens safepoint ID, the jdk.ExecuteVMOperation run
 * at it (field {@code safepoint} true) names it and gives its requester, jdk.SafepointEnd closes
 * it. What does not match is handed on as it is: an operation at a safepoint whose Begin is not
 * recorded (default.jfc keeps Begins above 10 ms only; or the reading started inside the
 * safepoint), an End without its Begin, and the Begins whose End never came, as unmatched.
 *
 * <p>When: {@link #streaming} hands a safepoint on at its End, for a stream ordered by commit
 * time (the VM thread commits Begin, operation, End in this order); Begins left open beyond
 * {@code maxOpen} (Ends that never come) are unmatched then, so memory stays bounded.
 * {@link #whole} hands everything on at {@link #finish}, in the order the Begins came, for a file
 * read without the JDK's sort, where a safepoint's events may come in any order.
 *
 * @param <B> what the reader keeps of a Begin (its row, or its times and thread)
 * @param <O> what the reader keeps of an operation (its name and requester)
 */
public final class SafepointMatcher<B, O> {
    /** What becomes of the events; every callback runs on the thread that calls this matcher. */
    public interface Listener<B, O> {
        /** Safepoint ID ended at END_TICKS; OPERATION null when none was recorded at it. */
        void matched(long id, B begin, long endTicks, O operation);

        /** Safepoint ID whose End did not come (OPERATION null when none was recorded at it). */
        void unmatched(long id, B begin, O operation);

        /** An operation run at safepoint ID whose Begin is not recorded. */
        void operationWithoutBegin(long id, O operation);

        /** An End whose Begin is not recorded. */
        void endWithoutBegin(long id);
    }

    private final Listener<B, O> listener;
    private final boolean streaming;
    private final int maxOpen;
    private final LinkedHashMap<Long, B> open = new LinkedHashMap<>();
    private final LinkedHashMap<Long, O> operations = new LinkedHashMap<>();
    private final LinkedHashMap<Long, Long> ends = new LinkedHashMap<>(); // (whole: every End until finish)

    private SafepointMatcher(Listener<B, O> listener, boolean streaming, int maxOpen) {
        this.listener = listener;
        this.streaming = streaming;
        this.maxOpen = maxOpen;
    }

    /** Hands each safepoint on at its End (a stream ordered by commit time). */
    public static <B, O> SafepointMatcher<B, O> streaming(Listener<B, O> listener, int maxOpen) {
        return new SafepointMatcher<>(listener, true, maxOpen);
    }

    /** Hands everything on at finish (events in any order). */
    public static <B, O> SafepointMatcher<B, O> whole(Listener<B, O> listener) {
        return new SafepointMatcher<>(listener, false, Integer.MAX_VALUE);
    }

    public void begin(long id, B begin) {
        open.put(id, begin);
        if (open.size() > maxOpen) {
            Iterator<Map.Entry<Long, B>> eldest = open.entrySet().iterator();
            Map.Entry<Long, B> entry = eldest.next();
            eldest.remove();
            listener.unmatched(entry.getKey(), entry.getValue(), operations.remove(entry.getKey()));
        }
    }

    public void operation(long id, O operation) {
        if (!streaming || open.containsKey(id)) {
            operations.put(id, operation);
        } else {
            listener.operationWithoutBegin(id, operation);
        }
    }

    public void end(long id, long endTicks) {
        if (!streaming) {
            ends.put(id, endTicks);
            return;
        }
        B begin = open.remove(id);
        O operation = operations.remove(id);
        if (begin == null) {
            listener.endWithoutBegin(id);
        } else {
            listener.matched(id, begin, endTicks, operation);
        }
    }

    /** Everything not handed on yet: the Begins still open (matched if their End came), then the
     *  operations and Ends without a Begin. */
    public void finish() {
        for (Map.Entry<Long, B> entry : open.entrySet()) {
            Long end = ends.remove(entry.getKey());
            O operation = operations.remove(entry.getKey());
            if (end != null) {
                listener.matched(entry.getKey(), entry.getValue(), end, operation);
            } else {
                listener.unmatched(entry.getKey(), entry.getValue(), operation);
            }
        }
        for (Map.Entry<Long, O> entry : operations.entrySet()) {
            listener.operationWithoutBegin(entry.getKey(), entry.getValue());
        }
        for (Long id : ends.keySet()) {
            listener.endWithoutBegin(id);
        }
        open.clear();
        operations.clear();
        ends.clear();
    }
}
