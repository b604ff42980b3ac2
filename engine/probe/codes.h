/* The code table: the Python code objects the GIL probe names (layout: docs/ring.md,
 * "Code table"; how a release is attributed: docs/probe.md, "The code of a release").
 *
 * A DROP record's `aux` says which code the thread was running when it gave the GIL up:
 * its low 32 bits are a code id, its high 32 bits the instruction offset (in code units)
 * in that code. Ids below TANDEM_CODE_FIRST_ID say why there is no code. Each code object
 * is interned once, at its first release, into a table file beside the events (a shared
 * mapping: nothing is lost when the process is killed); the hot path only stamps the id.
 */
#ifndef TANDEM_CODES_H
#define TANDEM_CODES_H

#include <stddef.h>
#include <stdint.h>

enum {
    TANDEM_CODE_NOT_RECORDED = 0, /* aux 0: a take, a sampling record, an older recording   */
    TANDEM_CODE_NO_FRAME = 1,     /* the thread had no Python frame (C thread, thread start) */
    TANDEM_CODE_UNKNOWN = 2,      /* not named: table full, or another interpreter's code    */
    TANDEM_CODE_FIRST_ID = 3,     /* table entries from here on                             */
};

/* Create PATH (0600, O_EXCL), map it and make it the table the stamps intern into. The
 * caller holds the GIL and no ring is set (no stamp in flight). Returns 0 or -1 + err. */
int tandem_codes_open(const char *path, char *err, size_t errlen);

/* Drop the table: release the interned code objects and unmap. The caller holds the GIL
 * and the hooks no longer stamp (tandem_hooks_set_ring(NULL) returned). */
void tandem_codes_close(void);

/* Fork child: forget the parent's table without touching the objects or the file. */
void tandem_codes_after_fork_child(void);

/* Entries interned and interns refused (table full) since open. */
uint32_t tandem_codes_count(void);
uint32_t tandem_codes_refused(void);

/* The stamp's slow path (code_capture.h): find the innermost complete Python frame of
 * TSTATE (a PyThreadState holding the GIL), intern its code, refresh the calling thread's
 * one-entry cache for RING_ID, and return the DROP record's aux. */
uint64_t tandem_code_slow(void *tstate, uint64_t ring_id);

#endif
