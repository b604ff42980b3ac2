/* The tandem shared-memory ring, producer side (layout and protocol: docs/ring.md, v2).
 *
 * One file, mapped MAP_SHARED: a 4096-byte header page, a lane table (512 bytes per lane,
 * padded to a page), then `lanes` rings of `lane_capacity` fixed-size records each.
 *
 * Lane 0 is shared: any thread may produce into it by claiming a position with a CAS on
 * the lane's head (the version 1 protocol). Lanes 1 .. lanes-1 are private: a thread takes
 * one on its first emit (cached in initial-exec TLS) and is its only producer, so an emit
 * there is plain stores plus release stores (plain moves on x86-64), no locked
 * instruction. Every slot is committed by a release store of its sequence word
 * (position + 1); a private lane then publishes its head too. The one consumer, the drain
 * thread, copies each lane's committed slots in position order to the events file and
 * advances that lane's tail with release semantics, which hands the slots back.
 * External readers only read, so they can never stall producers.
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_fast.h"
#include "tsc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL (populate_writable) */
#endif

/* ---- On-disk layout (docs/ring.md, "Header"); every multi-byte field little-endian. ---- */

#define RING_MAGIC "TNDMRING"
#define RING_VERSION 2u
#define RING_HEADER_SIZE 4096u
#define RING_FILE_KIND_RING 1u
#define RING_FILE_KIND_EVENTS 2u
#define RING_RECORD_TYPE_GIL 1u
#define RING_GIL_RECORD_SIZE 32u
#define RING_CLOCK_MONOTONIC 1u
#define RING_CLOCK_TSC 2u /* ring only: times are TSC ticks, mapped by the calibration table */
#define RING_MIN_CAPACITY 2u
#define RING_MAX_CAPACITY (1u << 26)
#define RING_MAX_LANES 64u
#define RING_AUTO_LANE_SLOTS 16384u
#define RING_LANE_STRIDE 512u
#define RING_MIN_DRAIN_US 100u
#define RING_FULL_WAIT_MAX_MS 250u /* wait_when_full: longest wait for the drain per event */

#define RING_STATE_DRAINING 1u /* a drain thread consumes this ring */
#define RING_STATE_CLOSED 2u   /* the producer closed the ring (no more records) */

/* Static identifying fields, written once before any producer runs. */
#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_HEADER_SIZE 12
#define OFF_FILE_KIND 16
#define OFF_RECORD_TYPE 20
#define OFF_RECORD_SIZE 24
#define OFF_LANE_CAPACITY 28
#define OFF_PRODUCER_PID 32
#define OFF_CLOCK_ID 36
#define OFF_SYNC_REALTIME 40
#define OFF_SYNC_MONOTONIC 48
#define OFF_SYNC_UNCERTAINTY 56
#define OFF_BOOT_ID 64          /* char[40]: the 36-char text of boot_id, NUL padded */
#define LEN_BOOT_ID 40
#define OFF_RUNTIME_VERSION 104 /* char[32] */
#define LEN_RUNTIME_VERSION 32
#define OFF_BACKEND 136         /* char[32] */
#define LEN_BACKEND 32
#define OFF_LANE_COUNT 168      /* u32 */
#define OFF_LANE_STRIDE 172     /* u32, 512 */
#define OFF_RECORDS_OFFSET 176  /* u64: 4096 + lane table rounded up to 4096 */
/* Whole-file state (the per-lane counters are in the lane table). */
#define OFF_STATE 1408      /* u32 RING_STATE_* bits */
#define OFF_DRAIN_LOST 1416 /* u64, meaningful in a closed events file: sum over the lanes */
#define OFF_NAMES_USED 2048 /* u32 + name table up to the page end (pause records; unused here) */
#define OFF_SEGMENT 184     /* u32, events file: segment number (0 for the first or only file) */
#define LANE_OFF_BASE_HEAD 400    /* u64, events file: the lane's positions before this segment */
#define LANE_OFF_BASE_DROPPED 408 /* u64, events file: the lane's drops reported before it   */
/* TSC calibration (clock_id 2 rings only; zero otherwise and in events files): the drain
 * thread's (tsc, CLOCK_MONOTONIC ns) pairs, under a seqlock (docs/ring.md, "TSC time"). */
#define OFF_CALIB_SEQ 512        /* u64: odd while the drain thread writes the block below  */
#define OFF_CALIB_TOTAL 520      /* u64: pairs written into the table so far               */
#define OFF_CALIB_FIRST_TSC 528  /* u64: the pair taken when the ring was created...        */
#define OFF_CALIB_FIRST_MONO 536 /* u64: ...(kept for the life of the ring)                 */
#define OFF_CALIB_TABLE 576      /* CALIB_SLOTS x (u64 tsc, u64 mono): pair i in slot i % 16 */
#define CALIB_SLOTS 16
#define CALIB_MAX_WIDTH_NS 2000 /* a wider (tsc, mono) bracket is not kept as a knot */
#define OFF_CALIB_END (OFF_CALIB_TABLE + CALIB_SLOTS * 16)

_Static_assert(sizeof(ring_lane) == RING_LANE_STRIDE, "a lane's counters take 512 bytes");
_Static_assert(sizeof(ring_gil_record) == RING_GIL_RECORD_SIZE, "GIL record is 32 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ring layout is little-endian");

struct tandem_ring {
    tandem_ring_hot hot;      /* first: read by the inline fast path (ring_fast.h) */
    unsigned char *base; /* the whole mapping: header page + lane table + records */
    size_t map_len;
    ring_lane *lanes;
    ring_gil_record *records; /* lane l's slots: records[l * lane_capacity ...] */
    uint32_t lane_count;
    uint64_t lane_capacity;
    uint64_t mask;
    size_t records_offset;
    struct tandem_ring *next_live; /* list of open rings (guarded by live_mutex) */
    char path[4096];

    /* Drain thread state (owned by the control thread until started, then shared). */
    int drain_started;
    pthread_t drain_thread;
    pthread_mutex_t drain_mutex;
    pthread_cond_t drain_cond; /* signalled by close to cut the period short */
    int drain_stop;            /* guarded by drain_mutex */
    _Atomic int wake_pending;  /* a producer asked for a pass (written under drain_mutex) */
    pthread_cond_t pass_cond;  /* broadcast (under drain_mutex) after a pass when full_waiters */
    int full_waiters;          /* producers waiting for room (guarded by drain_mutex) */
    int drain_stalled;         /* a wait for room timed out and no pass completed since
                                * (guarded by drain_mutex): full lanes drop, not wait */
    int wait_when_full;        /* options.wait_when_full */
    uint32_t period_us;
    int events_fd;             /* -1: consume without writing (drain thread's table) */
    int control_fd;            /* the first events file as opened in the program's table */
    int private_fd_table;      /* the drain thread runs with a private fd table */
    int events_failed;         /* a write failed: records are no longer appended */
    off_t events_size;         /* bytes of the events file: header + lane table + whole batches */
    unsigned char *events_header; /* records_offset bytes: header page + lane table */
    _Atomic uint64_t drained;
    _Atomic uint64_t drain_lost;
    _Atomic int drain_errno;
    _Atomic uint64_t full_waits;      /* waits of producers for room (wait_when_full) */
    _Atomic uint64_t wakeups;         /* wake_drain requests that signalled the drain */
    _Atomic uint64_t drain_cpu_ns;    /* the drain thread's CPU time, as of its last pass */
    uint64_t dropped_reported[RING_MAX_LANES]; /* drops already written as LOST markers */
    /* TSC time (time_tsc): the creation pair and the last CALIB_SLOTS pairs of the drain
     * thread (also in the header), and a buffer for converted copies of drained records. */
    int time_tsc;
    tandem_tsc_pair calib_first;
    uint64_t calib_tsc[CALIB_SLOTS], calib_mono[CALIB_SLOTS];
    uint64_t calib_total;
    double ns_per_tick;       /* nominal, from the creation pairs: to judge a pair's width */
    ring_gil_record *converted;
    uint64_t lane_drain_lost[RING_MAX_LANES]; /* (of the current segment when rotating) */
    /* Segment rotation (tandem_ring_set_segments): the events file is a series of
     * standalone files EVENTS.000000, EVENTS.000001, ...; each lane's position and reported
     * drops where the current segment starts. */
    uint64_t segment_bytes, segment_ns; /* 0, 0: one events file, no rotation */
    uint32_t segment;
    uint64_t segment_started_ns;
    char events_base[4096];
    uint64_t lane_base_head[RING_MAX_LANES], lane_base_dropped[RING_MAX_LANES];
    /* Bytes of each lane made writable so far, from its first slot (RING_STARTER_BYTES at
     * creation, then populate_lanes), and its head at the drain's previous look. */
    size_t lane_populated[RING_MAX_LANES];
    uint64_t lane_seen_head[RING_MAX_LANES];
};

