/* Stamp clock selection and (tsc, CLOCK_MONOTONIC) pairs (see tsc.h). */
#define _GNU_SOURCE
#include "tsc.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if TANDEM_HAVE_TSC
/* rdtsc ordered after every earlier instruction (lfence: loads done, hence the seq words
 * the drain checked) and before later ones. */
static inline uint64_t ordered_rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((uint64_t)hi << 32) | lo;
}
#else
static inline uint64_t ordered_rdtsc(void) { return 0; }
#endif

void tandem_tsc_pair_take(tandem_tsc_pair *pair) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t before = ordered_rdtsc();
        uint64_t mono = tandem_monotonic_ns();
        uint64_t after = ordered_rdtsc();
        if (after - before < best) {
            best = after - before;
            pair->tsc = before + (after - before) / 2;
            pair->mono_ns = mono;
            pair->width = best;
        }
    }
}

static int read_small_file(const char *path, char *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t used = 0;
    while (used + 1 < len) {
        ssize_t n = read(fd, buf + used, len - 1 - used);
        if (n <= 0) break;
        used += (size_t)n;
    }
    close(fd);
    buf[used] = 0;
    return (int)used;
}

/* Whether the first "flags" line of /proc/cpuinfo holds FLAG as a whole word. */
static int cpu_flag(const char *cpuinfo, const char *flag) {
    const char *line = strstr(cpuinfo, "\nflags");
    if (!line) return 0;
    const char *end = strchr(line + 1, '\n');
    size_t n = strlen(flag);
    for (const char *p = strstr(line, flag); p && (!end || p < end); p = strstr(p + 1, flag)) {
        if ((p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\n' || p[n] == 0)) return 1;
    }
    return 0;
}

int tandem_tsc_usable(char *why, size_t whylen) {
#if !TANDEM_HAVE_TSC
    snprintf(why, whylen, "no TSC on this architecture");
    return 0;
#else
    static char cpuinfo[1 << 16];
    if (read_small_file("/proc/cpuinfo", cpuinfo, sizeof cpuinfo) <= 0) {
        snprintf(why, whylen, "cannot read /proc/cpuinfo");
        return 0;
    }
    if (!cpu_flag(cpuinfo, "constant_tsc") || !cpu_flag(cpuinfo, "nonstop_tsc")) {
        snprintf(why, whylen, "the TSC is not invariant (constant_tsc and nonstop_tsc missing in /proc/cpuinfo)");
        return 0;
    }
    char source[64];
    if (read_small_file("/sys/devices/system/clocksource/clocksource0/current_clocksource", source, sizeof source) <= 0) {
        snprintf(why, whylen, "cannot read the kernel's current clocksource");
        return 0;
    }
    source[strcspn(source, "\n")] = 0;
    if (strcmp(source, "tsc") != 0) {
        snprintf(why, whylen, "the kernel's clocksource is %s, not tsc", source);
        return 0;
    }
    return 1;
#endif
}

int tandem_clock_choose(const char *requested, char *reason, size_t reasonlen) {
    reason[0] = 0;
    const char *name = requested && *requested ? requested : "auto";
    if (strcmp(name, "auto") == 0) {
        const char *env = getenv("TANDEM_PROBE_CLOCK");
        name = env && *env ? env : "auto";
    }
    if (strcmp(name, "clock_gettime") == 0) {
        snprintf(reason, reasonlen, "clock_gettime requested");
        return 0;
    }
    if (strcmp(name, "auto") != 0 && strcmp(name, "tsc") != 0) {
        snprintf(reason, reasonlen, "unknown clock %.40s (auto, tsc or clock_gettime)", name);
        return -1;
    }
    return tandem_tsc_usable(reason, reasonlen);
}
