package tandem.ingest;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

import jdk.jfr.EventType;
import jdk.jfr.Timespan;
import jdk.jfr.Unsigned;
import jdk.jfr.ValueDescriptor;
import jdk.jfr.consumer.EventStream;
import jdk.jfr.consumer.RecordedClass;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedMethod;
import jdk.jfr.consumer.RecordedObject;
import jdk.jfr.consumer.RecordedThread;
import tandem.jfr.PauseKinds;
import tandem.jfr.SafepointMatcher;

import static tandem.jfr.EventFields.longField;
import static tandem.jfr.EventFields.systemGcCallFrames;
import static tandem.jfr.EventFields.stringField;

/**
 * Reads the stop-the-world events of one JFR file (one JVM run) into flat columns.
 *
 * <p>Python calls {@link #read} once per file; all per-event work (filtering, matching
 * SafepointBegin/End by safepointId, joining GC names and causes by gcId) happens here so
 * that Python receives whole primitive arrays, never one call per event. Times are RAW
 * ticks ({@code getLong("startTime")}), converted to nanoseconds by Python with the chunk
 * headers, because the JDK's own Instant conversion uses the first chunk's header for
 * every chunk of a file.
 *
 * <p>Only the event types in {@link #EVENT_TYPES} are subscribed: the parser skips
 * everything else, which is what makes this fast. Per event, the handlers avoid what
 * jdk.jfr makes slow: fields are read by position rather than by name where the JVM allows
 * it ({@link Fields}), {@code getDuration(name)} looks the field's {@code @Timespan} up on
 * every call (a new annotation proxy each time; see {@link #durationNanos}), and
 * {@code getThread().getOSThreadId()} scans the thread's fields on every call (remembered per
 * thread object, see {@link ThreadIds}). Safepoints are matched as the live stream matches them
 * ({@link SafepointMatcher}); GC names and causes are joined by gcId in a primitive hash map.
 */
public final class PauseReader {
    /** Marks a null in the long columns (no real id, tick or count takes this value). */
    public static final long NULL = tandem.jfr.EventFields.NULL;

    public static final int KIND_SAFEPOINT = PauseKinds.SAFEPOINT;
    public static final int KIND_GC_PAUSE = PauseKinds.GC_PAUSE;
    public static final int KIND_GC = PauseKinds.GC;
    public static final int KIND_VM_OPERATION = PauseKinds.VM_OPERATION;
    public static final int KIND_COMPILATION = PauseKinds.COMPILATION;
    public static final int KIND_DEOPTIMIZATION = PauseKinds.DEOPTIMIZATION;
    /** The cause JFR gives a collection System.gc() asked for (HotSpot's GCCause::_java_lang_system_gc). */
    static final String SYSTEM_GC_CAUSE = "System.gc()";
    /** Names of the kind codes, indexed by code. */
    public static final String[] KINDS = PauseKinds.NAMES;

    /** The event name of tandem's clock-sync event (docs/session.md) and its one field. */
    public static final String CLOCK_SYNC = "tandem.ClockSync";
    public static final String CLOCK_SYNC_FIELD = "monotonicNanos";

    /** Every event type this reader subscribes to; the rest of the file is skipped. */
    public static final String[] EVENT_TYPES = {
        "jdk.SafepointBegin", "jdk.SafepointEnd", "jdk.ExecuteVMOperation", "jdk.GCPhasePause",
        "jdk.GarbageCollection", "jdk.Compilation", "jdk.Deoptimization", "jdk.SystemGC",
        "jdk.JVMInformation", "jdk.OSInformation", "jdk.GCConfiguration", "jdk.CPUTimeStampCounter",
        "jdk.InitialSystemProperty", CLOCK_SYNC,
    };

    // ---- the result: one row per pause-like interval, columns as whole arrays ----
    private final Rows rows = new Rows();
    private final Dictionary strings = new Dictionary();

    // ---- clock-sync samples: raw start ticks, System.nanoTime() and duration in ticks of each
    // tandem.ClockSync (nanoTime was read between its start and end) ----
    private final LongList syncTicks = new LongList();
    private final LongList syncMonotonicNanos = new LongList();
    private final LongList syncSpanTicks = new LongList();

    // ---- what the recording says about its JVM (first value seen wins) ----
    private String jvmName;
    private String jvmVersion;
    private String jvmVendor;
    private String osVersion;
    private String youngCollector;
    private String oldCollector;
    private long jvmPid = NULL;
    private long jvmStartMillis = NULL;
    private int fastTimeEnabled = -1;

    // ---- matching, resolved in finish(): safepoints by the rules the live stream matches them
    // with (tandem.jfr.SafepointMatcher), GC names and causes by gcId ----
    /** A VM operation run at a safepoint: its safepoint, its name's code, its requester, its own times and thread. */
    private record Operation(long id, int name, long requester, long start, long end, long thread) {}
    private final SafepointMatcher<Integer, Operation> safepoints = SafepointMatcher.whole(new SafepointRows());
    /** Operations at a safepoint whose Begin is not recorded: rows of their own, added in finish(). */
    private final List<Operation> safepointOperationsWithoutBegin = new ArrayList<>();
    /** gcId to the collection's name code (high 32 bits) and cause code (low 32 bits). */
    private final LongMap collectionNameAndCauseByGcId = new LongMap();
    private int orphanSafepointEnds;
    private long eventsSeen;
    private long unreadableEvents;
    private String firstUnreadable;