/* Bumped in the child after fork(): rings created in the parent are then ignored there. */
static _Atomic unsigned fork_generation;
static _Atomic uint64_t next_ring_id = 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t lane_key; /* non-NULL value: this thread may own lanes (release at exit) */
static pthread_mutex_t live_mutex = PTHREAD_MUTEX_INITIALIZER;
static tandem_ring *live_rings;

/* The calling thread's lane cache (ring_fast.h). */
__thread lane_cache tandem_my_lane __attribute__((tls_model("initial-exec")));
#define my_lane tandem_my_lane

static void on_fork_prepare(void) { pthread_mutex_lock(&live_mutex); }
static void on_fork_parent(void) { pthread_mutex_unlock(&live_mutex); }
static void on_fork_child(void) {
    atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
    /* The forking thread's lane cache names a parent ring: forget it, so the inline fast
     * path (ring_fast.h) misses and the full emit sees the fork and ignores the event. */
    my_lane.ring_id = 0;
    pthread_mutex_unlock(&live_mutex);
}

static void release_lanes(void *unused);

static void init_once(void) {
    pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child);
    pthread_key_create(&lane_key, release_lanes);
}

static inline unsigned current_generation(void) { return atomic_load_explicit(&fork_generation, memory_order_relaxed); }

static void put_u32(unsigned char *base, size_t off, uint32_t v) { memcpy(base + off, &v, 4); }
static void put_u64(unsigned char *base, size_t off, uint64_t v) { memcpy(base + off, &v, 8); }
static inline _Atomic uint32_t *header_u32(unsigned char *base, size_t off) { return (_Atomic uint32_t *)(base + off); }

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A (CLOCK_REALTIME, CLOCK_MONOTONIC) pair: realtime read between two monotonic reads,
 * the tightest bracket of a few tries kept; monotonic is the bracket's midpoint. */
static void clock_pair(uint64_t *realtime, uint64_t *monotonic, uint64_t *uncertainty) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 8; i++) {
        uint64_t before = clock_ns(CLOCK_MONOTONIC);
        uint64_t real = clock_ns(CLOCK_REALTIME);
        uint64_t after = clock_ns(CLOCK_MONOTONIC);
        if (after - before < best) {
            best = after - before;
            *realtime = real;
            *monotonic = before + (after - before) / 2;
        }
    }
    *uncertainty = best;
}

static void copy_text(unsigned char *dst, size_t cap, const char *src) {
    size_t n = src ? strnlen(src, cap - 1) : 0; /* keep at least one NUL */
    memset(dst, 0, cap);
    if (n) memcpy(dst, src, n);
}

static void read_boot_id(unsigned char dst[LEN_BOOT_ID]) {
    char text[64] = {0};
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, text, 36);
        close(fd);
        if (n != 36) text[0] = 0;
    }
    text[36] = 0;
    copy_text(dst, LEN_BOOT_ID, text);
}

static void fill_header(unsigned char *h, const tandem_ring_options *opt, uint32_t lanes, uint32_t lane_capacity,
                        size_t records_offset, const tandem_tsc_pair *first, const tandem_tsc_pair *second) {
    memset(h, 0, RING_HEADER_SIZE);
    memcpy(h + OFF_MAGIC, RING_MAGIC, 8);
    put_u32(h, OFF_VERSION, RING_VERSION);
    put_u32(h, OFF_HEADER_SIZE, RING_HEADER_SIZE);
    put_u32(h, OFF_FILE_KIND, RING_FILE_KIND_RING);
    put_u32(h, OFF_RECORD_TYPE, RING_RECORD_TYPE_GIL);
    put_u32(h, OFF_RECORD_SIZE, RING_GIL_RECORD_SIZE);
    put_u32(h, OFF_LANE_CAPACITY, lane_capacity);
    put_u32(h, OFF_PRODUCER_PID, (uint32_t)getpid());
    put_u32(h, OFF_CLOCK_ID, first ? RING_CLOCK_TSC : RING_CLOCK_MONOTONIC);
    if (first) { /* two pairs from the start, so a tailer always has a slope */
        put_u64(h, OFF_CALIB_FIRST_TSC, first->tsc);
        put_u64(h, OFF_CALIB_FIRST_MONO, first->mono_ns);
        put_u64(h, OFF_CALIB_TABLE, second->tsc);
        put_u64(h, OFF_CALIB_TABLE + 8, second->mono_ns);
        put_u64(h, OFF_CALIB_TOTAL, 1);
    }
    uint64_t real = 0, mono = 0, uncertainty = 0;
    clock_pair(&real, &mono, &uncertainty);
    put_u64(h, OFF_SYNC_REALTIME, real);
    put_u64(h, OFF_SYNC_MONOTONIC, mono);
    put_u64(h, OFF_SYNC_UNCERTAINTY, uncertainty);
    read_boot_id(h + OFF_BOOT_ID);
    copy_text(h + OFF_RUNTIME_VERSION, LEN_RUNTIME_VERSION, opt->python_version);
    copy_text(h + OFF_BACKEND, LEN_BACKEND, opt->backend);
    put_u32(h, OFF_LANE_COUNT, lanes);
    put_u32(h, OFF_LANE_STRIDE, RING_LANE_STRIDE);
    put_u64(h, OFF_RECORDS_OFFSET, records_offset);
}

/* Map a fresh, zero-filled file of MAP_LEN bytes at BUILD_PATH. Returns NULL with err set. */
static unsigned char *create_mapping(const char *build_path, const char *path, size_t map_len, char *err, size_t errlen) {
    int fd = open(build_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "ring %s: cannot create %s: %s", path, build_path, strerror(errno));
        return NULL;
    }
    /* Reserve the blocks now: a sparse file on a full disk would SIGBUS a producer later. */
    int rc = posix_fallocate(fd, 0, (off_t)map_len);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, (off_t)map_len) == 0 ? 0 : errno;
    if (rc != 0) {
        snprintf(err, errlen, "ring %s: cannot size to %zu bytes: %s", path, map_len, strerror(rc));
        close(fd);
        return NULL;
    }
    /* Not MAP_POPULATE: pages are made writable where producers will write, a few at start
     * and a lane in use by the drain thread (populate_writable; docs/ring.md, "Creating a
     * ring"). MADV_RANDOM: a fault reads in its own page only, not a read-ahead window of
     * pages (zeroed one by one) that no producer may ever use. */
    unsigned char *base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "ring %s: cannot map: %s", path, strerror(map_errno));
        return NULL;
    }
    madvise(base, map_len, MADV_RANDOM);
    return base;
}

