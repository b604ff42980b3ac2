/* Test and benchmark entry points of the ring: real pthreads producing into a real ring,
 * callable from Python as `_ring_selftest._ring_stress(...)`, `_ring_selftest._ring_bench(...)`
 * and `_ring_selftest._tsc_selftest(...)`.
 *
 * Not part of the engine: a CPython extension of its own, `_ring_selftest`, compiled from this
 * file with engine/probe/ring.c and tsc.c (the ring exactly as the probe builds it, same
 * flags) by tests/native/build.py, on demand, for the tests and bench/bench_ring.py. The
 * extension users install (engine.probe._probe) does not contain it.
 *
 * Stress records carry a self-check instead of real GIL data, so a reader can prove that
 * no record is torn and that each thread's records arrive in order:
 *     tid     = producer thread number t (1-based)
 *     mono_ns = (t << 40) | i            i = the thread's event counter, 0, 1, 2, ...
 *     kind    = 1 + i % 5
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "tsc.h"

#define SELFTEST_MAX_THREADS 64

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- _ring_stress -------------------------------------------------------------------- */

typedef struct {
    tandem_ring *ring;
    uint32_t thread_number;
    uint64_t events;
    uint64_t burst;     /* after this many events sleep pause_us (0: never sleep) */
    uint32_t pause_us;
    pthread_barrier_t *start;
} stress_worker;

static void *stress_main(void *arg) {
    stress_worker *w = arg;
    pthread_barrier_wait(w->start);
    uint64_t tag = (uint64_t)w->thread_number << 40;
    for (uint64_t i = 0; i < w->events; i++) {
        tandem_ring_emit_gil(w->ring, (uint16_t)(1 + i % 5), w->thread_number, tag | i, 0);
        if (w->burst && (i + 1) % w->burst == 0) {
            struct timespec pause = {0, (long)w->pause_us * 1000};
            nanosleep(&pause, NULL);
        }
    }
    return NULL;
}

static PyObject *ring_stress(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ring_path", "events_path", "threads", "events_per_thread", "capacity",
                             "drain_period_us", "burst", "pause_us", "lanes", "waves", NULL};
    const char *ring_path, *events_path = NULL;
    unsigned int threads, capacity, drain_period_us, pause_us = 0, lanes = 0, waves = 1;
    unsigned long long events_per_thread, burst = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "szIKII|KIII", kwlist, &ring_path, &events_path, &threads,
                                     &events_per_thread, &capacity, &drain_period_us, &burst, &pause_us, &lanes, &waves))
        return NULL;
    if (threads < 1 || threads > SELFTEST_MAX_THREADS || waves < 1 || waves > 64) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], waves in [1, 64]", SELFTEST_MAX_THREADS);
        return NULL;
    }
    char err[512] = {0};
    tandem_ring_options opt = {.capacity = capacity, .python_version = PY_VERSION, .backend = "selftest", .lanes = lanes};
    tandem_ring *ring = tandem_ring_create(ring_path, &opt, err, sizeof err);
    if (!ring) return PyErr_Format(PyExc_OSError, "%s", err);
    /* drain_period_us 0: no consumer at all, so everything beyond `capacity` is dropped. */
    if (drain_period_us && tandem_ring_start_drain(ring, events_path, drain_period_us, err, sizeof err) != 0) {
        tandem_ring_close(ring);
        return PyErr_Format(PyExc_OSError, "%s", err);
    }
    stress_worker workers[SELFTEST_MAX_THREADS];
    pthread_t tids[SELFTEST_MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads);
    uint64_t t0 = 0, t1 = 0;
    unsigned started = threads;
    Py_BEGIN_ALLOW_THREADS
    t0 = now_ns();
    /* WAVES: the threads run WAVES times in turn, each wave's threads new (numbered
     * wave * threads + 1 ...) and started once the previous wave has exited. */
    for (unsigned wave = 0; wave < waves && started == threads; wave++) {
        started = 0;
        for (unsigned t = 0; t < threads; t++) {
            workers[t] = (stress_worker){ring, wave * threads + t + 1, events_per_thread, burst, pause_us, &start};
            if (pthread_create(&tids[t], NULL, stress_main, &workers[t]) != 0) break;
            started++;
        }
        for (unsigned t = 0; t < started; t++) pthread_join(tids[t], NULL);
    }
    t1 = now_ns();
    Py_END_ALLOW_THREADS
    pthread_barrier_destroy(&start);
    if (started != threads) {
        /* The barrier would have held the started ones forever: cannot happen unless the
         * process is out of threads, in which case say so rather than hang. */
        tandem_ring_close(ring);
        return PyErr_Format(PyExc_OSError, "could only start %u of %u producer threads", started, threads);
    }
    Py_BEGIN_ALLOW_THREADS
    tandem_ring_close(ring);
    Py_END_ALLOW_THREADS
    /* The counters a test checks are in the files; it checks them against this count. */
    return Py_BuildValue("{s:K,s:K}", "produced", (unsigned long long)threads * waves * events_per_thread, "elapsed_ns",
                         (unsigned long long)(t1 - t0));
}

