/* Module glue of the GIL probe: engine.probe._probe.
 *
 *   start(ring_path, events_path, backend="auto", capacity=1048576, drain_period_us=20000,
 *         sample_period_us=100, clock="auto", wait_when_full=False, codes_path=None,
 *         segment_bytes=0, segment_ms=0) -> dict
 *                                           install a backend, create the ring, drain it
 *   stop() -> dict                          uninstall, wait for in-flight stamps, close
 *   status() -> dict                        backend, counters, what the backend can miss
 *   backends() -> dict                      name -> what it can miss
 * plus test entry points (_insn_length, _find_function) and benchmark ones (_hooks_only, _bench_stamp).
 * One probe per process; the Python wrapper (engine/probe/__init__.py) is the public API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "codes.h"
#include "hooks.h"
#include "patch.h"
#include "ring.h"
#include "sampling.h"
#include "symbols.h"
#include "tsc.h"

static const char *const MISSES_PRECISE =
    "nothing: every release (voluntary, forced switch, thread exit) and every take is stamped";
static const char *const MISSES_PRECISE_GOT =
    "nothing in the main interpreter: every release (voluntary, forced switch, thread exit) and every take "
    "is stamped; a sub-interpreter's own GIL (3.12+) is learned at its first take, whose wait and any "
    "release before it are not seen, up to 8 such GILs at once (status()['own_gils'])";
static const char *const MISSES_EXPORTED =
    "forced switches between CPU-bound threads, thread exit, releases inside libpython that "
    "do not go through the PLT";
static const char *const MISSES_SAMPLING =
    "holds and releases shorter than the sampling period; cannot tell waiting from released; "
    "times are sample times, not hand-over times";

typedef struct {
    const char *backend;            /* NULL when stopped                                */
    tandem_ring *ring;
    tandem_ring *ring_from_parent;  /* inherited through fork: left mapped, never used    */
    int hooks_installed;            /* precise/exported hooks are in place              */
    char ring_path[4096];
    char events_path[4096];
    char fallback[1024];            /* why better backends were not used                */
    uint32_t sample_period_us;
    uint64_t events_at_start;       /* the hooks' event counter is per process: report deltas */
    int clock_tsc;                  /* stamps are raw TSC (converted by the ring's drain)  */
    int wait_when_full;             /* a full lane makes its thread wait for the drain     */
    int starting;                   /* a start is under way (it releases the GIL briefly)  */
    const char *method;             /* precise: "got" or "inline" (tandem_hooks_precise_method) */
    char clock_reason[200];         /* why not tsc, when clock_gettime is used             */
} probe_state;

static probe_state probe;

/* The ring's geometry for the probe (docs/probe.md, "Ring size and losses"). */
#define PROBE_DEFAULT_CAPACITY (1u << 20) /* slots in all: 32 MiB of ring */
#define PROBE_LANE_SLOTS 65536u
#define PROBE_MAX_LANES 16u
static PyObject *ProbeError;

/* Whether the precise backend runs METHOD ("got" or "inline"). */
static int method_is(const char *method) {
    return probe.method && strcmp(probe.method, method) == 0;
}

static const char *misses_of(const char *backend) {
    if (!backend) return "";
    if (strcmp(backend, "precise") == 0) return method_is("got") ? MISSES_PRECISE_GOT : MISSES_PRECISE;
    if (strcmp(backend, "exported") == 0) return MISSES_EXPORTED;
    return MISSES_SAMPLING;
}

static void python_version(char *out, size_t len) {
    snprintf(out, len, "%s", Py_GetVersion());
    char *space = strchr(out, ' ');
    if (space) *space = '\0';
}

static void append_reason(const char *backend, const char *why) {
    size_t used = strlen(probe.fallback);
    snprintf(probe.fallback + used, sizeof probe.fallback - used, "%s%s: %s", used ? "; " : "", backend, why);
}

/* Try one backend; 0 on success. Hooks write nowhere until a ring is set. */
static int install_backend(const char *name, uint32_t sample_period_us, char *err, size_t errlen) {
    if (strcmp(name, "precise") == 0) return tandem_hooks_install_precise(err, errlen);
    if (strcmp(name, "exported") == 0) return tandem_hooks_install_exported(err, errlen);
    if (strcmp(name, "sampling") == 0) return 0; /* the thread starts once the ring exists */
    snprintf(err, errlen, "unknown backend %s (precise, exported, sampling or auto)", name);
    return -1;
}

