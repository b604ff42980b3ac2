/* GIL hooks: thread slots, the hot page, the stamps, GOT-slot patching, and what is common
 * to the backends (see hooks.h; the backends: hooks_hot.h). */
#define _GNU_SOURCE
#include "hooks_hot.h"

#include <dlfcn.h>
#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "symbols.h"

#pragma push_macro("membarrier_ready")
#undef membarrier_ready
tandem_hot_page hot_page __attribute__((aligned(4096))) = {.g = {.membarrier_ready = -1}};
#pragma pop_macro("membarrier_ready")
_Static_assert(sizeof hot_page == 4096, "the hooks' hot state must fill exactly one page");

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


/* A slot for a thread that found no free one: from the hot page while it has some. */
static tandem_thread_slot *new_slot(void) {
    int i = atomic_fetch_add(&hot_page.slots_used, 1);
    if (i < HOT_PAGE_SLOTS) return &hot_page.slots[i];
    tandem_thread_slot *s = aligned_alloc(_Alignof(tandem_thread_slot), sizeof *s);
    if (s != NULL) memset(s, 0, sizeof *s);
    return s;
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

void tandem_hooks_set_record_code(int on) {
    hot.record_code = on;
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
        uint64_t aux = with_code && hot.record_code ? tandem_code_aux(&tandem_my_lane, tstate, ring_id) : 0;
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
        int code_known = !with_code || !hot.record_code || tandem_code_aux_cached(c, tstate, ring_id, &aux);
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

HOT_CODE __attribute__((noinline)) void tandem_stamp_drop(PyThreadState *tstate) {
    stamp_fast(TANDEM_GIL_DROP, 1, tstate);
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
void ensure_membarrier(void) {
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
    tandem_got_after_fork_child();    /* the child keeps the main interpreter only */
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


static const char *precise_method = "";
const char *tandem_hooks_precise_method(void) { return precise_method; }
static char got_method_why[300];
const char *tandem_hooks_got_method_why(void) { return got_method_why; }
static int patched_functions;

/* The precise backend: the GOT method where it can learn the GIL's mutexes, else the
 * inline hooks (docs/probe.md, "precise"). */
int tandem_hooks_install_precise(char *err, size_t errlen) {
    ensure_membarrier();
    /* TANDEM_PROBE_METHOD=inline: the inline hooks even where the GOT method works (tests) */
    const char *method = getenv("TANDEM_PROBE_METHOD");
    int inline_only = method && strcmp(method, "inline") == 0;
    if (!inline_only) {
        pthread_mutex_lock(&got_mutex);
        tandem_got_install_lazy_request();
        pthread_mutex_unlock(&got_mutex);
    }
    /* Not under got_mutex: learning releases the GIL, and another thread may then stop. */
    int learned_ok = lazy_request ? tandem_got_learn_gil_mutexes(got_method_why, sizeof got_method_why) : -1;
    if (inline_only) snprintf(got_method_why, sizeof got_method_why, "not tried (TANDEM_PROBE_METHOD=inline)");
    else if (!lazy_request) snprintf(got_method_why, sizeof got_method_why, "no GOT slots for the GIL's mutexes");
    if (learned_ok == 0) {
        precise_method = "got";
        return 0;
    }
    char why[300];
    int patched = tandem_inline_install(why, sizeof why);
    if (patched < 0) {
        tandem_hooks_uninstall();   /* drop_gil's patches if any, the lazy request's GOT slots */
        snprintf(err, errlen, "GOT method: %s; inline hooks: %s", got_method_why, why);
        return -1;
    }
    patched_functions = patched;
    if (!lazy_request) {
        pthread_mutex_lock(&got_mutex);
        tandem_got_install_lazy_request();
        pthread_mutex_unlock(&got_mutex);
    }
    precise_method = "inline";
    return 0;
}


#define MAX_GOT_SLOTS 1024
typedef struct {
    void **slot;
    void *old_value;
    int in_relro;
} got_patch;
static got_patch got_patches[MAX_GOT_SLOTS];
static int got_patch_count;
pthread_mutex_t got_mutex = PTHREAD_MUTEX_INITIALIZER;

int got_patch_count_now(void) { return got_patch_count; }

void *interpreter_anchor(void) {
    /* Any exported function of the interpreter: tells which object (libpython or the
     * executable) to read. dlsym gives the definition itself, never a GOT/PLT entry. */
    return dlsym(RTLD_DEFAULT, "Py_GetVersion");
}


static void write_slot(void **slot, void *value, int in_relro) {
    uintptr_t page = (uintptr_t)slot & ~(uintptr_t)4095;
    if (in_relro) mprotect((void *)page, 4096, PROT_READ | PROT_WRITE);
    __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
    if (in_relro) mprotect((void *)page, 4096, PROT_READ);
}

/* Put back the slots patched from index FIRST on, newest first; got_mutex held. */
void restore_slots_from(int first) {
    for (int i = got_patch_count - 1; i >= first; i--) write_slot(got_patches[i].slot, got_patches[i].old_value, got_patches[i].in_relro);
    got_patch_count = first;
}

/* The address range of the loaded object (its PT_LOAD segments) that contains an address.
 * Computed before a slot scan, never during one: the scan runs inside dl_iterate_phdr,
 * which holds the loader's list lock, and dladdr there would take the loader's main lock
 * in the opposite order to a concurrent dlopen. */
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
object_range interpreter_range(void) {
    object_range r = {(uintptr_t)interpreter_anchor(), 0, 0};
    dl_iterate_phdr(range_cb, &r);
    return r;
}

void patch_slot(void **slot, int in_relro, const char *object, void *ctx) {
    (void)object;
    got_ctx *c = ctx;
    int in_interpreter = (uintptr_t)slot >= c->interpreter.start && (uintptr_t)slot < c->interpreter.end;
    if (in_interpreter) c->interpreter_slots++;
    else if (c->interpreter_only) return;
    if (got_patch_count >= MAX_GOT_SLOTS || *slot == c->replacement) return;
    got_patches[got_patch_count++] = (got_patch){slot, *slot, in_relro};
    write_slot(slot, c->replacement, in_relro);
}

void tandem_hooks_uninstall(void) {
    __atomic_store_n(&hot.gil_mutex, NULL, __ATOMIC_SEQ_CST);
    hot.switch_mutex = NULL;
    tandem_got_forget_other_gils();
    precise_method = "";
    tandem_inline_uninstall();
    patched_functions = 0;
    pthread_mutex_lock(&got_mutex);
    tandem_exported_forget();
    __atomic_store_n(&lazy_request, 0, __ATOMIC_SEQ_CST); /* before its slots go back */
    restore_slots_from(0);
    pthread_mutex_unlock(&got_mutex);
}

int tandem_hooks_patched_sites(void) {
    return patched_functions + got_patch_count;
}