    /** jdk.SystemGC calls: start and end ticks, the calling thread's OS id, its top frames' code. */
    private final LongList systemGcStart = new LongList();
    private final LongList systemGcEnd = new LongList();
    private final LongList systemGcThread = new LongList();
    private final IntList systemGcFrames = new IntList(-1);

    // ---- per event type: which fields it has, resolved once per type (see Fields) ----
    private final Fields safepointBeginFields = new Fields("safepointId", "totalThreadCount", "jniCriticalThreadCount");
    private final Fields safepointEndFields = new Fields("safepointId");
    private final Fields vmOperationFields = new Fields("safepointId", "operation", "safepoint", "caller");
    private final Fields gcPhasePauseFields = new Fields("gcId", "name");
    private final Fields garbageCollectionFields = new Fields("gcId", "name", "cause", "sumOfPauses", "longestPause");
    private final Fields compilationFields = new Fields("method", "compiler", "compileLevel");
    private final Fields deoptimizationFields = new Fields("duration", "method", "reason", "action");
    private final Fields systemGcFields = new Fields("stackTrace");

    /**
     * The chunks' ticks per second when the caller knows it (one JVM run: the same for every
     * chunk), else 0. Only used to take a fast path for tick timespans (see durationNanos).
     */
    private long ticksPerSecond;

    // ---- OS thread ids of the events' threads and of the VM operations' callers ----
    private final ThreadIds eventThreads = new ThreadIds();
    private final ThreadIds callers = new ThreadIds();

    /** Highest start tick dispatched so far; polled from another thread to draw progress. */
    public volatile long progressTicks = NULL;

    /** Whether event fields are read by position where that is checked to hold (see Fields). */
    private boolean byPosition = EventValues.AVAILABLE;
    private int typesReadByName;

    /** The stream being read, so that {@link #abort} can close it from another thread. */
    private volatile EventStream stream;
    private volatile boolean aborted;

    /** Reads one JFR file; throws IOException (or a RuntimeException from jdk.jfr) on bad input. */
    public static PauseReader read(String path) throws IOException {
        PauseReader reader = new PauseReader();
        reader.readFile(path);
        return reader;
    }

    /**
     * The ticks per second of every chunk about to be read (one JVM run), if known; lets tick
     * timespans (GarbageCollection's sumOfPauses, longestPause) skip jdk.jfr's slow
     * getDuration when they are nanoseconds already (1e9 ticks per second).
     */
    public void setTicksPerSecond(long ticksPerSecond) {
        this.ticksPerSecond = ticksPerSecond;
    }

    /**
     * Reads every field by name, as jdk.jfr's getters do: slower, the same columns (the test
     * suite's witness for reading by position, see Fields).
     */
    public void readByName() {
        byPosition = false;
    }

    /** Whether this reader reads fields by position (the JVM opens jdk.jfr.consumer to it). */
    public boolean readsByPosition() {
        return byPosition;
    }

    /** Event types (one per metadata) whose fields did not sit where Fields expects: read by name. */
    public int typesReadByName() {
        return typesReadByName;
    }

    /** Reads into this (already constructed) reader, so that another thread can poll progress. */
    public void readFile(String path) throws IOException {
        try (EventStream stream = EventStream.openFile(Path.of(path))) {
            this.stream = stream;
            if (aborted) {
                return;
            }
            // No JDK sort: safepoints (SafepointMatcher.whole), GC names and causes are matched
            // whatever the order, in finish().
            stream.setOrdered(false);
            subscribe(stream, "jdk.SafepointBegin", this::onSafepointBegin);
            subscribe(stream, "jdk.SafepointEnd", this::onSafepointEnd);
            subscribe(stream, "jdk.ExecuteVMOperation", this::onVmOperation);
            subscribe(stream, "jdk.GCPhasePause", this::onGcPhasePause);
            subscribe(stream, "jdk.GarbageCollection", this::onGarbageCollection);
            subscribe(stream, "jdk.Compilation", this::onCompilation);
            subscribe(stream, "jdk.Deoptimization", this::onDeoptimization);
            subscribe(stream, "jdk.SystemGC", this::onSystemGc);
            subscribe(stream, "jdk.JVMInformation", this::onJvmInformation);
            subscribe(stream, "jdk.OSInformation", e -> osVersion = firstNonNull(osVersion, stringField(e, "osVersion")));
            subscribe(stream, "jdk.GCConfiguration", this::onGcConfiguration);
            subscribe(stream, "jdk.CPUTimeStampCounter", this::onTimeStampCounter);
            subscribe(stream, "jdk.InitialSystemProperty", this::onSystemProperty);
            subscribe(stream, CLOCK_SYNC, this::onClockSync);
            stream.start();
        } finally {
            this.stream = null;
        }
        if (aborted) {
            throw new IOException("reading was aborted (jdk.jfr did not finish in time)");
        }
        finish();
    }

    /**
     * Stops a {@link #readFile} running in another thread: the guard against jdk.jfr waiting
     * for data that will never come (it waits on a chunk whose header says "not finished").
     * Ingest hands jdk.jfr only finished chunks, so this is a last resort.
     */
    public void abort() {
        aborted = true;
        EventStream current = stream;
        if (current != null) {
            current.close();
        }
    }

