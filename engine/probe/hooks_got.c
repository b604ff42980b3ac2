/* Precise backend, GOT method: every take_gil/drop_gil seen through the GIL's own mutexes
 * in the interpreter's GOT; and the lazy take request's GOT hooks, which every backend uses
 * (docs/probe.md). */
#define _GNU_SOURCE
#include "hooks_hot.h"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "symbols.h"

static int gil_mutex_locked(pthread_mutex_t *mutex);
static int switch_mutex_locked(pthread_mutex_t *mutex);
static void learn_mutex(pthread_mutex_t *mutex);

static int other_mutex_locked(pthread_mutex_t *mutex);

HOT_CODE static int mutex_lock_hook(pthread_mutex_t *mutex) {
    if (mutex == hot.gil_mutex) return gil_mutex_locked(mutex);
    if (mutex == hot.switch_mutex) return switch_mutex_locked(mutex);
    if (hot.gil_mutex != NULL) return other_mutex_locked(mutex); /* GOT method: other GILs */
    if (__builtin_expect(hot.learning, 0)) learn_mutex(mutex);
    if (__builtin_expect(take_state == TAKE_ENTERED, 0)) {
        take_state = TAKE_LOCKED;
        int rc = real_mutex_trylock(mutex);
        if (rc != EBUSY) return rc == 0 ? 0 : real_mutex_lock(mutex);
        take_state = TAKE_STAMPED;
        tandem_stamp(TANDEM_GIL_TAKE_REQUEST);   /* about to block on gil->mutex */
    }
    return real_mutex_lock(mutex);
}

static void gil_cond_waits(void);
static int other_gil_index(pthread_mutex_t *mutex);

HOT_CODE static int cond_timedwait_hook(pthread_cond_t *cond, pthread_mutex_t *mutex, const struct timespec *deadline) {
    if (mutex == hot.gil_mutex || (hot.other_gils_high && other_gil_index(mutex) >= 0)) gil_cond_waits();
    else if (__builtin_expect(take_state == TAKE_ENTERED || take_state == TAKE_LOCKED, 0)) {
        take_state = TAKE_STAMPED;
        tandem_stamp(TANDEM_GIL_TAKE_REQUEST);   /* the GIL is held by another thread */
    }
    return real_cond_timedwait(cond, mutex, deadline);
}

/* ---- precise backend, GOT method ---------------------------------------------------
 * take_gil and drop_gil lock the GIL's own mutexes through the interpreter's GOT, which
 * the lazy request above already takes over (pthread_mutex_lock, pthread_cond_timedwait).
 * Once the addresses of gil->mutex and gil->switch_mutex are known, those calls alone say
 * every hand-over, without patching either function (no trampoline, no saved registers,
 * no code page of ours but the hooks'):
 *
 *   drop_gil: lock(gil->mutex) while holding the GIL         -> DROP (then it clears
 *             `locked` and unlocks; in a forced switch it waits on switch_cond after)
 *   take_gil: lock(gil->mutex) while not holding             -> a take starts (lazy
 *             request: a busy mutex is a REQUEST), cond_timedwait(gil->cond, gil->mutex)
 *             -> REQUEST, then at `_ready` lock(gil->switch_mutex) -> TAKE_ACQUIRED (it
 *             sets `locked` right after: FORCE_SWITCHING, on in every Linux build)
 *
 * Each thread keeps its state (holding, dropped, taking, taking and requested) in its
 * lane cache, tagged with a generation. At install the installing thread holds the GIL
 * (start is called from Python); every other thread is then either outside the
 * interpreter or waiting in take_gil, so a thread whose state is of an older generation
 * is not holding: its next lock of gil->mutex is a take. drop_gil also locks
 * switch_mutex (after a forced switch's release, while dropped): ignored.
 *
 * The addresses are learned at install: the installing thread releases and re-takes the
 * GIL itself (PyEval_SaveThread, PyEval_RestoreThread) while its lock hook records the
 * mutexes it locks: the first locked in each is gil->mutex, the second in the take
 * switch_mutex. Anything else (no GOT slots, a different first mutex, no second one) and
 * the precise backend uses inline hooks on take_gil/drop_gil instead. Sub-interpreters
 * with a GIL of their own (3.12+) lock other mutexes: learned at their first take
 * ("GILs of other interpreters" below). */

enum { GIL_UNKNOWN, GIL_DROPPED, GIL_TAKING, GIL_REQUESTED, GIL_HOLDING };
#define GIL_STATE_BITS 3u
#define GIL_GENERATION_MASK (~0u >> GIL_STATE_BITS)

