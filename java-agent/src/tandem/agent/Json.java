package tandem.agent;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import java.util.Map;

/** Just enough JSON for jvm.json (JDK classes only: the agent has no libraries). */
final class Json {
    private Json() {}

    /**
     * Writes through a temporary file and a rename, so a reader never sees half a file; with
     * a java.io stream, which (unlike Files.write's channel) survives an interrupted thread.
     */
    static void writeAtomically(Path file, Map<String, ?> object) throws IOException {
        Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
        PrivateFiles.createFile(tmp); // 0600 from the start, never through a link
        try (OutputStream out = new FileOutputStream(tmp.toFile())) {
            out.write((format(object) + "\n").getBytes(StandardCharsets.UTF_8));
        }
        Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    static String format(Object value) {
        StringBuilder out = new StringBuilder();
        append(out, value, "");
        return out.toString();
    }

    private static void append(StringBuilder out, Object value, String indent) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Integer || value instanceof Long) {
            out.append(value);
        } else if (value instanceof Number) {
            double d = ((Number) value).doubleValue();
            out.append(Double.isFinite(d) ? Double.toString(d) : "null");
        } else if (value instanceof Map) {
            String inner = indent + "  ";
            out.append("{");
            boolean first = true;
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                out.append(first ? "\n" : ",\n").append(inner);
                appendString(out, String.valueOf(entry.getKey()));
                out.append(": ");
                append(out, entry.getValue(), inner);
                first = false;
            }
            out.append(first ? "}" : "\n" + indent + "}");
        } else if (value instanceof List) {
            out.append("[");
            boolean first = true;
            for (Object item : (List<?>) value) {
                out.append(first ? "" : ", ");
                append(out, item, indent);
                first = false;
            }
            out.append("]");
        } else {
            appendString(out, value.toString());
        }
    }

    private static void appendString(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }
}