static PyObject *status_dict(void) {
    char version[64];
    python_version(version, sizeof version);
    PyObject *d = Py_BuildValue(
        "{s:s,s:s,s:O,s:s,s:s,s:s,s:K,s:i,s:i,s:s,s:s}",
        "backend", probe.backend ? probe.backend : "none",
        /* precise: "got" (the GIL's mutexes through the GOT) or "inline" (patched functions) */
        "method", probe.backend && probe.method ? probe.method : "",
        "running", probe.ring ? Py_True : Py_False,
        "misses", misses_of(probe.backend),
        "ring_path", probe.ring_path,
        "events_path", probe.events_path,
        "events", (unsigned long long)(tandem_hooks_events() - probe.events_at_start),
        "threads_seen", tandem_hooks_threads_seen(), /* since the module was loaded */
        "patched_sites", tandem_hooks_patched_sites(),
        "fallback_reasons", probe.fallback,
        "python_version", version);
    if (d == NULL) return NULL;
    /* why the precise backend runs its inline hooks rather than the GOT method */
    PyObject *method_reason = Py_BuildValue("s", method_is("inline") ? tandem_hooks_got_method_why() : "");
    if (method_reason) PyDict_SetItemString(d, "method_reason", method_reason);
    Py_XDECREF(method_reason);
    PyObject *clock = Py_BuildValue("s", probe.clock_tsc ? "tsc" : "clock_gettime");
    PyObject *reason = Py_BuildValue("s", probe.clock_reason);
    if (clock) PyDict_SetItemString(d, "clock", clock);
    if (reason) PyDict_SetItemString(d, "clock_reason", reason);
    Py_XDECREF(clock);
    Py_XDECREF(reason);
    PyDict_SetItemString(d, "wait_when_full", probe.wait_when_full ? Py_True : Py_False);
    /* the code table (codes.h): code objects named, and refused once it was full */
    PyObject *codes = Py_BuildValue("{s:I,s:I}", "interned", tandem_codes_count(), "refused", tandem_codes_refused());
    if (codes) PyDict_SetItemString(d, "codes", codes);
    Py_XDECREF(codes);
    if (method_is("got")) {
        /* sub-interpreters' own GILs (GOT method): known now, learned since install, not kept */
        int learned, missed, now = tandem_hooks_other_gils(&learned, &missed);
        PyObject *v = Py_BuildValue("{s:i,s:i,s:i}", "now", now, "learned", learned, "missed", missed);
        if (v) PyDict_SetItemString(d, "own_gils", v);
        Py_XDECREF(v);
    }
    if (probe.backend && strcmp(probe.backend, "sampling") == 0) {
        PyObject *v = PyLong_FromUnsignedLongLong(tandem_sampling_samples());
        PyDict_SetItemString(d, "samples", v);
        Py_XDECREF(v);
        v = PyLong_FromUnsignedLong(probe.sample_period_us);
        PyDict_SetItemString(d, "sample_period_us", v);
        Py_XDECREF(v);
    }
    if (probe.ring) {
        tandem_ring_stats st;
        tandem_ring_stats_get(probe.ring, &st);
        PyObject *ring = Py_BuildValue("{s:K,s:K,s:K,s:K,s:i,s:K,s:K,s:K}", "claimed", (unsigned long long)st.claimed,
                                       "dropped", (unsigned long long)st.dropped, "drained",
                                       (unsigned long long)st.drained, "drain_lost",
                                       (unsigned long long)st.drain_lost, "drain_errno", st.drain_errno,
                                       "full_waits", (unsigned long long)st.full_waits,
                                       "drain_wakeups", (unsigned long long)st.wakeups,
                                       "drain_cpu_ns", (unsigned long long)st.drain_cpu_ns);
        if (ring) {
            PyDict_SetItemString(d, "ring", ring);
            Py_DECREF(ring);
        }
    }
    return d;
}