/* Make the pages of [FROM, FROM + LEN) present and writable, so that a producer's first
 * store to them does not fault on its hot path (a shared file mapping starts with no page
 * mapped, and a read-populated one write-protected for dirty tracking). Leaves every byte
 * as it is: safe while producers write into the range. MADV_POPULATE_WRITE (Linux 5.14)
 * does it in one call; before that, an atomic add of 0 to each page's first word. */
static void populate_writable(unsigned char *from, size_t len) {
    uintptr_t start = (uintptr_t)from & ~(uintptr_t)4095, end = ((uintptr_t)from + len + 4095) & ~(uintptr_t)4095;
    if (end <= start || madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) return; /* e.g. out of memory: producers fault the pages in themselves */
    for (uintptr_t page = start; page < end; page += 4096)
        atomic_fetch_add_explicit((_Atomic uint64_t *)page, 0, memory_order_relaxed);
}

/* Each lane's first RING_STARTER_BYTES are made writable at creation (a new thread's first
 * events); after that the drain thread keeps a lane in use writable ahead of its head
 * (populate_lanes) by four times what the head advanced since the previous pass, at least
 * RING_POPULATE_AHEAD_SLOTS, RING_POPULATE_CHUNK at a time: how long the drain may hold
 * the mapping's lock against the program's own mmap/munmap, or make a close wait. A lane
 * is made writable only as far as its producer gets: a thread with few GIL hand-overs
 * costs a few pages, not its 512. */
#define RING_STARTER_BYTES (4u * 4096u)
#define RING_POPULATE_AHEAD_SLOTS 2048u
#define RING_POPULATE_CHUNK (32u * 4096u)
/* The drain's first pass comes after this long (then the period doubles up to its own),
 * so the populating keeps up with a thread that starts at a high rate. */
#define RING_FIRST_DRAIN_US 1000u

static size_t records_offset_for(uint32_t lanes) {
    size_t table = (size_t)lanes * RING_LANE_STRIDE;
    return RING_HEADER_SIZE + (table + 4095u) / 4096u * 4096u;
}

tandem_ring *tandem_ring_create(const char *path, const tandem_ring_options *opt, char *err, size_t errlen) {
    pthread_once(&once, init_once);
    uint32_t cap = opt ? opt->capacity : 0;
    if (cap < RING_MIN_CAPACITY || cap > RING_MAX_CAPACITY || (cap & (cap - 1)) != 0) {
        snprintf(err, errlen, "ring %s: capacity %u is not a power of two in [%u, %u]", path, cap, RING_MIN_CAPACITY, RING_MAX_CAPACITY);
        return NULL;
    }
    uint32_t lanes = opt->lanes;
    if (lanes == 0) {
        lanes = cap / RING_AUTO_LANE_SLOTS;
        if (lanes < 1) lanes = 1;
        if (lanes > RING_MAX_LANES) lanes = RING_MAX_LANES;
    }
    if (lanes > RING_MAX_LANES || (lanes & (lanes - 1)) != 0 || cap / lanes < RING_MIN_CAPACITY) {
        snprintf(err, errlen, "ring %s: %u lanes: not a power of two in [1, %u] leaving >= %u slots per lane of %u", path, lanes,
                 RING_MAX_LANES, RING_MIN_CAPACITY, cap);
        return NULL;
    }
    uint32_t lane_cap = cap / lanes;
    char build_path[sizeof(((tandem_ring *)0)->path) + 32];
    if (strlen(path) >= sizeof(((tandem_ring *)0)->path)) {
        snprintf(err, errlen, "ring path too long: %.60s...", path);
        return NULL;
    }
    if (access(path, F_OK) == 0) { /* early, clear error; link() below is the real check */
        snprintf(err, errlen, "ring %s: cannot create: %s", path, strerror(EEXIST));
        return NULL;
    }
    /* Built under a private name and linked into place complete, so a reader never sees a
     * ring without its header; link() fails if PATH exists, like O_EXCL. */
    snprintf(build_path, sizeof build_path, "%s.building-%d", path, (int)getpid());
    size_t records_offset = records_offset_for(lanes);
    size_t map_len = records_offset + (size_t)cap * RING_GIL_RECORD_SIZE;
    int time_tsc = opt->time_tsc && TANDEM_HAVE_TSC;
    tandem_tsc_pair first = {0, 0, 0}, second = {0, 0, 0};
    if (time_tsc) tandem_tsc_pair_take(&first);
    unsigned char *base = create_mapping(build_path, path, map_len, err, errlen);
    size_t lane_bytes = (size_t)lane_cap * RING_GIL_RECORD_SIZE;
    size_t starter = lane_bytes < RING_STARTER_BYTES ? lane_bytes : RING_STARTER_BYTES;
    if (base) {
        /* The header, the lane table (every producer stores its lane's head there) and each
         * lane's first slots. */
        populate_writable(base, records_offset);
        for (uint32_t l = 0; l < lanes; l++) populate_writable(base + records_offset + l * lane_bytes, starter);
    }
    if (time_tsc) {
        /* A second pair at least 200 us later (mapping the ring usually takes longer), so
         * the slope a tailer uses before the drain's first pass is not mostly noise. */
        while (tandem_monotonic_ns() - first.mono_ns < 200000u) { }
        tandem_tsc_pair_take(&second);
    }
    tandem_ring *ring = base ? calloc(1, sizeof *ring) : NULL;
    unsigned char *events_header = ring ? calloc(1, records_offset) : NULL;
    if (base && (!ring || !events_header)) snprintf(err, errlen, "ring %s: out of memory", path);
    if (ring && events_header) {
        /* The file is zero-filled: every slot's seq is 0 = empty, every lane's counters 0
         * and owner 0 = free. */
        fill_header(base, opt, lanes, lane_cap, records_offset, time_tsc ? &first : NULL, &second);
        if (link(build_path, path) != 0) {
            snprintf(err, errlen, "ring %s: cannot create: %s", path, strerror(errno));
            free(events_header);
            events_header = NULL;
        }
    }
    unlink(build_path);
    if (!events_header) {
        free(ring);
        if (base) munmap(base, map_len);
        return NULL;
    }
    ring->base = base;
    ring->map_len = map_len;
    ring->lanes = (ring_lane *)(base + RING_HEADER_SIZE);
    ring->records = (ring_gil_record *)(base + records_offset);
    ring->lane_count = lanes;
    ring->lane_capacity = lane_cap;
    ring->mask = lane_cap - 1;
    ring->records_offset = records_offset;
    ring->events_header = events_header;
    ring->hot.id = atomic_fetch_add_explicit(&next_ring_id, 1, memory_order_relaxed);
    ring->hot.fork_generation = current_generation();
    ring->events_fd = -1;
    ring->control_fd = -1;
    ring->time_tsc = time_tsc;
    ring->wait_when_full = opt->wait_when_full != 0;
    ring->calib_first = first;
    for (uint32_t l = 0; l < lanes; l++) ring->lane_populated[l] = starter;
    ring->calib_tsc[0] = second.tsc;
    ring->calib_mono[0] = second.mono_ns;
    ring->calib_total = 1;
    ring->ns_per_tick = time_tsc ? (double)(second.mono_ns - first.mono_ns) / (double)(second.tsc - first.tsc) : 1.0;
    snprintf(ring->path, sizeof ring->path, "%s", path);
    pthread_mutex_init(&ring->drain_mutex, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ring->drain_cond, &ca);
    pthread_cond_init(&ring->pass_cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&live_mutex);
    ring->next_live = live_rings;
    live_rings = ring;
    pthread_mutex_unlock(&live_mutex);
    return ring;
}

/* ---- Producers -------------------------------------------------------------------------- */

/* Thread exit (pthread key destructor): give back every private lane this thread owns in
 * the open rings of this process. The release CAS orders the thread's last head store
 * before the next owner's acquire of the lane. */
