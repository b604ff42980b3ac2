package tandem.ingest;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import jdk.jfr.consumer.EventStream;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedObject;

/**
 * Reads the memory events of one JFR file into flat columns: a long table of (raw start
 * ticks, column, value, after GC) rows and the file's tandem.ClockSync samples.
 *
 * <p>Python (engine/memory/jvm.py) says which field of which event type makes which column
 * ({@link #field}), then calls {@link #readFile} once and takes the arrays: every event is
 * handled here, so the caller's GIL is free for the whole read (tandem live reads its JVMs'
 * memory beside the loop that correlates). The event types whose rows are computed, not read
 * from one field, are named here with what they make.
 */
public final class MemoryReader {
    /** One code heap's used bytes per event, column {@code jvm_code_cache:<heap>} (summed later). */
    public static final String CODE_CACHE = "jdk.CodeCacheStatistics";
    /** One NMT category's committed bytes per event, column {@code NMT_PREFIX + category}. */
    public static final String[] NMT_CATEGORIES = {"jdk.NativeMemoryUsage", "tandem.NativeMemoryUsage"};
    public static final String NMT_PREFIX = "nmt:";
    /**
     * G1's copying into the old generation: PLABs given out less what the copied objects used,
     * column {@code jvm_heap_gc_waste}. The unused tails stay in the heap's used bytes but hold
     * no live object (summed over the GCs by engine/memory/table.py).
     */
    public static final String G1_OLD_EVACUATION = "jdk.G1EvacuationOldStatistics";
    /** Which collector: a row {@code jvm_g1 = 1} when it is G1, whose side tables grow with its
     * committed heap (engine/memory/jvm.py estimates them). */
    public static final String GC_CONFIGURATION = "jdk.GCConfiguration";

    private final Map<String, List<String[]>> fields = new HashMap<>();  // type -> {column, field}
    private final Map<String, Boolean> atGc = new HashMap<>();

    // ---- the result: one row per value, columns as whole arrays; clock-sync samples ----
    private final Dictionary columnNames = new Dictionary();
    private final LongList ticks = new LongList();
    private final IntList columns = new IntList(-1);
    private final LongList values = new LongList();  // (every value is a long field or a difference of two)
    private final IntList afterGc = new IntList(0);
    private final LongList syncTicks = new LongList();
    private final LongList syncMonotonicNanos = new LongList();
    private final LongList syncSpanTicks = new LongList();

    /** Event TYPE's FIELD (a dotted path for a nested one) makes rows of COLUMN; AT_GC: the type
     * has a "when" field, Before GC or After GC. */
    public void field(String type, String column, String field, boolean atGcType) {
        fields.computeIfAbsent(type, t -> new ArrayList<>()).add(new String[] {column, field});
        atGc.put(type, atGcType);
    }

    /** Reads every event of PATH (finished chunks only: jdk.jfr waits for the rest of another). */
    public void readFile(String path) throws IOException {
        try (EventStream stream = EventStream.openFile(Path.of(path))) {
            for (Map.Entry<String, List<String[]>> entry : fields.entrySet()) {
                String[][] pairs = entry.getValue().toArray(new String[0][]);
                boolean whenField = atGc.get(entry.getKey());
                stream.onEvent(entry.getKey(), event -> fieldRows(event, pairs, whenField));
            }
            stream.onEvent(CODE_CACHE, this::codeCache);
            for (String type : NMT_CATEGORIES) {
                stream.onEvent(type, this::nmt);
            }
            stream.onEvent(G1_OLD_EVACUATION, this::oldEvacuation);
            stream.onEvent(GC_CONFIGURATION, this::gcConfiguration);
            stream.onEvent(PauseReader.CLOCK_SYNC, this::clockSync);
            stream.start();  // (in this thread, calling the handlers)
        }
    }

    private void fieldRows(RecordedEvent event, String[][] pairs, boolean whenField) {
        long at = event.getLong("startTime");
        boolean after = whenField && "After GC".equals(event.getString("when"));
        for (String[] pair : pairs) {
            if (event.hasField(pair[1])) {
                add(at, pair[0], event.getLong(pair[1]), after);
            }
        }
    }

    private void codeCache(RecordedEvent event) {
        long reserved = event.getLong("reservedTopAddress") - event.getLong("startAddress");
        add(event.getLong("startTime"), "jvm_code_cache:" + event.getString("codeBlobType"),
            reserved - event.getLong("unallocatedCapacity"), false);
    }

    private void nmt(RecordedEvent event) {
        add(event.getLong("startTime"), NMT_PREFIX + event.getString("type"), event.getLong("committed"), false);
    }

    private void oldEvacuation(RecordedEvent event) {
        RecordedObject stats = event.getValue("statistics");
        add(event.getLong("startTime"), "jvm_heap_gc_waste", stats.getLong("allocated") - stats.getLong("used"), true);
    }

    private void gcConfiguration(RecordedEvent event) {
        if ("G1New".equals(event.getString("youngCollector"))) {
            add(event.getLong("startTime"), "jvm_g1", 1, false);
        }
    }

    private void clockSync(RecordedEvent event) {
        syncTicks.add(event.getLong("startTime"));
        syncMonotonicNanos.add(event.getLong(PauseReader.CLOCK_SYNC_FIELD));
        syncSpanTicks.add(event.getLong("duration"));
    }

    private void add(long at, String column, long value, boolean after) {
        ticks.add(at);
        columns.add(columnNames.code(column));
        values.add(value);
        afterGc.add(after ? 1 : 0);
    }

    // ---- the result, taken by Python once the read is done ----

    public long[] ticks() { return ticks.toArray(); }
    /** Each row's column, an index into {@link #columnNames}. */
    public int[] columns() { return columns.toArray(); }
    public String[] columnNames() { return columnNames.toArray(); }
    public long[] values() { return values.toArray(); }
    /** 1: the row is of an event taken after a GC. */
    public int[] afterGc() { return afterGc.toArray(); }
    public long[] syncTicks() { return syncTicks.toArray(); }
    public long[] syncMonotonicNanos() { return syncMonotonicNanos.toArray(); }
    public long[] syncSpanTicks() { return syncSpanTicks.toArray(); }
}
