package tandem.agent;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.FileAttribute;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;

/**
 * A session is private to the user who records it (docs/session.md, "Who can read a
 * session"): directories 0700, files 0600, whatever the host's umask. JFR creates its
 * repository and chunks with the JVM's umask, so the agent tightens them after the fact
 * ({@link #tighten}); they sit inside a 0700 directory from the start, so nobody else can
 * reach them meanwhile.
 */
final class PrivateFiles {
    private PrivateFiles() {}

    static final Set<PosixFilePermission> DIRECTORY = PosixFilePermissions.fromString("rwx------");
    static final Set<PosixFilePermission> FILE = PosixFilePermissions.fromString("rw-------");
    static final FileAttribute<Set<PosixFilePermission>> FILE_ATTRIBUTE = PosixFilePermissions.asFileAttribute(FILE);

    /**
     * Creates `dir` 0700, or accepts it if it is a real directory (not a symbolic link) owned
     * by this process's user; anything else (another user's directory, a link planted where
     * the session goes) is refused rather than written into.
     */
    static Path directory(Path dir) throws IOException {
        try {
            Files.createDirectory(dir, PosixFilePermissions.asFileAttribute(DIRECTORY));
            return dir;
        } catch (FileAlreadyExistsException exists) {
            BasicFileAttributes attributes = Files.readAttributes(dir, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            if (!attributes.isDirectory()) {
                throw new IOException(dir + " exists and is not a directory (a symbolic link?); refusing to write into it");
            }
            int owner = (Integer) Files.getAttribute(dir, "unix:uid", LinkOption.NOFOLLOW_LINKS);
            if (owner != myUid()) {
                throw new IOException(dir + " belongs to another user (uid " + owner + "); refusing to write into it");
            }
            Files.setPosixFilePermissions(dir, DIRECTORY);
            return dir;
        }
    }

    /** Creates an empty file 0600 (replacing one that was there; never through a link). */
    static void createFile(Path file) throws IOException {
        Files.deleteIfExists(file);
        Files.createFile(file, FILE_ATTRIBUTE);
    }

    /** `directory` for `dir` and each missing parent up to an existing one (parents made 0700 too). */
    static Path directories(Path dir) throws IOException {
        Path parent = dir.toAbsolutePath().getParent();
        if (parent != null && !Files.exists(parent, LinkOption.NOFOLLOW_LINKS)) {
            directories(parent);
        }
        return directory(dir);
    }

    /** Every file under `root` 0600, every directory 0700 (symbolic links are not followed). */
    static void tighten(Path root) {
        if (!Files.isDirectory(root, LinkOption.NOFOLLOW_LINKS)) {
            return;
        }
        try {
            Files.walkFileTree(root, new SimpleFileVisitor<>() {
                @Override
                public FileVisitResult preVisitDirectory(Path dir, BasicFileAttributes attrs) {
                    set(dir, DIRECTORY);
                    return FileVisitResult.CONTINUE;
                }

                @Override
                public FileVisitResult visitFile(Path file, BasicFileAttributes attrs) {
                    if (attrs.isRegularFile()) {
                        set(file, FILE);
                    }
                    return FileVisitResult.CONTINUE;
                }

                @Override
                public FileVisitResult visitFileFailed(Path file, IOException e) {
                    return FileVisitResult.CONTINUE; // JFR removed it meanwhile
                }
            });
        } catch (IOException | RuntimeException e) {
            // files changing while we walk: the next pass gets them
        }
    }

    static void set(Path path, Set<PosixFilePermission> permissions) {
        try {
            if (!Files.getPosixFilePermissions(path, LinkOption.NOFOLLOW_LINKS).equals(permissions)) {
                Files.setPosixFilePermissions(path, permissions);
            }
        } catch (IOException | RuntimeException e) {
            // gone, or not ours: nothing to tighten
        }
    }

    private static int myUid() throws IOException {
        // /proc/self belongs to the process's effective user.
        return (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid");
    }
}
