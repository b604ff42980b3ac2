package tandem.agent;

import java.io.FileInputStream;
import java.io.FileNotFoundException;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.RandomAccessFile;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/**
 * Hard links to the chunk files of JFR's disk repository, so that JFR's clean-up at exit
 * (it deletes the repository) cannot take the data when its own dump fails.
 *
 * It does fail in practice: JPype's shutdown interrupts every non-daemon thread, JFR's
 * shutdown hook among them, and an interrupted FileChannel closes; a plain
 * -XX:StartFlightRecording:filename=... under JPype wrote an empty file in 2 of 3 runs.
 * A link shares the chunk's inode, so it also sees JFR finish the last chunk in place.
 * Concatenated chunk files are a valid recording (JFR's own dump is that concatenation).
 */
final class ChunkKeeper {
    private final Path repository;
    private final Path kept;
    private boolean linksUnsupported;
    private String newestLinked; // name of the newest chunk linked so far
    private static final long FILE_STATE_OFFSET = 64;

    ChunkKeeper(Path repository, Path kept) {
        this.repository = repository;
        this.kept = kept;
    }

    /**
     * Links every chunk newer than the last one linked (names are start times): a link the
     * session's keeper removed once it packed the chunk is not made again. Cheap; called once
     * a second and at exit.
     */
    synchronized void keepNewChunks() {
        if (linksUnsupported) {
            return;
        }
        for (Path chunk : chunksIn(repository)) {
            String name = chunk.getFileName().toString();
            if (newestLinked != null && name.compareTo(newestLinked) < 0) {
                continue;
            }
            try {
                if (!Files.isDirectory(kept)) {
                    PrivateFiles.directory(kept);
                }
                PrivateFiles.set(chunk, PrivateFiles.FILE); // the link shares the chunk's mode
                Files.createLink(kept.resolve(chunk.getFileName()), chunk);
                newestLinked = name;
            } catch (FileAlreadyExistsException known) {
                newestLinked = name; // linked before
            } catch (UnsupportedOperationException | IOException e) {
                if (Files.exists(chunk)) { // else JFR removed it meanwhile, nothing lost
                    linksUnsupported = true;
                    Agent.warn("cannot keep links to JFR chunks in " + kept + " (" + Agent.describe(e) + "); "
                            + "the recording depends on JFR's own dump at exit");
                    return;
                }
            }
        }
    }

    /**
     * The flight recorder (maxsize/maxage): JFR deletes its oldest chunks as it records; drop our
     * links to them too, or they would keep every chunk on disk. Only chunks older than the oldest
     * one JFR still has, and never while the repository is empty (JFR's clean-up at exit clears
     * it: then the links are the recording).
     */
    synchronized void forgetRotatedChunks() {
        List<Path> current = chunksIn(repository);
        if (current.isEmpty()) {
            return;
        }
        String oldest = current.get(0).getFileName().toString();
        for (Path chunk : chunksIn(kept)) {
            if (chunk.getFileName().toString().compareTo(oldest) < 0) {
                try {
                    Files.deleteIfExists(chunk);
                } catch (IOException ignored) {
                    // tried again next second
                }
            }
        }
    }

    /** False once links to chunks turned out impossible here (then JFR's own dump must write the recording). */
    synchronized boolean keeping() {
        return !linksUnsupported;
    }

    /** True when every kept chunk is finished (file state byte 0, docs/pauses.md "Chunks"). */
    synchronized boolean allKeptFinished() {
        List<Path> chunks = chunksIn(kept);
        for (Path chunk : chunks) {
            // RandomAccessFile, not a channel: an interrupt (JPype at shutdown) does not close it.
            try (RandomAccessFile file = new RandomAccessFile(chunk.toFile(), "r")) {
                file.seek(FILE_STATE_OFFSET);
                if (file.read() != 0) {
                    return false;
                }
            } catch (IOException e) {
                return false;
            }
        }
        return !chunks.isEmpty();
    }

    /** True once JFR has removed its chunk files (its shutdown clean-up ran). */
    boolean repositoryCleared() {
        return chunksIn(repository).isEmpty();
    }

    boolean hasChunks() {
        return !chunksIn(kept).isEmpty();
    }

    /**
     * Writes the kept chunks, in order, as one recording. A plain read/write loop on purpose:
     * FileChannel (and InputStream.transferTo, which uses it between files on JDK 21+) gives
     * up when the thread is interrupted, as JPype does to every thread at shutdown.
     */
    synchronized void writeRecording(Path destination) throws IOException {
        Path tmp = destination.resolveSibling(destination.getFileName() + ".tmp");
        PrivateFiles.createFile(tmp); // 0600 from the start, never through a link
        byte[] buffer = new byte[1 << 16];
        try (OutputStream out = new FileOutputStream(tmp.toFile())) {
            for (Path chunk : chunksIn(kept)) {
                InputStream in;
                try {
                    in = new FileInputStream(chunk.toFile());
                } catch (FileNotFoundException packed) {
                    continue; // the session's keeper packed it (packed/) and removed the link meanwhile
                }
                try (in) {
                    for (int n = in.read(buffer); n >= 0; n = in.read(buffer)) {
                        out.write(buffer, 0, n);
                    }
                }
            }
        }
        Files.move(tmp, destination, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    synchronized void discard() {
        for (Path chunk : chunksIn(kept)) {
            try {
                Files.deleteIfExists(chunk);
            } catch (IOException ignored) {
                // a leftover link only costs disk space
            }
        }
        try {
            Files.deleteIfExists(kept);
        } catch (IOException ignored) {
            // not empty: someone else's file
        }
    }

    /** The .jfr files under `directory` (JFR puts them one level down), sorted: names are start times. */
    private static List<Path> chunksIn(Path directory) {
        List<Path> chunks = new ArrayList<>();
        if (!Files.isDirectory(directory)) {
            return chunks;
        }
        try (Stream<Path> files = Files.walk(directory, 2)) {
            files.filter(p -> p.getFileName().toString().endsWith(".jfr") && Files.isRegularFile(p)).forEach(chunks::add);
        } catch (IOException | RuntimeException e) {
            // JFR deleting files while we look: what we saw is enough
        }
        chunks.sort((a, b) -> a.getFileName().toString().compareTo(b.getFileName().toString()));
        return chunks;
    }
}
