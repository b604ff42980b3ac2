package tandem.agent;

import java.lang.instrument.Instrumentation;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.function.Consumer;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordingStream;
import tandem.jfr.SafepointMatcher;

import static tandem.jfr.EventFields.longField;
import static tandem.jfr.EventFields.osThreadId;
import static tandem.jfr.EventFields.stringField;
import static tandem.jfr.EventFields.systemGcCallFrames;

/**
 * The agent's live output (option {@code live=true}): a {@link RecordingStream} with the
 * disk recording's settings ({@link PauseEvents}) whose callbacks turn the pause events into
 * records of {@code SESSION/jvm-<pid>/pauses.ring} ({@link PauseRing}, docs/ring.md).
 *
 * <p>Every callback runs on the stream's one thread, which is therefore the ring's one
 * writer. Kinds, as in docs/pauses.md: safepoint (SafepointBegin matched with SafepointEnd
 * by safepointId; named by the ExecuteVMOperation at that safepoint), gc_pause
 * (GCPhasePause), gc (GarbageCollection), vm_operation (ExecuteVMOperation not at a
 * safepoint). Who asked, as the disk recording's reader gives it: a safepoint's or VM
 * operation's requester is the operation's caller; a collection carries its cause; each
 * System.gc() call (jdk.SystemGC: its thread and frames) is a record of its own, which the
 * reader matches to the pauses inside it (the call commits after them).
 *
 * <p>Clock: events carry raw JFR ticks ({@code getLong("startTime")}). The stream also
 * delivers {@code tandem.ClockSync} (ticks paired with System.nanoTime, i.e.
 * CLOCK_MONOTONIC) and {@code jdk.CPUTimeStampCounter} (ticks per second):
 * {@code mono = sync.mono + (ticks - sync.ticks) * 1e9 / ticksPerSecond}, with the tightest of
 * the last few sync points. Pauses seen before the first sync point wait for it.
 *
 * <p>Latency: a RecordingStream sees events when JFR flushes, once a second (JFR clamps any
 * flush interval, {@code jcmd JFR.start flush-interval=} included, to at least 1 s), so a
 * pause would reach the ring 0 to 1 s after its end. A thread of ours therefore runs JFR's own
 * flush every {@code flush_ms} (default 200; {@link #jfrFlush}: jdk.jfr's internals, opened to
 * the agent with {@link Instrumentation#redefineModule}). Where that is not possible (no
 * Instrumentation, a JDK that moved them) JFR's 1 s flush stays, quietly; jvm.json says which
 * ({@code live.flush_interval_ms}, {@code live.flush_interval_problem}).
 */
final class LivePauses {
    static final String RING_FILE = "pauses.ring";
    static final String BACKEND = "jfr-stream";
    /** 16384 records (1 MiB): many seconds of pauses even on ZGC, several JFR flushes. */
    static final int CAPACITY = 1 << 14;
    /** JFR flush interval asked for by default (option flush_ms): ~0.1 s median, 0.2 s worst added latency. */
    static final long DEFAULT_FLUSH_MILLIS = 200;
    private static final int MAX_PENDING = 1 << 16;
    private static final int MAX_OPEN_SAFEPOINTS = 4096;
    private static final int SYNC_WINDOW = 8;
    private static final long CLOSE_WAIT_MILLIS = 2500;
    private static final long NULL = tandem.jfr.EventFields.NULL;

    private final PauseRing ring;
    private final RecordingStream stream;
    /** The flush interval set on the stream's recording, ms; -1 = JFR's default kept. */
    private long flushMillis = -1;
    private String flushProblem;
    private volatile boolean flusherStop;
    private volatile Runnable flushAction;
    private Thread flusher;

