package tandem.agent;

import java.io.IOException;
import java.lang.instrument.Instrumentation;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import jdk.jfr.Recording;
import jdk.jfr.RecordingState;

/**
 * The disk output of the agent: one JFR recording into SESSION/jvm-&lt;pid&gt;/ (layout in
 * docs/session.md). Its disk repository lives in the session too, so a JVM killed with
 * SIGKILL leaves its chunks there; every other exit (normal, System.exit, SIGTERM) runs
 * the shutdown hooks, which write recording.jfr.
 */
final class SessionRecording {
    private static final long CLOCK_SYNC_PERIOD_MILLIS = 1000;
    /** Free space below which the agent does not record (see stopForFullDisk). */
    static final long DISK_RESERVE_BYTES = 32L << 20;
    // JFR writes the whole recording at exit; large ones take seconds.
    private static final long WAIT_FOR_JFR_HOOK_MILLIS = 30_000;

    /** One session per JVM at a time; a new attach may start one once the last has closed. */
    private static SessionRecording current;

    private final AgentOptions options;
    private long lastRotationNanos = System.nanoTime(); // rotateChunkWhenDue
    private Recording rotation; // rotateChunkWhenDue's empty recording while it runs
    private boolean rotationStopped; // (guarded by rotationLock)
    private final Object rotationLock = new Object();
    private final String mode;
    private final Instrumentation inst;
    private final Path directory;
    private final Path recordingFile;
    private final Path unfinishedRecordingFile;
    private final Path repository;
    private final ChunkKeeper chunkKeeper;
    private final Map<String, Object> description = new LinkedHashMap<>();
    private Recording recording;
    private LivePauses live;
    private Thread clockSync;
    private PauseFlush pauseFlush;
    private Thread shutdownHook;
    private boolean closed;
    /** True when JFR writes the recording (its destination set), false when the agent does from kept chunks. */
    private boolean jfrDumps;

    private SessionRecording(AgentOptions options, String mode, Instrumentation inst) {
        this.options = options;
        this.mode = mode;
        this.inst = inst;
        this.directory = options.session.resolve("jvm-" + ProcessHandle.current().pid());
        this.recordingFile = directory.resolve("recording.jfr");
        // JFR creates its destination empty at once; the final name appears only when complete.
        this.unfinishedRecordingFile = directory.resolve("recording.jfr.part");
        this.repository = directory.resolve("repository");
        this.chunkKeeper = new ChunkKeeper(repository, directory.resolve(".chunks"));
    }

    static void start(AgentOptions options, String mode, Instrumentation inst) throws Exception {
        synchronized (SessionRecording.class) {
            if (current != null && !current.isClosed()) {
                throw new IllegalStateException("already recording into " + current.directory);
            }
            SessionRecording session = new SessionRecording(options, mode, inst);
            session.begin();
            current = session;
        }
    }

