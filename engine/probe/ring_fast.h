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
    uint64_t aux;         /* 0 for GIL events; count of lost events in a LOST marker */
} ring_gil_record;

/* First member of struct tandem_ring (ring.c): what the fast path reads of the ring. */
typedef struct {
    uint64_t id;              /* unique per ring in this process: the TLS lane cache's key */
    unsigned fork_generation; /* ring.c's fork generation when created; differs in a fork child */
} tandem_ring_hot;

/* The calling thread's lane in the ring it last produced into. */
typedef struct {
    uint64_t ring_id;          /* 0: none */
    ring_lane *lane;
    ring_gil_record *slots;    /* the lane's first slot */
    uint64_t capacity;         /* lane capacity (slots) */
    uint64_t tail_cache;       /* the lane's tail as last read: head - tail_cache >= real use */
    uint32_t shared_events;    /* events into the shared lane since the last look for a free lane */
    uint16_t lane_index;
    uint16_t shared;           /* no private lane was free: producing into lane 0 */
} lane_cache;

/* Defined in ring.c. In a fork child, the forking thread's cache is reset (ring_id 0), so a
 * parent's ring never matches it and the fast path never writes into a parent's ring. */
extern __thread lane_cache tandem_my_lane __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* Write one record into the thread's private lane at POS and publish it. The seqlock writer
 * side, for external readers that may still be copying the slot's previous record: mark the
 * slot empty, then a release fence so the mark is visible before any new field value; then
 * the fields, commit the slot's seq, publish the lane's head (plain moves on x86-64). */
static inline __attribute__((always_inline)) void tandem_lane_write(lane_cache *c, ring_lane *lane, uint64_t pos,
                                                                    uint16_t event, uint32_t tid, uint64_t mono_ns) {
    ring_gil_record *slot = &c->slots[pos & (c->capacity - 1)];
    atomic_store_explicit(&slot->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    slot->mono_ns = mono_ns;
    slot->tid = tid;
    slot->kind = event;
    slot->lane = c->lane_index;
    slot->aux = 0;
    atomic_store_explicit(&slot->seq, pos + 1, memory_order_release);
    atomic_store_explicit(&lane->head, pos + 1, memory_order_release);
}

static inline __attribute__((always_inline)) void tandem_ring_emit_gil_fast(tandem_ring *ring, uint16_t event, uint32_t tid,
                                                                            uint64_t mono_ns) {
    lane_cache *c = &tandem_my_lane;
    if (__builtin_expect(c->ring_id == ((const tandem_ring_hot *)ring)->id && !c->shared, 1)) {
        /* Private lane: we are its only producer, so head is ours to read plainly. */
        ring_lane *lane = c->lane;
        uint64_t pos = atomic_load_explicit(&lane->head, memory_order_relaxed);
        if (__builtin_expect(pos - c->tail_cache < c->capacity, 1)) {
            tandem_lane_write(c, lane, pos, event, tid, mono_ns);
            return;
        }
    }
    tandem_ring_emit_gil(ring, event, tid, mono_ns); /* every other case */
}

#endif