    // ---- clock (stream thread; read at close under the lock) ----
    private double nanosPerTick = Double.NaN;
    private String ticksSource = "unknown";
    private final ArrayDeque<long[]> syncs = new ArrayDeque<>(); // {ticks, mono, widthTicks}
    private long[] chosenSync;
    private long syncSamples;
    private long worstChosenWidthNs;
    private long lastSyncMono = NULL;

    // ---- matching (tandem.jfr.SafepointMatcher, as the offline reader matches) ----
    private final SafepointMatcher<long[], Operation> safepoints =
            SafepointMatcher.streaming(new SafepointRecords(), MAX_OPEN_SAFEPOINTS); // Begin: {start, beginEnd, tid}
    private final ArrayDeque<Object[]> pending = new ArrayDeque<>(); // before the clock is known
    private long orphanEnds;
    private long unmatched;
    private long pendingDropped;
    private boolean streamEnded;
    /** The stream's thread has left stream.start(): no callback can run any more. */
    private boolean dispatchEnded;
    private String streamError;

    /** The VM operation run at a safepoint: it names the safepoint's record and gives its requester. */
    private record Operation(String name, long requester) {}

    private LivePauses(PauseRing ring, RecordingStream stream) {
        this.ring = ring;
        this.stream = stream;
    }

    /** Creates the ring in DIRECTORY and starts the stream (its own daemon thread). */
    static LivePauses start(Path directory, Map<String, String> settings, Instrumentation inst, long flushMillis)
            throws Exception {
        PauseRing ring = PauseRing.create(directory.resolve(RING_FILE), capacity(), System.getProperty("java.version"), BACKEND);
        // The system property tandem.live.flush_ms overrides the option (benchmarks: bench/bench_live.py).
        flushMillis = Long.getLong("tandem.live.flush_ms", flushMillis);
        RecordingStream stream = null;
        try {
            stream = new RecordingStream();
            LivePauses live = new LivePauses(ring, stream);
            stream.setSettings(settings);
            stream.setOrdered(true);

            stream.onEvent("jdk.SafepointBegin", live.guard(live::onSafepointBegin));
            stream.onEvent("jdk.SafepointEnd", live.guard(live::onSafepointEnd));
            stream.onEvent("jdk.ExecuteVMOperation", live.guard(live::onVmOperation));
            stream.onEvent("jdk.GCPhasePause", live.guard(live::onGcPhasePause));
            stream.onEvent("jdk.GarbageCollection", live.guard(live::onGarbageCollection));
            stream.onEvent("jdk.SystemGC", live.guard(live::onSystemGc));
            stream.onEvent("jdk.CPUTimeStampCounter", live.guard(live::onTimeStampCounter));
            stream.onEvent(ClockSyncEvent.NAME, live.guard(live::onClockSync));
            stream.onError(live::onStreamError);
            stream.onClose(live::onStreamClosed);
            // Not startAsync(): its thread is not a daemon and would keep the JVM from exiting.
            Thread thread = new Thread(() -> live.run(), "tandem-live");
            thread.setDaemon(true);
            thread.start();
            if (flushMillis > 0) {
                live.startFlusher(inst, flushMillis);
            }
            return live;
        } catch (Throwable t) {
            if (stream != null) {
                stream.close();
            }
            ring.close();
            throw t;
        }
    }

