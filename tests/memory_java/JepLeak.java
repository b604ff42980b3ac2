import jep.Interpreter;
import jep.SharedInterpreter;

/**
 * A Java service running tests/memory_leak_program.py in Python through Jep, as Jep's users
 * embed Python (nothing for tandem): java JepLeak KIND RATE_MB_S SECONDS PROGRAM.
 */
public class JepLeak {
    public static void main(String[] args) throws Exception {
        try (Interpreter python = new SharedInterpreter()) {
            python.set("leak_args", new String[] {args[3], args[0], args[1], args[2]});
            python.exec("import sys; sys.argv = list(leak_args)");
            python.runScript(args[3]);
        }
    }
}