static inline __attribute__((always_inline)) int gil_state(lane_cache *c) {
    unsigned v = c->hook_gil_state;
    if ((v >> GIL_STATE_BITS) != (hot.gil_generation & GIL_GENERATION_MASK)) return GIL_UNKNOWN;
    return (int)(v & ((1u << GIL_STATE_BITS) - 1));
}

static inline __attribute__((always_inline)) void set_gil_state(lane_cache *c, int state) {
    c->hook_gil_state = (hot.gil_generation & GIL_GENERATION_MASK) << GIL_STATE_BITS | (unsigned)state;
}

HOT_CODE static int gil_mutex_locked(pthread_mutex_t *mutex) {
    lane_cache *c = my_lane_fast();
    if (gil_state(c) == GIL_HOLDING) {           /* drop_gil: it releases once it has the lock */
        PyThreadState *holder = tandem_gil_holder_of_mutex(mutex); /* drop_gil stored it just before */
        int rc = real_mutex_lock(mutex);
        set_gil_state(c, GIL_DROPPED);
        tandem_stamp_drop(holder);
        return rc;
    }
    set_gil_state(c, GIL_TAKING);                 /* take_gil */
    int rc = real_mutex_trylock(mutex);
    if (rc != EBUSY) return rc == 0 ? 0 : real_mutex_lock(mutex);
    set_gil_state(c, GIL_REQUESTED);
    tandem_stamp(TANDEM_GIL_TAKE_REQUEST);       /* about to block on gil->mutex */
    return real_mutex_lock(mutex);
}

HOT_CODE static int switch_mutex_locked(pthread_mutex_t *mutex) {
    int rc = real_mutex_lock(mutex);
    lane_cache *c = my_lane_fast();
    int state = gil_state(c);
    if (state == GIL_TAKING || state == GIL_REQUESTED || state == GIL_UNKNOWN) {
        set_gil_state(c, GIL_HOLDING);            /* take_gil's _ready: `locked` is set next */
        tandem_stamp(TANDEM_GIL_TAKE_ACQUIRED);
    }
    return rc;
}

HOT_CODE static void gil_cond_waits(void) {
    lane_cache *c = my_lane_fast();
    int state = gil_state(c);
    if (state == GIL_TAKING || state == GIL_UNKNOWN) { /* UNKNOWN: already waiting at install */
        set_gil_state(c, GIL_REQUESTED);
        tandem_stamp(TANDEM_GIL_TAKE_REQUEST);   /* the GIL is held by another thread */
    }
}

/* ---- GOT method: GILs of other interpreters ----------------------------------------
 * A sub-interpreter with a GIL of its own (3.12+: `_interpreters`, Jep's isolated
 * SubInterpreterOptions) runs the same take_gil/drop_gil on another struct, whose mutexes
 * the install never saw. Such a GIL is learned at its first take, by the take's shape: a
 * thread locks a mutex M that is no known GIL's, holds it, and its next lock is of
 * M + switch_offset (the switch_mutex of the same struct; the offset is the main GIL's,
 * the same struct in every interpreter). M then joins other_gils and this lock is that
 * take's acquisition; from then on M and M + switch_offset go through the same state
 * machine as the main GIL's (a thread holds one GIL at a time). A GIL whose mutex is
 * destroyed (the interpreter is finalized) leaves the table (pthread_mutex_destroy's GOT
 * slot, beside the others). Limits: OTHER_GILS_MAX at once (more are counted in
 * other_gils_missed); the first take of each is seen at its acquisition only, its wait
 * is not; a drop before that first take is not seen. */
#define OTHER_GILS_MAX 8
static pthread_mutex_t *_Atomic other_gils[OTHER_GILS_MAX]; /* NULL: free entry */
static atomic_int other_gils_lock;          /* spin lock of writers; readers take none */
static atomic_int other_gils_learned, other_gils_missed;
static int (*real_mutex_destroy)(pthread_mutex_t *);

HOT_CODE static int other_gil_index(pthread_mutex_t *mutex) {
    int high = __atomic_load_n(&hot.other_gils_high, __ATOMIC_ACQUIRE);
    for (int i = 0; i < high; i++) {
        if (atomic_load_explicit(&other_gils[i], memory_order_relaxed) == mutex) return i;
    }
    return -1;
}

/* MUTEX, which this thread locked, is still held by it: glibc keeps the owner's tid in it.
 * The caller knows MUTEX was locked through our hook, so its page was mapped then; whether
 * it still is, when it is not MUTEX + switch_offset's page, mincore says without a fault. */
