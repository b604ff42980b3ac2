package tandem.agent;

import java.lang.management.ManagementFactory;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.management.MBeanServer;
import javax.management.ObjectName;

import com.sun.management.HotSpotDiagnosticMXBean;

import jdk.jfr.Category;
import jdk.jfr.DataAmount;
import jdk.jfr.Description;
import jdk.jfr.Event;
import jdk.jfr.EventType;
import jdk.jfr.FlightRecorder;
import jdk.jfr.Label;
import jdk.jfr.Name;
import jdk.jfr.StackTrace;

/**
 * Native Memory Tracking's summary once a second on JDKs without JFR's own NMT events
 * (jdk.NativeMemoryUsage and jdk.NativeMemoryUsageTotal came in JDK 20): the agent reads
 * {@code VM.native_memory summary} through the DiagnosticCommand MBean and commits the same
 * fields under tandem's names. NMT itself can only be turned on at JVM start
 * ({@code -XX:NativeMemoryTracking=summary}, what {@code tandem record --native-memory} adds).
 */
final class NativeMemoryEvents {
    static final String USAGE = "tandem.NativeMemoryUsage";
    static final String TOTAL = "tandem.NativeMemoryUsageTotal";

    // JDK 17's summary: "-   Java Heap (reserved=251904KB, committed=16384KB)" per category
    // and "Total: reserved=1389580KB, committed=85844KB".
    private static final Pattern CATEGORY = Pattern.compile("^-\\s+(.+?) \\(reserved=(\\d+)KB, committed=(\\d+)KB\\)", Pattern.MULTILINE);
    private static final Pattern TOTAL_LINE = Pattern.compile("^Total: reserved=(\\d+)KB, committed=(\\d+)KB", Pattern.MULTILINE);

    @Name(USAGE)
    @Label("tandem native memory usage")
    @Category("tandem")
    @Description("NMT's summary per category (VM.native_memory summary), for JDKs without jdk.NativeMemoryUsage")
    @StackTrace(false)
    static final class Usage extends Event {
        @Label("Memory Type")
        String type;
        @Label("Reserved")
        @DataAmount(DataAmount.BYTES)
        long reserved;
        @Label("Committed")
        @DataAmount(DataAmount.BYTES)
        long committed;
    }

    @Name(TOTAL)
    @Label("tandem native memory usage total")
    @Category("tandem")
    @Description("NMT's summary total (VM.native_memory summary), for JDKs without jdk.NativeMemoryUsageTotal")
    @StackTrace(false)
    static final class Total extends Event {
        @Label("Reserved")
        @DataAmount(DataAmount.BYTES)
        long reserved;
        @Label("Committed")
        @DataAmount(DataAmount.BYTES)
        long committed;
    }

    private static boolean registered;

    private NativeMemoryEvents() {
    }

    /**
     * Registers the periodic reading when NMT is on and the JDK lacks JFR's own events; says why
     * not otherwise (null when registered), for jvm.json.
     */
    static synchronized String registerIfNeeded() {
        if (registered) {
            return null;
        }
        String tracking;
        try {
            tracking = ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class).getVMOption("NativeMemoryTracking").getValue();
        } catch (RuntimeException e) {
            return "no NativeMemoryTracking option: " + Agent.describe(e);
        }
        if (tracking == null || tracking.equals("off")) {
            return "NMT off";
        }
        for (EventType type : FlightRecorder.getFlightRecorder().getEventTypes()) {
            if (type.getName().equals("jdk.NativeMemoryUsage")) {
                return "JFR's own jdk.NativeMemoryUsage";
            }
        }
        FlightRecorder.addPeriodicEvent(Usage.class, NativeMemoryEvents::commitSummary);
        registered = true;
        return null;
    }

    /** One summary: a Usage event per category and a Total event (both stamped now). */
    private static void commitSummary() {
        String summary;
        try {
            MBeanServer server = ManagementFactory.getPlatformMBeanServer();
            summary = (String) server.invoke(new ObjectName("com.sun.management:type=DiagnosticCommand"), "vmNativeMemory",
                    new Object[] {new String[] {"summary"}}, new String[] {String[].class.getName()});
        } catch (Exception e) {
            return; // NMT shutting down with the JVM: nothing to read
        }
        Matcher category = CATEGORY.matcher(summary);
        while (category.find()) {
            Usage usage = new Usage();
            usage.type = category.group(1).trim();
            usage.reserved = Long.parseLong(category.group(2)) * 1024;
            usage.committed = Long.parseLong(category.group(3)) * 1024;
            usage.commit();
        }
        Matcher total = TOTAL_LINE.matcher(summary);
        if (total.find()) {
            Total event = new Total();
            event.reserved = Long.parseLong(total.group(1)) * 1024;
            event.committed = Long.parseLong(total.group(2)) * 1024;
            event.commit();
        }
    }
}