    /**
     * JFR's own flush, as its periodic task runs it (JDK 17: RequestEngine ->
     * MetadataRepository.flush + Utils.notifyFlush; JDK 21+: FlushTask -> PlatformRecorder.flush +
     * util.Utils.notifyFlush), reached through jdk.jfr's internals opened to the agent.
     * JFR clamps every flush interval to at least 1 s (RequestEngine/FlushTask.setInterval),
     * so a shorter one can only be had by calling the flush itself.
     */
    static Runnable jfrFlush(Instrumentation inst) throws Exception {
        Module jfr = RecordingStream.class.getModule();
        Module agent = LivePauses.class.getModule();
        ClassLoader loader = jfr.getClassLoader();
        if (inst != null && jfr.isNamed()) {
            Map<String, Set<Module>> exports = new java.util.HashMap<>();
            for (String pkg : jfr.getPackages()) {
                if (pkg.equals("jdk.jfr.internal") || pkg.equals("jdk.jfr.internal.util")) {
                    exports.put(pkg, Set.of(agent));
                }
            }
            inst.redefineModule(jfr, Set.of(), exports, Map.of(), Set.of(), Map.of());
        }
        java.lang.invoke.MethodHandle flush;
        java.lang.invoke.MethodHandles.Lookup lookup = java.lang.invoke.MethodHandles.lookup(); // jdk.jfr.internal is exported to us
        try { // JDK 21+
            Class<?> access = Class.forName("jdk.jfr.internal.PrivateAccess", true, loader);
            Object recorder = access.getMethod("getPlatformRecorder").invoke(access.getMethod("getInstance").invoke(null));
            flush = lookup.unreflect(recorder.getClass().getMethod("flush")).bindTo(recorder);
        } catch (NoSuchMethodException e) { // JDK 17
            Class<?> metadata = Class.forName("jdk.jfr.internal.MetadataRepository", true, loader);
            Object repository = metadata.getMethod("getInstance").invoke(null);
            flush = lookup.unreflect(metadata.getMethod("flush")).bindTo(repository);
        }
        Class<?> utils;
        try {
            utils = Class.forName("jdk.jfr.internal.util.Utils", true, loader);
            utils.getMethod("notifyFlush");
        } catch (ClassNotFoundException | NoSuchMethodException e) {
            utils = Class.forName("jdk.jfr.internal.Utils", true, loader);
        }
        java.lang.invoke.MethodHandle notify = lookup.unreflect(utils.getMethod("notifyFlush"));
        java.lang.invoke.MethodHandle flushHandle = flush;
        return () -> {
            try {
                flushHandle.invoke();
                notify.invoke();
            } catch (Throwable t) {
                throw new IllegalStateException(Agent.describe(t), t);
            }
        };
    }

    /** Flushes JFR every flushMillis while the stream runs (its own daemon thread); quiet fallback. */
    private void startFlusher(Instrumentation inst, long millis) {
        Runnable flush;
        try {
            flush = jfrFlush(inst);
        } catch (Throwable t) {
            flushProblem = Agent.describe(t); // JFR's own flush (1 s) stays: only slower
            return;
        }
        flushMillis = millis;
        flushAction = flush;
        Thread thread = new Thread(() -> {
            try {
                while (!flusherStop) {
                    Thread.sleep(millis);
                    synchronized (this) {
                        if (flusherStop || streamEnded) {
                            return;
                        }
                    }
                    flush.run();
                }
            } catch (InterruptedException e) {
                // closing
            } catch (Throwable t) {
                synchronized (this) {
                    flushProblem = "stopped: " + Agent.describe(t);
                    flushMillis = -1;
                    flushAction = null;
                }
            }
        }, "tandem-live-flush");
        thread.setDaemon(true);
        flusher = thread;
        thread.start();
    }

    /** CAPACITY, or the system property tandem.live.capacity (tests: a small ring that wraps). */
    static int capacity() {
        return Integer.getInteger("tandem.live.capacity", CAPACITY);
    }

    private void run() {
        try {
            stream.start(); // returns once the stream is closed
        } catch (Throwable t) {
            onStreamError(t);
        } finally {
            onDispatchEnded();
        }
    }

    /** The flush period of our flusher (ms), or -1 when JFR's own 1 s stayed; and why, if it failed. */
    synchronized long flushMillis() {
        return flushMillis;
    }

    synchronized String flushProblem() {
        return flushProblem;
    }

    Path ringPath() {
        return ring.path();
    }

    // ---------------------------------------------------------------- stream callbacks

