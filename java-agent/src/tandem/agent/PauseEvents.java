package tandem.agent;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.text.ParseException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import jdk.jfr.Configuration;

/**
 * The one place that decides which JFR events tandem records and how. Every output (the
 * disk recording today, the live RecordingStream later) takes its settings from
 * {@link #settings}, so both see the same events.
 *
 * Layers, later ones win: the base (.jfc given with settings=, else the JDK's "default"),
 * then the pause events tandem needs (default.jfc records safepoints only above 10 ms and
 * SafepointEnd not at all; see shared/notes/jfr.md) and default.jfc's per-chunk thread dump
 * switched off, then the events that carry secrets switched off (unless secret_events=true),
 * then the user's events=.
 */
final class PauseEvents {
    private PauseEvents() {}

    /** Events that make up a stop-the-world interval, recorded whatever their length. */
    static final List<String> ZERO_THRESHOLD = List.of(
            "jdk.SafepointBegin",
            "jdk.SafepointStateSynchronization",
            "jdk.SafepointEnd",
            "jdk.ExecuteVMOperation",
            "jdk.GCPhasePause",
            "jdk.GCPhasePauseLevel1",
            "jdk.GCPhasePauseLevel2",
            "jdk.GCPhasePauseLevel3",
            "jdk.GCPhasePauseLevel4",
            "jdk.GarbageCollection",
            "jdk.YoungGarbageCollection",
            "jdk.OldGarbageCollection",
            "tandem.ClockSync");

    /**
     * Events whose values are secrets the service may hold: its environment, its system and
     * security properties, command lines (its own JVM and Java arguments, every process on
     * the host, processes it starts), the option strings of other agents (license keys), and
     * the free-text messages of thrown errors. tandem reads none of them; they are left out
     * unless secret_events=true (or the user names one with events=).
     */
    static final List<String> SECRET_CARRYING = List.of(
            "jdk.InitialEnvironmentVariable",
            "jdk.InitialSystemProperty",
            "jdk.JVMInformation",          // jvmArguments, jvmFlags, javaArguments
            "jdk.SystemProcess",           // command line of every process on the host
            "jdk.ProcessStart",            // command lines the service runs (JDK 23+)
            "jdk.InitialSecurityProperty",
            "jdk.SecurityPropertyModification",
            "jdk.JavaAgent",               // other agents' options (JDK 22+)
            "jdk.NativeAgent",
            "jdk.JavaErrorThrow",          // messages
            "jdk.JavaExceptionThrow");

    /**
     * Memory, once a second (engine/memory reads them; docs/results.md, "memory.parquet"):
     * direct and mapped buffers, code cache, threads, and where the JDK has them the heap's
     * usage, the RSS and, with -XX:NativeMemoryTracking (tandem record --native-memory), NMT's
     * categories. JFR ignores the names a JDK does not know (17 has the first three only).
     * jdk.GCHeapSummary, jdk.MetaspaceSummary and (G1) jdk.G1EvacuationOldStatistics come at
     * every GC (default.jfc enables them; so does this, whatever the base settings).
     */
    static final List<String> MEMORY_EVERY_SECOND = List.of(
            "jdk.DirectBufferStatistics",
            "jdk.CodeCacheStatistics",
            "jdk.JavaThreadStatistics",
            "jdk.GCHeapMemoryUsage",
            "jdk.ResidentSetSize",
            "jdk.NativeMemoryUsage",
            "jdk.NativeMemoryUsageTotal",
            NativeMemoryEvents.USAGE,       // the same from VM.native_memory where JFR lacks them (NativeMemoryEvents)
            NativeMemoryEvents.TOTAL);
    static final List<String> MEMORY_AT_GC = List.of("jdk.GCHeapSummary", "jdk.MetaspaceSummary", "jdk.G1EvacuationOldStatistics");

    private static final Pattern TIMESPAN_WITHOUT_SPACE = Pattern.compile("(\\d+)(ns|us|ms|s|m|h|d)");

