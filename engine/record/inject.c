/* tandem attach for a running CPython: the one function gdb calls inside the target.
 *
 * gdb stops the target at a safe point (the entry of an allocator: no allocator lock is
 * held there), loads this library and calls tandem_inject_run(PATH). That only starts a
 * detached thread and returns at once; the thread takes the GIL as any other thread would
 * (PyGILState_Ensure), runs the Python file PATH, releases the GIL and exits, so no code of
 * ours runs inside whatever the stopped thread was doing, and no thread of ours stays.
 *
 * No Python headers: the three C API functions are declared here (their ABI is the same on
 * every CPython 3), so one build serves every interpreter; they resolve against the
 * target's own libpython or executable when gdb loads this library. */
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

extern int PyGILState_Ensure(void);
extern void PyGILState_Release(int state);
extern int PyRun_SimpleString(const char *command);

static void *run(void *path) {
    char command[4200];
    /* exec() of the file's text: PyRun_SimpleFile would need a FILE* of the target's libc */
    snprintf(command, sizeof command, "exec(compile(open(%s).read(), %s, 'exec'), {'__name__': '__tandem_attach__'})",
             (char *)path, (char *)path);
    int state = PyGILState_Ensure();
    PyRun_SimpleString(command);
    PyGILState_Release(state);
    free(path);
    return NULL;
}

__attribute__((visibility("default"))) int tandem_inject_run(const char *quoted_path) {
    if (strlen(quoted_path) > 2000) return -1;
    char *copy = strdup(quoted_path);
    if (copy == NULL) return -1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, run, copy);
    pthread_attr_destroy(&attr);
    if (rc != 0) free(copy);
    return rc;
}