static PyObject *start_locked(const char *ring_path, const char *events_path, const char *codes_path, const char *backend,
                              unsigned int capacity, unsigned int drain_period_us, unsigned int sample_period_us,
                              const char *clock, int wait_when_full, unsigned long long segment_bytes,
                              unsigned long long segment_ms);

static PyObject *probe_start(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"ring_path", "events_path", "backend", "capacity", "drain_period_us",
                             "sample_period_us", "clock", "wait_when_full", "codes_path", "segment_bytes",
                             "segment_ms", NULL};
    const char *ring_path, *events_path, *backend = "auto", *clock = "auto", *codes_path = NULL;
    unsigned int capacity = PROBE_DEFAULT_CAPACITY, drain_period_us = 20000, sample_period_us = 100;
    int wait_when_full = 0;
    unsigned long long segment_bytes = 0, segment_ms = 0; /* 0, 0: one events file */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|sIIIspzKK:start", kwlist, &ring_path, &events_path, &backend,
                                     &capacity, &drain_period_us, &sample_period_us, &clock, &wait_when_full,
                                     &codes_path, &segment_bytes, &segment_ms))
        return NULL;
#ifdef Py_GIL_DISABLED
    PyErr_SetString(ProbeError, "no GIL to watch: this is a free-threaded build of CPython");
    return NULL;
#endif
    if (probe.ring) {
        PyErr_Format(ProbeError, "the probe is already recording into %s", probe.ring_path);
        return NULL;
    }
    if (probe.starting) {
        /* The precise backend's install releases and re-takes the GIL once (learning the
         * GIL's mutexes): another thread may get here meanwhile. */
        PyErr_SetString(ProbeError, "the probe is being started by another thread");
        return NULL;
    }
    probe.starting = 1;
    PyObject *started = start_locked(ring_path, events_path, codes_path, backend, capacity, drain_period_us,
                                     sample_period_us, clock, wait_when_full, segment_bytes, segment_ms);
    probe.starting = 0;
    return started;
}

