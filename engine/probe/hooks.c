/* GIL hooks: stamps and the precise/exported backends (see hooks.h). */
#define _GNU_SOURCE
#include "code_capture.h"   /* first: CPython's internal headers */
#include "hooks.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "patch.h"
#include "ring_fast.h"
#include "symbols.h"
#include "tsc.h"

/* ---- per-thread slots --------------------------------------------------------------- */

/* The calling thread's slot: a field of the ring's TLS lane cache (ring_fast.h), so that a
 * stamp reads one TLS cache line for both. */
#define my_slot (tandem_my_lane.hook_slot)
static tandem_thread_slot *_Atomic all_slots;
static tandem_thread_slot *new_slot(void);
static atomic_int threads_seen;      /* threads that stamped at least once              */
static pthread_key_t slot_key;
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;

static void release_slot(void *slot) {
    /* Thread exit: the slot may be reused by a thread started later. */
    tandem_thread_slot *s = slot;
    my_slot = NULL;
    s->free = 1;
}

static void make_slot_key(void) {
    pthread_key_create(&slot_key, release_slot);
}

static tandem_thread_slot *slot_for_this_thread(void) {
    pthread_once(&slot_key_once, make_slot_key);
    tandem_thread_slot *s;
    for (s = atomic_load(&all_slots); s; s = s->next) {
        int expected = 1;
        if (s->free && __atomic_compare_exchange_n(&s->free, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) break;
    }
    if (s == NULL) {
        s = new_slot();
        if (s == NULL) return NULL;
        tandem_thread_slot *head = atomic_load(&all_slots);
        do {
            s->next = head;
        } while (!atomic_compare_exchange_weak(&all_slots, &head, s));
    }
    s->tid = (uint32_t)syscall(SYS_gettid);
    atomic_fetch_add(&threads_seen, 1);
    s->in_stamp = 0;
    my_slot = s;
    pthread_setspecific(slot_key, s);
    return s;
}

/* ---- the hot page ------------------------------------------------------------------
 * Everything the hooks and a stamp read or write of the hooks' own state sits in one
 * page-aligned page: the globals below, the patches (their trampoline pointers), the
 * function pointers of the GOT hooks and the per-thread slots of the first 27 threads.
 * Why: each stamp follows or precedes a system call, and where a system call costs the
 * TLB its entries (the shared 2-core VM here: a system call followed by 8 stores to 8
 * distinct pages costs ~25 ns more than to 8 lines of one page) every distinct page a
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
static struct {
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
    } g;
    tandem_patch take_patches[TANDEM_MAX_COPIES], drop_patches[TANDEM_MAX_COPIES];
    tandem_thread_slot slots[HOT_PAGE_SLOTS];
    atomic_int slots_used;
} hot_page __attribute__((aligned(4096))) = {.g = {.membarrier_ready = -1}};
_Static_assert(sizeof hot_page == 4096, "the hooks' hot state must fill exactly one page");
#define hot hot_page.g
#define active_ring hot.ring
#define membarrier_ready hot.membarrier_ready
#define stamp_tsc hot.stamp_tsc
#define take_patches hot_page.take_patches
#define drop_patches hot_page.drop_patches

/* The hooks' code, in one section of its own, kept in source order (no_reorder) within
 * one page: the first of them, tandem_stamp, is page-aligned and the take hooks call it
 * rather than inline it, so the whole section is ~1.5 KiB (tests/test_probe.py checks). */
#define HOT_CODE __attribute__((section(".text.tandem_hot"), no_reorder))

/* A slot for a thread that found no free one: from the hot page while it has some. */
static tandem_thread_slot *new_slot(void) {
    int i = atomic_fetch_add(&hot_page.slots_used, 1);
    if (i < HOT_PAGE_SLOTS) return &hot_page.slots[i];
    tandem_thread_slot *s = aligned_alloc(_Alignof(tandem_thread_slot), sizeof *s);
    if (s != NULL) memset(s, 0, sizeof *s);
    return s;
}

/* The calling thread's lane cache without the GOT (see lane_tls_offset). */
static inline __attribute__((always_inline)) lane_cache *my_lane_fast(void) {
    return (lane_cache *)((char *)__builtin_thread_pointer() + hot.lane_tls_offset);
}

static inline uint64_t stamp_time(void) {
    return __builtin_expect(stamp_tsc, 1) ? tandem_rdtsc() : tandem_monotonic_ns();
}

void tandem_hooks_set_clock(int tsc) {
    stamp_tsc = tsc && TANDEM_HAVE_TSC;
}

int tandem_hooks_clock_is_tsc(void) {
    return stamp_tsc;
}

/* A stamp of a DROP with WITH_CODE 1 records the code TSTATE runs (code_capture.h); a
 * TSTATE of (PyThreadState *)1 says the holder is not known. The code is read inside the
 * in_stamp window: stop waits for it as for the record (the table closes after the ring). */
static inline __attribute__((always_inline)) void stamp_with(tandem_thread_slot *s, uint16_t kind, uint32_t tid, int with_code,
                                                             PyThreadState *tstate) {
    s->in_stamp = 1;
    if (__builtin_expect(membarrier_ready != 1, 0)) __atomic_thread_fence(__ATOMIC_SEQ_CST);
    else __asm__ volatile("" ::: "memory");
    tandem_ring *ring = active_ring;
    if (ring != NULL) {
        uint64_t ring_id = hot.ring_id, t = stamp_time(); /* before the code: interning may take a while */
        uint64_t aux = with_code ? tandem_code_aux(&tandem_my_lane, tstate, ring_id) : 0;
        tandem_ring_emit_gil_fast(ring, ring_id, kind, tid, t, aux);
        s->events++;
    }
    __asm__ volatile("" ::: "memory");
    s->in_stamp = 0;
}

/* Every case of the stamp: the first stamp of a thread, no membarrier, the clock_gettime
 * clock, an emit that needs the ring's full path (a new ring, the shared lane, a lane past
 * its room limit). */
static __attribute__((noinline)) void stamp_general(uint16_t kind, int with_code, PyThreadState *tstate) {
    tandem_thread_slot *s = my_slot;
    if (__builtin_expect(s == NULL, 0)) {
        s = slot_for_this_thread();
        if (s == NULL) return;
    }
    stamp_with(s, kind, s->tid, with_code, tstate);
}

/* The common case inline (no call, no register to save and restore in the callers' leaf
 * functions: everything else is a tail call to stamp_general): TSC clock, membarrier, a
 * thread that has its slot and a private lane with room in the active ring. Same protocol
 * as stamp_with; leaving the fast path lowers in_stamp before stamp_general raises it
 * again and re-reads the ring, which is the protocol from the start. */
static inline __attribute__((always_inline)) void stamp_fast(uint16_t kind, int with_code, PyThreadState *tstate) {
    lane_cache *c = my_lane_fast();
    tandem_thread_slot *s = c->hook_slot;
    if (__builtin_expect(s == NULL || membarrier_ready != 1 || !stamp_tsc, 0)) {
        stamp_general(kind, with_code, tstate);
        return;
    }
    s->in_stamp = 1;
    __asm__ volatile("" ::: "memory");
    tandem_ring *ring = active_ring;
    if (ring != NULL) {
        uint64_t ring_id = hot.ring_id, aux = 0;
        /* a code not in the thread's cache: the general path (no call here keeps this a leaf) */
        int code_known = !with_code || tandem_code_aux_cached(c, tstate, ring_id, &aux);
        uint64_t t = tandem_rdtsc();
        if (__builtin_expect(!code_known || c->ring_id != ring_id || c->head >= c->limit, 0)) {
            __asm__ volatile("" ::: "memory");
            s->in_stamp = 0;
            stamp_general(kind, with_code, tstate);
            return;
        }
        tandem_lane_write(c, kind, s->tid, t, aux);
        s->events++;
    } else if (__builtin_expect(hot.dry_clock, 0)) {
        uint64_t t = tandem_rdtsc();             /* read, kept, written nowhere */
        __asm__ volatile("" ::"r"(t));
    }
    __asm__ volatile("" ::: "memory");
    s->in_stamp = 0;
}

HOT_CODE __attribute__((aligned(4096))) void tandem_stamp(uint16_t kind) {
    stamp_fast(kind, 0, NULL);
}

/* A release by the thread whose state is TSTATE (the GIL's holder): the record carries the
 * code it runs. */
HOT_CODE __attribute__((noinline)) static void tandem_stamp_drop(PyThreadState *tstate) {
    stamp_fast(TANDEM_GIL_DROP, 1, tstate);
}

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
static int learn_gil_mutexes(char *err, size_t errlen) {
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

void tandem_stamp_for(uint16_t kind, uint32_t tid) {
    tandem_thread_slot *s = my_slot;
    if (__builtin_expect(s == NULL, 0)) {
        s = slot_for_this_thread();
        if (s == NULL) return;
    }
    stamp_with(s, kind, tid, 0, NULL);
}

/* Called before any hook can run (install) and before a ring is set. */
static void ensure_membarrier(void) {
    hot.lane_tls_offset = (char *)&tandem_my_lane - (char *)__builtin_thread_pointer();
    if (membarrier_ready == -1) {
        membarrier_ready = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    }
}

/* Benchmark only (module.c's _hooks_only): with no ring set, every fast-path stamp still
 * reads the TSC and throws the value away, so that the interception plus the clock reads,
 * the floor under any stamp, can be measured apart from writing the record. */
void tandem_hooks_set_dry_clock(int on) {
    ensure_membarrier(); /* the fast path needs it, as with a ring */
    hot.dry_clock = on;
}

void tandem_hooks_set_ring(tandem_ring *ring) {
    ensure_membarrier();
    tandem_ring *old = active_ring;
    if (ring != NULL) hot.ring_id = ((const tandem_ring_hot *)ring)->id; /* before the pointer */
    __atomic_store_n(&active_ring, ring, __ATOMIC_SEQ_CST);
    if (old == NULL) return;
    if (membarrier_ready == 1) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    for (tandem_thread_slot *s = atomic_load(&all_slots); s; s = s->next) {
        while (s->in_stamp && s != my_slot) sched_yield();
    }
}

void tandem_hooks_after_fork_child(void) {
    active_ring = NULL;               /* the parent's; its drain thread does not exist here */
    atomic_store(&other_gils_lock, 0);
    forget_other_gils(NULL);          /* the child keeps the main interpreter only */
    hot.gil_generation++;             /* GOT method: the interpreter re-creates the GIL and takes it */
    for (tandem_thread_slot *s = atomic_load(&all_slots); s; s = s->next) {
        s->in_stamp = 0;              /* threads that were mid-stamp do not exist here       */
        if (s != my_slot) s->free = 1;
    }
    if (my_slot) my_slot->tid = (uint32_t)syscall(SYS_gettid);
}

uint64_t tandem_hooks_events(void) {
    uint64_t total = 0;
    for (tandem_thread_slot *s = atomic_load(&all_slots); s; s = s->next) total += s->events;
    return total;
}

int tandem_hooks_threads_seen(void) {
    return atomic_load(&threads_seen);
}

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

static int patched_functions;

static void *interpreter_anchor(void) {
    /* Any exported function of the interpreter: tells which object (libpython or the
     * executable) to read. dlsym gives the definition itself, never a GOT/PLT entry. */
    return dlsym(RTLD_DEFAULT, "Py_GetVersion");
}

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

static pthread_mutex_t got_mutex;
static void install_lazy_request(void);
static char got_method_why[300];
const char *tandem_hooks_got_method_why(void) { return got_method_why; }

static const char *precise_method = "";
const char *tandem_hooks_precise_method(void) { return precise_method; }

int tandem_hooks_install_precise(char *err, size_t errlen) {
    ensure_membarrier();
    /* TANDEM_PROBE_METHOD=inline: the inline hooks even where the GOT method works (tests) */
    const char *method = getenv("TANDEM_PROBE_METHOD");
    int inline_only = method && strcmp(method, "inline") == 0;
    if (!inline_only) {
        pthread_mutex_lock(&got_mutex);
        install_lazy_request();
        pthread_mutex_unlock(&got_mutex);
    }
    /* Not under got_mutex: learning releases the GIL, and another thread may then stop. */
    int learned_ok = lazy_request ? learn_gil_mutexes(got_method_why, sizeof got_method_why) : -1;
    if (inline_only) snprintf(got_method_why, sizeof got_method_why, "not tried (TANDEM_PROBE_METHOD=inline)");
    else if (!lazy_request) snprintf(got_method_why, sizeof got_method_why, "no GOT slots for the GIL's mutexes");
    if (learned_ok == 0) {
        precise_method = "got";
        return 0;
    }
    /* Decode both before patching either, so a refusal leaves nothing half-installed. */
    char why[300];
    int drops = patch_all("drop_gil", drop_patches, drop_hooks, why, sizeof why);
    int takes = drops < 0 ? -1 : patch_all("take_gil", take_patches, take_hooks, why, sizeof why);
    if (takes < 0) {
        tandem_hooks_uninstall();   /* drop_gil's patches if any, the lazy request's GOT slots */
        snprintf(err, errlen, "GOT method: %s; inline hooks: %s", got_method_why, why);
        return -1;
    }
    patched_functions = drops + takes;
#if PY_VERSION_HEX >= 0x030C0000
    hot.main_gil = PyInterpreterState_Main()->ceval.gil;
#else
    hot.main_gil = &_PyRuntime.ceval.gil;
#endif
    if (!lazy_request) {
        pthread_mutex_lock(&got_mutex);
        install_lazy_request();
        pthread_mutex_unlock(&got_mutex);
    }
    precise_method = "inline";
    return 0;
}

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

#define MAX_GOT_SLOTS 1024
typedef struct {
    void **slot;
    void *old_value;
    int in_relro;
} got_patch;
static got_patch got_patches[MAX_GOT_SLOTS];
static int got_patch_count;
/* Held while slots are scanned, patched or restored: dlopen may run on any thread. */
static pthread_mutex_t got_mutex = PTHREAD_MUTEX_INITIALIZER;
static int exported_installed;

static void write_slot(void **slot, void *value, int in_relro) {
    uintptr_t page = (uintptr_t)slot & ~(uintptr_t)4095;
    if (in_relro) mprotect((void *)page, 4096, PROT_READ | PROT_WRITE);
    __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
    if (in_relro) mprotect((void *)page, 4096, PROT_READ);
}

/* Put back the slots patched from index FIRST on, newest first; got_mutex held. */
static void restore_slots_from(int first) {
    for (int i = got_patch_count - 1; i >= first; i--) write_slot(got_patches[i].slot, got_patches[i].old_value, got_patches[i].in_relro);
    got_patch_count = first;
}

/* The address range of the loaded object (its PT_LOAD segments) that contains an address.
 * Computed before a slot scan, never during one: the scan runs inside dl_iterate_phdr,
 * which holds the loader's list lock, and dladdr there would take the loader's main lock
 * in the opposite order to a concurrent dlopen. */
typedef struct {
    uintptr_t address, start, end;
} object_range;

static int range_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    object_range *r = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int inside = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        if (a < lo) lo = a;
        if (b > hi) hi = b;
        if (r->address >= a && r->address < b) inside = 1;
    }
    if (!inside) return 0;
    r->start = lo;
    r->end = hi;
    return 1;
}

