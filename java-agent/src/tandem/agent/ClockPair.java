package tandem.agent;

import java.time.Instant;

/**
 * The wall clock read between two System.nanoTime() (CLOCK_MONOTONIC) reads, the tightest bracket
 * of a few tries: a try preempted between its reads (a loaded machine) brackets milliseconds.
 * The monotonic time is the bracket's midpoint; the wall time is within half the bracket of it.
 */
final class ClockPair {
    private static final int TRIES = 5;

    final long wallNanos;
    final long monotonicNanos;
    final long bracketNanos;

    private ClockPair(long wallNanos, long monotonicNanos, long bracketNanos) {
        this.wallNanos = wallNanos;
        this.monotonicNanos = monotonicNanos;
        this.bracketNanos = bracketNanos;
    }

    static ClockPair read() {
        ClockPair best = null;
        for (int attempt = 0; attempt < TRIES; attempt++) {
            long before = System.nanoTime();
            Instant wall = Instant.now();
            long after = System.nanoTime();
            if (best == null || after - before < best.bracketNanos) {
                best = new ClockPair(wall.getEpochSecond() * 1_000_000_000L + wall.getNano(),
                        before + (after - before) / 2, after - before);
            }
        }
        return best;
    }

    /** Half the bracket, rounded up: how far the wall time may be from the monotonic one. */
    long errorNanos() {
        return bracketNanos / 2 + 1;
    }
}