    /** A callback that can never throw into jdk.jfr (one warning, then the event is skipped). */
    private Consumer<RecordedEvent> guard(Consumer<RecordedEvent> handler) {
        return e -> {
            try {
                synchronized (this) {
                    handler.accept(e);
                }
            } catch (Throwable t) {
                onStreamError(t);
            }
        };
    }

    private synchronized void onStreamError(Throwable t) {
        if (streamError == null) {
            streamError = Agent.describe(t);
            Agent.warn("live output: " + streamError);
        }
    }

    private synchronized void onStreamClosed() {
        streamEnded = true;
        notifyAll();
    }

    private synchronized void onDispatchEnded() {
        streamEnded = true;
        dispatchEnded = true;
        notifyAll();
    }

    private void onSafepointBegin(RecordedEvent e) {
        long start = e.getLong("startTime");
        safepoints.begin(longField(e, "safepointId"), new long[] {start, start + e.getLong("duration"), osThreadId(e)});
    }

    private void onSafepointEnd(RecordedEvent e) {
        safepoints.end(longField(e, "safepointId"), e.getLong("startTime") + e.getLong("duration"));
    }

    /** Safepoint records from what the matcher found (every callback runs under this object's monitor). */
    private final class SafepointRecords implements SafepointMatcher.Listener<long[], Operation> {
        @Override
        public void matched(long id, long[] begin, long endTicks, Operation operation) {
            emitSafepoint(id, begin[0], endTicks, begin[2], operation, 0);
        }

        @Override
        public void unmatched(long id, long[] begin, Operation operation) {
            unmatched++;
            emitSafepoint(id, begin[0], begin[1], begin[2], operation, PauseRing.AUX_UNMATCHED);
        }

        /**
         * Left out: the stream started inside this safepoint, whose Begin the disk recording (which
         * started first) holds, so offline has the safepoint and live would have a second row.
         */
        @Override
        public void operationWithoutBegin(long id, Operation operation) {}

        @Override
        public void endWithoutBegin(long id) {
            orphanEnds++; // the stream started mid-safepoint
        }
    }

    private void onVmOperation(RecordedEvent e) {
        long id = longField(e, "safepointId");
        String operation = stringField(e, "operation");
        long requester = callerOsThreadId(e);
        if (e.hasField("safepoint") && e.getBoolean("safepoint")) {
            safepoints.operation(id, new Operation(operation, requester)); // names the safepoint's record
            return;
        }
        long start = e.getLong("startTime");
        emit(PauseRing.KIND_VM_OPERATION, start, start + e.getLong("duration"), osThreadId(e), id, operation, 0,
                requester, null);
    }

    private void onGcPhasePause(RecordedEvent e) {
        long start = e.getLong("startTime");
        emit(PauseRing.KIND_GC_PAUSE, start, start + e.getLong("duration"), osThreadId(e), longField(e, "gcId"),
                stringField(e, "name"), 0, NULL, null);
    }

    private void onGarbageCollection(RecordedEvent e) {
        long start = e.getLong("startTime");
        emit(PauseRing.KIND_GC, start, start + e.getLong("duration"), osThreadId(e), longField(e, "gcId"),
                stringField(e, "name"), 0, NULL, stringField(e, "cause"));
    }

    /** A System.gc() call, committed by the calling thread when the call returns. */
    private void onSystemGc(RecordedEvent e) {
        long start = e.getLong("startTime");
        emit(PauseRing.KIND_SYSTEM_GC_CALL, start, start + e.getLong("duration"), osThreadId(e), NULL,
                systemGcCallFrames(e.getStackTrace()), 0, NULL, null);
    }

    /** The OS thread that asked for a VM operation (its caller), NULL when JFR names none. */
    private static long callerOsThreadId(RecordedEvent e) {
        if (!e.hasField("caller")) {
            return NULL;
        }
        Object caller = e.getValue("caller");
        return caller instanceof jdk.jfr.consumer.RecordedThread thread ? thread.getOSThreadId() : NULL;
    }