    private void begin() throws Exception {
        long ownFrom = System.nanoTime(); // (CLOCK_MONOTONIC on Linux, as the session's clock)
        Map<String, String> settings = PauseEvents.settings(options.settings, options.events, options.secretEvents, options.memory); // bad input: no files
        PrivateFiles.directories(options.session);
        PrivateFiles.directory(directory);
        PrivateFiles.directory(repository);
        long free = usableBytes(directory);
        if (free < DISK_RESERVE_BYTES) {
            throw new IllegalStateException("only " + free / 1024 + " KiB free on the session's disk (tandem needs "
                    + (DISK_RESERVE_BYTES >> 20) + " MiB free: JFR stops the JVM when it cannot write)");
        }
        JfrRepository.use(repository, inst);
        ClockSyncEvent.registerChunkHook();
        String nmtEvents = NativeMemoryEvents.registerIfNeeded();
        description.put("native_memory_events", nmtEvents == null ? NativeMemoryEvents.USAGE : nmtEvents);

        recording = new Recording(settings);
        recording.setName("tandem");
        recording.setToDisk(true);
        if (options.maxBytes > 0) {
            recording.setMaxSize(options.maxBytes); // the flight recorder: JFR deletes its oldest chunks
        }
        // JFR drops the chunks whose end is older than its maxage when it finishes a chunk, and a
        // chunk spans at most one rotation period (rotateChunkWhenDue): what it holds reaches back
        // maxage plus two periods at most, so two periods less keeps it within --max-age.
        long withinMaxAge = options.maxAgeSeconds > 0
                ? Math.max((long) (options.maxAgeSeconds * 1000) - 2 * rotationPeriodMillis(), rotationPeriodMillis())
                : Long.MAX_VALUE;
        if (options.keeper && options.bounded()) {
            // The keeper packs each finished chunk from our links in .chunks/ and bounds that
            // history itself: JFR's repository need hold only its last chunks (JFR.dump's part
            // of a snapshot).
            recording.setMaxAge(Duration.ofMillis(Math.min(rotationPeriodMillis(), withinMaxAge)));
        } else if (options.maxAgeSeconds > 0) {
            recording.setMaxAge(Duration.ofMillis(withinMaxAge));
        }

        ClockPair start = ClockPair.read();
        recording.start(); // the first clock sync comes from beginChunk
        chunkKeeper.keepNewChunks();
        letJfrDumpIfChunksAreNotKept();
        PrivateFiles.tighten(repository); // JFR made its chunk directory with the JVM's umask

        describeJvm(start);
        if (options.live) {
            startLive(settings);
        }
        startPauseFlush();
        describeOwnStart(ownFrom, System.nanoTime());
        writeDescription("recording");

        shutdownHook = new Thread(() -> close("jvm exit", true), "tandem-agent-shutdown");
        Runtime.getRuntime().addShutdownHook(shutdownHook);
        clockSync = daemon("tandem-clock-sync", this::commitClockSyncEverySecond);
        clockSync.start();
        if (options.durationSeconds > 0) {
            daemon("tandem-duration", this::closeAfterDuration).start();
        }
    }

    /** The second output (live=true): a failure costs the live ring, never the disk recording. */
    private void startLive(Map<String, String> settings) {
        try {
            live = LivePauses.start(directory, settings, inst, options.flushMillis);
            Map<String, Object> about = new LinkedHashMap<>();
            about.put("ring", directory.relativize(live.ringPath()).toString());
            about.put("backend", LivePauses.BACKEND);
            about.put("capacity", LivePauses.capacity());
            about.put("flush_interval_ms", live.flushMillis() > 0 ? live.flushMillis() : null);
            if (live.flushProblem() != null) {
                about.put("flush_interval_problem", live.flushProblem());
            }
            description.put("live", about);
        } catch (Throwable t) {
            String reason = "live output off: " + Agent.describe(t);
            Agent.warn(reason);
            description.put("live_error", reason);
        }
    }

    /** The flush after stops (PauseFlush); where it cannot run, JFR's own flush stays, quietly. */
    private void startPauseFlush() {
        Map<String, Object> about = new LinkedHashMap<>();
        try {
            pauseFlush = PauseFlush.start(inst);
            about.put("poll_ms", PauseFlush.POLL_MILLIS);
            about.put("min_gap_ms", PauseFlush.MIN_GAP_MILLIS);
        } catch (Throwable t) {
            about.put("problem", Agent.describe(t));
        }
        description.put("flush_after_pauses", about);
    }

    private void stopPauseFlush() {
        if (pauseFlush == null) {
            return;
        }
        pauseFlush.stop();
        if (pauseFlush.problem() != null) {
            @SuppressWarnings("unchecked")
            Map<String, Object> about = (Map<String, Object>) description.get("flush_after_pauses");
            about.put("problem", pauseFlush.problem());
        }
    }

    /** Ends the live output first, so its ring is closed after its last events. */
    private void closeLive() {
        if (live == null) {
            return;
        }
        try {
            description.put("live", live.close());
        } catch (Throwable t) {
            Agent.warn("could not close the live ring: " + Agent.describe(t));
        }
    }

    /**
     * The flight recorder: JFR applies maxage/maxsize to whole chunks, and left alone starts a new
     * chunk only every 12 MB (hours of history at a quiet JVM's rate). Starting a recording to disk
     * makes JFR begin a new chunk, and stopping it another: an empty recording started at one
     * period's end and stopped at the next keeps chunks one rotationPeriodMillis long; JFR's
     * maxage is set two periods below --max-age.
     */
    private void rotateChunkWhenDue() {
        synchronized (rotationLock) {
            if (rotationStopped) {
                return;
            }
            rotateChunkWhenDueLocked();
        }
    }

