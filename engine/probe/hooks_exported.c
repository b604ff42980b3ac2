/* Exported backend: the GOT slots of PyEval_SaveThread/PyEval_RestoreThread in every
 * loaded object (docs/probe.md, "exported"). */
#define _GNU_SOURCE
#include "hooks_hot.h"

#include <dlfcn.h>
#include <stdio.h>

#include "symbols.h"

/* ---- exported backend: GOT slots of PyEval_SaveThread / PyEval_RestoreThread --------
 * Every loaded object's GOT slots bound to the two functions point at our hooks instead.
 * Objects loaded later (extension modules imported after start: under `tandem record`
 * that is nearly all of them, since the probe starts with the interpreter) are covered by
 * also taking over the GOT slots of dlopen: after a successful dlopen the same scan runs
 * again, which patches the new object's slots (slots already patched are skipped). */

typedef void *(*save_thread_fn)(void);
typedef void (*restore_thread_fn)(void *);
typedef void *(*dlopen_fn)(const char *, int);
static save_thread_fn real_save_thread;
static restore_thread_fn real_restore_thread;
static dlopen_fn real_dlopen;

HOT_CODE static void *save_thread_hook(void) {
#if PY_VERSION_HEX >= 0x030D0000
    tandem_stamp_drop(PyThreadState_GetUnchecked());  /* still current at PyEval_SaveThread's entry */
#else
    tandem_stamp_drop(_PyThreadState_UncheckedGet());
#endif
    return real_save_thread();
}

HOT_CODE static void restore_thread_hook(void *tstate) {
    take_entered();
    real_restore_thread(tstate);
    take_returned();
}

static int exported_installed;

static void *dlopen_hook(const char *file, int mode);

/* Patch every not yet patched slot of the three functions; got_mutex held. Returns the
 * slots of PyEval_SaveThread found in the interpreter's own object. */
static int patch_exported_slots(void) {
    object_range interpreter = interpreter_range();
    got_ctx save_ctx = {(void *)save_thread_hook, interpreter, 0, 0};
    got_ctx restore_ctx = {(void *)restore_thread_hook, {0, 0, 0}, 0, 0};
    got_ctx dlopen_ctx = {(void *)dlopen_hook, {0, 0, 0}, 0, 0};
    tandem_for_each_got_slot("PyEval_SaveThread", patch_slot, &save_ctx);
    tandem_for_each_got_slot("PyEval_RestoreThread", patch_slot, &restore_ctx);
    tandem_for_each_got_slot("dlopen", patch_slot, &dlopen_ctx);
    return save_ctx.interpreter_slots;
}

/* dlopen through a patched slot. The new object's slots are patched before it returns
 * to its caller, so the module's init function already goes through the hooks. (dlopen
 * sees this library as its caller: that only matters for a relative name searched with
 * the caller's RUNPATH; Python's imports pass absolute paths.) */
static void *dlopen_hook(const char *file, int mode) {
    void *handle = real_dlopen(file, mode);
    if (handle != NULL && file != NULL) {
        pthread_mutex_lock(&got_mutex);
        if (exported_installed) patch_exported_slots();
        pthread_mutex_unlock(&got_mutex);
    }
    return handle;
}

int tandem_hooks_install_exported(char *err, size_t errlen) {
    ensure_membarrier();
    real_save_thread = (save_thread_fn)dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    real_restore_thread = (restore_thread_fn)dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
    real_dlopen = (dlopen_fn)dlsym(RTLD_DEFAULT, "dlopen");
    if (!real_save_thread || !real_restore_thread || !real_dlopen) {
        snprintf(err, errlen, "PyEval_SaveThread/PyEval_RestoreThread are not exported here");
        return -1;
    }
    pthread_mutex_lock(&got_mutex);
    exported_installed = 1;
    int in_interpreter = patch_exported_slots();
    if (in_interpreter) tandem_got_install_lazy_request();
    pthread_mutex_unlock(&got_mutex);
    if (in_interpreter == 0) {
        /* A static or LTO build (e.g. Debian's /usr/bin/python3) calls PyEval_SaveThread
         * directly: its own releases (time.sleep, os.*, file and socket I/O) would be
         * missed and only extension modules seen, which looks like data but is not. */
        char path[512] = "the interpreter";
        tandem_object_path(interpreter_anchor(), path, sizeof path);
        tandem_hooks_uninstall();
        snprintf(err, errlen, "%s calls PyEval_SaveThread directly, not through its GOT (static libpython or LTO build): "
                 "only extension modules' releases would be seen", path);
        return -1;
    }
    return 0;
}


void tandem_exported_forget(void) {
    exported_installed = 0;
}