static void release_lanes(void *unused) {
    (void)unused;
    uint32_t me = (uint32_t)syscall(SYS_gettid);
    unsigned gen = current_generation();
    pthread_mutex_lock(&live_mutex);
    for (tandem_ring *r = live_rings; r; r = r->next_live) {
        if (r->hot.fork_generation != gen) continue;
        for (uint32_t l = 1; l < r->lane_count; l++) {
            uint32_t expected = me;
            atomic_compare_exchange_strong_explicit(&r->lanes[l].owner, &expected, 0, memory_order_release, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&live_mutex);
    my_lane.ring_id = 0;
}

/* Cold path: the first emit of this thread into RING (or a retry from the shared lane).
 * Takes the private lane this thread already owns in RING, else a free one, else lane 0. */
static __attribute__((noinline)) void take_lane(tandem_ring *ring, lane_cache *c) {
    uint32_t me = (uint32_t)syscall(SYS_gettid);
    uint32_t found = 0;
    for (uint32_t l = 1; l < ring->lane_count && !found; l++)
        if (atomic_load_explicit(&ring->lanes[l].owner, memory_order_acquire) == me) found = l;
    for (uint32_t l = 1; l < ring->lane_count && !found; l++) {
        uint32_t expected = 0;
        /* acquire pairs with the previous owner's release at its exit: its head is ours now. */
        if (atomic_load_explicit(&ring->lanes[l].owner, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&ring->lanes[l].owner, &expected, me, memory_order_acquire, memory_order_relaxed))
            found = l;
    }
    c->ring_id = ring->hot.id;
    c->lane_index = (uint16_t)found;
    c->tag = (uint64_t)found << 48;
    c->lane = &ring->lanes[found];
    c->slots = &ring->records[(size_t)found * ring->lane_capacity];
    c->capacity = ring->lane_capacity;
    c->mask = ring->lane_capacity - 1;
    /* A private lane's positions run on across owners: the previous owner's last head
     * (its release at exit pairs with our acquire of owner). */
    c->head = atomic_load_explicit(&c->lane->head, memory_order_relaxed);
    c->tail_cache = atomic_load_explicit(&c->lane->tail, memory_order_acquire);
    c->limit = 0; /* the first emit takes the full path and sets the room limit */
    c->shared = found == 0;
    c->shared_events = 0;
    if (found) pthread_setspecific(lane_key, (void *)1); /* so release_lanes runs at exit */
}

/* CLOCK_MONOTONIC now + NS, for pthread_cond_timedwait on the ring's condition variables
 * (created with CLOCK_MONOTONIC). */
static struct timespec monotonic_deadline(uint64_t ns) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    ns += (uint64_t)deadline.tv_nsec;
    deadline.tv_sec += (time_t)(ns / 1000000000u);
    deadline.tv_nsec = (long)(ns % 1000000000u);
    return deadline;
}

/* Ask the drain thread for a pass now (a lane is half full): at most one request per
 * pass (wake_pending), taken under the drain's mutex so the request cannot fall between
 * its check and its wait. Producer slow path only: about once per half lane. */
static __attribute__((noinline)) void wake_drain(tandem_ring *ring) {
    if (!ring->drain_started || atomic_load_explicit(&ring->wake_pending, memory_order_relaxed)) return;
    pthread_mutex_lock(&ring->drain_mutex);
    atomic_store_explicit(&ring->wake_pending, 1, memory_order_relaxed);
    pthread_cond_signal(&ring->drain_cond);
    atomic_fetch_add_explicit(&ring->wakeups, 1, memory_order_relaxed);
    pthread_mutex_unlock(&ring->drain_mutex);
}

/* wait_when_full: the calling producer's lane is full and the drain thread is late
 * (starved of CPU on a loaded machine). Rather than drop the event, ask the drain thread
 * for a pass and sleep until LANE has room (its tail moved), the CPU going to the drain
 * meanwhile. The drain thread does the writing, not this thread: it alone holds the
 * events file in a descriptor table the program cannot touch (tandem_private_fd_table),
 * whereas a write from here would go through the program's table, where the events
 * file's descriptor may have been closed or even reused by the program. Returns 1 if the
 * lane has room, 0 if the drain is not running or stalled (then the caller drops). A
 * thread is held here for about one pass, while holding whatever it holds (the GIL at
 * drop_gil entry and take_gil return); the drain thread never needs any of it. The wait
 * is bounded (RING_FULL_WAIT_MAX_MS): a drain stuck in a write (a hung network file
 * system) must not hang the program. After a timeout the ring counts as stalled and full
 * lanes drop (counted) without waiting until the drain completes a pass again. */
static __attribute__((noinline)) int wait_for_room(tandem_ring *ring, ring_lane *lane, uint64_t pos) {
    if (!ring->wait_when_full || !ring->drain_started) return 0;
    int room = 0, waited = 0;
    struct timespec deadline = monotonic_deadline((uint64_t)RING_FULL_WAIT_MAX_MS * 1000000u);
    pthread_mutex_lock(&ring->drain_mutex);
    while (!ring->drain_stop && !ring->drain_stalled) {
        /* acquire pairs with the drain's release store of tail (as in the emit). */
        if (pos - atomic_load_explicit(&lane->tail, memory_order_acquire) < ring->lane_capacity) {
            room = 1;
            break;
        }
        if (waited == 2) { /* timed out, still full */
            ring->drain_stalled = 1;
            break;
        }
        atomic_store_explicit(&ring->wake_pending, 1, memory_order_relaxed);
        pthread_cond_signal(&ring->drain_cond);
        ring->full_waiters++;
        int rc = pthread_cond_timedwait(&ring->pass_cond, &ring->drain_mutex, &deadline);
        ring->full_waiters--;
        waited = rc == ETIMEDOUT ? 2 : 1;
    }
    pthread_mutex_unlock(&ring->drain_mutex);
    if (waited) atomic_fetch_add_explicit(&ring->full_waits, 1, memory_order_relaxed);
    return room;
}

/* Lane 0, any number of producers: the version 1 protocol (CAS claim, commit by seq). */
static __attribute__((noinline)) void emit_shared(tandem_ring *ring, lane_cache *c, uint16_t event, uint32_t tid, uint64_t mono_ns,
                                                  uint64_t aux) {
    ring_lane *lane = &ring->lanes[0];
    /* Now and then look again for a private lane (threads holding them may have exited). */
    if (++c->shared_events >= 65536u && ring->lane_count > 1) c->ring_id = 0;
    uint64_t pos = atomic_load_explicit(&lane->head, memory_order_relaxed);
    int helped = 0;
    for (;;) {
        /* acquire pairs with the drain thread's release store of tail: its reads of the
         * slot's previous record happen before our writes below. */
        uint64_t consumed = atomic_load_explicit(&lane->tail, memory_order_acquire);
        if (__builtin_expect(pos < consumed, 0)) { /* our pos is stale (tail was read later) */
            pos = atomic_load_explicit(&lane->head, memory_order_relaxed);
            continue;
        }
        if (__builtin_expect(pos - consumed >= ring->lane_capacity, 0)) {
            if (!helped && wait_for_room(ring, lane, pos)) { /* once: a claim stuck uncommitted keeps it full */
                helped = 1;
                continue;
            }
            atomic_fetch_add_explicit(&lane->dropped, 1, memory_order_relaxed);
            wake_drain(ring);
            return;
        }
        /* relaxed: the CAS only has to make the claim unique; publication is via seq. */
        if (atomic_compare_exchange_weak_explicit(&lane->head, &pos, pos + 1, memory_order_relaxed, memory_order_relaxed))
            break;
    }
    if (__builtin_expect((pos - atomic_load_explicit(&lane->tail, memory_order_relaxed)) * 2 >= ring->lane_capacity, 0))
        wake_drain(ring);
    ring_gil_record *slot = &ring->records[pos & ring->mask];
    atomic_store_explicit(&slot->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    slot->mono_ns = mono_ns;
    slot->tid = tid;
    slot->kind = event;
    slot->lane = 0;
    slot->aux = aux;
    atomic_store_explicit(&slot->seq, pos + 1, memory_order_release);
}

void tandem_ring_emit_gil(tandem_ring *ring, uint16_t event, uint32_t tid, uint64_t mono_ns, uint64_t aux) {
    if (__builtin_expect(ring->hot.fork_generation != current_generation(), 0))
        return; /* a fork child writing into the parent's ring would corrupt its positions */
    lane_cache *c = &my_lane;
    if (__builtin_expect(c->ring_id != ring->hot.id, 0)) take_lane(ring, c);
    if (__builtin_expect(c->shared, 0)) {
        emit_shared(ring, c, event, tid, mono_ns, aux);
        return;
    }
    if (__builtin_expect(c->head < c->limit, 1)) { /* room by the cached limit (callers other than the fast path) */
        tandem_lane_write(c, event, tid, mono_ns, aux);
        return;
    }
    /* Private lane, past the room limit of the fast path: read the real tail (acquire pairs
     * with the drain's release store: its reads of a slot's old record happen before our
     * writes). Under half full: room up to half full again. At half full or more: wake the
     * drain, room up to full (the next look at tail is when that runs out). Full: drop. */
    uint64_t pos = c->head;
    c->tail_cache = atomic_load_explicit(&c->lane->tail, memory_order_acquire);
    uint64_t used = pos - c->tail_cache;
    if (__builtin_expect(used >= c->capacity, 0) && wait_for_room(ring, c->lane, pos)) {
        c->tail_cache = atomic_load_explicit(&c->lane->tail, memory_order_acquire);
        used = pos - c->tail_cache;
    }
    if (__builtin_expect(used >= c->capacity, 0)) {
        /* Full: dropping (not overwriting) keeps offline recording lossless up to the
         * drain's pace, and counts exactly what was lost. Only we write `dropped`. */
        ring_lane *lane = c->lane;
        atomic_store_explicit(&lane->dropped, atomic_load_explicit(&lane->dropped, memory_order_relaxed) + 1,
                              memory_order_release);
        wake_drain(ring);
        return;
    }
    if (used * 2 >= c->capacity) {
        wake_drain(ring);
        c->limit = c->tail_cache + c->capacity;
    } else {
        c->limit = c->tail_cache + c->capacity / 2;
    }
    tandem_lane_write(c, event, tid, mono_ns, aux);
}

/* ---- Drain thread ------------------------------------------------------------------- */

/* write(2) all of IOV (restarting on EINTR and short writes). Returns 0 or an errno. */
static int write_all(int fd, struct iovec *iov, int iovcnt) {
    while (iovcnt > 0) {
        ssize_t n = writev(fd, iov, iovcnt > 1024 ? 1024 : iovcnt);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO; /* no progress on a regular file: give up rather than spin */
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* ---- TSC time (docs/ring.md, "TSC time") ------------------------------------------------
 * Every drain pass of a time_tsc ring takes a (tsc, mono) pair after it has found the
 * records it will drain, so those were all stamped before the pair. The pairs so far (the
 * creation pair, then the last CALIB_SLOTS) are the knots of a piecewise-linear map from
 * TSC to CLOCK_MONOTONIC: a value between two knots is interpolated between them, one
 * beyond the last (or before the first) knot is extrapolated with the slope over all
 * knots. */

/* Append PAIR to the calibration table, in the ring struct and under the header's seqlock
 * (drain thread only). */
static void calib_push(tandem_ring *ring, const tandem_tsc_pair *pair) {
    uint64_t last = ring->calib_tsc[(ring->calib_total - 1) % CALIB_SLOTS];
    if (pair->tsc <= last) return; /* cannot happen with an invariant TSC; keep the map monotonic */
    /* A pair whose clock_gettime was preempted in all its tries is uncertain by half its
     * width: skip it (the previous knots still hold), unless the last one kept is older
     * than a second. */
    double width_ns = (double)pair->width * ring->ns_per_tick;
    double since_ns = (double)(pair->tsc - last) * ring->ns_per_tick;
    if (width_ns > (double)CALIB_MAX_WIDTH_NS && since_ns < 1e9) return;
    uint64_t slot = ring->calib_total % CALIB_SLOTS;
    ring->calib_tsc[slot] = pair->tsc;
    ring->calib_mono[slot] = pair->mono_ns;
    ring->calib_total++;
    _Atomic uint64_t *seq = (_Atomic uint64_t *)(ring->base + OFF_CALIB_SEQ);
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_relaxed); /* odd: being written */
    atomic_thread_fence(memory_order_release);
    _Atomic uint64_t *entry = (_Atomic uint64_t *)(ring->base + OFF_CALIB_TABLE + slot * 16);
    atomic_store_explicit(&entry[0], pair->tsc, memory_order_relaxed);
    atomic_store_explicit(&entry[1], pair->mono_ns, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint64_t *)(ring->base + OFF_CALIB_TOTAL), ring->calib_total, memory_order_relaxed);
    atomic_store_explicit(seq, s + 2, memory_order_release);
}

typedef struct {
    int n;
    uint64_t tsc[CALIB_SLOTS + 1], mono[CALIB_SLOTS + 1];
    double slope[CALIB_SLOTS + 1]; /* slope[i]: ns per tick from knot i to i + 1 */
    double overall;                /* ns per tick from the first knot to the last */
} tsc_map;

static void tsc_map_build(const tandem_ring *ring, tsc_map *m) {
    uint64_t kept = ring->calib_total < CALIB_SLOTS ? ring->calib_total : CALIB_SLOTS;
    m->n = 0;
    m->tsc[m->n] = ring->calib_first.tsc;
    m->mono[m->n++] = ring->calib_first.mono_ns;
    for (uint64_t i = ring->calib_total - kept; i < ring->calib_total; i++) {
        uint64_t t = ring->calib_tsc[i % CALIB_SLOTS], mono = ring->calib_mono[i % CALIB_SLOTS];
        if (t <= m->tsc[m->n - 1] || mono < m->mono[m->n - 1]) continue;
        m->tsc[m->n] = t;
        m->mono[m->n++] = mono;
    }
    for (int i = 0; i + 1 < m->n; i++)
        m->slope[i] = (double)(m->mono[i + 1] - m->mono[i]) / (double)(m->tsc[i + 1] - m->tsc[i]);
    m->overall = m->n > 1 ? (double)(m->mono[m->n - 1] - m->mono[0]) / (double)(m->tsc[m->n - 1] - m->tsc[0]) : 1.0;
}

static inline uint64_t from_knot(uint64_t mono, uint64_t tsc, double slope, uint64_t t) {
    double delta = (double)(int64_t)(t - tsc) * slope; /* signed: t may lie before the knot */
    return mono + (uint64_t)(int64_t)(delta < 0 ? delta - 0.5 : delta + 0.5);
}

static inline uint64_t tsc_map_apply(const tsc_map *m, uint64_t t) {
    int last = m->n - 1;
    if (t >= m->tsc[last]) return from_knot(m->mono[last], m->tsc[last], m->overall, t);
    if (last >= 1 && t >= m->tsc[last - 1]) return from_knot(m->mono[last - 1], m->tsc[last - 1], m->slope[last - 1], t);
    if (t < m->tsc[0]) return from_knot(m->mono[0], m->tsc[0], m->overall, t);
    int lo = 0, hi = last; /* m->tsc[lo] <= t < m->tsc[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (m->tsc[mid] <= t) lo = mid;
        else hi = mid;
    }
    return from_knot(m->mono[lo], m->tsc[lo], m->slope[lo], t);
}

/* The current events file's name: EVENTS itself, or EVENTS.NNNNNN when rotating. */
static void events_file_name(const tandem_ring *ring, char *name, size_t len) {
    if (ring->segment_bytes || ring->segment_ns) snprintf(name, len, "%s.%06u", ring->events_base, ring->segment);
    else snprintf(name, len, "%s", ring->events_base);
}

/* Create the current events file (0600, O_EXCL) and write its header: a copy of the ring's
 * header page (file_kind = events, state 0, CLOCK_MONOTONIC, no calibration block), its
 * segment number, and a lane table holding only each lane's base (positions and reported
 * drops before this segment) until finish_events_file writes the counters. Records then
 * start at the same records_offset as in the ring. Returns 0, or -1 with err set. */
static int open_events_file(tandem_ring *ring, char *err, size_t errlen) {
    char name[4200];
    events_file_name(ring, name, sizeof name);
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "events file %s: cannot create: %s", name, strerror(errno));
        return -1;
    }
    unsigned char *h = ring->events_header;
    memset(h, 0, ring->records_offset);
    memcpy(h, ring->base, RING_HEADER_SIZE);
    put_u32(h, OFF_STATE, 0);
    put_u32(h, OFF_FILE_KIND, RING_FILE_KIND_EVENTS);
    put_u32(h, OFF_CLOCK_ID, RING_CLOCK_MONOTONIC); /* the drain converts TSC times */
    memset(h + OFF_CALIB_SEQ, 0, OFF_CALIB_END - OFF_CALIB_SEQ);
    put_u32(h, OFF_SEGMENT, ring->segment);
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        size_t off = RING_HEADER_SIZE + (size_t)l * RING_LANE_STRIDE;
        put_u64(h, off + LANE_OFF_BASE_HEAD, ring->lane_base_head[l]);
        put_u64(h, off + LANE_OFF_BASE_DROPPED, ring->lane_base_dropped[l]);
    }
    struct iovec iov = {h, ring->records_offset};
    int rc = write_all(fd, &iov, 1);
    if (rc != 0) {
        snprintf(err, errlen, "events file %s: cannot write header: %s", name, strerror(rc));
        close(fd);
        unlink(name);
        return -1;
    }
    ring->events_fd = fd;
    ring->events_size = (off_t)ring->records_offset;
    ring->segment_started_ns = clock_ns(CLOCK_MONOTONIC);
    return 0;
}

