package tandem.demo;

import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The Java half of tandem's built-in hybrid workload (`tandem demo`): background threads
 * that allocate steadily so the collector runs, and a "scoring" call that Python request
 * threads make through JPype, the way an inference server calls a JVM library.
 */
public final class Allocator {
    private static final AtomicBoolean running = new AtomicBoolean();
    private static final AtomicLong allocatedBytes = new AtomicLong();

    private Allocator() {}

    /** Start {@code threads} daemon threads, each allocating about {@code mbPerSecond} MB/s. */
    public static void start(int threads, int mbPerSecond) {
        if (!running.compareAndSet(false, true)) {
            return;
        }
        for (int i = 0; i < threads; i++) {
            Thread t = new Thread(() -> allocate(mbPerSecond), "tandem-demo-allocator-" + i);
            t.setDaemon(true);
            t.start();
        }
    }

    public static void stop() {
        running.set(false);
    }

    public static long allocatedBytes() {
        return allocatedBytes.get();
    }

    private static void allocate(int mbPerSecond) {
        // A window of live arrays makes some objects survive a young collection, so pauses
        // have real copying work; the rest is short-lived garbage.
        byte[][] survivors = new byte[512][];
        long bytesPerMilli = Math.max(1, (long) mbPerSecond * 1024 * 1024 / 1000);
        int slot = 0;
        while (running.get()) {
            long start = System.nanoTime();
            long done = 0;
            while (done < bytesPerMilli) {
                byte[] chunk = new byte[8 * 1024];
                chunk[slot & 1023] = (byte) slot;
                survivors[slot++ & 511] = chunk;
                done += chunk.length;
            }
            allocatedBytes.addAndGet(done);
            long spent = System.nanoTime() - start;
            if (spent < 1_000_000) {
                try {
                    Thread.sleep(0, (int) (1_000_000 - spent));
                } catch (InterruptedException e) {
                    return;
                }
            }
        }
    }

    /** The request path's Java call: a little numeric work on the caller's thread, allocating as it goes. */
    public static double score(double[] features) {
        double[] weights = new double[features.length];
        double sum = 0;
        for (int i = 0; i < features.length; i++) {
            weights[i] = Math.sin(i) * 0.5;
            sum += weights[i] * features[i];
        }
        return sum;
    }
}
