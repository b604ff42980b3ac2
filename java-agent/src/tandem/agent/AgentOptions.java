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

    private AgentOptions(String raw, Path session, String settings, List<String> events, double durationSeconds,
                         boolean live) {
        this.raw = raw;
        this.session = session;
        this.settings = settings;
        this.events = events;
        this.durationSeconds = durationSeconds;
        this.live = live;
    }

    static AgentOptions parse(String raw) {
        String text = raw == null ? "" : raw.strip();
        Path session = null;
        String settings = null;
        List<String> events = new ArrayList<>();
        double duration = 0;
        boolean live = false;
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
                default:
                    throw new IllegalArgumentException("unknown option '" + key + "' (known: session, settings, events, duration, live)");
            }
        }
        if (session == null) {
            throw new IllegalArgumentException("no session=<directory> in options '" + text + "'");
        }
        return new AgentOptions(text, session, settings, Collections.unmodifiableList(events), duration, live);
    }
}