    /** At close: the empty recording must not outlive ours (it would keep JFR writing chunks). */
    private void stopChunkRotation() {
        synchronized (rotationLock) {
            rotationStopped = true;
            if (rotation != null) {
                try {
                    rotation.close();
                } catch (Throwable ignored) {
                    // the JVM is going down; nothing to keep
                }
                rotation = null;
            }
        }
    }

    private void rotateChunkWhenDueLocked() {
        long now = System.nanoTime();
        if (now - lastRotationNanos < rotationPeriodMillis() * 1_000_000L) {
            return;
        }
        lastRotationNanos = now;
        try {
            // Starting a recording and stopping it each begin a chunk: one of the two per period.
            if (rotation == null) {
                rotation = new Recording();
                rotation.setName("tandem-chunk-rotation");
                rotation.setToDisk(true);
                rotation.start();
            } else {
                Recording running = rotation;
                rotation = null;
                running.close();
            }
        } catch (Throwable t) {
            Agent.warn("could not start a new JFR chunk for --max-age: " + Agent.describe(t));
            lastRotationNanos = Long.MAX_VALUE / 2; // said once; JFR's own 12 MB chunks remain
        }
    }

    /** A tenth of --max-age, within [5 s, 60 s] (at most a third of it); 60 s with --max-size alone. */
    private long rotationPeriodMillis() {
        if (options.maxAgeSeconds <= 0) {
            return 60_000;
        }
        long ageMillis = (long) (options.maxAgeSeconds * 1000);
        return Math.min(ageMillis / 3, Math.min(60_000, Math.max(5_000, ageMillis / 10)));
    }

    private void commitClockSyncEverySecond() {
        try {
            while (!Thread.currentThread().isInterrupted()) {
                Thread.sleep(CLOCK_SYNC_PERIOD_MILLIS);
                ClockSyncEvent.commitNow();
                chunkKeeper.keepNewChunks();
                if (options.bounded()) {
                    rotateChunkWhenDue();
                    if (!options.keeper) { // (with a keeper, the links are the history: it removes them once packed)
                        chunkKeeper.forgetRotatedChunks(); // else our links would keep what maxsize/maxage let go
                    }
                }
                letJfrDumpIfChunksAreNotKept();
                PrivateFiles.tighten(repository); // a new chunk after a rotation
                long free = usableBytes(directory);
                if (free < DISK_RESERVE_BYTES) {
                    stopForFullDisk(free);
                    return;
                }
            }
        } catch (InterruptedException stopped) {
            // close() stops us
        }
    }

    /**
     * Normally the agent writes recording.jfr itself from the chunks it keeps, and JFR has no
     * destination: JFR's own dump at exit fails under JPype (it interrupts every thread at
     * shutdown) and prints "[error][jfr] Unable to complete I/O operation when dumping
     * recording" although nothing is lost. Where chunks cannot be kept (no hard links on
     * this file system), JFR's dump at exit is the way, as JFR does it by default.
     */
    private synchronized void letJfrDumpIfChunksAreNotKept() {
        if (jfrDumps || chunkKeeper.keeping() || recording.getState() != RecordingState.RUNNING) {
            return;
        }
        try {
            recording.setDestination(unfinishedRecordingFile);
            recording.setDumpOnExit(true);
            jfrDumps = true;
        } catch (IOException | RuntimeException e) {
            Agent.warn("cannot have JFR write " + unfinishedRecordingFile + " at exit: " + Agent.describe(e));
        }
    }

