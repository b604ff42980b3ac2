/* The tandem shared-memory ring, producer side (layout and protocol: docs/ring.md).
 *
 * One file, mapped MAP_SHARED: a 4096-byte header page, then `capacity` fixed-size records.
 * Producers (any thread) claim a position with a CAS on `head`, but only while the ring
 * is not full (head - tail < capacity); otherwise they count a drop. A claimed slot is
 * published by storing its sequence word (position + 1) with release semantics. The one
 * consumer, the drain thread, copies committed slots in position order to the events file
 * and then advances `tail` with release semantics, which hands the slots back to producers.
 * External readers only read (they never move `tail`), so they can never stall producers.
 */
#define _GNU_SOURCE
#include "ring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ---- On-disk layout (docs/ring.md, "Header"); every multi-byte field little-endian. ---- */

#define RING_MAGIC "TNDMRING"
#define RING_VERSION 1u
#define RING_HEADER_SIZE 4096u
#define RING_FILE_KIND_RING 1u
#define RING_FILE_KIND_EVENTS 2u
#define RING_RECORD_TYPE_GIL 1u
#define RING_GIL_RECORD_SIZE 32u
#define RING_CLOCK_MONOTONIC 1u
#define RING_MIN_CAPACITY 2u
#define RING_MAX_CAPACITY (1u << 26)

#define RING_STATE_DRAINING 1u /* a drain thread consumes this ring */
#define RING_STATE_CLOSED 2u   /* the producer closed the ring (no more records) */

/* Static identifying fields, written once before any producer runs. */
#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_HEADER_SIZE 12
#define OFF_FILE_KIND 16
#define OFF_RECORD_TYPE 20
#define OFF_RECORD_SIZE 24
#define OFF_CAPACITY 28
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
/* Live counters, each alone in a 128-byte block so producers hammering `head` do not
 * invalidate the line the drain thread writes (`tail`) and vice versa (adjacent-line
 * prefetch pairs 64-byte lines, hence 128). */
#define OFF_HEAD 1024
#define OFF_TAIL 1152
#define OFF_DROPPED 1280
#define OFF_STATE 1408      /* u32 RING_STATE_* bits */
#define OFF_DRAIN_LOST 1416 /* u64, meaningful in a closed events file */
#define OFF_NAMES_USED 2048 /* u32 + name table up to the page end (pause records; unused here) */

/* GIL record (record_type 1, 32 bytes). */
typedef struct {
    _Atomic uint64_t seq; /* 0 = no committed record; position + 1 = committed record */
    uint64_t mono_ns;
    uint32_t tid;
    uint16_t kind;
    uint16_t flags;
    uint64_t aux; /* 0 for GIL events; count of lost events in a LOST marker */
} ring_gil_record;

_Static_assert(sizeof(ring_gil_record) == RING_GIL_RECORD_SIZE, "GIL record is 32 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ring layout is little-endian");

struct tandem_ring {
    unsigned char *base; /* the whole mapping: header page + records */
    size_t map_len;
    ring_gil_record *records;
    uint64_t capacity;
    uint64_t mask;
    unsigned fork_generation; /* value of fork_generation when created; differs in a fork child */
    char path[4096];

    /* Drain thread state (owned by the control thread until started, then shared). */
    int drain_started;
    pthread_t drain_thread;
    pthread_mutex_t drain_mutex;
    pthread_cond_t drain_cond; /* signalled by close to cut the period short */
    int drain_stop;            /* guarded by drain_mutex */
    uint32_t period_us;
    int events_fd;             /* -1: consume without writing */
    int events_failed;         /* a write failed: records are no longer appended */
    off_t events_size;         /* bytes of the events file: header + whole batches */
    unsigned char events_header[RING_HEADER_SIZE];
    _Atomic uint64_t drained;
    _Atomic uint64_t drain_lost;
    _Atomic int drain_errno;
    uint64_t dropped_reported; /* drops already written as LOST markers (drain thread only) */
};

/* Bumped in the child after fork(): rings created in the parent are then ignored there. */
static _Atomic unsigned fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) { atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed); }
static void register_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }

static inline _Atomic uint64_t *header_u64(unsigned char *base, size_t off) { return (_Atomic uint64_t *)(base + off); }
static inline _Atomic uint32_t *header_u32(unsigned char *base, size_t off) { return (_Atomic uint32_t *)(base + off); }

static void put_u32(unsigned char *base, size_t off, uint32_t v) { memcpy(base + off, &v, 4); }
static void put_u64(unsigned char *base, size_t off, uint64_t v) { memcpy(base + off, &v, 8); }

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