static PyObject *start_locked(const char *ring_path, const char *events_path, const char *codes_path, const char *backend,
                              unsigned int capacity, unsigned int drain_period_us, unsigned int sample_period_us,
                              const char *clock, int wait_when_full, unsigned long long segment_bytes,
                              unsigned long long segment_ms) {
    /* A ring inherited through fork() is left mapped, never closed: its drain thread's
     * condition variable had a waiter in the parent, so destroying it here would block. */
    probe.ring_from_parent = NULL;
    char err[512] = "";
    char clock_reason[200];
    int clock_tsc = tandem_clock_choose(clock, clock_reason, sizeof clock_reason);
    if (clock_tsc < 0) {
        PyErr_Format(ProbeError, "cannot start the GIL probe: %s", clock_reason);
        return NULL;
    }
    const char *chosen = NULL;
    probe.fallback[0] = '\0';
    if (probe.hooks_installed) {
        chosen = probe.backend;   /* fork child: the parent's hooks are still in place */
    } else if (strcmp(backend, "auto") == 0) {
        static const char *const order[] = {"precise", "exported", "sampling"};
        for (int i = 0; i < 3 && !chosen; i++) {
            if (install_backend(order[i], sample_period_us, err, sizeof err) == 0) chosen = order[i];
            else append_reason(order[i], err);
        }
    } else if (install_backend(backend, sample_period_us, err, sizeof err) == 0) {
        static const char *const names[] = {"precise", "exported", "sampling"};
        for (int i = 0; i < 3; i++)
            if (strcmp(backend, names[i]) == 0) chosen = names[i];
    }
    if (!chosen) {
        PyErr_Format(ProbeError, "cannot start the GIL probe: %s", probe.fallback[0] ? probe.fallback : err);
        return NULL;
    }
    probe.hooks_installed = strcmp(chosen, "sampling") != 0;
    probe.method = strcmp(chosen, "precise") == 0 ? tandem_hooks_precise_method() : "";
    char version[64];
    python_version(version, sizeof version);
    /* Deep lanes rather than many: up to 16 lanes (15 private) of >= 65536 slots each. A
     * thread doing GIL round trips in a loop stamps ~10 M events/s: 65536 slots give the
     * drain thread ~3 ms from the half-full wake-up to a full lane, which a loaded machine
     * needs (shallower lanes drop such a loop's events). Fewer slots than 2 x 65536 in all:
     * 2 lanes. */
    uint32_t lanes = capacity / PROBE_LANE_SLOTS;
    if (lanes > PROBE_MAX_LANES) lanes = PROBE_MAX_LANES;
    if (lanes < 2) lanes = capacity >= 4 ? 2 : 1;
    /* Never blocking a producer is the default: a thread stalled on a full lane would hold
     * the GIL (drop_gil entry, take_gil return) and add the very latency spikes tandem is
     * there to find. wait_when_full=True trades that for a lossless events file. */
    tandem_ring_options opt = {capacity, version, chosen, lanes, (uint32_t)clock_tsc, (uint32_t)wait_when_full};
    tandem_ring *ring = tandem_ring_create(ring_path, &opt, err, sizeof err);
    /* The code table (codes.h) before any stamp can reach the ring; none: releases unnamed. */
    if (ring) tandem_ring_set_segments(ring, segment_bytes, segment_ms * 1000000ull);
    if (ring == NULL || (codes_path && tandem_codes_open(codes_path, err, sizeof err) != 0) ||
        tandem_ring_start_drain(ring, events_path, drain_period_us, err, sizeof err) != 0) {
        if (ring) tandem_ring_close(ring);
        tandem_codes_close();
        if (probe.hooks_installed) tandem_hooks_uninstall();
        probe.hooks_installed = 0;
        PyErr_Format(ProbeError, "cannot start the GIL probe: %s", err);
        return NULL;
    }
    probe.events_at_start = tandem_hooks_events();
    probe.ring = ring;
    probe.backend = chosen;
    probe.sample_period_us = sample_period_us;
    probe.clock_tsc = clock_tsc;
    probe.wait_when_full = wait_when_full;
    snprintf(probe.clock_reason, sizeof probe.clock_reason, "%s", clock_tsc ? "" : clock_reason);
    snprintf(probe.ring_path, sizeof probe.ring_path, "%s", ring_path);
    snprintf(probe.events_path, sizeof probe.events_path, "%s", events_path);
    tandem_hooks_set_clock(clock_tsc); /* no ring is set: no stamp is in flight */
    tandem_hooks_set_record_code(codes_path != NULL);
    tandem_hooks_set_ring(ring);
    if (strcmp(chosen, "sampling") == 0 && tandem_sampling_start(sample_period_us, err, sizeof err) != 0) {
        tandem_hooks_set_ring(NULL);
        tandem_ring_close(ring);
        tandem_codes_close();
        probe.ring = NULL;
        probe.backend = NULL;
        PyErr_Format(ProbeError, "cannot start the GIL probe: %s", err);
        return NULL;
    }
    return status_dict();
}

static PyObject *probe_stop(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    if (!probe.ring) return status_dict();
    tandem_ring *ring = probe.ring;
    /* Stop producing first (waiting for in-flight stamps must not hold the GIL), read the
     * final counters, then close the ring: only once no thread can be inside a stamp. */
    Py_BEGIN_ALLOW_THREADS
    tandem_sampling_stop();
    if (probe.hooks_installed) tandem_hooks_uninstall();
    tandem_hooks_set_ring(NULL);
    Py_END_ALLOW_THREADS
    probe.hooks_installed = 0;
    PyObject *final = status_dict();
    PyObject *running = final ? PyDict_GetItemString(final, "running") : NULL;
    if (running) PyDict_SetItemString(final, "running", Py_False);
    Py_BEGIN_ALLOW_THREADS
    tandem_ring_close(ring);
    Py_END_ALLOW_THREADS
    tandem_codes_close();   /* no stamp in flight since set_ring(NULL); the GIL is held */
    probe.ring = NULL;
    probe.backend = NULL;
    return final;
}

static PyObject *probe_status(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return status_dict();
}

static PyObject *probe_backends(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{s:s,s:s,s:s}", "precise", MISSES_PRECISE, "exported", MISSES_EXPORTED, "sampling",
                         MISSES_SAMPLING);
}

