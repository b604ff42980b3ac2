package tandem.agent;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The agent's option string, as given after {@code -javaagent:tandem-agent.jar=} or to
 * {@code VirtualMachine.loadAgent}: comma-separated {@code key=value} pairs.
 *
 * <pre>
 *   session=/abs/SESSION            required: the session directory (docs/session.md)
 *   settings=/path/x.jfc | profile  optional: base settings instead of the JDK's "default"
 *   events=jdk.X#threshold=0ms;jdk.Y  optional: extra event settings, ';'-separated
 *   duration=30                     optional: stop after this many seconds (attach)
 *   live=true                       optional: also write pauses into SESSION/jvm-PID/pauses.ring
 *   flush_ms=200                    optional (live): JFR flush interval in ms for the live stream
 *                                   (default 200; 0 = JFR's own, about 1 s); see LivePauses
 *   secret_events=true              optional: leave the events that carry the environment, system
 *                                   properties and command lines to the base settings (see PauseEvents)
 *   memory=false                    optional: leave out the memory events (PauseEvents.MEMORY_*; tandem record --no-memory)
 *   maxsize=BYTES                   optional (flight recorder): JFR keeps its chunks within this many bytes
 *   maxage=SECONDS                  optional (flight recorder): JFR drops chunks older than this
 *   keeper=true                     optional (flight recorder): tandem record's keeper packs the finished
 *                                   chunks kept in .chunks/ and keeps the history within the bounds;
 *                                   JFR itself then keeps only the last two chunks (SessionRecording)
 * </pre>
 *
 * Values are split at the first '=' only, so an event setting may hold its own '='.
 */
final class AgentOptions {
    final String raw;
    final Path session;
    final String settings;
    final List<String> events;
    final double durationSeconds;
    final boolean live;
    /** JFR flush interval asked for the live stream, ms; 0 = leave JFR's default (1 s). */
    final long flushMillis;
    final boolean secretEvents;
    /** Memory events on (the default): PauseEvents.MEMORY_EVERY_SECOND, MEMORY_AT_GC. */
    final boolean memory;
    /** Flight recorder bounds of the JFR recording (Recording.setMaxSize / setMaxAge); 0 = none. */
    final long maxBytes;
    final double maxAgeSeconds;
    /** The session's keeper owns the chunks' history (packs and bounds it): JFR keeps only the newest. */
    final boolean keeper;

    private AgentOptions(String raw, Path session, String settings, List<String> events, double durationSeconds,
                         boolean live, long flushMillis, boolean secretEvents, boolean memory, long maxBytes,
                         double maxAgeSeconds, boolean keeper) {
        this.raw = raw;
        this.session = session;
        this.settings = settings;
        this.events = events;
        this.durationSeconds = durationSeconds;
        this.live = live;
        this.flushMillis = flushMillis;
        this.secretEvents = secretEvents;
        this.memory = memory;
        this.maxBytes = maxBytes;
        this.maxAgeSeconds = maxAgeSeconds;
        this.keeper = keeper;
    }

    /** True when the recording is bounded: JFR then deletes its oldest chunks as it goes. */
    boolean bounded() {
        return maxBytes > 0 || maxAgeSeconds > 0;
    }

    static AgentOptions parse(String raw) {
        String text = raw == null ? "" : raw.strip();
        Path session = null;
        String settings = null;
        List<String> events = new ArrayList<>();
        double duration = 0;
        boolean live = false;
        boolean secretEvents = false;
        boolean memory = true;
        long flushMillis = LivePauses.DEFAULT_FLUSH_MILLIS;
        long maxBytes = 0;
        double maxAge = 0;
        boolean keeper = false;
        for (String pair : text.split(",")) {
            if (pair.isBlank()) {
                continue;
            }
            int eq = pair.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("option '" + pair + "' is not key=value");
            }
            String key = pair.substring(0, eq).strip();
            String value = pair.substring(eq + 1).strip();
            switch (key) {
                case "session":
                    session = Path.of(value).toAbsolutePath();
                    break;
                case "settings":
                    settings = value;
                    break;
                case "events":
                    for (String event : value.split(";")) {
                        if (!event.isBlank()) {
                            events.add(event.strip());
                        }
                    }
                    break;
                case "duration":
                    try {
                        duration = Double.parseDouble(value.endsWith("s") ? value.substring(0, value.length() - 1) : value);
                    } catch (NumberFormatException e) {
                        throw new IllegalArgumentException("duration=" + value + " is not a number of seconds");
                    }
                    if (!(duration > 0)) {
                        throw new IllegalArgumentException("duration=" + value + " must be positive");
                    }
                    break;
                case "live":
                    if (value.equalsIgnoreCase("true")) {
                        live = true;
                    } else if (value.equalsIgnoreCase("false")) {
                        live = false;
                    } else {
                        throw new IllegalArgumentException("live=" + value + " is not true or false");
                    }
                    break;
                case "flush_ms":
                    try {
                        flushMillis = Long.parseLong(value);
                    } catch (NumberFormatException e) {
                        throw new IllegalArgumentException("flush_ms=" + value + " is not a whole number of milliseconds");
                    }
                    if (flushMillis < 0 || flushMillis > 60_000) {
                        throw new IllegalArgumentException("flush_ms=" + value + " must be in [0, 60000]");
                    }
                    break;
                case "secret_events":
                    secretEvents = bool(key, value);
                    break;
                case "memory":
                    memory = bool(key, value);
                    break;
                case "maxsize":
                    try {
                        maxBytes = Long.parseLong(value);
                    } catch (NumberFormatException e) {
                        throw new IllegalArgumentException("maxsize=" + value + " is not a whole number of bytes");
                    }
                    if (maxBytes <= 0) {
                        throw new IllegalArgumentException("maxsize=" + value + " must be positive");
                    }
                    break;
                case "maxage":
                    try {
                        maxAge = Double.parseDouble(value);
                    } catch (NumberFormatException e) {
                        throw new IllegalArgumentException("maxage=" + value + " is not a number of seconds");
                    }
                    if (!(maxAge > 0)) {
                        throw new IllegalArgumentException("maxage=" + value + " must be positive");
                    }
                    break;
                case "keeper":
                    keeper = bool(key, value);
                    break;
                default:
                    throw new IllegalArgumentException("unknown option '" + key
                            + "' (known: session, settings, events, duration, live, flush_ms, secret_events, memory, maxsize, maxage, keeper)");
            }
        }
        if (session == null) {
            throw new IllegalArgumentException("no session=<directory> in options '" + text + "'");
        }
        return new AgentOptions(text, session, settings, Collections.unmodifiableList(events), duration, live, flushMillis,
                secretEvents, memory, maxBytes, maxAge, keeper);
    }

    private static boolean bool(String key, String value) {
        if (value.equalsIgnoreCase("true")) {
            return true;
        }
        if (value.equalsIgnoreCase("false")) {
            return false;
        }
        throw new IllegalArgumentException(key + "=" + value + " is not true or false");
    }
}
