/* The ring's producer fast path, inline (private to engine/probe; the contract is ring.h).
 *
 * The GIL hooks stamp on every hand-over, so the common case of tandem_ring_emit_gil (a
 * thread writing into its own private lane, which has room by the cached tail) is here as
 * a static inline function: the stamp is then one function, with no call into ring.c.
 * Everything else (first emit of a thread into a ring, the shared lane, a lane that looks
 * full, a fork child) falls through to tandem_ring_emit_gil, which handles every case.
 * Layout and protocol: docs/ring.md; the slow path and the drain thread: ring.c.
 */
#ifndef TANDEM_RING_FAST_H
#define TANDEM_RING_FAST_H

#include <stdatomic.h>
#include <stdint.h>

#include "ring.h"

/* One lane's counters: 512 bytes, each producer- or consumer-written word alone in a
 * 128-byte block (adjacent-line prefetch pairs 64-byte lines, hence 128). */
typedef struct {
    _Atomic uint64_t head;    /* +0: positions claimed (shared lane) / committed (private) */
    unsigned char pad0[120];
    _Atomic uint64_t tail;    /* +128: positions consumed by the drain thread              */
    unsigned char pad1[120];
    _Atomic uint64_t dropped; /* +256: events dropped because the lane was full            */
    unsigned char pad2[120];
    _Atomic uint32_t owner;   /* +384: tid of the thread owning a private lane, 0 = free   */
    uint32_t reserved;        /* +388 */
    uint64_t drain_lost;      /* +392: events file only: records consumed, not written     */
    unsigned char pad3[112];
} ring_lane;

/* GIL record (record_type 1, 32 bytes). */
typedef struct {
    _Atomic uint64_t seq; /* 0 = no committed record; lane position + 1 = committed record */
    uint64_t mono_ns;
    uint32_t tid;
    uint16_t kind;
    uint16_t lane;        /* index of the lane the record was produced into */
    uint64_t aux;         /* DROP: the code (codes.h); other GIL events 0; LOST marker: count of lost events */
} ring_gil_record;

/* First member of struct tandem_ring (ring.c): what the fast path reads of the ring. */
typedef struct {
    uint64_t id;              /* unique per ring in this process: the TLS lane cache's key */
    unsigned fork_generation; /* ring.c's fork generation when created; differs in a fork child */
} tandem_ring_hot;

struct tandem_thread_slot;

/* The calling thread's lane in the ring it last produced into. The fields a stamp uses
 * fill the first cache line exactly (ring id, slot base, mask, our copy of the head, the
 * room limit, the lane, the record tag, and the hooks' per-thread slot); the rest is
 * touched on the slow path only. */
typedef struct __attribute__((aligned(64))) {
    uint64_t ring_id;          /* 0: none */
    ring_gil_record *slots;    /* the lane's first slot */
    uint64_t mask;             /* lane capacity - 1 */
    uint64_t head;             /* private lane: next position; only we write lane->head, so
                                * this copy is exact and the shared line is never read */
    uint64_t limit;            /* positions below it may be written without reading tail:
                                * 0 for the shared lane (every emit takes the full path) */
    ring_lane *lane;
    uint64_t tag;              /* (uint64_t)lane_index << 48: the `lane` field in place */
    struct tandem_thread_slot *hook_slot; /* hooks.c's slot of this thread (not the ring's) */
    uint64_t capacity;         /* lane capacity (slots) */
    uint64_t tail_cache;       /* the lane's tail as last read: head - tail_cache >= real use */
    uint32_t shared_events;    /* events into the shared lane since the last look for a free lane */
    int hook_take_state;       /* hooks.c: where this thread is in a take of the GIL (inline method) */
    unsigned hook_gil_state;   /* hooks.c: the thread's GIL state and its generation (GOT method) */
    int hook_learning;         /* hooks.c: this thread is learning the GIL's mutexes */
    void *hook_last_lock;      /* hooks.c: the last mutex this thread locked that is no known GIL's */
    /* code_capture.h: the code this thread last released in (a one-entry cache of the code
     * table), valid for the ring code_ring only */
    void *code_key;            /* the code object */
    void *code_min_instr;      /* its first traceable instruction: a frame before it is incomplete */
    uint64_t code_ring;
    uint32_t code_id;
    uint16_t lane_index;
    uint16_t shared;           /* no private lane was free: producing into lane 0 */
} lane_cache;

/* Defined in ring.c. In a fork child, the forking thread's cache is reset (ring_id 0), so a
 * parent's ring never matches it and the fast path never writes into a parent's ring. */
extern __thread lane_cache tandem_my_lane __attribute__((tls_model("initial-exec"), visibility("hidden")));

#define TANDEM_PREFETCH_AHEAD 8 /* records: 256 bytes, 4 lines ahead */

/* tid, kind and lane are adjacent (bytes 16..23 of a record): one 8-byte store. */
static inline uint64_t tandem_record_word(uint32_t tid, uint16_t event, uint64_t tag) {
    return (uint64_t)tid | (uint64_t)event << 32 | tag;
}

/* Write one record into the thread's private lane at its head and publish it. The seqlock
 * writer side, for external readers that may still be copying the slot's previous record:
 * mark the slot empty, then a release fence so the mark is visible before any new field
 * value; then the fields, commit the slot's seq, publish the lane's head (plain moves on
 * x86-64). 5 stores per record: seq, time, tid+kind+lane, aux (the code of a DROP, 0
 * otherwise), seq, plus the head. */
static inline __attribute__((always_inline)) void tandem_lane_write(lane_cache *c, uint16_t event, uint32_t tid,
                                                                    uint64_t mono_ns, uint64_t aux) {
    uint64_t pos = c->head;
    ring_gil_record *slot = &c->slots[pos & c->mask];
    /* Fetch the line of the slot 8 positions on: a lane's lines were last written a lap ago
     * (2 MiB ago with 65536-slot lanes: out of L1/L2) and read since by the drain thread on
     * another core. Between two GIL events there are hundreds of ns to hide the fetch in
     * (in a back-to-back C loop there is nothing to hide it behind, which is why it looked
     * useless there). Measured on the lseek loop: ~-10 ns/event, at the noise's edge.
     * prefetchw (fetch for ownership) was no better here and needs a CPUID check. */
    __builtin_prefetch(&c->slots[(pos + TANDEM_PREFETCH_AHEAD) & c->mask], 1, 3);
    atomic_store_explicit(&slot->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    slot->mono_ns = mono_ns;
    uint64_t word = tandem_record_word(tid, event, c->tag);
    __builtin_memcpy(&slot->tid, &word, 8);
    slot->aux = aux;
    atomic_store_explicit(&slot->seq, pos + 1, memory_order_release);
    atomic_store_explicit(&c->lane->head, pos + 1, memory_order_release);
    c->head = pos + 1;
}

/* RING_ID: ((tandem_ring_hot *)ring)->id, passed by a caller that keeps it at hand. */
static inline __attribute__((always_inline)) void tandem_ring_emit_gil_fast(tandem_ring *ring, uint64_t ring_id, uint16_t event,
                                                                            uint32_t tid, uint64_t mono_ns, uint64_t aux) {
    lane_cache *c = &tandem_my_lane;
    /* Private lane with room by the cached limit (the shared lane has limit 0). */
    if (__builtin_expect(c->ring_id == ring_id && c->head < c->limit, 1)) {
        tandem_lane_write(c, event, tid, mono_ns, aux);
        return;
    }
    tandem_ring_emit_gil(ring, event, tid, mono_ns, aux); /* every other case */
}

#endif