    public boolean aborted() { return aborted; }

    /**
     * Subscribes one event type, counting what jdk.jfr delivers (see {@link #eventsSeen()}).
     * An event whose fields jdk.jfr cannot give as their declared types (damaged constant pools
     * or payload: a stack trace that is not one) is skipped and counted, not thrown: jdk.jfr
     * would print the exception and go on.
     */
    private void subscribe(EventStream stream, String type, java.util.function.Consumer<RecordedEvent> handler) {
        stream.onEvent(type, e -> {
            eventsSeen++;
            try {
                handler.accept(e);
            } catch (RuntimeException damaged) {
                unreadableEvents++;
                if (firstUnreadable == null) {
                    firstUnreadable = type + ": " + damaged;
                }
            }
        });
    }

    // ---------------------------------------------------------------- handlers

    private void onSafepointBegin(RecordedEvent e) {
        Fields f = safepointBeginFields.of(e);
        long start = f.start(e);
        long duration = f.duration(e);
        long id = f.longField(e, 0);
        int row = rows.add(KIND_SAFEPOINT, start, start + duration, osThreadId(e, f));
        rows.safepointId.set(row, id);
        rows.timeToSafepointTicks.set(row, duration);
        rows.totalThreads.set(row, f.longField(e, 1));
        rows.jniCriticalThreads.set(row, f.longField(e, 2));
        rows.name.set(row, strings.code("safepoint"));
        // Unmatched until its End is seen (the recording may stop mid-pause).
        rows.unmatched.set(row, 1);
        if (id != NULL) {
            safepoints.begin(id, row);
        }
        progress(start);
    }

    private void onSafepointEnd(RecordedEvent e) {
        Fields f = safepointEndFields.of(e);
        long id = f.longField(e, 0);
        if (id != NULL) {
            safepoints.end(id, f.start(e) + f.duration(e));
        }
    }

    /** A safepoint row (added at its Begin) completed by what the matcher found for it. */
    private final class SafepointRows implements SafepointMatcher.Listener<Integer, Operation> {
        @Override
        public void matched(long id, Integer row, long endTicks, Operation operation) {
            rows.endTicks.set(row, endTicks);
            rows.unmatched.set(row, 0);
            named(row, operation);
        }

        @Override
        public void unmatched(long id, Integer row, Operation operation) {
            named(row, operation); // (the row stays as its Begin made it: unmatched)
        }

        /** The row named by the operation run at its safepoint, which also gives its requester. */
        private void named(int row, Operation operation) {
            if (operation != null) {
                rows.operation.set(row, operation.name());
                rows.name.set(row, operation.name());
                rows.requesterOsThreadId.set(row, operation.requester());
            }
        }

        @Override
        public void operationWithoutBegin(long id, Operation operation) {
            safepointOperationsWithoutBegin.add(operation);
        }

        @Override
        public void endWithoutBegin(long id) {
            orphanSafepointEnds++;
        }
    }

    private void onVmOperation(RecordedEvent e) {
        Fields f = vmOperationFields.of(e);
        long id = f.longField(e, 0);
        int operation = strings.code(f.stringField(e, 1));
        boolean atSafepoint = f.has(2) && f.booleanField(e, 2);
        // Who asked for it: the thread that requested the operation (the event's own thread is
        // the VM thread that ran it).
        long requester = f.has(3) ? callers.of(f.value(e, 3)) : NULL;
        if (atSafepoint) {
            // Names its safepoint's row, or is a row of its own if that safepoint's Begin is not recorded.
            long start = f.start(e);
            Operation atSafepointOperation = new Operation(id, operation, requester, start, start + f.duration(e), osThreadId(e, f));
            if (id != NULL) {
                safepoints.operation(id, atSafepointOperation);
            } else {
                safepointOperationsWithoutBegin.add(atSafepointOperation);
            }
            return;
        }
        long start = f.start(e);
        int row = rows.add(KIND_VM_OPERATION, start, start + f.duration(e), osThreadId(e, f));
        rows.name.set(row, operation);
        rows.operation.set(row, operation);
        rows.safepointId.set(row, id);
        rows.atSafepoint.set(row, 0);
        rows.requesterOsThreadId.set(row, requester);
        progress(start);
    }

    private void onGcPhasePause(RecordedEvent e) {
        Fields f = gcPhasePauseFields.of(e);
        long start = f.start(e);
        int row = rows.add(KIND_GC_PAUSE, start, start + f.duration(e), osThreadId(e, f));
        rows.gcId.set(row, f.longField(e, 0));
        rows.name.set(row, strings.code(f.stringField(e, 1)));
        progress(start);
    }

