package tandem.ingest;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
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
    public static final String CLOCK_SYNC = "tandem.ClockSync";

    private final Map<String, List<String[]>> fields = new HashMap<>();  // type -> {column, field}
    private final Map<String, Boolean> atGc = new HashMap<>();

    private final Map<String, Integer> columnCodes = new HashMap<>();
    private final List<String> columnNames = new ArrayList<>();
    private long[] ticks = new long[1024];
    private int[] columns = new int[1024];
    private double[] values = new double[1024];
    private boolean[] afterGc = new boolean[1024];
    private int size;
    private long[] syncTicks = new long[64];
    private long[] syncMono = new long[64];
    private int syncSize;

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
            stream.onEvent(CLOCK_SYNC, this::clockSync);
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
        if (syncSize == syncTicks.length) {
            syncTicks = Arrays.copyOf(syncTicks, 2 * syncSize);
            syncMono = Arrays.copyOf(syncMono, 2 * syncSize);
        }
        syncTicks[syncSize] = event.getLong("startTime");
        syncMono[syncSize++] = event.getLong("monotonicNanos");
    }

    private void add(long at, String column, double value, boolean after) {
        if (size == ticks.length) {
            int grown = 2 * size;
            ticks = Arrays.copyOf(ticks, grown);
            columns = Arrays.copyOf(columns, grown);
            values = Arrays.copyOf(values, grown);
            afterGc = Arrays.copyOf(afterGc, grown);
        }
        Integer code = columnCodes.get(column);
        if (code == null) {
            code = columnNames.size();
            columnCodes.put(column, code);
            columnNames.add(column);
        }
        ticks[size] = at;
        columns[size] = code;
        values[size] = value;
        afterGc[size++] = after;
    }

    // ---- the result, taken by Python once the read is done ----

    public long[] ticks() {
        return Arrays.copyOf(ticks, size);
    }

    /** Each row's column, an index into {@link #columnNames}. */
    public int[] columns() {
        return Arrays.copyOf(columns, size);
    }

    public String[] columnNames() {
        return columnNames.toArray(new String[0]);
    }

    public double[] values() {
        return Arrays.copyOf(values, size);
    }

    public boolean[] afterGc() {
        return Arrays.copyOf(afterGc, size);
    }

    public long[] syncTicks() {
        return Arrays.copyOf(syncTicks, syncSize);
    }

    public long[] syncMono() {
        return Arrays.copyOf(syncMono, syncSize);
    }
}
