/* Inline hooks on x86-64 (see patch.h). */
#define _GNU_SOURCE
#include "patch.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096u
#define JMP_REL32_LEN 5
#define JMP_ABS_LEN 14          /* jmp *0(%rip) ; .quad destination */

/* ---- length decoder -----------------------------------------------------------------
 * Covers what compilers put at the start of functions (push/pop, mov/lea/arith with a
 * ModRM operand, sub/add rsp imm, xor, test, endbr64, nops, mov reg imm). Unknown opcodes
 * are refused: refusing only costs a fallback to another backend, guessing costs a crash. */

/* Length of ModRM + SIB + displacement starting at M; sets *rip_relative. */
static size_t modrm_length(const unsigned char *m, int *rip_relative) {
    unsigned mod = m[0] >> 6, rm = m[0] & 7;
    size_t len = 1;
    if (mod == 3) return len;
    if (rm == 4) {                       /* SIB byte follows */
        unsigned base = m[1] & 7;
        len++;
        if (mod == 0 && base == 5) len += 4;
    } else if (mod == 0 && rm == 5) {    /* disp32(%rip) */
        *rip_relative = 1;
        return len + 4;
    }
    if (mod == 1) len += 1;
    if (mod == 2) len += 4;
    return len;
}

size_t tandem_movable_insn_length(const unsigned char *code, char *why, size_t whylen) {
    const unsigned char *p = code;
    int operand16 = 0, rex_w = 0, rip = 0;
    /* legacy prefixes, then at most one REX */
    while (*p == 0x66 || *p == 0xF2 || *p == 0xF3 || *p == 0x2E || *p == 0x3E) {
        if (*p == 0x66) operand16 = 1;
        p++;
    }
    if ((*p & 0xF0) == 0x40) {
        rex_w = (*p & 0x08) != 0;
        p++;
    }
    unsigned char op = *p++;
    size_t imm = 0;
    int has_modrm = 0;
    if (op >= 0x50 && op <= 0x5F) {                         /* push/pop reg */
    } else if (op == 0x90) {                                /* nop */
    } else if ((op <= 0x3F && (op & 7) <= 3)) {             /* add/or/adc/sbb/and/sub/xor/cmp r/m */
        has_modrm = 1;
    } else if (op <= 0x3F && (op & 7) == 4) {               /* op al, imm8 */
        imm = 1;
    } else if (op <= 0x3F && (op & 7) == 5) {               /* op eax, imm32 */
        imm = operand16 ? 2 : 4;
    } else if (op == 0x80 || op == 0x83 || op == 0xC0 || op == 0xC1 || op == 0xC6) {
        has_modrm = 1; imm = 1;                             /* group 1/2 imm8, mov r/m8 imm8 */
    } else if (op == 0x81 || op == 0xC7 || op == 0x69) {
        has_modrm = 1; imm = operand16 ? 2 : 4;
    } else if (op == 0x6B) {
        has_modrm = 1; imm = 1;
    } else if (op == 0x84 || op == 0x85 || op == 0x86 || op == 0x87 || (op >= 0x88 && op <= 0x8B) ||
               op == 0x8D || op == 0x63 || op == 0xD1 || op == 0xD3) {
        has_modrm = 1;                                      /* test, xchg, mov, lea, movsxd, shifts */
    } else if (op >= 0xB8 && op <= 0xBF) {                  /* mov reg, imm32/imm64 */
        imm = rex_w ? 8 : (operand16 ? 2 : 4);
    } else if (op >= 0xB0 && op <= 0xB7) {
        imm = 1;
    } else if (op == 0x0F) {
        unsigned char op2 = *p++;
        if (op2 == 0x1E && p[0] == 0xFA && code[0] == 0xF3) { /* endbr64 */
            p++;
        } else if (op2 == 0x1F || (op2 >= 0x40 && op2 <= 0x4F) || op2 == 0xAF || op2 == 0xB6 ||
                   op2 == 0xB7 || op2 == 0xBE || op2 == 0xBF || op2 == 0x10 || op2 == 0x11 ||
                   op2 == 0x28 || op2 == 0x29 || op2 == 0x57 || op2 == 0xEF || op2 == 0x6F ||
                   op2 == 0x7F || op2 == 0xD6) {
            has_modrm = 1;                                  /* nopl, cmov, imul, movzx/sx, SSE moves */
        } else {
            snprintf(why, whylen, "two-byte opcode 0f %02x is not known to the decoder", op2);
            return 0;
        }
    } else {
        if (op == 0xE8 || op == 0xE9 || op == 0xEB || (op >= 0x70 && op <= 0x7F) || op == 0xC3 || op == 0xFF)
            snprintf(why, whylen, "branch or call (opcode %02x) in the prologue", op);
        else
            snprintf(why, whylen, "opcode %02x is not known to the decoder", op);
        return 0;
    }
    if (has_modrm) p += modrm_length(p, &rip);
    if (rip) {
        snprintf(why, whylen, "RIP-relative operand (opcode %02x) in the prologue", op);
        return 0;
    }
    p += imm;
    return (size_t)(p - code);
}