static void fill_header(unsigned char *h, const tandem_ring_options *opt) {
    memset(h, 0, RING_HEADER_SIZE);
    memcpy(h + OFF_MAGIC, RING_MAGIC, 8);
    put_u32(h, OFF_VERSION, RING_VERSION);
    put_u32(h, OFF_HEADER_SIZE, RING_HEADER_SIZE);
    put_u32(h, OFF_FILE_KIND, RING_FILE_KIND_RING);
    put_u32(h, OFF_RECORD_TYPE, RING_RECORD_TYPE_GIL);
    put_u32(h, OFF_RECORD_SIZE, RING_GIL_RECORD_SIZE);
    put_u32(h, OFF_CAPACITY, opt->capacity);
    put_u32(h, OFF_PRODUCER_PID, (uint32_t)getpid());
    put_u32(h, OFF_CLOCK_ID, RING_CLOCK_MONOTONIC);
    uint64_t real = 0, mono = 0, uncertainty = 0;
    clock_pair(&real, &mono, &uncertainty);
    put_u64(h, OFF_SYNC_REALTIME, real);
    put_u64(h, OFF_SYNC_MONOTONIC, mono);
    put_u64(h, OFF_SYNC_UNCERTAINTY, uncertainty);
    read_boot_id(h + OFF_BOOT_ID);
    copy_text(h + OFF_RUNTIME_VERSION, LEN_RUNTIME_VERSION, opt->python_version);
    copy_text(h + OFF_BACKEND, LEN_BACKEND, opt->backend);
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
    unsigned char *base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "ring %s: cannot map: %s", path, strerror(map_errno));
        return NULL;
    }
    /* MAP_POPULATE maps a shared file's pages read-only (to track dirtiness), so the first
     * store to each page would still fault, on a producer's hot path: store to each now. */
    for (size_t off = 0; off < map_len; off += 4096) ((volatile unsigned char *)base)[off] = 0;
    return base;
}

tandem_ring *tandem_ring_create(const char *path, const tandem_ring_options *opt, char *err, size_t errlen) {
    pthread_once(&atfork_once, register_atfork);
    uint32_t cap = opt ? opt->capacity : 0;
    if (cap < RING_MIN_CAPACITY || cap > RING_MAX_CAPACITY || (cap & (cap - 1)) != 0) {
        snprintf(err, errlen, "ring %s: capacity %u is not a power of two in [%u, %u]", path, cap, RING_MIN_CAPACITY, RING_MAX_CAPACITY);
        return NULL;
    }
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
    size_t map_len = RING_HEADER_SIZE + (size_t)cap * RING_GIL_RECORD_SIZE;
    unsigned char *base = create_mapping(build_path, path, map_len, err, errlen);
    tandem_ring *ring = base ? calloc(1, sizeof *ring) : NULL;
    if (base && !ring) snprintf(err, errlen, "ring %s: out of memory", path);
    if (ring) {
        /* The file is zero-filled: every slot's seq is 0 = empty, the counters are 0. */
        fill_header(base, opt);
        if (link(build_path, path) != 0) {
            snprintf(err, errlen, "ring %s: cannot create: %s", path, strerror(errno));
            free(ring);
            ring = NULL;
        }
    }
    unlink(build_path);
    if (!ring) {
        if (base) munmap(base, map_len);
        return NULL;
    }
    ring->base = base;
    ring->map_len = map_len;
    ring->records = (ring_gil_record *)(base + RING_HEADER_SIZE);
    ring->capacity = cap;
    ring->mask = cap - 1;
    ring->fork_generation = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    ring->events_fd = -1;
    snprintf(ring->path, sizeof ring->path, "%s", path);
    pthread_mutex_init(&ring->drain_mutex, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ring->drain_cond, &ca);
    pthread_condattr_destroy(&ca);
    return ring;
}