/* Test entry point: length of the first instruction of BYTES, or ValueError(reason). */
static PyObject *probe_insn_length(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    unsigned char code[32] = {0};
    memcpy(code, view.buf, view.len < 16 ? (size_t)view.len : 16);
    PyBuffer_Release(&view);
    char why[200];
    size_t n = tandem_movable_insn_length(code, why, sizeof why);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    return PyLong_FromSize_t(n);
}

/* Test entry point: [(name, address, first 16 bytes)] of every copy of a function. */
static PyObject *probe_find_function(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    tandem_function found[TANDEM_MAX_COPIES];
    char err[300];
    int n = tandem_find_functions((void *)Py_GetVersion, name, found, TANDEM_MAX_COPIES, err, sizeof err);
    if (n < 0) {
        PyErr_SetString(ProbeError, err);
        return NULL;
    }
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(sKy#)", found[i].name, (unsigned long long)found[i].address,
                                    (const char *)found[i].address, (Py_ssize_t)16);
        if (!t || PyList_Append(list, t) != 0) Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

static double elapsed_ns(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

/* Benchmark entry point: (ns per stamp into a scratch ring large enough that no stamp is
 * dropped, ns per bare clock_gettime, ns per bare rdtsc), measured back to back so that a
 * busy machine slows all alike. CLOCK: the stamps' clock ("auto", "tsc", "clock_gettime").
 * Needs the probe stopped. */
static PyObject *probe_bench_stamp(PyObject *self, PyObject *args) {
    (void)self;
    const char *ring_path, *clock = "auto";
    unsigned int count;
    if (!PyArg_ParseTuple(args, "sI|s:_bench_stamp", &ring_path, &count, &clock)) return NULL;
    if (probe.ring) {
        PyErr_SetString(ProbeError, "stop the probe before _bench_stamp");
        return NULL;
    }
    char err[300];
    int clock_tsc = tandem_clock_choose(clock, err, sizeof err);
    if (clock_tsc < 0) {
        PyErr_SetString(ProbeError, err);
        return NULL;
    }
    uint32_t capacity = 2;
    /* No drop, so every timed stamp writes: two lanes (shared + this thread's) each >= count. */
    while (capacity < 2 * count && capacity < (1u << 26)) capacity <<= 1;
    tandem_ring_options opt = {capacity, "bench", "bench", 2, (uint32_t)clock_tsc};
    tandem_ring *ring = tandem_ring_create(ring_path, &opt, err, sizeof err);
    if (ring == NULL || tandem_ring_start_drain(ring, NULL, 1000, err, sizeof err) != 0) {
        if (ring) tandem_ring_close(ring);
        PyErr_SetString(ProbeError, err);
        return NULL;
    }
    struct timespec t0, t1, t2, t3, scratch;
    volatile long sink = 0;
    Py_BEGIN_ALLOW_THREADS
    tandem_hooks_set_clock(clock_tsc);
    tandem_hooks_set_ring(ring);
    /* Warm-up pass over the whole ring: fault its pages in (a recording reuses them as it
     * wraps), then let the drain free every slot before the timed pass. */
    for (unsigned i = 0; i < capacity; i++) tandem_stamp(TANDEM_GIL_DROP);
    struct timespec settle = {0, 50 * 1000 * 1000};
    nanosleep(&settle, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; i < count; i++) tandem_stamp(TANDEM_GIL_DROP);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (unsigned i = 0; i < count; i++) {
        clock_gettime(CLOCK_MONOTONIC, &scratch);
        sink += scratch.tv_nsec;
    }
    clock_gettime(CLOCK_MONOTONIC, &t2);
    for (unsigned i = 0; i < count; i++) sink += (long)tandem_rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &t3);
    tandem_hooks_set_ring(NULL);
    tandem_ring_close(ring);
    Py_END_ALLOW_THREADS
    (void)sink;
    return Py_BuildValue("(ddd)", elapsed_ns(&t0, &t1) / count, elapsed_ns(&t1, &t2) / count, elapsed_ns(&t2, &t3) / count);
}

/* Benchmark entry point: _hooks_only(0) removes the precise hooks, 1 installs them with no
 * ring (what the interception alone costs), 2 also makes every stamp read the TSC and write
 * nothing (interception plus clock reads: the floor under any stamp); bench/bench_probe.py. */
static PyObject *probe_hooks_only(PyObject *self, PyObject *arg) {
    (void)self;
    long mode = PyLong_AsLong(arg);
    if (mode == -1 && PyErr_Occurred()) return NULL;
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "_hooks_only takes 0 (off), 1 (hooks) or 2 (hooks and clock reads)");
        return NULL;
    }
    if (probe.ring || probe.starting) {
        PyErr_SetString(ProbeError, "stop the probe before _hooks_only");
        return NULL;
    }
    char err[300];
    /* Both modes on the TSC clock where it is usable, so both take the stamp's fast path and
     * differ by the clock reads alone. */
    int tsc = tandem_clock_choose("tsc", err, sizeof err) == 1;
    if (mode == 2 && !tsc) {
        PyErr_Format(ProbeError, "_hooks_only(2) needs the TSC clock: %s", err);
        return NULL;
    }
    tandem_hooks_set_clock(tsc);
    tandem_hooks_set_dry_clock(mode == 2);
    if (mode && !probe.hooks_installed) {
        if (tandem_hooks_install_precise(err, sizeof err) != 0) {
            tandem_hooks_set_dry_clock(0);
            PyErr_SetString(ProbeError, err);
            return NULL;
        }
        probe.hooks_installed = 1;
    } else if (!mode && probe.hooks_installed) {
        tandem_hooks_uninstall();
        probe.hooks_installed = 0;
    }
    Py_RETURN_NONE;
}

