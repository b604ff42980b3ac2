/* The hooks' hot path, shared by the backends' files (private to engine/probe, like
 * ring_fast.h for the ring; the contract is hooks.h).
 *
 *   hooks.c           thread slots, the hot page, the stamps, the GOT-slot patching all
 *                     backends use, ring/clock switching, uninstall
 *   hooks_got.c       precise backend, GOT method: the GIL's mutexes through the
 *                     interpreter's GOT (and the lazy take request every backend uses)
 *   hooks_inline.c    precise backend, inline hooks on take_gil/drop_gil (the fallback)
 *   hooks_exported.c  exported backend: PyEval_SaveThread/RestoreThread GOT slots
 *
 * Include it first (it includes CPython's internal headers through code_capture.h).
 */
#ifndef TANDEM_HOOKS_HOT_H
#define TANDEM_HOOKS_HOT_H

#include "code_capture.h"   /* first: CPython's internal headers */
#include "hooks.h"

#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "patch.h"
#include "ring_fast.h"
#include "symbols.h"
#include "tsc.h"

/* ---- the hot page ------------------------------------------------------------------
 * Everything the hooks and a stamp read or write of the hooks' own state sits in one
 * page-aligned page: the globals below, the patches (their trampoline pointers), the
 * function pointers of the GOT hooks and the per-thread slots of the first 27 threads.
 * Why: each stamp follows or precedes a system call, and where a system call costs the
 * TLB its entries (on some VMs a system call followed by 8 stores to 8 distinct pages costs
 * ~25 ns more than to 8 lines of one page) every distinct page a
 * stamp touches is a TLB miss. A stamp's data is now this page, the thread's TLS, the
 * ring slot and the lane's head; its code one page (HOT_CODE), plus, with the inline
 * hooks, one trampoline page.
 *
 * Stop must know when no thread is still inside tandem_ring_emit_gil for the ring it is
 * about to close. Each thread raises its own in_stamp flag around the emit (plain stores,
 * no atomic read-modify-write on the hot path); the stopping thread clears the ring pointer
 * and then runs membarrier(PRIVATE_EXPEDITED), which puts a full barrier in every running
 * thread, before it waits for the flags (asymmetric Dekker, as userspace RCU does). Where
 * membarrier is missing, every stamp pays a fence instead.
 *
 * The globals, in the page's first line:
 *   ring     the active ring (NULL: do not stamp);
 *   ring_id  its id (tandem_ring_hot.id), so the lane cache check does not read the ring
 *            struct. Stored before ring and only while ring is NULL (set_ring: every switch
 *            goes through NULL, which waits for in-flight stamps), and x86-64 keeps stores
 *            and loads in order: a stamp that sees a ring sees its id;
 *   lane_tls_offset  where the thread's lane cache (tandem_my_lane) is from the thread
 *            pointer: initial-exec TLS has one offset for every thread, and reading it
 *            here spares the hot path the GOT page the compiler would load it from;
 *   stamp_tsc        the stamp's clock, chosen at start (tandem_hooks_set_clock) while no
 *            ring is set, so no stamp is in flight when it changes: 1 = raw TSC (the ring
 *            converts it to CLOCK_MONOTONIC off the hot path), 0 = clock_gettime;
 *   membarrier_ready -1 unknown, 1 usable, 0 not: then every stamp pays a fence;
 *   lazy_request, real_*  the lazy take request's state ("Lazy take request" below);
 *   gil_mutex ... learning  the GOT method of the precise backend (below). */
typedef int (*mutex_lock_fn)(pthread_mutex_t *);
typedef int (*cond_timedwait_fn)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

#define HOT_PAGE_SLOTS 27
typedef struct {
    struct __attribute__((aligned(64))) {
        tandem_ring *volatile ring;
        volatile uint64_t ring_id;
        intptr_t lane_tls_offset;
        int stamp_tsc;
        int membarrier_ready;
        int lazy_request;                    /* set while no hook runs (install) */
        mutex_lock_fn real_mutex_lock;
        mutex_lock_fn real_mutex_trylock;
        cond_timedwait_fn real_cond_timedwait;
        pthread_mutex_t *gil_mutex;          /* GOT method: gil->mutex and gil->switch_mutex of   */
        pthread_mutex_t *switch_mutex;       /* the main interpreter's GIL (NULL: not in use)      */
        unsigned gil_generation;             /* GOT method: bumped at each install and fork        */
        int learning;                        /* GOT method: a thread is learning the mutexes       */
        int dry_clock;                       /* benchmark: no ring, a stamp still reads its clock  */
        int other_gils_high;                 /* GOT method: entries of other_gils in use (below)   */
        int switch_offset;                   /* GOT method: switch_mutex - mutex in a GIL, bytes   */
        struct _gil_runtime_state *main_gil; /* inline hooks: the holder of a drop is read here    */
        int record_code;                     /* a DROP records its code (a code table is open)      */
    } g;
    tandem_patch take_patches[TANDEM_MAX_COPIES], drop_patches[TANDEM_MAX_COPIES];
    tandem_thread_slot slots[HOT_PAGE_SLOTS];
    atomic_int slots_used;
} tandem_hot_page;
/* Defined in hooks.c, page-aligned: exactly one page. */
extern tandem_hot_page hot_page __attribute__((visibility("hidden")));
#define hot hot_page.g
#define active_ring hot.ring
#define membarrier_ready hot.membarrier_ready
#define stamp_tsc hot.stamp_tsc
#define take_patches hot_page.take_patches
#define drop_patches hot_page.drop_patches

