/* The stamp clock of the GIL probe: CLOCK_MONOTONIC through the vDSO, or the raw TSC
 * converted to CLOCK_MONOTONIC nanoseconds off the hot path (docs/probe.md, "Time source";
 * the ring side of the conversion: docs/ring.md, "TSC time").
 *
 * TSC mode is used only where the TSC is invariant (constant_tsc and nonstop_tsc in
 * /proc/cpuinfo) and the kernel's clocksource is tsc: then CLOCK_MONOTONIC is itself the
 * TSC scaled by the kernel (plus NTP slewing), so a linear map between (tsc, mono) pairs
 * taken every drain pass reproduces it. x86-64 only (aarch64 would read CNTVCT_EL0).
 */
#ifndef TANDEM_TSC_H
#define TANDEM_TSC_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__)
#define TANDEM_HAVE_TSC 1
/* Hot path: a plain rdtsc (not ordered against other instructions; the drain thread's
 * pairs are, see tandem_tsc_pair). */
static inline uint64_t tandem_rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
#else
#define TANDEM_HAVE_TSC 0
static inline uint64_t tandem_rdtsc(void) { return 0; }
#endif

static inline uint64_t tandem_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A (tsc, CLOCK_MONOTONIC ns) pair read together: clock_gettime between two ordered TSC
 * reads, the tightest bracket of a few tries kept; tsc is the bracket's midpoint and
 * width its length in ticks. */
typedef struct {
    uint64_t tsc;
    uint64_t mono_ns;
    uint64_t width;
} tandem_tsc_pair;
void tandem_tsc_pair_take(tandem_tsc_pair *pair);

/* Whether this machine's TSC may stand in for CLOCK_MONOTONIC: 1, or 0 with the reason. */
int tandem_tsc_usable(char *why, size_t whylen);

/* Decide the stamp clock. REQUESTED: "auto" (or NULL/""): the environment variable
 * TANDEM_PROBE_CLOCK if set, else tsc where usable; "tsc": tsc where usable; "clock_gettime".
 * Returns 1 for tsc, 0 for clock_gettime (REASON says why not tsc), -1 for an unknown name. */
int tandem_clock_choose(const char *requested, char *reason, size_t reasonlen);

#endif