    private void onTimeStampCounter(RecordedEvent e) {
        if (!Double.isNaN(nanosPerTick)) {
            return;
        }
        boolean fast = e.hasField("fastTimeEnabled") && e.getBoolean("fastTimeEnabled");
        long perSecond = longField(e, fast ? "fastTimeFrequency" : "osFrequency");
        if (perSecond > 0) {
            nanosPerTick = 1e9 / perSecond;
            ticksSource = fast ? "tsc" : "os";
            convertPending();
        }
    }

    private void onClockSync(RecordedEvent e) {
        if (!e.hasField(ClockSyncEvent.FIELD)) {
            return;
        }
        long[] sync = {e.getLong("startTime"), e.getLong(ClockSyncEvent.FIELD), e.getLong("duration")};
        syncSamples++;
        lastSyncMono = Math.max(lastSyncMono, sync[1]);
        syncs.addLast(sync);
        if (syncs.size() > SYNC_WINDOW) {
            syncs.removeFirst();
        }
        if (Double.isNaN(nanosPerTick) && syncSamples >= 2) {
            // No jdk.CPUTimeStampCounter (disabled by the user?): the rate from two sync points.
            long[] first = syncs.peekFirst();
            if (sync[0] - first[0] > 0 && sync[1] - first[1] > 100_000_000L) {
                nanosPerTick = (double) (sync[1] - first[1]) / (sync[0] - first[0]);
                ticksSource = "sync-fit";
            }
        }
        // The tightest recent pair: monotonicNanos lies within its [start, end] ticks.
        long[] tightest = null;
        for (long[] s : syncs) {
            if (tightest == null || s[2] < tightest[2]) {
                tightest = s;
            }
        }
        chosenSync = tightest;
        if (!Double.isNaN(nanosPerTick)) {
            worstChosenWidthNs = Math.max(worstChosenWidthNs, Math.round(chosenSync[2] * nanosPerTick));
        }
        convertPending();
        notifyAll(); // close() waits for its end marker
    }

    // ---------------------------------------------------------------- conversion and output

    private boolean clockKnown() {
        return chosenSync != null && !Double.isNaN(nanosPerTick);
    }

    private long toMonotonic(long ticks) {
        return chosenSync[1] + Math.round((ticks - chosenSync[0]) * nanosPerTick);
    }

    private void emit(int kind, long startTicks, long endTicks, long tid, long id, String name, long aux, long requester,
                      String cause) {
        if (!clockKnown()) {
            if (pending.size() >= MAX_PENDING) {
                pendingDropped++;
                ring.drop();
                return;
            }
            pending.addLast(new Object[] {kind, startTicks, endTicks, tid, id, name, aux, requester, cause});
            return;
        }
        ring.write(kind, toMonotonic(startTicks), toMonotonic(endTicks), tid == NULL ? 0 : tid, id == NULL ? 0 : id, name, aux,
                requester == NULL ? 0 : requester, cause);
    }

    private void emitSafepoint(long id, long startTicks, long endTicks, long tid, Operation operation, long aux) {
        emit(PauseRing.KIND_SAFEPOINT, startTicks, endTicks, tid, id,
                operation != null && operation.name() != null ? operation.name() : "safepoint", aux,
                operation != null ? operation.requester() : NULL, null);
    }

    private void convertPending() {
        if (!clockKnown()) {
            return;
        }
        while (!pending.isEmpty()) {
            Object[] p = pending.removeFirst();
            emit((Integer) p[0], (Long) p[1], (Long) p[2], (Long) p[3], (Long) p[4], (String) p[5], (Long) p[6], (Long) p[7],
                    (String) p[8]);
        }
    }

    // ---------------------------------------------------------------- close

    /** The stream delivered the sync point committed at MARKER (System.nanoTime()), or a later one. */
    private boolean sawSyncAfter(long marker) {
        return lastSyncMono >= marker - 1_000_000L;
    }