    private void onGarbageCollection(RecordedEvent e) {
        Fields f = garbageCollectionFields.of(e);
        long start = f.start(e);
        long gcId = f.longField(e, 0);
        int name = strings.code(f.stringField(e, 1));
        int cause = strings.code(f.stringField(e, 2));
        int row = rows.add(KIND_GC, start, start + f.duration(e), osThreadId(e, f));
        rows.gcId.set(row, gcId);
        rows.name.set(row, name);
        rows.collector.set(row, name);
        rows.cause.set(row, cause);
        // Timespans may be ticks or nanoseconds depending on the JDK that wrote the file:
        // getDuration() applies the field's own unit.
        rows.sumOfPausesNanos.set(row, durationNanos(e, f, 3));
        rows.longestPauseNanos.set(row, durationNanos(e, f, 4));
        if (gcId != NULL) {
            collectionNameAndCauseByGcId.put(gcId, ((long) name << 32) | (cause & 0xFFFFFFFFL));
        }
        progress(start);
    }

    private void onCompilation(RecordedEvent e) {
        Fields f = compilationFields.of(e);
        long start = f.start(e);
        int row = rows.add(KIND_COMPILATION, start, start + f.duration(e), osThreadId(e, f));
        rows.name.set(row, strings.code(methodName(e, f, 0)));
        String compiler = f.stringField(e, 1);
        if (compiler != null && f.has(2)) {
            compiler = compiler + " level " + f.longField(e, 2);
        }
        rows.compiler.set(row, strings.code(compiler));
        progress(start);
    }

    private void onDeoptimization(RecordedEvent e) {
        Fields f = deoptimizationFields.of(e);
        long start = f.start(e);
        long duration = f.has(0) ? f.duration(e) : 0;
        int row = rows.add(KIND_DEOPTIMIZATION, start, start + duration, osThreadId(e, f));
        rows.name.set(row, strings.code(methodName(e, f, 1)));
        rows.cause.set(row, strings.code(f.stringField(e, 2)));
        rows.operation.set(row, strings.code(f.stringField(e, 3)));
        progress(start);
    }

    /** A System.gc() call: who called it, from where (tandem's settings record its stack trace). */
    private void onSystemGc(RecordedEvent e) {
        Fields f = systemGcFields.of(e);
        long start = f.start(e);
        systemGcStart.add(start);
        systemGcEnd.add(start + f.duration(e));
        systemGcThread.add(osThreadId(e, f));
        systemGcFrames.add(strings.code(f.has(0) ? systemGcCallFrames(e.getStackTrace()) : null));
    }

    private void onJvmInformation(RecordedEvent e) {
        jvmName = firstNonNull(jvmName, stringField(e, "jvmName"));
        jvmVersion = firstNonNull(jvmVersion, stringField(e, "jvmVersion"));
        if (jvmPid == NULL) {
            jvmPid = longField(e, "pid");
        }
        if (jvmStartMillis == NULL && e.hasField("jvmStartTime")) {
            jvmStartMillis = e.getInstant("jvmStartTime").toEpochMilli();
        }
    }

    private void onGcConfiguration(RecordedEvent e) {
        youngCollector = firstNonNull(youngCollector, stringField(e, "youngCollector"));
        oldCollector = firstNonNull(oldCollector, stringField(e, "oldCollector"));
    }

    private void onTimeStampCounter(RecordedEvent e) {
        if (fastTimeEnabled < 0 && e.hasField("fastTimeEnabled")) {
            fastTimeEnabled = e.getBoolean("fastTimeEnabled") ? 1 : 0;
        }
    }

    private void onSystemProperty(RecordedEvent e) {
        if (jvmVendor == null && "java.vm.vendor".equals(stringField(e, "key"))) {
            jvmVendor = stringField(e, "value");
        }
    }

    private void onClockSync(RecordedEvent e) {
        if (jvmPid == NULL && e.hasField("pid")) {
            jvmPid = longValue(e, "pid"); // recordings without jdk.JVMInformation (docs/session.md)
        }
        if (e.hasField(CLOCK_SYNC_FIELD)) {
            syncTicks.add(longValue(e, "startTime"));
            syncMonotonicNanos.add(longValue(e, CLOCK_SYNC_FIELD));
            syncSpanTicks.add(longValue(e, "duration"));
        }
    }

    // ---------------------------------------------------------------- matching

    /** Resolves what needed events seen in any order (GC names and causes) and the safepoints left open. */
    private void finish() {
        safepoints.finish();
        for (int row = 0; row < rows.size; row++) {
            int kind = rows.kind.get(row);
            if (kind == KIND_GC_PAUSE) {
                int collection = collectionNameAndCauseByGcId.find(rows.gcId.get(row));
                if (collection >= 0) {
                    long nameAndCause = collectionNameAndCauseByGcId.value(collection);
                    rows.collector.set(row, (int) (nameAndCause >> 32));
                    rows.cause.set(row, (int) nameAndCause);
                }
            }
        }
        // A VM operation at a safepoint whose Begin was not recorded (e.g. default.jfc keeps
        // Begins only above 10 ms) is still a real stop-the-world interval: keep it.
        for (Operation op : safepointOperationsWithoutBegin) {
            int row = rows.add(KIND_VM_OPERATION, op.start(), op.end(), op.thread());
            rows.safepointId.set(row, op.id());
            rows.name.set(row, op.name());
            rows.operation.set(row, op.name());
            rows.atSafepoint.set(row, 1);
            rows.requesterOsThreadId.set(row, op.requester());
        }
        safepointOperationsWithoutBegin.clear();
        attachSystemGcCalls();
        rows.trim();
    }

