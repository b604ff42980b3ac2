package tandem.jfr;

/**
 * The kinds of pause tandem reads from JFR (docs/pauses.md, "kind"), one numbering for both of
 * its readers: the offline reader's rows (tandem.ingest.PauseReader) and the live stream's
 * records in pauses.ring (tandem.agent.PauseRing, docs/ring.md), whose codes these are.
 */
public final class PauseKinds {
    private PauseKinds() {}

    /** A stop of the world from jdk.SafepointBegin to jdk.SafepointEnd, named by its VM operation. */
    public static final int SAFEPOINT = 1;
    /** jdk.GCPhasePause. */
    public static final int GC_PAUSE = 2;
    /** jdk.GarbageCollection. */
    public static final int GC = 3;
    /** jdk.ExecuteVMOperation not run at a safepoint, or run at one whose Begin was not recorded. */
    public static final int VM_OPERATION = 4;
    /** Not a pause: a System.gc() call (jdk.SystemGC), the live ring's record of who asked. */
    public static final int SYSTEM_GC_CALL = 5;
    /** jdk.Compilation (the offline reader only). */
    public static final int COMPILATION = 6;
    /** jdk.Deoptimization (the offline reader only). */
    public static final int DEOPTIMIZATION = 7;

    /** Names by code: the `kind` column's values (index 0 is no kind). */
    public static final String[] NAMES = {
        "", "safepoint", "gc_pause", "gc", "vm_operation", "system_gc_call", "compilation", "deoptimization",
    };
}