/* The object holding the interpreter (libpython, or the executable); empty if not found. */
static object_range interpreter_range(void) {
    object_range r = {(uintptr_t)interpreter_anchor(), 0, 0};
    dl_iterate_phdr(range_cb, &r);
    return r;
}

typedef struct {
    void *replacement;
    object_range interpreter; /* the object holding the interpreter (empty: not counted) */
    int interpreter_slots;    /* of the slots seen, those in that object                  */
    int interpreter_only;     /* patch the slots in that object only                      */
} got_ctx;

static void patch_slot(void **slot, int in_relro, const char *object, void *ctx) {
    (void)object;
    got_ctx *c = ctx;
    int in_interpreter = (uintptr_t)slot >= c->interpreter.start && (uintptr_t)slot < c->interpreter.end;
    if (in_interpreter) c->interpreter_slots++;
    else if (c->interpreter_only) return;
    if (got_patch_count >= MAX_GOT_SLOTS || *slot == c->replacement) return;
    got_patches[got_patch_count++] = (got_patch){slot, *slot, in_relro};
    write_slot(slot, c->replacement, in_relro);
}

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

/* Lazy take request (above): the interpreter's own GOT slots of pthread_mutex_lock and
 * pthread_cond_timedwait (take_gil's; extension modules' slots are left alone). The
 * functions are looked up with dlsym, never taken from a slot: a lazily bound slot holds
 * the PLT stub, whose resolver would write the real address over our hook. Called with
 * got_mutex held, after the take/drop hooks are in place. */
static void install_lazy_request(void) {
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
    int before = got_patch_count;
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
    if (in_interpreter) install_lazy_request();
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

void tandem_hooks_uninstall(void) {
    __atomic_store_n(&hot.gil_mutex, NULL, __ATOMIC_SEQ_CST);
    hot.switch_mutex = NULL;
    forget_other_gils(NULL);
    precise_method = "";
    for (int i = 0; i < TANDEM_MAX_COPIES; i++) {
        tandem_patch_uninstall(&take_patches[i]);
        tandem_patch_uninstall(&drop_patches[i]);
    }
    patched_functions = 0;
    pthread_mutex_lock(&got_mutex);
    exported_installed = 0;
    __atomic_store_n(&lazy_request, 0, __ATOMIC_SEQ_CST); /* before its slots go back */
    restore_slots_from(0);
    pthread_mutex_unlock(&got_mutex);
}

int tandem_hooks_patched_sites(void) {
    return patched_functions + got_patch_count;
}
