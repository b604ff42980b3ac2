package tandem.agent;

import java.lang.instrument.Instrumentation;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/**
 * Entry points of the tandem Java agent: {@code -javaagent:tandem-agent.jar=session=DIR,...}
 * (premain) and the Attach API (agentmain). Options: see {@link AgentOptions}.
 *
 * The agent must never crash or stop its host JVM: anything that goes wrong is one line
 * {@code tandem-agent: ...} on stderr and the program runs on without recording.
 */
public final class Agent {
    private Agent() {}

    public static void premain(String options, Instrumentation inst) {
        start(options, "premain", inst);
    }

    public static void agentmain(String options, Instrumentation inst) {
        start(options, "agentmain", inst);
    }

    private static void start(String options, String mode, Instrumentation inst) {
        AgentOptions parsed = null;
        try {
            parsed = AgentOptions.parse(options);
            SessionRecording.start(parsed, mode, inst);
        } catch (Throwable t) {
            String reason = "not recording: " + describe(t);
            warn(reason);
            if (parsed != null) {
                leaveReasonInSession(parsed, reason);
            }
        }
    }

    /**
     * The JVM's stderr may be far from the user (an attached service, a JNI host): the reason
     * also goes to SESSION/jvm-PID/agent-error.txt, where `tandem attach`/`record` show it.
     */
    private static void leaveReasonInSession(AgentOptions options, String reason) {
        try {
            Path directory = options.session.resolve("jvm-" + ProcessHandle.current().pid());
            PrivateFiles.directories(directory);
            Path file = directory.resolve("agent-error.txt");
            PrivateFiles.createFile(file); // 0600 from the start, never through a link
            Files.write(file, List.of("tandem-agent: " + reason));
        } catch (Throwable ignored) {
            // the stderr line is all we can do
        }
    }

    static void warn(String message) {
        System.err.println("tandem-agent: " + message.replace('\n', ' '));
    }

    static String describe(Throwable t) {
        Throwable root = t;
        while (root.getCause() != null && root.getCause() != root) {
            root = root.getCause();
        }
        String message = root.getMessage();
        if (message == null) {
            return root.getClass().getName();
        }
        // Our own errors read as sentences; the JDK's (NoSuchFileException: /x) need their kind.
        boolean ours = root instanceof IllegalArgumentException || root instanceof IllegalStateException;
        return ours ? message : root.getClass().getSimpleName() + ": " + message;
    }
}
