package tandem.ingest;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/** Strings to dense int codes (a column of the readers holds the codes); null is -1. */
final class Dictionary {
    private final Map<String, Integer> codes = new HashMap<>();
    private final List<String> values = new ArrayList<>();

    int code(String value) {
        if (value == null) {
            return -1;
        }
        Integer code = codes.get(value);
        if (code == null) {
            code = values.size();
            codes.put(value, code);
            values.add(value);
        }
        return code;
    }

    String[] toArray() { return values.toArray(new String[0]); }
}
