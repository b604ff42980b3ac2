/* Producer side of the tandem shared-memory ring (layout and protocol: docs/ring.md).
 *
 * Contract between the ring (engine/probe/ring.c, transport) and the GIL hooks
 * (engine/probe/hooks*.c, capture). The hooks only ever call tandem_ring_emit_gil on the
 * hot path (through its inline private-lane fast path, ring_fast.h, which falls back to
 * it); everything else happens at start/stop.
 *
 * Threads: tandem_ring_emit_gil may be called from any number of threads at once. Format
 * v2 gives each producer thread its own lane (a single-producer ring: no locked
 * instruction on the hot path); the first emit of a thread into a ring takes a free lane
 * (cold path, once), later ones find it in a thread-local cache. Threads beyond the
 * ring's lanes share lane 0 (compare-and-swap claim). A lane is given back when its
 * thread exits. create / start_drain / stats / close are called from one control thread.
 * close unmaps the ring: call it only once no thread can still be inside
 * tandem_ring_emit_gil (uninstall the hooks and let in-flight calls return first).
 *
 * fork(): a child process inherits the mapping; emit calls in the child are ignored and
 * close in the child only unmaps (the child must create its own ring to record).
 */
#ifndef TANDEM_RING_H
#define TANDEM_RING_H

#include <stddef.h>
#include <stdint.h>

/* GIL event kinds stamped by the probe (values are part of the on-disk format). */
enum tandem_gil_event {
    TANDEM_GIL_DROP = 1,          /* drop_gil entry: the thread releases the GIL          */
    TANDEM_GIL_TAKE_REQUEST = 2,  /* take_gil entry: the thread asks for the GIL back     */
    TANDEM_GIL_TAKE_ACQUIRED = 3, /* take_gil return: the thread holds the GIL again      */
    TANDEM_GIL_SAMPLE_HELD = 4,   /* sampling backend: `tid` was seen holding the GIL     */
    TANDEM_GIL_SAMPLE_FREE = 5,   /* sampling backend: nobody held the GIL at this instant */
};

/* Written only by the drain thread into the events file (never into the ring): `aux`
 * producer events were dropped because lane `lane` was full since that lane's previous
 * marker. */
#define TANDEM_RING_LOST_MARKER 0xFF01u

typedef struct tandem_ring tandem_ring;

typedef struct {
    uint32_t capacity;            /* record slots in all lanes together; a power of two,
                                   * 2 .. 2^26 (the memory budget: capacity * 32 bytes)   */
    const char *python_version;   /* e.g. "3.12.1", copied into the header (<= 31 bytes)  */
    const char *backend;          /* probe backend that produces into this ring (<= 31)   */
    uint32_t lanes;               /* lanes, a power of two in [1, 64] with capacity/lanes
                                   * >= 2; lane 0 is the shared one, so lanes - 1 threads
                                   * get a private lane. 0 = automatic:
                                   * clamp(capacity / 16384, 1, 64) (lanes of >= 16384
                                   * slots). 1 = one shared lane (the v1 protocol).       */
    uint32_t time_tsc;            /* 1: producers pass raw TSC ticks as the time (the ring
                                   * header says clock_id 2 and carries the drain thread's
                                   * (tsc, CLOCK_MONOTONIC) pairs; the drain converts what it
                                   * appends to the events file to CLOCK_MONOTONIC ns).
                                   * 0: CLOCK_MONOTONIC ns (clock_id 1).                   */
    uint32_t wait_when_full;      /* 1: while a drain thread runs, a producer whose lane is
                                   * full wakes it and sleeps until the lane has room,
                                   * instead of dropping: lossless offline recording at the
                                   * price of stalling that thread for about one drain pass
                                   * when the drain thread is starved. 0: drop and count
                                   * (the ring protocol's "full" rule).                    */
} tandem_ring_options;

