package tandem.agent;

import java.lang.instrument.Instrumentation;

/** Entry points of the tandem Java agent (see issue: recording). Placeholder until the agent lands. */
public final class Agent {
    private Agent() {}

    public static void premain(String options, Instrumentation inst) {}

    public static void agentmain(String options, Instrumentation inst) {}
}
