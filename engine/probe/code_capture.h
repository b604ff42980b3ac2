/* The code of a release, read at drop_gil while the thread still holds the GIL (private to
 * engine/probe's hot path, like ring_fast.h; the contract is codes.h).
 *
 * Compiled against the internal headers of the CPython it is built for (frames have no
 * public layout), so a file that includes it must include it first. The common case, the
 * innermost frame's code being the one the thread last released in, is a few loads and a
 * compare with the thread's one-entry cache; everything else is tandem_code_slow (codes.c).
 */
#ifndef TANDEM_CODE_CAPTURE_H
#define TANDEM_CODE_CAPTURE_H

#define Py_BUILD_CORE_MODULE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_gil.h"
#include "internal/pycore_frame.h"

#include "codes.h"
#include "ring_fast.h"

static inline __attribute__((always_inline)) _PyInterpreterFrame *tandem_innermost_frame(PyThreadState *tstate) {
#if PY_VERSION_HEX >= 0x030D0000
    return tstate->current_frame;
#else
    return tstate->cframe->current_frame;
#endif
}

static inline __attribute__((always_inline)) PyCodeObject *tandem_frame_code(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030D0000
    return (PyCodeObject *)frame->f_executable;
#else
    return frame->f_code;
#endif
}

static inline __attribute__((always_inline)) _Py_CODEUNIT *tandem_frame_instr(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030D0000
    return frame->instr_ptr;
#else
    return frame->prev_instr;
#endif
}

/* A C-stack shim frame (3.12+) is never the code of a release. */
#if PY_VERSION_HEX >= 0x030C0000
#define TANDEM_FRAME_IS_SHIM(frame) ((frame)->owner == FRAME_OWNED_BY_CSTACK)
#else
#define TANDEM_FRAME_IS_SHIM(frame) 0
#endif

/* The thread dropping GIL (the tstate it stored in gil->last_holder just before locking
 * gil->mutex, which is where the GOT method sees the drop). */
static inline __attribute__((always_inline)) PyThreadState *tandem_gil_holder_of_mutex(pthread_mutex_t *gil_mutex) {
    struct _gil_runtime_state *gil =
        (struct _gil_runtime_state *)((char *)gil_mutex - offsetof(struct _gil_runtime_state, mutex));
#if PY_VERSION_HEX >= 0x030D0000
    return __atomic_load_n(&gil->last_holder, __ATOMIC_RELAXED);
#else
    return (PyThreadState *)__atomic_load_n(&gil->last_holder._value, __ATOMIC_RELAXED);
#endif
}

/* The DROP record's aux for TSTATE (NULL: no Python thread state; (PyThreadState *)1: the
 * holder is not known) when the fast path knows it: 1 and *AUX set; 0: call
 * tandem_code_slow. C is the calling thread's lane cache, RING_ID the active ring's. */
static inline __attribute__((always_inline)) int tandem_code_aux_cached(lane_cache *c, PyThreadState *tstate, uint64_t ring_id,
                                                                      uint64_t *aux) {
    if (__builtin_expect((uintptr_t)tstate <= 1, 0)) {
        *aux = tstate ? TANDEM_CODE_UNKNOWN : TANDEM_CODE_NO_FRAME;
        return 1;
    }
    _PyInterpreterFrame *frame = tandem_innermost_frame(tstate);
    if (frame == NULL) {
        *aux = TANDEM_CODE_NO_FRAME;
        return 1;
    }
    PyCodeObject *code = tandem_frame_code(frame);
    _Py_CODEUNIT *instr = tandem_frame_instr(frame);
    /* Cache hit: same code, a complete frame (its first traceable instruction reached), not
     * a shim, filled for this ring (a code interned into a closed table may be freed since
     * and its address reused). */
    if (__builtin_expect((void *)code == c->code_key && (void *)instr >= c->code_min_instr && c->code_ring == ring_id &&
                         !TANDEM_FRAME_IS_SHIM(frame), 1)) {
        *aux = c->code_id | (uint64_t)(uint32_t)(instr - _PyCode_CODE(code)) << 32;
        return 1;
    }
    return 0;
}

static inline __attribute__((always_inline)) uint64_t tandem_code_aux(lane_cache *c, PyThreadState *tstate, uint64_t ring_id) {
    uint64_t aux;
    if (tandem_code_aux_cached(c, tstate, ring_id, &aux)) return aux;
    return tandem_code_slow(tstate, ring_id);
}

#endif
