package tandem.agent;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.HashMap;
import java.util.Map;
import tandem.jfr.PauseKinds;

/**
 * The writer of a JVM pause ring: the shared-memory ring of docs/ring.md (version 2), record
 * type 2 (64-byte pause records), one lane, written by one thread at a time.
 *
 * <p>The lane protocol is the spec's "Java writer": plain stores for the fields between a
 * seqlock reset of {@code seq} (opaque store + release fence) and the release stores of
 * {@code seq} and {@code head}. All methods are {@code synchronized}: in normal operation only
 * the RecordingStream's callback thread calls them (the lock is never contended); the lock
 * only hands the writer over to the closing thread with a happens-before edge.
 *
 * <p>No drain thread runs in the JVM (the disk recording is the durable copy), so nothing
 * else would ever move {@code tail}: the writer retires the oldest position itself before it
 * reuses its slot (docs/ring.md, "Java writer"). The ring therefore never fills; a live
 * reader that falls more than a lane behind counts the overwritten records as missed.
 * {@code dropped} counts the pauses the writer was given but could not write (the ring was
 * already closed, or the caller gave up on them, see {@link #drop}).
 */
final class PauseRing {
    // Record kinds: tandem.jfr.PauseKinds, the offline reader's numbering too.
    static final int KIND_SAFEPOINT = PauseKinds.SAFEPOINT;
    static final int KIND_GC_PAUSE = PauseKinds.GC_PAUSE;
    static final int KIND_GC = PauseKinds.GC;
    static final int KIND_VM_OPERATION = PauseKinds.VM_OPERATION;
    /** Not a pause: a System.gc() call (jdk.SystemGC), which a reader matches to the pauses inside it. */
    static final int KIND_SYSTEM_GC_CALL = PauseKinds.SYSTEM_GC_CALL;
    /** aux bit: a safepoint whose End never came; end_ns is the end of its Begin (a lower bound). */
    static final long AUX_UNMATCHED = 1;

    static final int VERSION = 2;
    static final int HEADER_SIZE = 4096;
    static final int LANE_STRIDE = 512;
    static final int RECORD_SIZE = 64;
    static final int RECORDS_OFFSET = 8192; // header page + the lane table of one lane, page-rounded
    private static final int FILE_KIND_RING = 1;
    private static final int RECORD_TYPE_PAUSE = 2;
    private static final int CLOCK_MONOTONIC = 1;
    private static final int STATE_CLOSED = 2;
    // Byte offsets of docs/ring.md's tables (tests/test_ring_layout.py holds them to it).
    // Header:
    static final int OFF_MAGIC = 0;
    static final int OFF_VERSION = 8;
    static final int OFF_HEADER_SIZE = 12;
    static final int OFF_FILE_KIND = 16;
    static final int OFF_RECORD_TYPE = 20;
    static final int OFF_RECORD_SIZE = 24;
    static final int OFF_LANE_CAPACITY = 28;
    static final int OFF_PRODUCER_PID = 32;
    static final int OFF_CLOCK_ID = 36;
    static final int OFF_SYNC_REALTIME_NS = 40;
    static final int OFF_SYNC_MONOTONIC_NS = 48;
    static final int OFF_SYNC_UNCERTAINTY_NS = 56;
    static final int OFF_BOOT_ID = 64;
    static final int OFF_RUNTIME_VERSION = 104;
    static final int OFF_BACKEND = 136;
    static final int OFF_LANE_COUNT = 168;
    static final int OFF_LANE_STRIDE = 172;
    static final int OFF_RECORDS_OFFSET = 176;
    static final int OFF_STATE = 1408;
    static final int OFF_NAMES_USED = 2048;
    static final int NAME_TABLE_START = 2112;
    // Lane table entry (lane 0 at HEADER_SIZE):
    static final int LANE_OFF_HEAD = 0;
    static final int LANE_OFF_TAIL = 128;
    static final int LANE_OFF_DROPPED = 256;
    // Pause record:
    static final int REC_OFF_SEQ = 0;
    static final int REC_OFF_START_NS = 8;
    static final int REC_OFF_TID = 16;
    static final int REC_OFF_KIND = 20;
    static final int REC_OFF_LANE = 22;
    static final int REC_OFF_AUX = 24;
    static final int REC_OFF_END_NS = 32;
    static final int REC_OFF_ID = 40;
    static final int REC_OFF_NAME_CODE = 48;
    static final int REC_OFF_REQUESTER = 52;
    static final int REC_OFF_CAUSE_CODE = 56;
    private static final int HEAD = HEADER_SIZE + LANE_OFF_HEAD; // lane 0
    private static final int TAIL = HEADER_SIZE + LANE_OFF_TAIL;
    private static final int DROPPED = HEADER_SIZE + LANE_OFF_DROPPED;
    private static final int STATE = OFF_STATE;
    private static final int NAMES_USED = OFF_NAMES_USED;
    private static final int NAMES = NAME_TABLE_START;

