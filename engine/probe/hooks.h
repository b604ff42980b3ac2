/* GIL hooks: the stamps written on every GIL hand-over, and the backends that trigger them.
 *
 *   precise   inline hooks on CPython's static take_gil/drop_gil (found in .symtab):
 *             every release (voluntary, forced switch, thread exit) and every take.
 *   exported  GOT slots of the exported PyEval_SaveThread/PyEval_RestoreThread in every
 *             loaded object: voluntary releases only (Py_BEGIN/END_ALLOW_THREADS).
 *   sampling  see sampling.h.
 */
#ifndef TANDEM_HOOKS_H
#define TANDEM_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "ring.h"

/* Every thread that stamps gets one slot, found through an initial-exec TLS pointer (the
 * thread id is cached there: gettid() is a system call). Slots are recycled at thread exit. */
/* One per thread, alone in its 128-byte block (adjacent-line prefetch pairs 64-byte lines):
 * its owner writes in_stamp twice and events once per stamp, so two threads' slots sharing
 * a line would bounce it between their cores on every GIL event. */
typedef struct __attribute__((aligned(128))) tandem_thread_slot {
    uint32_t tid;
    volatile int in_stamp;            /* 1 while this thread may be writing into the ring  */
    volatile int free;                /* 1 when the thread that owned it has exited          */
    uint64_t events;                  /* stamps written by the threads that owned this slot */
    struct tandem_thread_slot *next;  /* singly linked, never unlinked                        */
} tandem_thread_slot;

/* Stamp one event for the calling thread into the active ring (no-op when none). */
void tandem_stamp(uint16_t kind);

/* Same, with a thread id given by the caller (the sampling thread stamps for others). */
void tandem_stamp_for(uint16_t kind, uint32_t tid);

/* The stamps' clock: 1 = raw TSC (for a ring created with time_tsc = 1), 0 =
 * clock_gettime(CLOCK_MONOTONIC). Set it only while no ring is set (before
 * tandem_hooks_set_ring(ring)), so it matches the ring every stamp goes to. */
void tandem_hooks_set_clock(int tsc);
int tandem_hooks_clock_is_tsc(void);

/* Whether a DROP records the code it runs (codes.h): 1 while a code table is open. Set it
 * only while no ring is set, like the clock. */
void tandem_hooks_set_record_code(int on);

/* GOT method: GILs of sub-interpreters known now; LEARNED (since install) and MISSED (no
 * room in the table) are written. */
int tandem_hooks_other_gils(int *learned, int *missed);

/* Benchmark only: with no ring set, fast-path stamps (TSC clock) read the TSC and write
 * nothing (1), or do neither (0). Call it while no ring is set. */
void tandem_hooks_set_dry_clock(int on);

/* Make RING the one the stamps go to (NULL: stop stamping). Detaching waits until no
 * thread is still writing into the old ring, so the caller may close it afterwards. */
void tandem_hooks_set_ring(tandem_ring *ring);

int tandem_hooks_install_precise(char *err, size_t errlen);
/* How the precise backend hooks: "got" (the GIL's mutexes through the interpreter's GOT),
 * "inline" (patched take_gil/drop_gil), "" when not installed; and why not "got". */
const char *tandem_hooks_precise_method(void);
const char *tandem_hooks_got_method_why(void);
int tandem_hooks_install_exported(char *err, size_t errlen);
void tandem_hooks_uninstall(void);

/* Counters for status(). */
uint64_t tandem_hooks_events(void);
int tandem_hooks_threads_seen(void);
int tandem_hooks_patched_sites(void);       /* functions (precise) or GOT slots (exported)  */

/* In a child after fork(): forget the parent's ring (its drain thread is gone) without
 * touching it, and give this thread its own id. The hooks stay installed. */
void tandem_hooks_after_fork_child(void);

#endif