    static Map<String, String> settings(String base, List<String> userEvents, boolean secretEvents, boolean memory)
            throws IOException, ParseException {
        Map<String, String> settings = new LinkedHashMap<>(baseConfiguration(base).getSettings());
        for (String event : ZERO_THRESHOLD) {
            settings.put(event + "#enabled", "true");
            settings.put(event + "#threshold", "0 ms");
        }
        // default.jfc takes a thread dump at every chunk boundary: a safepoint operation of
        // our own making in the pauses we report, and a crash (SIGSEGV in Threads::print_on,
        // seen at JVM exit with a JPype demo) when a thread attached through JNI exited
        // without detaching. tandem reads no thread dumps; events=jdk.ThreadDump brings it back.
        settings.put("jdk.ThreadDump#enabled", "false");
        // Who asked for a System.gc() and from where: the event is committed by the calling
        // thread itself (named even where ExecuteVMOperation's caller is N/A: a thread attached
        // through JNI, e.g. JPype's GC link), with its Java frames (none from a JNI caller).
        settings.put("jdk.SystemGC#enabled", "true");
        settings.put("jdk.SystemGC#threshold", "0 ms");
        settings.put("jdk.SystemGC#stackTrace", "true");
        if (memory) { // (off: the base settings' own, for tandem record --no-memory)
            for (String event : MEMORY_EVERY_SECOND) {
                settings.put(event + "#enabled", "true");
                settings.put(event + "#period", "1 s");
            }
            for (String event : MEMORY_AT_GC) {
                settings.put(event + "#enabled", "true");
            }
        }
        settings.put("tandem.ClockSync#stackTrace", "false");
        settings.put("tandem.ClockSync#period", "everyChunk"); // plus the agent's own once a second
        // Tells ingest whether ticks are the OS clock or the TSC (and at which frequency).
        settings.put("jdk.CPUTimeStampCounter#enabled", "true");
        settings.put("jdk.CPUTimeStampCounter#period", "beginChunk");
        if (!secretEvents) {
            for (String event : SECRET_CARRYING) {
                settings.put(event + "#enabled", "false");
            }
        }
        for (String event : userEvents) {
            addUserEvent(settings, event);
        }
        return settings;
    }

    /** "jdk.X" enables jdk.X; "jdk.X#threshold=0ms" sets one setting and enables jdk.X; "jdk.X#enabled=false" disables it. */
    private static void addUserEvent(Map<String, String> settings, String event) {
        int hash = event.indexOf('#');
        String name = hash < 0 ? event : event.substring(0, hash);
        if (name.isEmpty() || name.contains("=")) {
            throw new IllegalArgumentException("event setting '" + event + "' is not NAME or NAME#setting=value");
        }
        if (hash >= 0) {
            String setting = event.substring(hash + 1);
            int eq = setting.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("event setting '" + event + "' is not NAME#setting=value");
            }
            String key = setting.substring(0, eq).strip();
            String value = setting.substring(eq + 1).strip();
            Matcher timespan = TIMESPAN_WITHOUT_SPACE.matcher(value);
            if (timespan.matches()) {
                // JDK 17's parser wants "0 ms"; users write "0ms" as in `jfr configure`.
                value = timespan.group(1) + " " + timespan.group(2);
            }
            settings.put(name + "#" + key, value);
            if (key.equals("enabled")) {
                return;
            }
        }
        settings.put(name + "#enabled", "true");
    }

    private static Configuration baseConfiguration(String base) throws IOException, ParseException {
        if (base == null || base.isEmpty()) {
            return Configuration.getConfiguration("default");
        }
        Path file = Path.of(base);
        if (Files.isRegularFile(file)) {
            return Configuration.create(file);
        }
        if (!base.contains("/") && !base.endsWith(".jfc")) {
            return Configuration.getConfiguration(base); // a JDK configuration name: "profile"
        }
        throw new IllegalArgumentException("settings file " + base + " not found");
    }
}