    /**
     * JFR stops the whole JVM when it cannot write a chunk ("An irrecoverable error in Jfr.
     * Shutting down VM..."): tandem stops recording first, while DISK_RESERVE_BYTES are still
     * free. The chunks so far are finished in place and stay in .chunks/ (the session's
     * readers look there when there is no recording.jfr); jvm.json says "stopped" and why.
     */
    private void stopForFullDisk(long free) {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
        }
        String reason = "the session's disk is nearly full (" + free / 1024 + " KiB free; tandem stops below "
                + (DISK_RESERVE_BYTES >> 20) + " MiB, before JFR would stop the JVM)";
        Agent.warn("recording stopped: " + reason);
        try {
            stopPauseFlush();
            closeLive();
            if (jfrDumps) {
                recording.setDestination(null); // no dump: it needs the space that is missing
            }
            recording.stop();
            chunkKeeper.keepNewChunks();
            description.put("stop_reason", reason);
            description.put("end_monotonic_ns", System.nanoTime());
            writeDescription("stopped");
        } catch (Throwable t) {
            Agent.warn("could not stop the recording in " + directory + ": " + Agent.describe(t));
        }
    }

    static long usableBytes(Path path) {
        try {
            return Files.getFileStore(path).getUsableSpace();
        } catch (IOException | RuntimeException e) {
            return Long.MAX_VALUE; // unknown: JFR's own handling applies
        }
    }

    private void closeAfterDuration() {
        try {
            Thread.sleep((long) (options.durationSeconds * 1000));
        } catch (InterruptedException e) {
            return;
        }
        close("duration " + options.durationSeconds + " s", false);
        try {
            Runtime.getRuntime().removeShutdownHook(shutdownHook);
        } catch (IllegalStateException shuttingDown) {
            // the hook runs anyway and finds us closed
        }
    }

    private synchronized boolean isClosed() {
        return closed;
    }

    /**
     * Ends the session once: recording.jfr written, jvm.json "closed".
     *
     * At JVM exit JFR's own shutdown hook runs concurrently with ours, stops every recording
     * and then deletes the disk repository; stopping ours from here would race that deletion
     * (the dump then misses its chunks). So at exit this hook waits for JFR's to finish the
     * last chunk and writes the chunks kept by {@link ChunkKeeper}; where chunks cannot be kept,
     * JFR's hook writes the destination (dumpOnExit) and this one waits for it.
     */
    private void close(String reason, boolean atJvmExit) {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
        }
        try {
            clockSync.interrupt();
            stopChunkRotation();
            stopPauseFlush();
            if (atJvmExit) {
                chunkKeeper.keepNewChunks(); // before JFR's own hook can clear the repository
            }
            closeLive();
            if (!atJvmExit) {
                recording.stop(); // writes the destination, if set; the last clock sync comes from endChunk
                if (!jfrDumps) {
                    PrivateFiles.createFile(unfinishedRecordingFile);
                    recording.dump(unfinishedRecordingFile); // not at exit: nothing interrupts it
                }
                recording.close();
                Files.move(unfinishedRecordingFile, recordingFile, StandardCopyOption.REPLACE_EXISTING,
                        StandardCopyOption.ATOMIC_MOVE);
            } else if (!jfrDumps) {
                chunkKeeper.keepNewChunks();
                waitForJfrToFinishItsChunks();
                chunkKeeper.writeRecording(recordingFile);
            } else {
                chunkKeeper.keepNewChunks();
                if (jfrWroteTheRecordingAtExit()) {
                    Files.move(unfinishedRecordingFile, recordingFile, StandardCopyOption.REPLACE_EXISTING,
                            StandardCopyOption.ATOMIC_MOVE);
                } else if (chunkKeeper.hasChunks()) {
                    chunkKeeper.writeRecording(recordingFile);
                    Files.deleteIfExists(unfinishedRecordingFile);
                    description.put("written_from", "kept chunks (JFR's own dump at exit failed)");
                } else {
                    throw new IllegalStateException("JFR wrote no recording and no chunk was kept");
                }
            }
            chunkKeeper.discard();
            PrivateFiles.tighten(directory); // recording.jfr as JFR's dump made it
            description.put("stop_reason", reason);
            description.put("end_monotonic_ns", System.nanoTime());
            writeDescription("closed");
        } catch (Throwable t) {
            Agent.warn("could not close the recording in " + directory + ": " + Agent.describe(t));
        }
    }

    /**
     * At exit, JFR's shutdown hook stops our recording, which finishes the last chunk in place
     * (the kept links share its inode), then clears the repository. Waits for that (at most
     * WAIT_FOR_JFR_HOOK_MILLIS); interrupts do not end the wait.
     */
    private void waitForJfrToFinishItsChunks() {
        long deadline = System.nanoTime() + WAIT_FOR_JFR_HOOK_MILLIS * 1_000_000;
        boolean interrupted = false;
        try {
            while (System.nanoTime() < deadline) {
                if (recording.getState() != RecordingState.RUNNING
                        && (chunkKeeper.repositoryCleared() || chunkKeeper.allKeptFinished())) {
                    return;
                }
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Waits for JFR's shutdown hook: true once it wrote and closed our recording, false once
     * it gave up (stopped the recording and cleared the repository without closing it).
     * Interrupts do not end the wait (JPype interrupts every thread at shutdown).
     */
    private boolean jfrWroteTheRecordingAtExit() {
        long deadline = System.nanoTime() + WAIT_FOR_JFR_HOOK_MILLIS * 1_000_000;
        boolean interrupted = false;
        try {
            while (System.nanoTime() < deadline) {
                RecordingState state = recording.getState();
                if (state == RecordingState.CLOSED) {
                    return true;
                }
                if (state != RecordingState.RUNNING && chunkKeeper.repositoryCleared()) {
                    return false;
                }
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            return recording.getState() == RecordingState.CLOSED;
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private void describeJvm(ClockPair start) {
        description.put("pid", ProcessHandle.current().pid());
        description.put("java_version", System.getProperty("java.version"));
        description.put("java_vendor", System.getProperty("java.vendor"));
        description.put("vm_name", System.getProperty("java.vm.name"));
        description.put("vm_version", System.getProperty("java.vm.version"));
        description.put("start_monotonic_ns", start.monotonicNanos);
        description.put("start_wall_ns", start.wallNanos);
        description.put("start_clock_error_ns", start.errorNanos());
        description.put("boot_id", firstLine("/proc/sys/kernel/random/boot_id"));
        // Not InetAddress.getLocalHost(): it may wait on DNS, and the agent must not block the JVM.
        String hostname = firstLine("/proc/sys/kernel/hostname");
        description.put("hostname", hostname != null ? hostname : System.getenv("HOSTNAME"));
        description.put("mode", mode);
        description.put("options", options.raw);
        description.put("settings", options.settings != null ? options.settings : "default");
        description.put("events", options.events);
        description.put("secret_events", options.secretEvents);
        description.put("duration_s", options.durationSeconds > 0 ? options.durationSeconds : null);
        description.put("max_size_bytes", options.maxBytes > 0 ? options.maxBytes : null);
        description.put("max_age_s", options.maxAgeSeconds > 0 ? options.maxAgeSeconds : null);
        description.put("keeper", options.keeper);
        description.put("recording", directory.relativize(recordingFile).toString());
        description.put("repository", directory.relativize(repository).toString());
    }

    /**
     * The VM operations JFR runs as the agent starts its recording (RedefineClasses for its
     * event classes, JFROldObject, ClassLoaderStatsOperation for the first chunk's events) are
     * asked for by the thread that runs the agent: with -javaagent, the thread that created the
     * JVM, which in JPype or jpy is a Python thread. Their requester and window let a reader
     * tell them from the service's own (engine/ingest/jfr.py, `asked_by_tandem`).
     */
    private void describeOwnStart(long fromNanos, long toNanos) {
        description.put("agent_start_from_monotonic_ns", fromNanos);
        description.put("agent_start_to_monotonic_ns", toNanos);
        description.put("agent_start_os_thread_id", currentOsThreadId());
    }

    /** This thread's Linux tid (/proc/thread-self is PID/task/TID), or null elsewhere. */
    private static Long currentOsThreadId() {
        try {
            Path self = Files.readSymbolicLink(Path.of("/proc/thread-self"));
            return Long.parseLong(self.getFileName().toString());
        } catch (Exception e) {
            return null;
        }
    }

    private void writeDescription(String state) throws java.io.IOException {
        description.put("state", state);
        Json.writeAtomically(directory.resolve("jvm.json"), description);
    }

    private static String firstLine(String file) {
        try {
            return Files.readString(Path.of(file), StandardCharsets.UTF_8).strip();
        } catch (Exception e) {
            return null;
        }
    }

    private static Thread daemon(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        return thread;
    }
}
