/* Precise backend, inline hooks on CPython's static take_gil/drop_gil (found in .symtab,
 * patched by patch.c): the fallback where the GOT method cannot learn the GIL's mutexes. */
#define _GNU_SOURCE
#include "hooks_hot.h"

#include <stdio.h>

#include "symbols.h"

/* ---- precise backend: inline hooks on take_gil / drop_gil ---------------------------
 * The replacements are C functions that pass six integer registers through unchanged: the
 * argument lists differ per version (drop_gil takes 2 or 3 pointer/int arguments: 3.11
 * runtime ceval + interp ceval + tstate, 3.13 interp + tstate + final_release; take_gil
 * takes tstate) and clones (.constprop/.isra) may drop some, but all are integer/pointer
 * arguments in registers, so forwarding all six registers is right for every one of them.
 * take_gil is called normally (not jumped to) so that its return can be stamped; if it ends
 * the thread (PyThread_exit_thread during finalization) it never returns, which is fine:
 * pthread_exit unwinds through this frame using its ordinary unwind tables. */

/* At drop_gil's entry the GIL's last_holder is the thread that took it last, the one
 * dropping it, unless a sub-interpreter's own GIL is dropped (the inline hooks do not tell
 * GILs apart): then the holder read is another thread's and says "not known". */
static inline __attribute__((always_inline)) PyThreadState *inline_drop_holder(void) {
    struct _gil_runtime_state *gil = hot.main_gil;
    if (gil == NULL) return (PyThreadState *)1;
    PyThreadState *holder = tandem_gil_holder_of_mutex((pthread_mutex_t *)&gil->mutex);
    tandem_thread_slot *s = my_lane_fast()->hook_slot;
    if (holder == NULL || s == NULL || holder->native_thread_id != (unsigned long)s->tid) return (PyThreadState *)1;
    return holder;
}

typedef uintptr_t (*six_register_fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

#define TAKE_GIL_HOOK(i)                                                                             \
    HOT_CODE static uintptr_t take_gil_hook_##i(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, \
                                       uintptr_t f) {                                                \
        take_entered();                                                                              \
        uintptr_t result = ((six_register_fn)take_patches[i].original)(a, b, c, d, e, f);            \
        take_returned();                                                                             \
        return result;                                                                               \
    }
#define DROP_GIL_HOOK(i)                                                                             \
    HOT_CODE static uintptr_t drop_gil_hook_##i(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, \
                                       uintptr_t f) {                                                \
        tandem_stamp_drop(inline_drop_holder()); /* at entry: drop_gil may block in a forced switch */ \
        return ((six_register_fn)drop_patches[i].original)(a, b, c, d, e, f);                       \
    }
TAKE_GIL_HOOK(0) TAKE_GIL_HOOK(1) TAKE_GIL_HOOK(2) TAKE_GIL_HOOK(3)
DROP_GIL_HOOK(0) DROP_GIL_HOOK(1) DROP_GIL_HOOK(2) DROP_GIL_HOOK(3)

static void *const take_hooks[TANDEM_MAX_COPIES] = {take_gil_hook_0, take_gil_hook_1, take_gil_hook_2, take_gil_hook_3};
static void *const drop_hooks[TANDEM_MAX_COPIES] = {drop_gil_hook_0, drop_gil_hook_1, drop_gil_hook_2, drop_gil_hook_3};

static int patch_all(const char *name, tandem_patch *patches, void *const *hooks, char *err, size_t errlen) {
    tandem_function found[TANDEM_MAX_COPIES];
    int n = tandem_find_functions(interpreter_anchor(), name, found, TANDEM_MAX_COPIES, err, errlen);
    if (n < 0) return -1;
    if (n == 0) {
        char path[512] = "the interpreter";
        tandem_object_path(interpreter_anchor(), path, sizeof path);
        snprintf(err, errlen, "no %s in the symbol table of %s (stripped build?)", name, path);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char why[200];
        if (tandem_patch_install(&patches[i], (void *)found[i].address, hooks[i], why, sizeof why) != 0) {
            for (int j = 0; j < i; j++) tandem_patch_uninstall(&patches[j]);
            snprintf(err, errlen, "%s: %s", found[i].name, why);
            return -1;
        }
    }
    return n;
}


int tandem_inline_install(char *why, size_t whylen) {
    /* Decode both before patching either, so a refusal leaves nothing half-installed. */
    int drops = patch_all("drop_gil", drop_patches, drop_hooks, why, whylen);
    int takes = drops < 0 ? -1 : patch_all("take_gil", take_patches, take_hooks, why, whylen);
    if (takes < 0) return -1;
#if PY_VERSION_HEX >= 0x030C0000
    hot.main_gil = PyInterpreterState_Main()->ceval.gil;
#else
    hot.main_gil = &_PyRuntime.ceval.gil;
#endif
    return drops + takes;
}

void tandem_inline_uninstall(void) {
    hot.main_gil = NULL;
    for (int i = 0; i < TANDEM_MAX_COPIES; i++) {
        tandem_patch_uninstall(&take_patches[i]);
        tandem_patch_uninstall(&drop_patches[i]);
    }
}