    /**
     * Each stop-the-world row (safepoint, GC pause, collection, VM operation) lying inside a
     * System.gc() call (the call returns when its collection is done) gets the call's thread and
     * frames. Calls of one run are sorted by start; a row takes the last call starting at or
     * before it, if that call ends at or after it. A row that is known to be someone else's is
     * left alone although it lies inside: a VM operation another thread asked for (JFR's
     * periodic thread takes its thread-dump safepoints while the caller waits for its turn), a
     * collection with another cause.
     */
    private void attachSystemGcCalls() {
        int calls = systemGcStart.size;
        if (calls == 0) {
            return;
        }
        Integer[] order = new Integer[calls];
        for (int i = 0; i < calls; i++) {
            order[i] = i;
        }
        java.util.Arrays.sort(order, (a, b) -> Long.compare(systemGcStart.get(a), systemGcStart.get(b)));
        int systemGcCause = strings.code(SYSTEM_GC_CAUSE);
        long[] starts = new long[calls];
        for (int i = 0; i < calls; i++) {
            starts[i] = systemGcStart.get(order[i]);
        }
        for (int row = 0; row < rows.size; row++) {
            int kind = rows.kind.get(row);
            if (kind == KIND_COMPILATION || kind == KIND_DEOPTIMIZATION) {
                continue;
            }
            int at = java.util.Arrays.binarySearch(starts, rows.startTicks.get(row));
            // the last call starting at or before the row (binarySearch finds any of equal starts)
            if (at >= 0) {
                while (at + 1 < calls && starts[at + 1] == starts[at]) {
                    at++;
                }
            } else {
                at = -at - 2;
            }
            if (at < 0 || systemGcEnd.get(order[at]) < rows.endTicks.get(row)) {
                continue;
            }
            long requester = rows.requesterOsThreadId.get(row);
            int cause = rows.cause.get(row);
            if ((requester != NULL && requester != systemGcThread.get(order[at]))
                    || (cause >= 0 && cause != systemGcCause)) {
                continue;
            }
            rows.systemGcOsThreadId.set(row, systemGcThread.get(order[at]));
            rows.systemGcFrames.set(row, systemGcFrames.get(order[at]));
        }
    }

    // ---------------------------------------------------------------- field helpers

    private void progress(long ticks) {
        if (ticks > progressTicks) {
            progressTicks = ticks;
        }
    }

    /** The OS thread id of the event's thread, as {@code e.getThread().getOSThreadId()}. */
    private long osThreadId(RecordedEvent e, Fields f) {
        return f.hasThread ? eventThreads.of(f.thread(e)) : NULL;
    }

    /**
     * OS thread ids of RecordedThread values (NULL for anything else), the last few remembered:
     * getOSThreadId scans the thread's fields on every call, while the thread objects come from
     * the chunk's constant pool, one object per thread, and pause events come from a few threads
     * (the VM thread, the GC threads, the callers that asked).
     */
    private static final class ThreadIds {
        private static final int REMEMBERED = 16;
        private final RecordedThread[] threads = new RecordedThread[REMEMBERED];
        private final long[] ids = new long[REMEMBERED];
        private int next;

        long of(Object value) {
            if (!(value instanceof RecordedThread)) {
                return NULL;
            }
            for (int i = 0; i < REMEMBERED; i++) {
                if (threads[i] == value) {
                    return ids[i];
                }
            }
            RecordedThread thread = (RecordedThread) value;
            int slot = next;
            next = (next + 1) % REMEMBERED;
            threads[slot] = thread;
            ids[slot] = thread.getOSThreadId();
            return ids[slot];
        }
    }

    private static final String EVENT_THREAD = "eventThread";
    private static final long NANOS_PER_SECOND = 1_000_000_000L;
    /** Longs up to 2^53 survive jdk.jfr's (long) (ticks / 1.0) unchanged. */
    private static final long EXACT_IN_DOUBLE = 1L << 53;

    /**
     * {@code e.getDuration(name).toNanos()} for field {@code i} of {@code f} (NULL if absent).
     * jdk.jfr builds a new @Timespan annotation proxy on every getDuration call; the unit is
     * looked up once per event type here instead, and nanosecond timespans, or tick timespans
     * of a run with 1e9 ticks per second (jdk.jfr then divides by exactly 1.0), are read with
     * getLong. Anything else (other units, other tick rates, 0/MIN/MAX specials, values a
     * double cannot hold) takes jdk.jfr's own path, so the result is always its result.
     */
    private long durationNanos(RecordedEvent e, Fields f, int i) {
        if (!f.has(i)) {
            return NULL;
        }
        String unit = f.timespanUnit(i);
        boolean plain = Timespan.NANOSECONDS.equals(unit)
            || (Timespan.TICKS.equals(unit) && ticksPerSecond == NANOS_PER_SECOND);
        if (plain) {
            long value = f.longField(e, i);
            if (value > -EXACT_IN_DOUBLE && value < EXACT_IN_DOUBLE) {
                return value;
            }
        }
        return e.getDuration(f.names[i]).toNanos();
    }

    private static String methodName(RecordedEvent e, Fields f, int i) {
        if (!f.has(i)) {
            return null;
        }
        RecordedMethod method = (RecordedMethod) f.value(e, i);
        if (method == null) {
            return null;
        }
        RecordedClass type = method.getType();
        return (type == null ? "?" : type.getName().replace('/', '.')) + "." + method.getName();
    }

