package tandem.ingest;

import java.util.Arrays;

/** A growable int column of the readers; FILL: what a row not set holds (PauseReader's Rows). */
final class IntList {
    final int fill;
    int[] array = new int[1024];
    int size;

    IntList(int fill) { this.fill = fill; }

    void add(int value) {
        if (size == array.length) {
            array = Arrays.copyOf(array, size * 2);
        }
        array[size++] = value;
    }

    int get(int i) { return array[i]; }
    void set(int i, int value) { array[i] = value; }
    int[] toArray() { return Arrays.copyOf(array, size); }
}