static void after_fork_child(void) {
    tandem_hooks_after_fork_child();
    tandem_codes_after_fork_child();
    tandem_sampling_after_fork_child();
    if (probe.ring) {
        probe.ring_from_parent = probe.ring;  /* the parent's: leaked on purpose (see start) */
        probe.ring = NULL;
    }
    if (strcmp(probe.backend ? probe.backend : "", "sampling") == 0) probe.backend = NULL;
}

static PyMethodDef probe_methods[] = {
    {"start", (PyCFunction)(void (*)(void))probe_start, METH_VARARGS | METH_KEYWORDS,
     "start(ring_path, events_path, backend='auto', capacity=1048576, drain_period_us=20000, sample_period_us=100, clock='auto', wait_when_full=False, codes_path=None, segment_bytes=0, segment_ms=0)"},
    {"stop", probe_stop, METH_NOARGS, "Stop recording; returns the final status."},
    {"status", probe_status, METH_NOARGS, "Backend, counters and what the backend can miss."},
    {"backends", probe_backends, METH_NOARGS, "Backend name -> what it can miss."},
    {"_insn_length", probe_insn_length, METH_O, "Test hook: length of a movable prologue instruction."},
    {"_find_function", probe_find_function, METH_O, "Test hook: copies of a function in .symtab."},
    {"_hooks_only", probe_hooks_only, METH_O, "Benchmark: _hooks_only(0|1|2): precise hooks off, on without a ring, on with clock reads."},
    {"_bench_stamp", probe_bench_stamp, METH_VARARGS, "Benchmark: _bench_stamp(ring_path, count, clock='auto') -> (ns per stamp, ns per clock_gettime, ns per rdtsc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef probe_module = {PyModuleDef_HEAD_INIT, "_probe", "CPython GIL probe (native part).", -1,
                                          probe_methods};

PyMODINIT_FUNC PyInit__probe(void) {
    PyObject *m = PyModule_Create(&probe_module);
    if (m == NULL) return NULL;
    ProbeError = PyErr_NewException("engine.probe._probe.ProbeError", PyExc_RuntimeError, NULL);
    if (ProbeError == NULL || PyModule_AddObjectRef(m, "ProbeError", ProbeError) != 0) goto fail;
#ifdef Py_GIL_DISABLED
    if (PyModule_AddIntConstant(m, "FREE_THREADED", 1) != 0) goto fail;
#else
    if (PyModule_AddIntConstant(m, "FREE_THREADED", 0) != 0) goto fail;
#endif
    static int atfork_registered = 0;
    if (!atfork_registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_registered = 1;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
