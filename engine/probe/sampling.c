/* Sampling backend (see sampling.h). The only file compiled against CPython's internal
 * headers: they give the layout of struct _gil_runtime_state for the version built for. */
#define _GNU_SOURCE
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_gil.h"

#include "sampling.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "hooks.h"
#include "ring.h"

static pthread_t sampler;
static atomic_int sampler_running, sampler_stop;
static atomic_uint_fast64_t samples;
static struct _gil_runtime_state *gil;
static uint32_t period_us;

static int gil_locked(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return __atomic_load_n(&gil->locked, __ATOMIC_RELAXED);
#else
    return __atomic_load_n(&gil->locked._value, __ATOMIC_RELAXED);
#endif
}

static PyThreadState *gil_last_holder(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return __atomic_load_n(&gil->last_holder, __ATOMIC_RELAXED);
#else
    return (PyThreadState *)__atomic_load_n(&gil->last_holder._value, __ATOMIC_RELAXED);
#endif
}

static void *sample_loop(void *arg) {
    (void)arg;
    tandem_private_fd_table(-1); /* needs no file: do not slow the program's fd calls (ring.c) */
    struct timespec period = {period_us / 1000000, (long)(period_us % 1000000) * 1000};
    uint32_t last_seen = UINT32_MAX;  /* 0 = free, else the holder's tid */
    while (!atomic_load(&sampler_stop)) {
        uint32_t now_seen = 0;
        if (gil_locked()) {
            PyThreadState *holder = gil_last_holder();
            /* The holder may exit and free its thread state between the two reads: the
             * memory stays mapped (malloc) so the read is safe but the id may be stale for
             * one sample. */
            now_seen = holder ? (uint32_t)__atomic_load_n(&holder->native_thread_id, __ATOMIC_RELAXED) : 0;
            if (now_seen == 0) now_seen = UINT32_MAX - 1;   /* held by a thread we cannot name */
        }
        if (now_seen != last_seen) {
            if (now_seen == 0) tandem_stamp_for(TANDEM_GIL_SAMPLE_FREE, 0);
            else tandem_stamp_for(TANDEM_GIL_SAMPLE_HELD, now_seen);
            last_seen = now_seen;
        }
        atomic_fetch_add(&samples, 1);
        nanosleep(&period, NULL);
    }
    return NULL;
}

int tandem_sampling_start(uint32_t period, char *err, size_t errlen) {
    if (atomic_load(&sampler_running)) return 0;
#ifdef Py_GIL_DISABLED
    snprintf(err, errlen, "no GIL to watch: this is a free-threaded build");
    return -1;
#else
#if PY_VERSION_HEX >= 0x030C0000
    gil = PyInterpreterState_Get()->ceval.gil;
#else
    gil = &_PyRuntime.ceval.gil;
#endif
    period_us = period ? period : 100;
    atomic_store(&sampler_stop, 0);
    atomic_store(&samples, 0);
    if (pthread_create(&sampler, NULL, sample_loop, NULL) != 0) {
        snprintf(err, errlen, "cannot start the sampling thread");
        return -1;
    }
    atomic_store(&sampler_running, 1);
    return 0;
#endif
}

void tandem_sampling_stop(void) {
    if (!atomic_load(&sampler_running)) return;
    atomic_store(&sampler_stop, 1);
    pthread_join(sampler, NULL);
    atomic_store(&sampler_running, 0);
}

void tandem_sampling_after_fork_child(void) {
    atomic_store(&sampler_running, 0);   /* the thread did not survive the fork */
}

uint64_t tandem_sampling_samples(void) { return atomic_load(&samples); }
int tandem_sampling_running(void) { return atomic_load(&sampler_running); }