/* Write the current events file's counters (lane table, name table, drain_lost, state
 * closed) and close it. FINAL: the ring closes (no producer emits: each lane's head is
 * every position claimed); else a rotation, where a lane's counters are what this file
 * holds: positions up to the tail (all consumed) and the drops reported in markers. */
static void finish_events_file(tandem_ring *ring, int final) {
    unsigned char *h = ring->events_header;
    uint64_t lost = 0;
    for (uint32_t l = 0; l < ring->lane_count; l++) lost += ring->lane_drain_lost[l];
    put_u64(h, OFF_DRAIN_LOST, lost);
    put_u32(h, OFF_STATE, RING_STATE_CLOSED);
    memcpy(h + OFF_NAMES_USED, ring->base + OFF_NAMES_USED, RING_HEADER_SIZE - OFF_NAMES_USED);
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        size_t off = RING_HEADER_SIZE + (size_t)l * RING_LANE_STRIDE;
        uint64_t tail = atomic_load(&ring->lanes[l].tail);
        put_u64(h, off + 0, final ? atomic_load(&ring->lanes[l].head) : tail);
        put_u64(h, off + 128, tail);
        put_u64(h, off + 256, final ? atomic_load(&ring->lanes[l].dropped) : ring->dropped_reported[l]);
        put_u32(h, off + 384, atomic_load(&ring->lanes[l].owner));
        put_u64(h, off + 392, ring->lane_drain_lost[l]);
    }
    /* Lane table first, state last: a reader seeing `closed` sees the counters. */
    size_t table = ring->records_offset - RING_HEADER_SIZE;
    if (pwrite(ring->events_fd, h + RING_HEADER_SIZE, table, RING_HEADER_SIZE) < 0 ||
        pwrite(ring->events_fd, h + 1024, RING_HEADER_SIZE - 1024, 1024) < 0)
        atomic_store(&ring->drain_errno, errno);
    close(ring->events_fd);
    ring->events_fd = -1;
}

