package tandem.agent;

import com.sun.tools.attach.VirtualMachine;

/**
 * Loads the tandem agent into a running JVM: {@code java -cp tandem-agent.jar
 * tandem.agent.Attach PID AGENT_JAR OPTIONS} (used by `tandem attach`). Exit code 0 when the
 * agent was loaded; otherwise one line {@code tandem-attach: ...} on stderr and exit code 1.
 */
public final class Attach {
    private Attach() {}

    public static void main(String[] args) {
        if (args.length != 3) {
            System.err.println("tandem-attach: usage: Attach PID AGENT_JAR OPTIONS");
            System.exit(2);
        }
        try {
            VirtualMachine vm = VirtualMachine.attach(args[0]);
            try {
                vm.loadAgent(args[1], args[2]);
            } finally {
                vm.detach();
            }
        } catch (Throwable t) {
            System.err.println("tandem-attach: pid " + args[0] + ": " + Agent.describe(t).replace('\n', ' '));
            System.exit(1);
        }
    }
}
