package tandem.ingest;

import java.util.Arrays;

/** A growable long column of the readers (PauseReader, MemoryReader), handed to Python whole. */
final class LongList {
    long[] array = new long[1024];
    int size;

    void add(long value) {
        if (size == array.length) {
            array = Arrays.copyOf(array, size * 2);
        }
        array[size++] = value;
    }

    long get(int i) { return array[i]; }
    void set(int i, long value) { array[i] = value; }
    long[] toArray() { return Arrays.copyOf(array, size); }
}