/* ---- _ring_bench --------------------------------------------------------------------- */

static __thread uint32_t bench_cached_tid __attribute__((tls_model("initial-exec")));

/* The two loops run in alternating short blocks, all threads together (a barrier before
 * each block), and each kind keeps its fastest block: on a shared, busy machine a block
 * that was preempted is slower, never faster, so the minimum is the undisturbed cost. */
#define BENCH_BLOCKS 20

typedef struct {
    tandem_ring *ring;
    uint64_t events;   /* per thread, over all blocks of one kind */
    pthread_barrier_t *start;
    double clock_ns;   /* per bare clock_gettime(CLOCK_MONOTONIC), fastest block */
    double stamp_ns;   /* per clock_gettime + cached tid + tandem_ring_emit_gil, fastest block */
    uint64_t sink;
} bench_worker;

static void *bench_main(void *arg) {
    bench_worker *w = arg;
    bench_cached_tid = (uint32_t)gettid();
    struct timespec ts;
    uint64_t sink = 0, per_block = w->events / BENCH_BLOCKS + 1;
    double best_clock = 1e300, best_stamp = 1e300;
    for (int block = 0; block < BENCH_BLOCKS; block++) {
        pthread_barrier_wait(w->start);
        uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < per_block; i++) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sink += (uint64_t)ts.tv_nsec;
        }
        uint64_t t1 = now_ns();
        if ((double)(t1 - t0) / (double)per_block < best_clock) best_clock = (double)(t1 - t0) / (double)per_block;

        pthread_barrier_wait(w->start);
        t0 = now_ns();
        for (uint64_t i = 0; i < per_block; i++) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t mono = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
            tandem_ring_emit_gil(w->ring, TANDEM_GIL_DROP, bench_cached_tid, mono, 0);
        }
        t1 = now_ns();
        if ((double)(t1 - t0) / (double)per_block < best_stamp) best_stamp = (double)(t1 - t0) / (double)per_block;
    }
    w->clock_ns = best_clock;
    w->stamp_ns = best_stamp;
    w->sink = sink;
    return NULL;
}

static PyObject *ring_bench(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ring_path", "threads", "events_per_thread", "capacity", "drain_period_us", "lanes", NULL};
    const char *ring_path;
    unsigned int threads, capacity, drain_period_us = 1000, lanes = 0;
    unsigned long long events;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sIKI|II", kwlist, &ring_path, &threads, &events, &capacity,
                                     &drain_period_us, &lanes))
        return NULL;
    if (threads < 1 || threads > SELFTEST_MAX_THREADS || events == 0) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d] and events_per_thread > 0", SELFTEST_MAX_THREADS);
        return NULL;
    }
    char err[512] = {0};
    tandem_ring_options opt = {.capacity = capacity, .python_version = PY_VERSION, .backend = "bench", .lanes = lanes};
    tandem_ring *ring = tandem_ring_create(ring_path, &opt, err, sizeof err);
    if (!ring) return PyErr_Format(PyExc_OSError, "%s", err);
    if (tandem_ring_start_drain(ring, NULL, drain_period_us, err, sizeof err) != 0) {
        tandem_ring_close(ring);
        return PyErr_Format(PyExc_OSError, "%s", err);
    }
    bench_worker workers[SELFTEST_MAX_THREADS];
    pthread_t tids[SELFTEST_MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads);
    unsigned started = 0;
    Py_BEGIN_ALLOW_THREADS
    for (unsigned t = 0; t < threads; t++) {
        workers[t] = (bench_worker){.ring = ring, .events = events, .start = &start};
        if (pthread_create(&tids[t], NULL, bench_main, &workers[t]) != 0) break;
        started++;
    }
    for (unsigned t = 0; t < started; t++) pthread_join(tids[t], NULL);
    Py_END_ALLOW_THREADS
    pthread_barrier_destroy(&start);
    tandem_ring_stats stats;
    tandem_ring_stats_get(ring, &stats);
    Py_BEGIN_ALLOW_THREADS
    tandem_ring_close(ring);
    Py_END_ALLOW_THREADS
    if (started != threads) return PyErr_Format(PyExc_OSError, "could only start %u of %u threads", started, threads);
    double clock_ns = 0, stamp_ns = 0;
    for (unsigned t = 0; t < threads; t++) {
        clock_ns += workers[t].clock_ns / threads;
        stamp_ns += workers[t].stamp_ns / threads;
    }
    return Py_BuildValue("{s:d,s:d,s:K,s:K}", "clock_ns", clock_ns, "stamp_ns", stamp_ns, "claimed",
                         (unsigned long long)stats.claimed, "dropped", (unsigned long long)stats.dropped);
}

/* ---- _tsc_selftest ------------------------------------------------------------------- */