    private static final VarHandle LONGS = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle INTS = MethodHandles.byteBufferViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

    private final Path path;
    private final ByteBuffer buf;
    private final int capacity;
    private final Map<String, Integer> nameCodes = new HashMap<>();
    private long tailCache;
    private int namesUsed;
    private boolean closed;
    private long written;
    private long namesRefused;

    private PauseRing(Path path, ByteBuffer buf, int capacity) {
        this.path = path;
        this.buf = buf;
        this.capacity = capacity;
    }

    /**
     * Creates PATH (mode 0600, fails if it exists) as docs/ring.md "Creating a ring" says: a
     * building name, the whole size written (no sparse file), every page stored to once,
     * the header filled, then link() to the final name.
     */
    static PauseRing create(Path path, int capacity, String runtimeVersion, String backend) throws IOException {
        if (capacity < 2 || Integer.bitCount(capacity) != 1 || capacity > (1 << 24)) {
            throw new IllegalArgumentException("pause ring capacity " + capacity + " is not a power of two in [2, 2^24]");
        }
        long pid = ProcessHandle.current().pid();
        Path building = path.resolveSibling(path.getFileName() + ".building-" + pid);
        int size = RECORDS_OFFSET + capacity * RECORD_SIZE;
        Files.createFile(building, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
        try {
            ByteBuffer buf;
            try (FileChannel channel = FileChannel.open(building, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
                ByteBuffer zeros = ByteBuffer.allocate(1 << 16);
                for (long at = 0; at < size; ) {
                    zeros.clear().limit((int) Math.min(zeros.capacity(), size - at));
                    at += channel.write(zeros, at);
                }
                buf = channel.map(FileChannel.MapMode.READ_WRITE, 0, size).order(ByteOrder.LITTLE_ENDIAN);
            } // the mapping outlives the channel
            for (int page = 0; page < size; page += 4096) {
                buf.put(page, (byte) 0); // first write faults here, not on the writer's path
            }
            PauseRing ring = new PauseRing(path, buf, capacity);
            ring.writeHeader(pid, runtimeVersion, backend);
            Files.createLink(path, building); // fails if PATH exists, like O_EXCL
            return ring;
        } finally {
            Files.deleteIfExists(building);
        }
    }

    private void writeHeader(long pid, String runtimeVersion, String backend) {
        buf.put(OFF_MAGIC, "TNDMRING".getBytes(StandardCharsets.US_ASCII));
        buf.putInt(OFF_VERSION, VERSION);
        buf.putInt(OFF_HEADER_SIZE, HEADER_SIZE);
        buf.putInt(OFF_FILE_KIND, FILE_KIND_RING);
        buf.putInt(OFF_RECORD_TYPE, RECORD_TYPE_PAUSE);
        buf.putInt(OFF_RECORD_SIZE, RECORD_SIZE);
        buf.putInt(OFF_LANE_CAPACITY, capacity);
        buf.putInt(OFF_PRODUCER_PID, (int) pid);
        buf.putInt(OFF_CLOCK_ID, CLOCK_MONOTONIC);
        ClockPair pair = ClockPair.read();
        buf.putLong(OFF_SYNC_REALTIME_NS, pair.wallNanos);
        buf.putLong(OFF_SYNC_MONOTONIC_NS, pair.monotonicNanos);
        buf.putLong(OFF_SYNC_UNCERTAINTY_NS, pair.bracketNanos);
        putText(OFF_BOOT_ID, OFF_RUNTIME_VERSION - OFF_BOOT_ID, bootId());
        putText(OFF_RUNTIME_VERSION, OFF_BACKEND - OFF_RUNTIME_VERSION, runtimeVersion);
        putText(OFF_BACKEND, 32, backend);
        buf.putInt(OFF_LANE_COUNT, 1);
        buf.putInt(OFF_LANE_STRIDE, LANE_STRIDE);
        buf.putLong(OFF_RECORDS_OFFSET, RECORDS_OFFSET);
    }

    /** ASCII text, NUL-padded, truncated to leave at least one NUL; unprintable characters become '?'. */
    private void putText(int offset, int size, String text) {
        if (text == null) {
            return;
        }
        int n = Math.min(text.length(), size - 1);
        for (int i = 0; i < n; i++) {
            char c = text.charAt(i);
            buf.put(offset + i, (byte) (c >= 0x20 && c <= 0x7E ? c : '?'));
        }
    }

    private static String bootId() {
        try {
            String id = Files.readString(Path.of("/proc/sys/kernel/random/boot_id"), StandardCharsets.US_ASCII).strip();
            return id.matches("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}") ? id : "";
        } catch (IOException | RuntimeException e) {
            return ""; // allowed: "or empty"
        }
    }

    /**
     * Writes one pause record (times in CLOCK_MONOTONIC ns). Never blocks, never fails: a
     * closed ring counts the pause as dropped.
     */
    synchronized void write(int kind, long startNs, long endNs, long tid, long id, String name, long aux, long requester,
                            String cause) {
        if (closed) {
            countDrop();
            return;
        }
        int nameCode = nameCode(name); // published (release) before the record that uses it
        int causeCode = nameCode(cause);
        long pos = (long) LONGS.getOpaque(buf, HEAD); // only we write it
        if (pos - tailCache >= capacity) {
            // No drain in the JVM: retire the oldest position ourselves, so the ring never
            // fills. External readers never read tail; it keeps tail <= head <= tail + cap.
            tailCache = pos + 1 - capacity;
            LONGS.setRelease(buf, TAIL, tailCache);
        }
        int at = RECORDS_OFFSET + (int) (pos & (capacity - 1)) * RECORD_SIZE;
        LONGS.setOpaque(buf, at + REC_OFF_SEQ, 0L); // seqlock: being rewritten
        VarHandle.releaseFence();      // ...visible before any new field value
        buf.putLong(at + REC_OFF_START_NS, startNs);
        buf.putInt(at + REC_OFF_TID, osThread(tid));
        buf.putShort(at + REC_OFF_KIND, (short) kind);
        buf.putShort(at + REC_OFF_LANE, (short) 0);
        buf.putLong(at + REC_OFF_AUX, aux);
        buf.putLong(at + REC_OFF_END_NS, endNs);
        buf.putLong(at + REC_OFF_ID, id);
        buf.putInt(at + REC_OFF_NAME_CODE, nameCode);
        buf.putInt(at + REC_OFF_REQUESTER, osThread(requester));
        buf.putInt(at + REC_OFF_CAUSE_CODE, causeCode);
        buf.putInt(at + REC_OFF_CAUSE_CODE + 4, 0); // reserved to the end of the record
        LONGS.setRelease(buf, at + REC_OFF_SEQ, pos + 1);   // commit the slot
        LONGS.setRelease(buf, HEAD, pos + 1); // publish head
        written++;
    }

    private static int osThread(long tid) {
        return tid > 0 && tid <= 0xFFFF_FFFFL ? (int) tid : 0;
    }

    /** Counts one pause the caller could not hand over (e.g. its time could not be converted). */
    synchronized void drop() {
        countDrop();
    }

    private void countDrop() {
        LONGS.setRelease(buf, DROPPED, (long) LONGS.getOpaque(buf, DROPPED) + 1);
    }

    /** 1 + the name's offset in the header's name table, appended on first use; 0 if none or no room. */
    private int nameCode(String name) {
        if (name == null || name.isEmpty()) {
            return 0;
        }
        Integer known = nameCodes.get(name);
        if (known != null) {
            return known;
        }
        byte[] bytes = name.replace('\0', ' ').getBytes(StandardCharsets.UTF_8);
        int code = 0;
        if (NAMES + namesUsed + bytes.length + 1 <= HEADER_SIZE) {
            buf.put(NAMES + namesUsed, bytes); // the NUL after it is already there (zero-filled)
            code = 1 + namesUsed;
            namesUsed += bytes.length + 1;
            INTS.setRelease(buf, NAMES_USED, namesUsed);
        } else {
            namesRefused++;
        }
        nameCodes.put(name, code);
        return code;
    }

    /** Marks the ring closed by its producer (state bit 1), after the last record. Idempotent. */
    synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        INTS.setRelease(buf, STATE, (int) INTS.getOpaque(buf, STATE) | STATE_CLOSED);
    }

    synchronized long written() { return written; }
    synchronized long dropped() { return (long) LONGS.getOpaque(buf, DROPPED); }
    synchronized long namesRefused() { return namesRefused; }
    int capacity() { return capacity; }
    Path path() { return path; }
}