/* Counters as seen by the control thread (for probe.json and `tandem doctor`). */
typedef struct {
    uint64_t claimed;             /* events that got a slot (sum of the lanes' heads)     */
    uint64_t dropped;             /* events dropped because their lane was full (sum)     */
    uint64_t drained;             /* records appended to the events file                  */
    uint64_t drain_lost;          /* records consumed but not written (events file error) */
    int drain_errno;              /* first write error of the drain thread, 0 if none     */
    uint64_t full_waits;          /* times a producer found its lane full and waited for
                                   * the drain (wait_when_full): the drain was late      */
    uint64_t wakeups;             /* times a producer woke the drain (a lane half full)   */
    uint64_t drain_cpu_ns;        /* the drain thread's CPU time up to its last pass      */
} tandem_ring_stats;

/* Create PATH (mode 0600, O_EXCL) sized for the options, map it, fill the header.
 * Returns NULL and writes a one-line reason into err on failure. */
tandem_ring *tandem_ring_create(const char *path, const tandem_ring_options *opt, char *err, size_t errlen);

/* Hot path, any thread: never allocates, never takes a lock; on a private lane no locked
 * instruction either. When the thread's lane is full the event is dropped and counted in
 * that lane, or, with options.wait_when_full and a drain thread running, the thread waits
 * for the drain to make room (at most 250 ms). Cold paths: the first call of a thread for
 * a ring takes a lane (one gettid system call, a scan of the lane table with a CAS,
 * pthread_setspecific, which glibc may satisfy with a calloc the first time in a thread),
 * and a thread on the shared lane does so again every 65536 events; a lane reaching half
 * full wakes the drain (its mutex and condition variable, once per drain pass). */
/* AUX: the record's aux (a DROP's code, codes.h; 0 for other events). */
void tandem_ring_emit_gil(tandem_ring *ring, uint16_t event, uint32_t tid, uint64_t mono_ns, uint64_t aux);

/* Start a native thread (no GIL) that appends committed records, each lane's in order, to
 * EVENTS_PATH every PERIOD_US microseconds (more often, down to 100 us, while a lane is
 * more than a quarter full when it wakes; at once when a producer finds its lane half
 * full). It first gives itself a private descriptor table holding only the events file
 * (tandem_private_fd_table), so a small ring loses nothing to a slow reader
 * and a SIGKILLed process leaves a file readable up to the last drained record. Lanes
 * interleave in the file (a batch per lane per pass): order is per lane, i.e. per thread.
 * EVENTS_PATH is created 0600 O_EXCL. EVENTS_PATH NULL: the thread only consumes (frees
 * slots) without writing, for live mode without a file. Returns 0, or -1 with err set. */
int tandem_ring_start_drain(tandem_ring *ring, const char *events_path, uint32_t period_us, char *err, size_t errlen);

/* Before tandem_ring_start_drain: write the events as a series of segments instead of one
 * file, EVENTS_PATH.000000, .000001, ... (docs/ring.md, "Segments"): the drain closes the
 * current one (whole, with its counters, readable on its own) after the pass that makes it
 * MAX_BYTES long or MAX_NS old, and starts the next. 0 for both: one file (the default).
 * Returns 0, or -1 once the drain has started. */
int tandem_ring_set_segments(tandem_ring *ring, uint64_t max_bytes, uint64_t max_ns);

/* For the probe's native helper threads (drain, sampler), called first in the thread: give
 * it a private file descriptor table holding only KEEP_FD (-1: none), so its existence does
 * not put the program's own fd system calls on the kernel's shared-table slow path
 * (ring.c says why). Returns 1 if done, 0 if the table stays shared (old kernel). */
int tandem_private_fd_table(int keep_fd);

/* Fill STATS (any time between create and close). */
void tandem_ring_stats_get(tandem_ring *ring, tandem_ring_stats *stats);

/* Stop the drain thread after a last drain, flush, unmap. The ring file stays. */
void tandem_ring_close(tandem_ring *ring);

#endif