    private static String firstNonNull(String current, String candidate) {
        return current != null ? current : candidate;
    }

    // ---------------------------------------------------------------- results, read by Python

    public int size() { return rows.size; }
    public int[] kind() { return rows.kind.array; }
    public long[] startTicks() { return rows.startTicks.array; }
    public long[] endTicks() { return rows.endTicks.array; }
    public long[] osThreadId() { return rows.osThreadId.array; }
    public long[] requesterOsThreadId() { return rows.requesterOsThreadId.array; }
    public long[] systemGcOsThreadId() { return rows.systemGcOsThreadId.array; }
    /** Codes into {@link #dictionary()}: the top frames of the System.gc() call a row lies in. */
    public int[] systemGcFrames() { return rows.systemGcFrames.array; }
    public long[] safepointId() { return rows.safepointId.array; }
    public long[] gcId() { return rows.gcId.array; }
    public long[] timeToSafepointTicks() { return rows.timeToSafepointTicks.array; }
    public long[] totalThreads() { return rows.totalThreads.array; }
    public long[] jniCriticalThreads() { return rows.jniCriticalThreads.array; }
    public long[] sumOfPausesNanos() { return rows.sumOfPausesNanos.array; }
    public long[] longestPauseNanos() { return rows.longestPauseNanos.array; }
    public int[] name() { return rows.name.array; }
    public int[] cause() { return rows.cause.array; }
    public int[] operation() { return rows.operation.array; }
    public int[] collector() { return rows.collector.array; }
    public int[] compiler() { return rows.compiler.array; }
    public int[] unmatched() { return rows.unmatched.array; }
    public int[] atSafepoint() { return rows.atSafepoint.array; }
    /** The strings that the int columns above index (-1 is null). */
    public String[] dictionary() { return strings.toArray(); }

    public long[] syncTicks() { return syncTicks.toArray(); }
    public long[] syncMonotonicNanos() { return syncMonotonicNanos.toArray(); }
    public long[] syncSpanTicks() { return syncSpanTicks.toArray(); }

    public String jvmName() { return jvmName; }
    public String jvmVersion() { return jvmVersion; }
    public String jvmVendor() { return jvmVendor; }
    public String osVersion() { return osVersion; }
    public String youngCollector() { return youngCollector; }
    public String oldCollector() { return oldCollector; }
    public long jvmPid() { return jvmPid; }
    public long jvmStartMillis() { return jvmStartMillis; }
    /** 1 if JFR used the CPU's TSC ("fast time"), 0 if the OS clock, -1 if not recorded. */
    public int fastTimeEnabled() { return fastTimeEnabled; }
    /** SafepointEnd events whose Begin is not in the file (the recording started mid-pause). */
    public int orphanSafepointEnds() { return orphanSafepointEnds; }
    /**
     * Events of the subscribed types delivered by jdk.jfr. Zero for a file HotSpot wrote means
     * damage: jdk.jfr's EventStream swallows parse errors (IOException) and simply stops.
     */
    public long eventsSeen() { return eventsSeen; }
    /** Delivered events whose fields could not be read as their types (skipped): damage inside events. */
    public long unreadableEvents() { return unreadableEvents; }
    /** The first of those: its type and the exception. */
    public String firstUnreadable() { return firstUnreadable; }

    // ---------------------------------------------------------------- reading an event's fields

    /**
     * Which of some field names an event type has, their @Timespan units, and where each sits
     * among the event's values, found once per {@link EventType} object (jdk.jfr makes one per
     * type per metadata, so a handler sees a new one only when a chunk brings new metadata).
     *
     * <p>jdk.jfr offers fields by name only: every getValue(name) scans the type's fields
     * comparing names, and getLong(name) also looks the field's @Unsigned annotation up. Where
     * the JVM opens jdk.jfr.consumer to this class (tandem's own JVM does, engine/jvm.py), the
     * values are read from the event by position instead ({@link EventValues}); the positions
     * are checked against getValue on the first event of each type, and a type that fails the
     * check, or a JVM that does not open the package, reads by name. Either way a value is
     * exactly what jdk.jfr's getters return.
     */
    private final class Fields {
        final String[] names;
        private final boolean[] present;
        private final String[] units;
        private final boolean[] unsigned;
        /** Index of each name in the type's field list, -1 if absent. */
        private final int[] index;
        private EventType type;
        boolean hasThread;
        private int threadIndex;
        private boolean hasDuration;
        /** Read values by position (see the class comment) for the current type. */
        private boolean direct;
        /** How many leading fields (startTime, and duration if any) are not in the values array. */
        private int implicit;

        Fields(String... names) {
            this.names = names;
            this.present = new boolean[names.length];
            this.units = new String[names.length];
            this.unsigned = new boolean[names.length];
            this.index = new int[names.length];
        }

