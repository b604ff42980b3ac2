/* tandem attach for a running CPython: the library loaded into the target.
 *
 * Its constructor runs when the library is loaded (by pyinjector's remote dlopen, or by
 * gdb's call of dlopen as a fallback). It only starts a detached thread and returns at
 * once; the thread takes the GIL as any other thread would (PyGILState_Ensure), runs a
 * Python file, releases the GIL and exits, so no code of ours runs inside whatever the
 * interrupted thread was doing, and no thread of ours stays.
 *
 * Which file: the one beside this library, named as the library with `.py` for `.so`
 * (tandem writes both under one fresh name per injection; the loaded path is found with
 * dladdr, so nothing is passed through the environment or the target's memory). A fresh
 * name per injection matters: a second dlopen of a path already loaded runs no constructor.
 *
 * No Python headers: the three C API functions are declared here (their ABI is the same on
 * every CPython 3), so one build serves every interpreter; they resolve against the
 * target's own libpython or executable when the library is loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int PyGILState_Ensure(void);
extern void PyGILState_Release(int state);
extern int PyRun_SimpleString(const char *command);

#define MAX_PATH_CHARS 1000

static void *run(void *path) {
    char command[8 * MAX_PATH_CHARS + 256];
    /* exec() of the file's text: PyRun_SimpleFile would need a FILE* of the target's libc.
     * The path is passed as raw bytes through a bytes literal of hex escapes, so no quote or
     * backslash in it can end the literal. */
    char literal[4 * MAX_PATH_CHARS + 1];
    size_t n = 0;
    for (const unsigned char *c = path; *c; c++) n += (size_t)sprintf(literal + n, "\\x%02x", *c);
    literal[n] = '\0';
    snprintf(command, sizeof command,
             "exec(compile(open(b'%s').read(), b'%s'.decode(errors='replace'), 'exec'), {'__name__': '__tandem_attach__'})",
             literal, literal);
    int state = PyGILState_Ensure();
    PyRun_SimpleString(command);
    PyGILState_Release(state);
    free(path);
    return NULL;
}

__attribute__((constructor)) static void tandem_inject_start(void) {
    Dl_info self;
    if (!dladdr((void *)tandem_inject_start, &self) || self.dli_fname == NULL) return;
    size_t len = strlen(self.dli_fname);
    if (len < 4 || len > MAX_PATH_CHARS || strcmp(self.dli_fname + len - 3, ".so") != 0) return;
    char *script = strdup(self.dli_fname);
    if (script == NULL) return;
    memcpy(script + len - 3, ".py", 3);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attr, run, script) != 0) free(script);
    pthread_attr_destroy(&attr);
}
