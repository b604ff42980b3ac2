/* Sampling backend: a native thread (never takes the GIL) that reads the GIL's `locked`
 * and `last_holder` fields every PERIOD_US and stamps a change of holder:
 * TANDEM_GIL_SAMPLE_HELD with the holder's thread id, or TANDEM_GIL_SAMPLE_FREE.
 * Works on stripped builds (the struct layout comes from CPython's internal headers at
 * compile time). Misses every hold or release shorter than the period, cannot tell a
 * waiting thread from a released one, and stamps at the sample, not at the hand-over. */
#ifndef TANDEM_SAMPLING_H
#define TANDEM_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

/* Call with the GIL held (it reads the interpreter's state once). */
int tandem_sampling_start(uint32_t period_us, char *err, size_t errlen);
void tandem_sampling_stop(void);
uint64_t tandem_sampling_samples(void);
int tandem_sampling_running(void);
void tandem_sampling_after_fork_child(void);

#endif