        /** This, describing {@code e}'s event type. */
        Fields of(RecordedEvent e) {
            EventType t = e.getEventType();
            if (t != type) {
                List<ValueDescriptor> fields = e.getFields();
                for (int i = 0; i < names.length; i++) {
                    index[i] = indexOf(fields, names[i]);
                    present[i] = index[i] >= 0;
                    ValueDescriptor field = present[i] ? fields.get(index[i]) : null;
                    Timespan timespan = field == null ? null : field.getAnnotation(Timespan.class);
                    units[i] = timespan == null ? null : timespan.value();
                    unsigned[i] = field != null && field.getAnnotation(Unsigned.class) != null;
                }
                threadIndex = indexOf(fields, EVENT_THREAD);
                hasThread = threadIndex >= 0;
                hasDuration = indexOf(fields, DURATION) == 1;
                type = t;
                direct = byPosition && positionsHold(e, fields);
                if (byPosition && !direct) {
                    typesReadByName++;
                }
            }
            return this;
        }

        private static int indexOf(List<ValueDescriptor> fields, String name) {
            for (int i = 0; i < fields.size(); i++) {
                if (fields.get(i).getName().equals(name)) {
                    return i;
                }
            }
            return -1;
        }

        /** Whether reading by position gives what getValue gives, on this event. */
        private boolean positionsHold(RecordedEvent e, List<ValueDescriptor> fields) {
            Object[] values = EventValues.of(e);
            implicit = fields.size() - values.length;
            if (implicit != (hasDuration ? 2 : 1) || indexOf(fields, START_TIME) != 0
                    || EventValues.startTicks(e) != e.getLong(START_TIME)
                    || (hasDuration && EventValues.durationTicks(e) != e.getLong(DURATION))) {
                return false;
            }
            for (int i = 0; i < names.length; i++) {
                if (present[i] && !samePosition(e, values, index[i], names[i])) {
                    return false;
                }
            }
            return !hasThread || samePosition(e, values, threadIndex, EVENT_THREAD);
        }

        private boolean samePosition(RecordedEvent e, Object[] values, int fieldIndex, String name) {
            if (fieldIndex < implicit) {
                return false;
            }
            Object value = values[fieldIndex - implicit];
            return !(value instanceof Object[]) && Objects.equals(value, e.getValue(name));
        }

        /** getValue(name) of field {@code fieldIndex}; a struct value (an Object[]) goes by name. */
        private Object valueAt(RecordedEvent e, int fieldIndex, String name) {
            if (direct) {
                Object value = EventValues.of(e)[fieldIndex - implicit];
                if (!(value instanceof Object[])) {
                    return value;
                }
            }
            return e.getValue(name);
        }

        boolean has(int i) { return present[i]; }

        String timespanUnit(int i) { return units[i]; }

        /** getLong("startTime"): raw ticks. */
        long start(RecordedEvent e) {
            return direct ? EventValues.startTicks(e) : longValue(e, START_TIME);
        }

        /** getLong("duration"): ticks. */
        long duration(RecordedEvent e) {
            return direct && hasDuration ? EventValues.durationTicks(e) : longValue(e, DURATION);
        }

        /** getValue of field {@code i} (the caller checked has(i)). */
        Object value(RecordedEvent e, int i) {
            return valueAt(e, index[i], names[i]);
        }

        /** getValue("eventThread") (the caller checked hasThread). */
        Object thread(RecordedEvent e) {
            return valueAt(e, threadIndex, EVENT_THREAD);
        }

        long longField(RecordedEvent e, int i) {
            if (!present[i]) {
                return NULL;
            }
            // getLong's own widening, with the field's @Unsigned looked up once per type.
            Object value = value(e, i);
            if (value instanceof Long) {
                return (Long) value;
            }
            if (value instanceof Integer) {
                int v = (Integer) value;
                return unsigned[i] ? Integer.toUnsignedLong(v) : v;
            }
            return e.getLong(names[i]);
        }

        boolean booleanField(RecordedEvent e, int i) {
            Object value = value(e, i);
            return value instanceof Boolean ? (Boolean) value : e.getBoolean(names[i]);
        }

        String stringField(RecordedEvent e, int i) {
            if (!present[i]) {
                return null;
            }
            Object value = value(e, i);
            return value == null ? null : value.toString();
        }
    }

    /**
     * {@code e.getLong(name)} without jdk.jfr's per-call @Unsigned lookup: a value that is a
     * Long already is what getLong returns; anything else takes getLong itself.
     */
    static long longValue(RecordedEvent e, String name) {
        Object value = e.getValue(name);
        return value instanceof Long ? (Long) value : e.getLong(name);
    }

    private static final String START_TIME = "startTime";
    private static final String DURATION = "duration";

    /**
     * An event's values as jdk.jfr.consumer keeps them (JDK 17 to 25): the start and end
     * ticks in RecordedEvent's own fields, every other field in RecordedObject's values array
     * in the type's field order. Unavailable (null handles) when the package is not open to
     * this class; {@link Fields} checks the layout before trusting it.
     */
    private static final class EventValues {
        private static final VarHandle OBJECTS = handle(RecordedObject.class, "objects", Object[].class);
        private static final VarHandle START_TICKS = handle(RecordedEvent.class, "startTimeTicks", long.class);
        private static final VarHandle END_TICKS = handle(RecordedEvent.class, "endTimeTicks", long.class);
        static final boolean AVAILABLE = OBJECTS != null && START_TICKS != null && END_TICKS != null;