static int held_by_this_thread(pthread_mutex_t *mutex, pthread_mutex_t *next) {
#ifdef __GLIBC__
    uintptr_t page = (uintptr_t)mutex & ~(uintptr_t)4095;
    if (page != ((uintptr_t)next & ~(uintptr_t)4095)) {
        unsigned char resident;
        if (mincore((void *)page, 1, &resident) != 0) return 0; /* ENOMEM: not mapped */
    }
    return mutex->__data.__owner == (int)syscall(SYS_gettid);
#else
    (void)mutex;
    (void)next;
    return 0;
#endif
}

static void other_gils_lock_take(void) {
    while (atomic_exchange_explicit(&other_gils_lock, 1, memory_order_acquire)) sched_yield();
}

static void other_gils_lock_release(void) {
    atomic_store_explicit(&other_gils_lock, 0, memory_order_release);
}

/* Add MUTEX (another GIL's mutex); 1 if it is in the table now. */
static int learn_other_gil(pthread_mutex_t *mutex) {
    other_gils_lock_take();
    int high = hot.other_gils_high, free_entry = -1, found = 0;
    for (int i = 0; i < high; i++) {
        pthread_mutex_t *m = atomic_load_explicit(&other_gils[i], memory_order_relaxed);
        if (m == mutex) found = 1;
        if (m == NULL && free_entry < 0) free_entry = i;
    }
    if (!found) {
        if (free_entry < 0 && high < OTHER_GILS_MAX) free_entry = high;
        if (free_entry >= 0) {
            atomic_store_explicit(&other_gils[free_entry], mutex, memory_order_release);
            if (free_entry == high) __atomic_store_n(&hot.other_gils_high, high + 1, __ATOMIC_RELEASE);
            atomic_fetch_add(&other_gils_learned, 1);
            found = 1;
        } else {
            atomic_fetch_add(&other_gils_missed, 1);
        }
    }
    other_gils_lock_release();
    return found;
}

static void forget_other_gils(pthread_mutex_t *only) {
    other_gils_lock_take();
    for (int i = 0; i < hot.other_gils_high; i++) {
        if (only == NULL || atomic_load_explicit(&other_gils[i], memory_order_relaxed) == only)
            atomic_store_explicit(&other_gils[i], NULL, memory_order_relaxed);
    }
    if (only == NULL) __atomic_store_n(&hot.other_gils_high, 0, __ATOMIC_RELEASE);
    other_gils_lock_release();
}

static int mutex_destroy_hook(pthread_mutex_t *mutex) {
    if (hot.other_gils_high && other_gil_index(mutex) >= 0) forget_other_gils(mutex);
    return real_mutex_destroy(mutex);
}

/* The lock of PREVIOUS + switch_offset (MUTEX) by a thread whose last lock was PREVIOUS:
 * another GIL's first take if the thread still holds PREVIOUS. */
static __attribute__((noinline, cold)) int maybe_other_gil_taken(lane_cache *c, pthread_mutex_t *previous, pthread_mutex_t *mutex) {
    if (real_mutex_destroy == NULL || !held_by_this_thread(previous, mutex) || !learn_other_gil(previous))
        return real_mutex_lock(mutex);
    c->hook_last_lock = NULL;
    int rc = real_mutex_lock(mutex);
    set_gil_state(c, GIL_HOLDING);                /* that GIL's take_gil, at `_ready` */
    tandem_stamp(TANDEM_GIL_TAKE_ACQUIRED);
    return rc;
}

/* A mutex of no known GIL locked while the GOT method runs (out of line: the main GIL's
 * hand-overs in mutex_lock_hook keep their short prologue). */
HOT_CODE __attribute__((noinline)) static int other_mutex_locked(pthread_mutex_t *mutex) {
    if (__builtin_expect(hot.other_gils_high != 0, 0)) {
        if (other_gil_index(mutex) >= 0) return gil_mutex_locked(mutex);
        if (other_gil_index((pthread_mutex_t *)((char *)mutex - hot.switch_offset)) >= 0) return switch_mutex_locked(mutex);
    }
    lane_cache *c = my_lane_fast();
    pthread_mutex_t *previous = c->hook_last_lock;
    c->hook_last_lock = mutex;
    if (__builtin_expect((char *)mutex - hot.switch_offset == (char *)previous, 0)) return maybe_other_gil_taken(c, previous, mutex);
    return real_mutex_lock(mutex);
}

int tandem_hooks_other_gils(int *learned, int *missed) {
    *learned = atomic_load(&other_gils_learned);
    *missed = atomic_load(&other_gils_missed);
    int now = 0;
    for (int i = 0; i < hot.other_gils_high; i++) now += atomic_load(&other_gils[i]) != NULL;
    return now;
}

#define LEARN_MAX 8
static pthread_mutex_t *learned[LEARN_MAX];
static int learned_count;

static void learn_mutex(pthread_mutex_t *mutex) {
    if (my_lane_fast()->hook_learning && learned_count < LEARN_MAX) learned[learned_count++] = mutex;
}