/* Rotation, after a pass (drain thread): the current segment reached its size or age
 * (and holds records): close it whole and start the next, whose lanes start where this
 * one's ended. A next segment that cannot be created (disk full) ends the writing as a
 * failed write does: the drain keeps consuming and counts what it could not write. */
static void rotate_if_due(tandem_ring *ring) {
    if (!(ring->segment_bytes || ring->segment_ns) || ring->events_fd < 0 || ring->events_failed) return;
    if (ring->events_size == (off_t)ring->records_offset) return;
    int by_size = ring->segment_bytes && (uint64_t)ring->events_size >= ring->segment_bytes;
    int by_age = ring->segment_ns && clock_ns(CLOCK_MONOTONIC) - ring->segment_started_ns >= ring->segment_ns;
    if (!by_size && !by_age) return;
    finish_events_file(ring, 0);
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        ring->lane_base_head[l] = atomic_load_explicit(&ring->lanes[l].tail, memory_order_relaxed);
        ring->lane_base_dropped[l] = ring->dropped_reported[l];
        ring->lane_drain_lost[l] = 0;
    }
    ring->segment++;
    char err[512];
    if (open_events_file(ring, err, sizeof err) != 0) {
        atomic_store_explicit(&ring->drain_errno, errno ? errno : EIO, memory_order_relaxed);
        ring->events_failed = 1;
    }
}

int tandem_ring_set_segments(tandem_ring *ring, uint64_t max_bytes, uint64_t max_ns) {
    if (ring->drain_started) return -1;
    ring->segment_bytes = max_bytes;
    ring->segment_ns = max_ns;
    return 0;
}

/* One pass over every lane: copy the committed records from the lane's tail on (in
 * position order, stopping at the first slot still being written) to the events file, a
 * LOST marker after them for the lane's new drops, then hand the slots back by advancing
 * each lane's tail. Returns the largest backlog found (slots in use in one lane).
 * Drain thread only (and close, after join). */