        private static VarHandle handle(Class<?> owner, String name, Class<?> type) {
            try {
                return MethodHandles.privateLookupIn(owner, MethodHandles.lookup()).findVarHandle(owner, name, type);
            } catch (ReflectiveOperationException | RuntimeException notOpen) {
                return null;
            }
        }

        static Object[] of(RecordedEvent e) {
            return (Object[]) OBJECTS.get((RecordedObject) e);
        }

        static long startTicks(RecordedEvent e) {
            return (long) START_TICKS.get(e);
        }

        static long durationTicks(RecordedEvent e) {
            return (long) END_TICKS.get(e) - (long) START_TICKS.get(e);
        }
    }

    // ---------------------------------------------------------------- a long-keyed map

    /** long keys to long values, open addressing; last put wins. */
    private static final class LongMap {
        private long[] keys = new long[1 << 14];
        private long[] values = new long[1 << 14];
        private byte[] state = new byte[1 << 14];  // 0 empty, 1 present
        private int size;

        // Keys are JFR's GC ids: counters, so neighbouring keys go to
        // neighbouring slots (no collisions, cache-friendly); high bits folded in.
        private static int hash(long key, int mask) {
            int h = (int) (key ^ (key >>> 32));
            return (h ^ (h >>> 16)) & mask;
        }

        void put(long key, long value) {
            if (2 * (size + 1) > keys.length) {
                grow();
            }
            int mask = keys.length - 1;
            int i = hash(key, mask);
            while (state[i] != 0 && keys[i] != key) {
                i = (i + 1) & mask;
            }
            if (state[i] == 0) {
                size++;
                keys[i] = key;
            }
            state[i] = 1;
            values[i] = value;
        }

        /** The slot holding {@code key}, or -1. */
        int find(long key) {
            int mask = keys.length - 1;
            int i = hash(key, mask);
            while (state[i] != 0) {
                if (keys[i] == key) {
                    return i;
                }
                i = (i + 1) & mask;
            }
            return -1;
        }

        long value(int slot) { return values[slot]; }

        private void grow() {
            long[] oldKeys = keys;
            long[] oldValues = values;
            byte[] oldState = state;
            keys = new long[oldKeys.length * 2];
            values = new long[oldKeys.length * 2];
            state = new byte[oldKeys.length * 2];
            int mask = keys.length - 1;
            for (int j = 0; j < oldKeys.length; j++) {
                if (oldState[j] != 0) {
                    int i = hash(oldKeys[j], mask);
                    while (state[i] != 0) {
                        i = (i + 1) & mask;
                    }
                    keys[i] = oldKeys[j];
                    values[i] = oldValues[j];
                    state[i] = oldState[j];
                }
            }
        }
    }

    // ---------------------------------------------------------------- growable columns

    /** All row columns, grown together; ids and ticks default to NULL, codes to -1. */
    private static final class Rows {
        int size;
        final IntList kind = new IntList(-1);
        final LongList startTicks = new LongList();
        final LongList endTicks = new LongList();
        final LongList osThreadId = new LongList();
        final LongList requesterOsThreadId = new LongList();
        final LongList systemGcOsThreadId = new LongList();
        final LongList safepointId = new LongList();
        final LongList gcId = new LongList();
        final LongList timeToSafepointTicks = new LongList();
        final LongList totalThreads = new LongList();
        final LongList jniCriticalThreads = new LongList();
        final LongList sumOfPausesNanos = new LongList();
        final LongList longestPauseNanos = new LongList();
        final IntList name = new IntList(-1);
        final IntList cause = new IntList(-1);
        final IntList operation = new IntList(-1);
        final IntList collector = new IntList(-1);
        final IntList compiler = new IntList(-1);
        final IntList unmatched = new IntList(0);
        final IntList atSafepoint = new IntList(-1);
        final IntList systemGcFrames = new IntList(-1);
        private final LongList[] longs = {startTicks, endTicks, osThreadId, requesterOsThreadId, systemGcOsThreadId, safepointId, gcId,
            timeToSafepointTicks, totalThreads, jniCriticalThreads, sumOfPausesNanos, longestPauseNanos};
        private final IntList[] ints = {kind, name, cause, operation, collector, compiler, unmatched, atSafepoint, systemGcFrames};

        /** Rows the columns have room for; the room beyond size holds each column's fill. */
        private int capacity;

        Rows() {
            grow(1 << 14);
        }

        int add(int kindCode, long start, long end, long thread) {
            if (size == capacity) {
                grow(2 * capacity);
            }
            int row = size++;
            kind.array[row] = kindCode;
            startTicks.array[row] = start;
            endTicks.array[row] = end;
            osThreadId.array[row] = thread;
            return row;
        }

        private void grow(int rows) {
            for (LongList column : longs) {
                column.array = java.util.Arrays.copyOf(column.array, rows);
                java.util.Arrays.fill(column.array, capacity, rows, NULL);
            }
            for (IntList column : ints) {
                column.array = java.util.Arrays.copyOf(column.array, rows);
                java.util.Arrays.fill(column.array, capacity, rows, column.fill);
            }
            capacity = rows;
        }

        void trim() {
            for (LongList column : longs) {
                column.array = java.util.Arrays.copyOf(column.array, size);
            }
            for (IntList column : ints) {
                column.array = java.util.Arrays.copyOf(column.array, size);
            }
            capacity = size;
        }
    }
}
