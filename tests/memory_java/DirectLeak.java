import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/**
 * A JVM alone that keeps DirectByteBuffers at a known rate: java DirectLeak.java RATE_MB_S SECONDS.
 * Warms up for 3 s, then leaks; its last line is `leaked BYTES in SECONDS s` (its own count).
 */
public class DirectLeak {
    public static void main(String[] args) throws Exception {
        double rate = Double.parseDouble(args[0]) * 1e6;
        double seconds = Double.parseDouble(args[1]);
        List<ByteBuffer> kept = new ArrayList<>();
        List<byte[]> garbage = new ArrayList<>();
        long warmUpEnd = System.nanoTime() + 3_000_000_000L;
        while (System.nanoTime() < warmUpEnd) {
            garbage.add(new byte[16384]);
            if (garbage.size() > 100) {
                garbage.clear();
            }
            Thread.sleep(5);
        }
        long begin = System.nanoTime();
        long leaked = 0;
        while (System.nanoTime() - begin < seconds * 1e9) {
            double due = rate * (System.nanoTime() - begin) / 1e9;
            while (leaked < due) {
                kept.add(ByteBuffer.allocateDirect(1 << 20));
                leaked += 1 << 20;
            }
            Thread.sleep(50);
        }
        System.out.printf("leaked %d in %.3f s%n", leaked, (System.nanoTime() - begin) / 1e9);
    }
}