static uint64_t drain_once(tandem_ring *ring) {
    struct iovec iov[RING_MAX_LANES * 3];
    ring_gil_record lost[RING_MAX_LANES];
    uint64_t start[RING_MAX_LANES], end[RING_MAX_LANES];
    int has_lost[RING_MAX_LANES];
    int n = 0;
    uint64_t total = 0, backlog = 0;
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        ring_lane *lane = &ring->lanes[l];
        ring_gil_record *slots = &ring->records[(size_t)l * ring->lane_capacity];
        uint64_t s = atomic_load_explicit(&lane->tail, memory_order_relaxed); /* only we write it */
        uint64_t head = atomic_load_explicit(&lane->head, memory_order_acquire);
        uint64_t e = s;
        if (l > 0) {
            /* Private lane: its one producer publishes head after committing each record, so
             * every position below the head we acquired is committed and its fields are
             * visible: no need to read each slot's seq (that scan was most of a pass's cost:
             * one cache line fetched from the producer's core per two records). */
            e = head;
        } else {
            /* Shared lane: head counts claims; stop at the first slot not committed yet.
             * acquire on seq pairs with the producer's release store: the fields are complete. */
            while (e < head && atomic_load_explicit(&slots[e & ring->mask].seq, memory_order_acquire) == e + 1) e++;
        }
        start[l] = s;
        end[l] = e;
        if (head - s > backlog) backlog = head - s;
        total += e - s;
        uint64_t dropped = atomic_load_explicit(&lane->dropped, memory_order_acquire);
        has_lost[l] = dropped != ring->dropped_reported[l];
        if (has_lost[l]) {
            ring_gil_record *m = &lost[l];
            memset(m, 0, sizeof *m);
            m->mono_ns = clock_ns(CLOCK_MONOTONIC);
            m->kind = TANDEM_RING_LOST_MARKER;
            m->lane = (uint16_t)l;
            m->aux = dropped - ring->dropped_reported[l];
            ring->dropped_reported[l] = dropped;
        }
    }
    /* TSC time: a pair taken after every record drained in this pass was committed, so
     * their stamps all lie before it (interpolated, not extrapolated). */
    tsc_map map = {.n = 0};
    int convert = ring->time_tsc && ring->converted && ring->events_fd >= 0 && !ring->events_failed;
    if (ring->time_tsc) {
        tandem_tsc_pair pair;
        tandem_tsc_pair_take(&pair);
        calib_push(ring, &pair);
        if (convert) tsc_map_build(ring, &map);
    }
    uint64_t done = 0; /* records already converted into ring->converted */
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        ring_gil_record *slots = &ring->records[(size_t)l * ring->lane_capacity];
        uint64_t s = start[l], count = end[l] - start[l];
        if (count) {
            uint64_t first = s & ring->mask;
            uint64_t until_wrap = ring->lane_capacity - first;
            uint64_t part1 = count < until_wrap ? count : until_wrap;
            if (convert) {
                ring_gil_record *out = &ring->converted[done];
                memcpy(out, &slots[first], part1 * RING_GIL_RECORD_SIZE);
                if (count > part1) memcpy(out + part1, &slots[0], (count - part1) * RING_GIL_RECORD_SIZE);
                for (uint64_t i = 0; i < count; i++) out[i].mono_ns = tsc_map_apply(&map, out[i].mono_ns);
                iov[n++] = (struct iovec){out, count * RING_GIL_RECORD_SIZE};
                done += count;
            } else {
                iov[n++] = (struct iovec){&slots[first], part1 * RING_GIL_RECORD_SIZE};
                if (count > part1) iov[n++] = (struct iovec){&slots[0], (count - part1) * RING_GIL_RECORD_SIZE};
            }
        }
        if (has_lost[l]) iov[n++] = (struct iovec){&lost[l], sizeof lost[l]};
    }
    if (n == 0) {
        rotate_if_due(ring); /* an idle segment still ends at its age */
        return backlog;
    }
    if (ring->events_fd >= 0 && !ring->events_failed) {
        off_t batch_bytes = 0;
        for (int i = 0; i < n; i++) batch_bytes += (off_t)iov[i].iov_len;
        int rc = write_all(ring->events_fd, iov, n); /* (advances iov on short writes) */
        if (rc != 0) {
            /* Disk full or the like: cut a partly written batch off (the file keeps whole
             * passes only), then keep consuming, else every later event would be dropped,
             * but write no more records: they are counted as drain_lost, and close still
             * writes the final header. */
            atomic_store_explicit(&ring->drain_errno, rc, memory_order_relaxed);
            ring->events_failed = 1;
            if (ftruncate(ring->events_fd, ring->events_size) != 0) { /* the reader drops a cut record */ }
            for (uint32_t l = 0; l < ring->lane_count; l++) ring->lane_drain_lost[l] += end[l] - start[l];
            atomic_fetch_add_explicit(&ring->drain_lost, total, memory_order_relaxed);
        } else {
            ring->events_size += batch_bytes;
            atomic_fetch_add_explicit(&ring->drained, total, memory_order_relaxed);
        }
    } else if (ring->events_failed) {
        for (uint32_t l = 0; l < ring->lane_count; l++) ring->lane_drain_lost[l] += end[l] - start[l];
        atomic_fetch_add_explicit(&ring->drain_lost, total, memory_order_relaxed);
    }
    /* release: our reads of the slots above happen before a producer reuses them. */
    for (uint32_t l = 0; l < ring->lane_count; l++)
        if (end[l] != start[l]) atomic_store_explicit(&ring->lanes[l].tail, end[l], memory_order_release);
    rotate_if_due(ring);
    return backlog;
}

/* Give the calling (native helper) thread a file descriptor table of its own holding only
 * KEEP_FD (-1: none). Why: while a second thread shares the process's table, the kernel
 * takes the slow path in every fd-taking system call of every thread (fdget takes a file
 * reference instead of borrowing it; lseek/read/write on a file also lock its f_pos
 * mutex): measured ~50 ns per os.lseek() call in a single-threaded program, i.e. the
 * drain thread alone cost a single-threaded service more than all the stamps together.
 * unshare(CLONE_FILES) copies the table; every copied descriptor except KEEP_FD is closed
 * at once (close_range), so the thread holds no reference to the program's files: a file
 * the program closes is really closed, and POSIX locks are owned per table, so ours never
 * release the program's. Where close_range is missing (Linux < 5.9) the table stays
 * shared: correct, only slower. Returns 1 when the table is private. */
int tandem_private_fd_table(int keep_fd) {
    if (syscall(SYS_close_range, ~0u, ~0u, 0) != 0) return 0; /* no close_range: keep sharing */
    if (unshare(CLONE_FILES) != 0) return 0;
    if (keep_fd < 0) {
        syscall(SYS_close_range, 0u, ~0u, 0);
    } else {
        if (keep_fd > 0) syscall(SYS_close_range, 0u, (unsigned)keep_fd - 1, 0);
        syscall(SYS_close_range, (unsigned)keep_fd + 1, ~0u, 0);
    }
    return 1;
}

/* Drain thread: make lane L writable up to UPTO bytes from its first slot, a chunk at a
 * time. Returns 0 when it stopped early: the ring closes or a producer asks for a pass. */
static int populate_lane(tandem_ring *ring, uint32_t l, size_t upto) {
    unsigned char *lane = (unsigned char *)&ring->records[(size_t)l * ring->lane_capacity];
    while (ring->lane_populated[l] < upto) {
        pthread_mutex_lock(&ring->drain_mutex);
        int stop = ring->drain_stop;
        pthread_mutex_unlock(&ring->drain_mutex);
        if (stop || atomic_load_explicit(&ring->wake_pending, memory_order_relaxed)) return 0;
        size_t n = upto - ring->lane_populated[l];
        if (n > RING_POPULATE_CHUNK) n = RING_POPULATE_CHUNK;
        populate_writable(lane + ring->lane_populated[l], n);
        ring->lane_populated[l] += n;
    }
    return 1;
}

/* Drain thread, as it starts and after each pass: keep every lane in use (its head moved
 * or a thread owns it; FIRST: also the lane the first producer thread takes, about to be)
 * writable ahead of its head, so that its producer's stores do not fault on the hot path.
 * Past the first lap every page was written once: nothing left to do for that lane. Stops
 * early when the ring closes or a producer asks for a pass; the next call goes on. */
static void populate_lanes(tandem_ring *ring, int first) {
    uint64_t cap = ring->lane_capacity;
    uint32_t first_lane = ring->lane_count > 1 ? 1 : 0;
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        if (ring->lane_populated[l] >= cap * RING_GIL_RECORD_SIZE) continue;
        uint64_t head = atomic_load_explicit(&ring->lanes[l].head, memory_order_relaxed);
        if (!(first && l == first_lane) && head == 0 && atomic_load_explicit(&ring->lanes[l].owner, memory_order_relaxed) == 0)
            continue;
        uint64_t ahead = 4 * (head - ring->lane_seen_head[l]);
        ring->lane_seen_head[l] = head;
        if (ahead < RING_POPULATE_AHEAD_SLOTS) ahead = RING_POPULATE_AHEAD_SLOTS;
        uint64_t target = head >= cap || ahead >= cap - head ? cap : head + ahead;
        if (!populate_lane(ring, l, (size_t)target * RING_GIL_RECORD_SIZE)) return;
    }
}