    /**
     * Waits, on this object's monitor (the callbacks notify it), until DONE holds or the
     * System.nanoTime() DEADLINE passes; returns whether it was interrupted meanwhile (JPype
     * interrupts every thread at shutdown: the bound is kept, not cut short).
     */
    private synchronized boolean waitUntil(java.util.function.BooleanSupplier done, long deadline) {
        boolean interrupted = false;
        while (!done.getAsBoolean()) {
            long left = (deadline - System.nanoTime()) / 1_000_000L;
            if (left <= 0) {
                break;
            }
            try {
                wait(left);
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        return interrupted;
    }

    /**
     * Ends the live output: lets the stream deliver what JFR has buffered (a sync point
     * committed now, waited for at most CLOSE_WAIT_MILLIS: JFR flushes about once a second),
     * closes it, flushes the safepoints whose End never came as unmatched, and marks the
     * ring closed. Returns what the agent writes into jvm.json.
     */
    Map<String, Object> close() {
        // The flusher stops first: at exit JFR writes its last chunk and takes its own
        // end-of-recording safepoints; flushing meanwhile made the ring and the recording
        // disagree on those (one whole, the other unmatched). The last pauses come with JFR's
        // own flush, as without the flusher (not interrupted: it may be inside a flush).
        flusherStop = true;
        long marker = NULL;
        try {
            ClockSyncEvent.commitNow();
            marker = System.nanoTime();
        } catch (Throwable t) {
            // JFR is shutting down: take what the stream has
        }
        long deadline = System.nanoTime() + CLOSE_WAIT_MILLIS * 1_000_000L;
        long endMarker = marker;
        boolean interrupted = waitUntil(() -> endMarker == NULL || streamEnded || sawSyncAfter(endMarker), deadline);
        try {
            stream.close();
        } catch (Throwable t) {
            // closing a stream JFR already stopped
        }
        // close() returns (and runs the onClose actions) while the stream's thread may still be
        // inside its last dispatch, longer on a loaded machine; what it hands over after the
        // ring is closed is lost to the ring. So wait for that thread to leave stream.start(),
        // within the close's own bound (at least 0.5 s). (EventStream.awaitTermination returns
        // as soon as the stream is closed: no help here.)
        interrupted |= waitUntil(() -> dispatchEnded, System.nanoTime() + Math.max(500_000_000L, deadline - System.nanoTime()));
        Map<String, Object> summary = new LinkedHashMap<>();
        synchronized (this) {
            safepoints.finish(); // the Begins whose End never came, as unmatched
            while (!pending.isEmpty()) { // no clock ever: these cannot be placed on CLOCK_MONOTONIC
                pending.removeFirst();
                pendingDropped++;
                ring.drop();
            }
            ring.close();
            summary.put("ring", RING_FILE);
            summary.put("backend", BACKEND);
            summary.put("capacity", ring.capacity());
            summary.put("written", ring.written());
            summary.put("dropped", ring.dropped());
            summary.put("unmatched_safepoints", unmatched);
            summary.put("orphan_safepoint_ends", orphanEnds);
            summary.put("names_refused", ring.namesRefused());
            summary.put("ticks", ticksSource);
            summary.put("ticks_per_second", Double.isNaN(nanosPerTick) ? null : Math.round(1e9 / nanosPerTick));
            summary.put("clock_sync_samples", syncSamples);
            // monotonicNanos lies inside its sync event's [start, end]: the width bounds the offset error.
            summary.put("clock_error_ns", clockKnown() ? worstChosenWidthNs : null);
            summary.put("end_marker_seen", marker != NULL && sawSyncAfter(marker));
            summary.put("stream_thread_ended", dispatchEnded);
            summary.put("flush_interval_ms", flushMillis > 0 ? flushMillis : null);
            summary.put("flush_interval_problem", flushProblem);
            summary.put("error", streamError);
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        return summary;
    }
}