/* ---- trampoline memory within +-2 GB of the target ---------------------------------- */

static unsigned char *map_near(uintptr_t target) {
    const uintptr_t step = 1u << 20, limit = (uintptr_t)1 << 31;
    uintptr_t base = target & ~(uintptr_t)(PAGE - 1);
    for (uintptr_t dist = step; dist < limit - step; dist += step) {
        for (int sign = -1; sign <= 1; sign += 2) {
            uintptr_t hint = sign < 0 ? base - dist : base + dist;
            if (sign < 0 && base < dist) continue;
            void *m = mmap((void *)hint, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (m == MAP_FAILED) continue;
            if ((uintptr_t)m != hint) {         /* old kernel ignored the flag: placed elsewhere */
                munmap(m, PAGE);
                continue;
            }
            return m;
        }
    }
    return NULL;
}

/* A trampoline block (TRAMPOLINE_BLOCK bytes) within +-2 GB of TARGET. Blocks are carved
 * from one page while it reaches: the hooks of drop_gil and take_gil (and their clones)
 * then share one page of code, one TLB entry per GIL hand-over instead of one per
 * function. Blocks are never reused, since a thread may still be inside one after an
 * uninstall (64 bytes per patched function per start: a page per 64). Install and
 * uninstall run one at a time (engine.probe's start and stop). */
#define TRAMPOLINE_BLOCK 64u
static unsigned char *block_page;
static unsigned block_used;

static int reaches(uintptr_t from, uintptr_t to) {
    intptr_t d = (intptr_t)to - (intptr_t)from, margin = 2 * (intptr_t)PAGE;
    return d > INT32_MIN + margin && d < INT32_MAX - margin;
}

static unsigned char *trampoline_block(uintptr_t target) {
    if (block_page == NULL || block_used + TRAMPOLINE_BLOCK > PAGE || !reaches(target, (uintptr_t)block_page)) {
        unsigned char *page = map_near(target);
        if (page == NULL) return NULL;
        block_page = page;
        block_used = 0;
    }
    unsigned char *block = block_page + block_used;
    block_used += TRAMPOLINE_BLOCK;
    return block;
}

/* A jump from AT to DESTINATION: `jmp rel32` when within +-2 GB (a direct jump, cheaper
 * than an indirect one on the hot path), else `jmp *0(%rip); .quad destination`. Writes at
 * most JMP_ABS_LEN bytes. */
static void write_jump(unsigned char *at, uintptr_t destination) {
    intptr_t rel = (intptr_t)destination - (intptr_t)(at + JMP_REL32_LEN);
    if (rel >= INT32_MIN && rel <= INT32_MAX) {
        int32_t rel32 = (int32_t)rel;
        at[0] = 0xE9;
        memcpy(at + 1, &rel32, 4);
        return;
    }
    at[0] = 0xFF; at[1] = 0x25;             /* jmp *0(%rip) */
    memset(at + 2, 0, 4);
    memcpy(at + 6, &destination, 8);
}

/* Make other cores drop any stale decoded copy of the patched bytes (Linux >= 4.16);
 * harmless to skip where unavailable: the store itself is atomic. */
static void sync_other_cores(void) {
    static int registered = 0;
    if (!registered) {
        registered = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0 ? 1 : -1;
    }
    if (registered == 1) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
}

static int store_word(uintptr_t at, uint64_t word) {
    uintptr_t page = at & ~(uintptr_t)(PAGE - 1);
    size_t len = (at + 8 > page + PAGE) ? 2 * PAGE : PAGE;
    /* RWX, not RW: other threads may be executing this very page while we write. */
    if (mprotect((void *)page, len, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return -1;
    __atomic_store_n((uint64_t *)at, word, __ATOMIC_SEQ_CST);
    mprotect((void *)page, len, PROT_READ | PROT_EXEC);
    sync_other_cores();
    return 0;
}

int tandem_patch_install(tandem_patch *p, void *target_ptr, void *replacement, char *err, size_t errlen) {
    /* P is not cleared first: a hook that was entered before an earlier uninstall may still
     * be about to read p->original; it must see the old trampoline or the new one, never 0. */
    uintptr_t target = (uintptr_t)target_ptr;
    if (target & 7) {
        /* The 5-byte jump must sit inside one aligned 8-byte word to be written atomically. */
        if ((target & 7) > 3) {
            snprintf(err, errlen, "function at %#lx is not aligned for an atomic patch", (unsigned long)target);
            return -1;
        }
    }
    const unsigned char *code = target_ptr;
    size_t stolen = 0;
    char why[128];
    while (stolen < JMP_REL32_LEN) {
        size_t n = tandem_movable_insn_length(code + stolen, why, sizeof why);
        if (n == 0) {
            snprintf(err, errlen, "cannot relocate prologue at +%zu: %s", stolen, why);
            return -1;
        }
        stolen += n;
    }
    unsigned char *block = trampoline_block(target);
    if (block == NULL) {
        snprintf(err, errlen, "no free page within 2 GB of %#lx for the trampoline", (unsigned long)target);
        return -1;
    }
    /* block layout: [0, 14) relay: jump to the replacement (which may be far away);
     *               [16, 16 + 33) original: stolen prologue (< 5 + 15 bytes) + jump back. */
    unsigned char *page = (unsigned char *)((uintptr_t)block & ~(uintptr_t)(PAGE - 1));
    unsigned char *relay = block, *original = block + 16;
    /* RWX while written: other threads may be running an earlier block of this page. */
    if (mprotect(page, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
        snprintf(err, errlen, "mprotect of the trampoline failed: %s", strerror(errno));
        return -1;
    }
    write_jump(relay, (uintptr_t)replacement);
    memcpy(original, code, stolen);
    write_jump(original + stolen, target + stolen);
    if (mprotect(page, PAGE, PROT_READ | PROT_EXEC) != 0) {
        snprintf(err, errlen, "mprotect of the trampoline failed: %s", strerror(errno));
        return -1;
    }
    uintptr_t word_at = target & ~(uintptr_t)7;
    unsigned offset = (unsigned)(target - word_at);
    uint64_t old_word;
    memcpy(&old_word, (void *)word_at, 8);
    unsigned char new_bytes[8];
    memcpy(new_bytes, &old_word, 8);
    int32_t rel = (int32_t)((intptr_t)relay - (intptr_t)(target + JMP_REL32_LEN));
    new_bytes[offset] = 0xE9;
    memcpy(new_bytes + offset + 1, &rel, 4);
    uint64_t new_word;
    memcpy(&new_word, new_bytes, 8);
    p->target = target;
    p->saved_word = old_word;
    p->stolen = stolen;
    p->page = page;
    __atomic_store_n(&p->original, (void *)original, __ATOMIC_RELEASE);
    if (store_word(word_at, new_word) != 0) {
        snprintf(err, errlen, "cannot make the code page writable: %s", strerror(errno));
        return -1;
    }
    p->installed = 1;
    return 0;
}

void tandem_patch_uninstall(tandem_patch *p) {
    if (!p->installed) return;
    store_word(p->target & ~(uintptr_t)7, p->saved_word);
    p->installed = 0;
}