static void *drain_main(void *arg) {
    tandem_ring *ring = arg;
    /* From here on the events files are this thread's alone: segments it creates live in
     * its private table, so it also does the last pass and closes the file (a descriptor
     * number of this table means nothing, or another file, in the program's). */
    ring->private_fd_table = tandem_private_fd_table(ring->events_fd);
    uint32_t wait_us = ring->period_us < RING_FIRST_DRAIN_US ? ring->period_us : RING_FIRST_DRAIN_US;
    populate_lanes(ring, 1);
    pthread_mutex_lock(&ring->drain_mutex);
    while (!ring->drain_stop) {
        if (!atomic_load_explicit(&ring->wake_pending, memory_order_relaxed)) {
            struct timespec deadline = monotonic_deadline((uint64_t)wait_us * 1000u);
            pthread_cond_timedwait(&ring->drain_cond, &ring->drain_mutex, &deadline);
        }
        if (ring->drain_stop) break;
        atomic_store_explicit(&ring->wake_pending, 0, memory_order_relaxed); /* before the pass: a later request wakes the next */
        pthread_mutex_unlock(&ring->drain_mutex);
        uint64_t backlog = drain_once(ring);
        atomic_store_explicit(&ring->drain_cpu_ns, clock_ns(CLOCK_THREAD_CPUTIME_ID), memory_order_relaxed);
        /* A lane over a quarter full at wake-up: come back sooner (down to 100 us); an
         * idle ring: back to the configured period. Producers also wake the drain when a
         * lane is half full (wake_drain) or full (wait_for_room). */
        if (backlog * 4 > ring->lane_capacity) wait_us = wait_us / 2 > RING_MIN_DRAIN_US ? wait_us / 2 : RING_MIN_DRAIN_US;
        else if (backlog * 16 < ring->lane_capacity) wait_us = wait_us * 2 < ring->period_us ? wait_us * 2 : ring->period_us;
        pthread_mutex_lock(&ring->drain_mutex);
        ring->drain_stalled = 0; /* a pass completed: full lanes may wait again */
        if (ring->full_waiters) pthread_cond_broadcast(&ring->pass_cond); /* tails moved: recheck */
        pthread_mutex_unlock(&ring->drain_mutex);
        populate_lanes(ring, 0); /* after the waiters are let go: it may take a while */
        pthread_mutex_lock(&ring->drain_mutex);
    }
    if (ring->full_waiters) pthread_cond_broadcast(&ring->pass_cond);     /* stopping: give up */
    pthread_mutex_unlock(&ring->drain_mutex);
    /* Closing (tandem_ring_close: no thread emits any more): the last records, then the
     * final counters into the events file. */
    drain_once(ring);
    if (ring->events_fd >= 0) finish_events_file(ring, 1);
    return NULL;
}

int tandem_ring_start_drain(tandem_ring *ring, const char *events_path, uint32_t period_us, char *err, size_t errlen) {
    if (ring->drain_started) {
        snprintf(err, errlen, "ring %s: drain already started", ring->path);
        return -1;
    }
    if (period_us < RING_MIN_DRAIN_US || period_us > 10000000) {
        snprintf(err, errlen, "ring %s: drain period %u us is outside [100, 10000000]", ring->path, period_us);
        return -1;
    }
    ring->period_us = period_us;
    ring->events_fd = -1;
    if (events_path) {
        if (ring->time_tsc) {
            /* Converted copies of one pass's records: at most every slot. Pages are only
             * touched as far as the largest pass. */
            ring->converted = malloc((size_t)ring->lane_count * ring->lane_capacity * RING_GIL_RECORD_SIZE);
            if (!ring->converted) {
                snprintf(err, errlen, "events file %s: out of memory for the TSC conversion buffer", events_path);
                return -1;
            }
        }
        snprintf(ring->events_base, sizeof ring->events_base, "%s", events_path);
        if (open_events_file(ring, err, errlen) != 0) return -1;
    }
    ring->control_fd = ring->events_fd;
    ring->drain_stop = 0;
    atomic_fetch_or_explicit(header_u32(ring->base, OFF_STATE), RING_STATE_DRAINING, memory_order_relaxed);
    /* The drain thread blocks every signal (it inherits the mask at creation), so process
     * signals go to the interpreter's threads, not to a thread that cannot run handlers. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&ring->drain_thread, NULL, drain_main, ring);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc == 0) pthread_setname_np(ring->drain_thread, "tandem-drain");
    if (rc != 0) {
        snprintf(err, errlen, "ring %s: cannot start drain thread: %s", ring->path, strerror(rc));
        atomic_fetch_and_explicit(header_u32(ring->base, OFF_STATE), ~RING_STATE_DRAINING, memory_order_relaxed);
        if (ring->events_fd >= 0) close(ring->events_fd);
        ring->events_fd = -1;
        return -1;
    }
    ring->drain_started = 1;
    return 0;
}

void tandem_ring_stats_get(tandem_ring *ring, tandem_ring_stats *stats) {
    uint64_t claimed = 0, dropped = 0;
    for (uint32_t l = 0; l < ring->lane_count; l++) {
        claimed += atomic_load_explicit(&ring->lanes[l].head, memory_order_relaxed);
        dropped += atomic_load_explicit(&ring->lanes[l].dropped, memory_order_relaxed);
    }
    stats->claimed = claimed;
    stats->dropped = dropped;
    stats->drained = atomic_load_explicit(&ring->drained, memory_order_relaxed);
    stats->drain_lost = atomic_load_explicit(&ring->drain_lost, memory_order_relaxed);
    stats->drain_errno = atomic_load_explicit(&ring->drain_errno, memory_order_relaxed);
    stats->full_waits = atomic_load_explicit(&ring->full_waits, memory_order_relaxed);
    stats->wakeups = atomic_load_explicit(&ring->wakeups, memory_order_relaxed);
    stats->drain_cpu_ns = atomic_load_explicit(&ring->drain_cpu_ns, memory_order_relaxed);
}

void tandem_ring_close(tandem_ring *ring) {
    if (!ring) return;
    int in_fork_child = ring->hot.fork_generation != current_generation();
    if (!in_fork_child) {
        if (ring->drain_started) {
            pthread_mutex_lock(&ring->drain_mutex);
            ring->drain_stop = 1;
            pthread_cond_signal(&ring->drain_cond);
            pthread_mutex_unlock(&ring->drain_mutex);
            pthread_join(ring->drain_thread, NULL); /* (it did the last pass and closed its file) */
            /* The program's copy of the first events file's descriptor, when the drain
             * thread's table was a private copy (else the thread closed the one shared). */
            if (ring->private_fd_table && ring->control_fd >= 0) close(ring->control_fd);
        }
        atomic_fetch_and_explicit(header_u32(ring->base, OFF_STATE), ~RING_STATE_DRAINING, memory_order_relaxed);
        atomic_fetch_or_explicit(header_u32(ring->base, OFF_STATE), RING_STATE_CLOSED, memory_order_release);
    }
    pthread_mutex_lock(&live_mutex);
    for (tandem_ring **p = &live_rings; *p; p = &(*p)->next_live) {
        if (*p == ring) {
            *p = ring->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&live_mutex);
    munmap(ring->base, ring->map_len);
    pthread_mutex_destroy(&ring->drain_mutex);
    pthread_cond_destroy(&ring->pass_cond);
    pthread_cond_destroy(&ring->drain_cond);
    free(ring->events_header);
    free(ring->converted);
    free(ring);
}