/* The calling thread stamps EVENTS records with the raw TSC into a new time_tsc ring
 * drained to EVENTS_PATH, each TSC read bracketed by two clock_gettime(CLOCK_MONOTONIC)
 * reads, pausing PAUSE_US every BURST events so that many drain passes happen. Returns
 * {'before': bytes, 'after': bytes} (u64 brackets, in emission order) for a test to compare
 * with the converted times of the records (tid 1, kind 1 + i % 3, one lane). */
static PyObject *tsc_selftest(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ring_path", "events_path", "events", "drain_period_us", "burst", "pause_us", NULL};
    const char *ring_path, *events_path;
    unsigned int events, drain_period_us = 1000, burst = 100, pause_us = 100;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssI|III", kwlist, &ring_path, &events_path, &events, &drain_period_us,
                                     &burst, &pause_us))
        return NULL;
    char err[512] = {0};
    if (!tandem_tsc_usable(err, sizeof err)) return PyErr_Format(PyExc_OSError, "TSC not usable: %s", err);
    if (events == 0 || burst == 0) return PyErr_Format(PyExc_ValueError, "events and burst must be > 0");
    PyObject *before = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)events * 8);
    PyObject *after = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)events * 8);
    if (!before || !after) {
        Py_XDECREF(before);
        Py_XDECREF(after);
        return NULL;
    }
    uint64_t *b = (uint64_t *)PyBytes_AS_STRING(before), *a = (uint64_t *)PyBytes_AS_STRING(after);
    /* Two lanes: this thread gets lane 1 of its own. */
    tandem_ring_options opt = {.capacity = 1u << 16, .python_version = PY_VERSION, .backend = "tsc-selftest", .lanes = 2,
                               .time_tsc = 1};
    tandem_ring *ring = tandem_ring_create(ring_path, &opt, err, sizeof err);
    if (!ring || tandem_ring_start_drain(ring, events_path, drain_period_us, err, sizeof err) != 0) {
        if (ring) tandem_ring_close(ring);
        Py_DECREF(before);
        Py_DECREF(after);
        return PyErr_Format(PyExc_OSError, "%s", err);
    }
    Py_BEGIN_ALLOW_THREADS
    for (unsigned i = 0; i < events; i++) {
        b[i] = tandem_monotonic_ns();
        uint64_t t = tandem_rdtsc();
        a[i] = tandem_monotonic_ns();
        tandem_ring_emit_gil(ring, (uint16_t)(1 + i % 3), 1, t, 0);
        if ((i + 1) % burst == 0) {
            struct timespec pause = {0, (long)pause_us * 1000};
            nanosleep(&pause, NULL);
        }
    }
    tandem_ring_close(ring);
    Py_END_ALLOW_THREADS
    PyObject *out = Py_BuildValue("{s:N,s:N}", "before", before, "after", after);
    return out;
}

static PyMethodDef ring_selftest_methods[] = {
    {"_tsc_selftest", (PyCFunction)(void (*)(void))tsc_selftest, METH_VARARGS | METH_KEYWORDS,
     "_tsc_selftest(ring_path, events_path, events, drain_period_us=1000, burst=100, pause_us=100)\n"
     "Test only: stamp EVENTS records with the raw TSC into a new TSC-time ring, each TSC read\n"
     "bracketed by clock_gettime(CLOCK_MONOTONIC); returns {'before', 'after'} (u64 bytes)."},
    {"_ring_stress", (PyCFunction)(void (*)(void))ring_stress, METH_VARARGS | METH_KEYWORDS,
     "_ring_stress(ring_path, events_path, threads, events_per_thread, capacity, drain_period_us, burst=0, pause_us=0, lanes=0, waves=1)\n"
     "Test only: THREADS pthreads emit self-checking records into a new ring of CAPACITY slots in\n"
     "LANES lanes (0: automatic); drain to EVENTS_PATH (None: consume only; drain_period_us 0: no\n"
     "drain). WAVES: that many successive sets of THREADS new threads (lanes get reused).\n"
     "Returns {'produced', 'elapsed_ns'}."},
    {"_ring_bench", (PyCFunction)(void (*)(void))ring_bench, METH_VARARGS | METH_KEYWORDS,
     "_ring_bench(ring_path, threads, events_per_thread, capacity, drain_period_us=1000, lanes=0)\n"
     "Benchmark: per-thread ns of a bare clock_gettime loop (anchor) and of a full stamp\n"
     "(clock_gettime + cached tid + tandem_ring_emit_gil), threads running at once, in\n"
     "alternating blocks; each kind's fastest block. lanes=1: every thread on the shared lane\n"
     "(CAS claim, the format-v1 protocol), for comparison."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ring_selftest_module = {
    PyModuleDef_HEAD_INIT, "_ring_selftest",
    "The ring's test and benchmark entry points (tests/native/ring_selftest.c); not shipped.", -1,
    ring_selftest_methods};

PyMODINIT_FUNC PyInit__ring_selftest(void) { return PyModule_Create(&ring_selftest_module); }