/* The hooks' code, in one section of its own, kept in source order (no_reorder) within
 * one page: the first of them, tandem_stamp, is page-aligned and the take hooks call it
 * rather than inline it, so the whole section is ~2 KiB (tests/test_probe.py checks). A
 * `.text.hot.*` name: the default linker script gathers these input sections of every
 * object file together (in link order, hooks.c first), so the backends' files share it. */
#define HOT_CODE __attribute__((section(".text.hot.tandem"), no_reorder))

/* The calling thread's lane cache without the GOT (see lane_tls_offset). */
static inline __attribute__((always_inline)) lane_cache *my_lane_fast(void) {
    return (lane_cache *)((char *)__builtin_thread_pointer() + hot.lane_tls_offset);
}

/* The stamps (hooks.c, in the hot page). tandem_stamp_drop: a release by the thread whose
 * state is TSTATE (the GIL's holder; NULL: no Python thread state; (PyThreadState *)1: not
 * known): the record carries the code it runs (code_capture.h). */
void tandem_stamp_drop(PyThreadState *tstate);

/* ---- Lazy take request --------------------------------------------------------------
 * A take of the GIL that does not wait is the common case (every Py_END_ALLOW_THREADS of
 * an uncontended program): its request and its acquisition are tens of ns apart, the
 * time to lock gil->mutex and see `locked` clear. Rather than read the clock at take_gil's
 * entry and again at its return, the entry only notes that this thread is in a take; the
 * request is stamped, with a clock read of its own, at the moment the take starts to wait:
 * when locking gil->mutex finds it busy (pthread_mutex_lock: a trylock first) or at the
 * first wait on gil->cond (pthread_cond_timedwait), both reached through the interpreter's
 * GOT. A take that never waited writes only its TAKE_ACQUIRED record at return: a
 * TAKE_ACQUIRED with no TAKE_REQUEST since the thread's DROP means "asked and got it at
 * this instant" (docs/ring.md, "Event kinds"). So a waiting thread is visible as waiting
 * while it waits (a live reader sees its request), and a take that did not wait costs one
 * clock read and one record instead of two of each (a third fewer records to write, drain
 * and store in a release-heavy program). Where the interpreter's object has no GOT slot
 * for both functions, the request is stamped at entry (lazy_request 0), for every take. */

enum { TAKE_NONE, TAKE_ENTERED, TAKE_LOCKED, TAKE_STAMPED };
#define take_state (my_lane_fast()->hook_take_state)
#define lazy_request hot.lazy_request

static inline __attribute__((always_inline)) void take_entered(void) {
    if (__builtin_expect(lazy_request, 1)) {
        take_state = TAKE_ENTERED;
    } else {
        tandem_stamp(TANDEM_GIL_TAKE_REQUEST);
        take_state = TAKE_STAMPED;
    }
}

static inline __attribute__((always_inline)) void take_returned(void) {
    take_state = TAKE_NONE;
    tandem_stamp(TANDEM_GIL_TAKE_ACQUIRED);
}

/* The first lock in a take is gil->mutex's (every version here locks it first). */
#define real_mutex_lock hot.real_mutex_lock
#define real_mutex_trylock hot.real_mutex_trylock
#define real_cond_timedwait hot.real_cond_timedwait

/* GOT method (hooks_got.c). */
int tandem_got_learn_gil_mutexes(char *err, size_t errlen);
void tandem_got_forget_other_gils(void);
void tandem_got_after_fork_child(void);
/* The lazy take request's GOT slots (pthread_mutex_lock, pthread_cond_timedwait, and
 * pthread_mutex_destroy for other GILs) in the interpreter's object; got_mutex held. */
void tandem_got_install_lazy_request(void);

/* Inline hooks (hooks_inline.c): patch take_gil/drop_gil; functions patched, or -1 + why. */
int tandem_inline_install(char *why, size_t whylen);
void tandem_inline_uninstall(void);

/* Exported backend (hooks_exported.c), got_mutex held. */
void tandem_exported_forget(void);

/* GOT slots (hooks.c): every backend patches the interpreter's or other objects' slots. */
typedef struct {
    uintptr_t address, start, end;
} object_range;
typedef struct {
    void *replacement;
    object_range interpreter; /* the object holding the interpreter (empty: not counted) */
    int interpreter_slots;    /* of the slots seen, those in that object                  */
    int interpreter_only;     /* patch the slots in that object only                      */
} got_ctx;
/* Held while slots are scanned, patched or restored: dlopen may run on any thread. */
extern pthread_mutex_t got_mutex __attribute__((visibility("hidden")));
void *interpreter_anchor(void);
object_range interpreter_range(void);
/* tandem_for_each_got_slot's callback: CTX is a got_ctx. */
void patch_slot(void **slot, int in_relro, const char *object, void *ctx);
int got_patch_count_now(void);
void restore_slots_from(int first);
void ensure_membarrier(void);

#endif
