package tandem.agent;

import java.lang.instrument.Instrumentation;
import java.lang.management.ManagementFactory;
import java.lang.reflect.Method;
import java.nio.file.Path;
import java.util.Map;
import java.util.Set;
import javax.management.DynamicMBean;
import javax.management.ObjectName;

/**
 * Moves JFR's disk repository (JVM-wide, no public API) into the session, through the
 * JFR.configure diagnostic command, as `jcmd PID JFR.configure repositorypath=...` would.
 *
 * The command is reached without starting the platform MBean server when possible: that
 * server initialises java.util.logging's LogManager, which breaks programs that choose their
 * own LogManager in main() (log4j-jul, JBoss LogManager), and costs 130-230 ms at start.
 */
final class JfrRepository {
    private JfrRepository() {}

    private static final String OPERATION = "jfrConfigure";
    private static final String[] SIGNATURE = {String[].class.getName()};

    static void use(Path repository, Instrumentation inst) throws Exception {
        Object[] arguments = {new String[] {"repositorypath=\"" + repository + "\""}};
        DynamicMBean direct = diagnosticCommandWithoutMBeanServer(inst);
        if (direct != null) {
            try {
                direct.invoke(OPERATION, arguments, SIGNATURE);
                return;
            } catch (Throwable t) {
                // fall back to the documented route below
            }
        }
        ManagementFactory.getPlatformMBeanServer().invoke(
                new ObjectName("com.sun.management:type=DiagnosticCommand"), OPERATION, arguments, SIGNATURE);
    }

    /** jdk.management's DiagnosticCommandImpl singleton, or null if this JDK hides it differently. */
    private static DynamicMBean diagnosticCommandWithoutMBeanServer(Instrumentation inst) {
        try {
            Module management = ModuleLayer.boot().findModule("jdk.management").orElse(null);
            if (inst == null || management == null) {
                return null;
            }
            String pkg = "com.sun.management.internal";
            inst.redefineModule(management, Set.of(), Map.of(), Map.of(pkg, Set.of(JfrRepository.class.getModule())),
                    Set.of(), Map.of());
            // Its static initialiser loads libmanagement_ext, which holds DiagnosticCommandImpl's natives.
            Class.forName(pkg + ".PlatformMBeanProviderImpl", true, management.getClassLoader());
            Class<?> impl = Class.forName(pkg + ".DiagnosticCommandImpl", true, management.getClassLoader());
            Method getter = impl.getDeclaredMethod("getDiagnosticCommandMBean");
            getter.setAccessible(true);
            return (DynamicMBean) getter.invoke(null);
        } catch (Throwable t) {
            return null;
        }
    }
}