void tandem_ring_emit_gil(tandem_ring *ring, uint16_t event, uint32_t tid, uint64_t mono_ns) {
    if (__builtin_expect(ring->fork_generation != atomic_load_explicit(&fork_generation, memory_order_relaxed), 0))
        return; /* a fork child writing into the parent's ring would corrupt its positions */
    _Atomic uint64_t *head = header_u64(ring->base, OFF_HEAD);
    _Atomic uint64_t *tail = header_u64(ring->base, OFF_TAIL);
    uint64_t pos = atomic_load_explicit(head, memory_order_relaxed);
    for (;;) {
        /* acquire pairs with the drain thread's release store of tail: its reads of the
         * slot's previous record happen before our writes below. */
        uint64_t consumed = atomic_load_explicit(tail, memory_order_acquire);
        if (__builtin_expect(pos < consumed, 0)) { /* our pos is stale (tail was read later) */
            pos = atomic_load_explicit(head, memory_order_relaxed);
            continue;
        }
        if (__builtin_expect(pos - consumed >= ring->capacity, 0)) {
            /* Full: dropping (not overwriting) keeps offline recording lossless up to the
             * drain's pace, and counts exactly what was lost. */
            atomic_fetch_add_explicit(header_u64(ring->base, OFF_DROPPED), 1, memory_order_relaxed);
            return;
        }
        /* relaxed: the CAS only has to make the claim unique; publication is via seq. */
        if (atomic_compare_exchange_weak_explicit(head, &pos, pos + 1, memory_order_relaxed, memory_order_relaxed))
            break;
    }
    ring_gil_record *slot = &ring->records[pos & ring->mask];
    /* Seqlock writer side, for external readers that may still be copying this slot's
     * previous record: mark the slot empty, then a release fence so the mark is visible
     * before any of the new field values (on x86-64 both compile to plain stores). */
    atomic_store_explicit(&slot->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    slot->mono_ns = mono_ns;
    slot->tid = tid;
    slot->kind = event;
    slot->flags = 0;
    slot->aux = 0;
    /* Publish: release makes the fields visible to whoever acquires seq == pos + 1. */
    atomic_store_explicit(&slot->seq, pos + 1, memory_order_release);
}

/* ---- Drain thread ------------------------------------------------------------------- */

/* write(2) all of IOV (restarting on EINTR and short writes). Returns 0 or an errno. */
static int write_all(int fd, struct iovec *iov, int iovcnt) {
    while (iovcnt > 0) {
        ssize_t n = writev(fd, iov, iovcnt);
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

/* One pass: copy the committed records from tail on (in position order, stopping at the
 * first slot still being written) to the events file, add a LOST marker for new drops,
 * then hand the slots back by advancing tail. Drain thread only (and close, after join). */
static void drain_once(tandem_ring *ring) {
    _Atomic uint64_t *tail = header_u64(ring->base, OFF_TAIL);
    uint64_t start = atomic_load_explicit(tail, memory_order_relaxed); /* only we write it */
    uint64_t head = atomic_load_explicit(header_u64(ring->base, OFF_HEAD), memory_order_relaxed);
    uint64_t end = start;
    /* acquire on seq pairs with the producer's release store: the fields are complete. */
    while (end < head && atomic_load_explicit(&ring->records[end & ring->mask].seq, memory_order_acquire) == end + 1)
        end++;

    uint64_t dropped = atomic_load_explicit(header_u64(ring->base, OFF_DROPPED), memory_order_relaxed);
    ring_gil_record lost = {0};
    int with_marker = dropped != ring->dropped_reported;
    if (with_marker) {
        lost.mono_ns = clock_ns(CLOCK_MONOTONIC);
        lost.kind = TANDEM_RING_LOST_MARKER;
        lost.aux = dropped - ring->dropped_reported;
    }
    if (end == start && !with_marker) return;

    uint64_t count = end - start;
    if (ring->events_fd >= 0 && !ring->events_failed) {
        struct iovec iov[3];
        int n = 0;
        uint64_t first = start & ring->mask;
        uint64_t until_wrap = ring->capacity - first;
        uint64_t part1 = count < until_wrap ? count : until_wrap;
        if (part1) iov[n++] = (struct iovec){&ring->records[first], part1 * RING_GIL_RECORD_SIZE};
        if (count > part1) iov[n++] = (struct iovec){&ring->records[0], (count - part1) * RING_GIL_RECORD_SIZE};
        if (with_marker) iov[n++] = (struct iovec){&lost, sizeof lost};
        off_t batch_bytes = 0;
        for (int i = 0; i < n; i++) batch_bytes += (off_t)iov[i].iov_len;
        int rc = write_all(ring->events_fd, iov, n); /* (advances iov on short writes) */
        if (rc != 0) {
            /* Disk full or the like: cut a partly written batch off (the file keeps whole
             * batches only), then keep consuming, else every later event would be dropped,
             * but write no more records: they are counted as drain_lost, and close still
             * writes the final header. */
            atomic_store_explicit(&ring->drain_errno, rc, memory_order_relaxed);
            ring->events_failed = 1;
            if (ftruncate(ring->events_fd, ring->events_size) != 0) { /* the reader drops a cut record */ }
            atomic_fetch_add_explicit(&ring->drain_lost, count, memory_order_relaxed);
        } else {
            ring->events_size += batch_bytes;
            atomic_fetch_add_explicit(&ring->drained, count, memory_order_relaxed);
        }
    } else if (ring->events_failed) {
        atomic_fetch_add_explicit(&ring->drain_lost, count, memory_order_relaxed);
    }
    ring->dropped_reported = dropped;
    /* release: our reads of the slots above happen before a producer reuses them. */
    atomic_store_explicit(tail, end, memory_order_release);
}

static void *drain_main(void *arg) {
    tandem_ring *ring = arg;
    pthread_mutex_lock(&ring->drain_mutex);
    while (!ring->drain_stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)ring->period_us * 1000u;
        deadline.tv_sec += (time_t)(ns / 1000000000u);
        deadline.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&ring->drain_cond, &ring->drain_mutex, &deadline);
        if (ring->drain_stop) break;
        pthread_mutex_unlock(&ring->drain_mutex);
        drain_once(ring);
        pthread_mutex_lock(&ring->drain_mutex);
    }
    pthread_mutex_unlock(&ring->drain_mutex);
    return NULL;
}

int tandem_ring_start_drain(tandem_ring *ring, const char *events_path, uint32_t period_us, char *err, size_t errlen) {
    if (ring->drain_started) {
        snprintf(err, errlen, "ring %s: drain already started", ring->path);
        return -1;
    }
    if (period_us < 100 || period_us > 10000000) {
        snprintf(err, errlen, "ring %s: drain period %u us is outside [100, 10000000]", ring->path, period_us);
        return -1;
    }
    ring->period_us = period_us;
    ring->events_fd = -1;
    if (events_path) {
        int fd = open(events_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            snprintf(err, errlen, "events file %s: cannot create: %s", events_path, strerror(errno));
            return -1;
        }
        /* The events file stands alone: it starts with a copy of the ring's header page
         * (file_kind = events, counters 0 until close writes the final ones). */
        memcpy(ring->events_header, ring->base, RING_HEADER_SIZE);
        memset(ring->events_header + OFF_HEAD, 0, RING_HEADER_SIZE - OFF_HEAD);
        put_u32(ring->events_header, OFF_FILE_KIND, RING_FILE_KIND_EVENTS);
        struct iovec iov = {ring->events_header, RING_HEADER_SIZE};
        int rc = write_all(fd, &iov, 1);
        if (rc != 0) {
            snprintf(err, errlen, "events file %s: cannot write header: %s", events_path, strerror(rc));
            close(fd);
            unlink(events_path);
            return -1;
        }
        ring->events_fd = fd;
        ring->events_size = RING_HEADER_SIZE;
    }
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
    stats->claimed = atomic_load_explicit(header_u64(ring->base, OFF_HEAD), memory_order_relaxed);
    stats->dropped = atomic_load_explicit(header_u64(ring->base, OFF_DROPPED), memory_order_relaxed);
    stats->drained = atomic_load_explicit(&ring->drained, memory_order_relaxed);
    stats->drain_lost = atomic_load_explicit(&ring->drain_lost, memory_order_relaxed);
    stats->drain_errno = atomic_load_explicit(&ring->drain_errno, memory_order_relaxed);
}

void tandem_ring_close(tandem_ring *ring) {
    if (!ring) return;
    int in_fork_child = ring->fork_generation != atomic_load_explicit(&fork_generation, memory_order_relaxed);
    if (!in_fork_child) {
        if (ring->drain_started) {
            pthread_mutex_lock(&ring->drain_mutex);
            ring->drain_stop = 1;
            pthread_cond_signal(&ring->drain_cond);
            pthread_mutex_unlock(&ring->drain_mutex);
            pthread_join(ring->drain_thread, NULL);
            drain_once(ring); /* the last records, now that no thread emits any more */
            if (ring->events_fd >= 0) {
                /* Final counters (and name table) in the events file's header: a reader can
                 * then check records + lost == claimed + dropped for a clean recording. */
                put_u64(ring->events_header, OFF_HEAD, atomic_load(header_u64(ring->base, OFF_HEAD)));
                put_u64(ring->events_header, OFF_TAIL, atomic_load(header_u64(ring->base, OFF_TAIL)));
                put_u64(ring->events_header, OFF_DROPPED, atomic_load(header_u64(ring->base, OFF_DROPPED)));
                put_u64(ring->events_header, OFF_DRAIN_LOST, atomic_load(&ring->drain_lost));
                put_u32(ring->events_header, OFF_STATE, RING_STATE_CLOSED);
                memcpy(ring->events_header + OFF_NAMES_USED, ring->base + OFF_NAMES_USED, RING_HEADER_SIZE - OFF_NAMES_USED);
                if (pwrite(ring->events_fd, ring->events_header + OFF_HEAD, RING_HEADER_SIZE - OFF_HEAD, OFF_HEAD) < 0)
                    atomic_store(&ring->drain_errno, errno);
                close(ring->events_fd);
            }
        }
        atomic_fetch_and_explicit(header_u32(ring->base, OFF_STATE), ~RING_STATE_DRAINING, memory_order_relaxed);
        atomic_fetch_or_explicit(header_u32(ring->base, OFF_STATE), RING_STATE_CLOSED, memory_order_release);
    }
    munmap(ring->base, ring->map_len);
    pthread_mutex_destroy(&ring->drain_mutex);
    pthread_cond_destroy(&ring->drain_cond);
    free(ring);
}