/* Learn gil->mutex and switch_mutex (see above); the GOT slots of pthread_mutex_lock and
 * pthread_cond_timedwait must be ours (the caller checks lazy_request) and the caller must
 * hold the GIL. Returns 0, or -1 with the reason. */
int tandem_got_learn_gil_mutexes(char *err, size_t errlen) {
    typedef void *(*save_fn)(void);
    typedef void (*restore_fn)(void *);
    save_fn save = (save_fn)dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    restore_fn restore = (restore_fn)dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
    if (!save || !restore) {
        snprintf(err, errlen, "PyEval_SaveThread/PyEval_RestoreThread are not exported here");
        return -1;
    }
    lane_cache *c = my_lane_fast();
    learned_count = 0;
    c->hook_learning = 1;
    __atomic_store_n(&hot.learning, 1, __ATOMIC_SEQ_CST);
    void *tstate = save();                        /* drop_gil */
    int in_drop = learned_count;
    restore(tstate);                              /* take_gil */
    __atomic_store_n(&hot.learning, 0, __ATOMIC_SEQ_CST);
    c->hook_learning = 0;
    if (in_drop < 1 || learned_count < in_drop + 2 || learned[in_drop] != learned[0] || learned[in_drop + 1] == learned[0]) {
        snprintf(err, errlen, "releasing and re-taking the GIL locked %d then %d mutexes through the GOT, not gil->mutex then "
                 "gil->mutex and switch_mutex", in_drop, learned_count - in_drop);
        return -1;
    }
    hot.gil_generation++;
    set_gil_state(c, GIL_HOLDING);                /* we hold the GIL again */
    hot.switch_mutex = learned[in_drop + 1];
    hot.switch_offset = (int)((char *)hot.switch_mutex - (char *)learned[0]);
    atomic_store(&other_gils_learned, 0);
    atomic_store(&other_gils_missed, 0);
    __atomic_store_n(&hot.gil_mutex, learned[0], __ATOMIC_SEQ_CST);
    return 0;
}


/* Lazy take request (above): the interpreter's own GOT slots of pthread_mutex_lock and
 * pthread_cond_timedwait (take_gil's; extension modules' slots are left alone). The
 * functions are looked up with dlsym, never taken from a slot: a lazily bound slot holds
 * the PLT stub, whose resolver would write the real address over our hook. Called with
 * got_mutex held, after the take/drop hooks are in place. */
void tandem_got_install_lazy_request(void) {
    real_mutex_lock = (mutex_lock_fn)dlsym(RTLD_DEFAULT, "pthread_mutex_lock");
    real_mutex_trylock = (mutex_lock_fn)dlsym(RTLD_DEFAULT, "pthread_mutex_trylock");
    real_cond_timedwait = (cond_timedwait_fn)dlsym(RTLD_DEFAULT, "pthread_cond_timedwait");
    if (!real_mutex_lock || !real_mutex_trylock || !real_cond_timedwait) return;
    object_range interpreter = interpreter_range();
    if (interpreter.end == 0) return;
    got_ctx lock_ctx = {(void *)mutex_lock_hook, interpreter, 0, 1};
    got_ctx wait_ctx = {(void *)cond_timedwait_hook, interpreter, 0, 1};
    /* Only the slots of the interpreter's object count, which are the only ones patched;
     * both functions or neither, so undo a half install. */
    int before = got_patch_count_now();
    tandem_for_each_got_slot("pthread_mutex_lock", patch_slot, &lock_ctx);
    tandem_for_each_got_slot("pthread_cond_timedwait", patch_slot, &wait_ctx);
    if (lock_ctx.interpreter_slots == 0 || wait_ctx.interpreter_slots == 0) {
        restore_slots_from(before);
        return;
    }
    /* Optional: without it other interpreters' GILs are not learned (see other_gils). */
    real_mutex_destroy = (int (*)(pthread_mutex_t *))dlsym(RTLD_DEFAULT, "pthread_mutex_destroy");
    got_ctx destroy_ctx = {(void *)mutex_destroy_hook, interpreter, 0, 1};
    if (real_mutex_destroy) tandem_for_each_got_slot("pthread_mutex_destroy", patch_slot, &destroy_ctx);
    if (destroy_ctx.interpreter_slots == 0) real_mutex_destroy = NULL;
    __atomic_store_n(&lazy_request, 1, __ATOMIC_SEQ_CST);
}


void tandem_got_forget_other_gils(void) {
    forget_other_gils(NULL);
}

void tandem_got_after_fork_child(void) {
    atomic_store(&other_gils_lock, 0);   /* a thread holding it does not exist here */
    forget_other_gils(NULL);
}
