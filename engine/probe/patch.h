/* Inline hooks on x86-64: redirect the first instruction of a function to a replacement and
 * give back a callable "original" (the relocated prologue followed by a jump back).
 *
 * How: the first whole instructions covering >= 5 bytes are decoded (a small length decoder
 * that knows the instructions of function prologues and refuses anything position-dependent:
 * RIP-relative operands, relative branches, calls), copied into a 64-byte block of a
 * trampoline page within +-2 GB of the target (one page serves every patch it reaches),
 * and replaced by a 5-byte `jmp rel32` written as one aligned 8-byte atomic store while the
 * page is RWX (other threads may be executing it).
 */
#ifndef TANDEM_PATCH_H
#define TANDEM_PATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uintptr_t target;          /* patched function                                       */
    uint64_t saved_word;       /* the 8 bytes at target before patching (for uninstall)  */
    size_t stolen;             /* prologue bytes moved into the trampoline               */
    unsigned char *page;       /* its trampoline's page; stays mapped after uninstall     */
    void *original;            /* call this to run the unpatched function                 */
    int installed;
} tandem_patch;

/* Length of the instruction at CODE if it is safe to move elsewhere, else 0 with a reason. */
size_t tandem_movable_insn_length(const unsigned char *code, char *why, size_t whylen);

/* Install: after this, calls to TARGET run REPLACEMENT; p->original runs the old code.
 * Returns 0, or -1 with a one-line reason (nothing changed in that case). */
int tandem_patch_install(tandem_patch *p, void *target, void *replacement, char *err, size_t errlen);

/* Put the original bytes back. The trampoline stays mapped: a thread may still be in it. */
void tandem_patch_uninstall(tandem_patch *p);

#endif
