/* Symbol lookup: ELF .symtab of the mapped libpython (local functions) and GOT slots.
 * See symbols.h. Dependency-free on purpose: the probe runs inside any interpreter. */
#define _GNU_SOURCE
#include "symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- which loaded object contains an address --------------------------------------- */

typedef struct {
    uintptr_t anchor;
    int found;
    uintptr_t bias;                 /* dlpi_addr: run-time address = file vaddr + bias */
    char path[4096];
} object_query;

static int find_object_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    object_query *q = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (q->anchor >= start && q->anchor < start + ph->p_memsz) {
            q->found = 1;
            q->bias = info->dlpi_addr;
            const char *name = info->dlpi_name;
            if (name == NULL || name[0] == '\0') {
                /* The executable itself (static libpython). */
                ssize_t n = readlink("/proc/self/exe", q->path, sizeof q->path - 1);
                q->path[n > 0 ? n : 0] = '\0';
            } else {
                snprintf(q->path, sizeof q->path, "%s", name);
            }
            return 1;
        }
    }
    return 0;
}

static int locate_object(const void *anchor, object_query *q) {
    memset(q, 0, sizeof *q);
    q->anchor = (uintptr_t)anchor;
    dl_iterate_phdr(find_object_cb, q);
    return q->found && q->path[0] ? 0 : -1;
}

int tandem_object_path(const void *anchor, char *path, size_t pathlen) {
    object_query q;
    if (locate_object(anchor, &q) != 0) return -1;
    snprintf(path, pathlen, "%s", q.path);
    return 0;
}

/* ---- .symtab of the file on disk --------------------------------------------------- */

/* "take_gil" matches "take_gil", "take_gil.constprop.0", "take_gil.isra.0"; not ".cold" or
 * ".part.N", which are outlined fragments, not entry points. */
static int is_copy_of(const char *sym, const char *base) {
    size_t n = strlen(base);
    if (strncmp(sym, base, n) != 0) return 0;
    const char *rest = sym + n;
    if (*rest == '\0') return 1;
    if (strstr(rest, ".cold") || strstr(rest, ".part")) return 0;
    return strncmp(rest, ".constprop.", 11) == 0 || strncmp(rest, ".isra.", 6) == 0;
}

/* File offset of virtual address VADDR, from the program headers (for the byte check). */
static int file_offset_of(const ElfW(Ehdr) *eh, size_t file_size, uint64_t vaddr, uint64_t *off) {
    if (eh->e_phoff == 0 || eh->e_phoff + (uint64_t)eh->e_phnum * sizeof(ElfW(Phdr)) > file_size) return -1;
    const ElfW(Phdr) *ph = (const void *)((const char *)eh + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr && vaddr < ph[i].p_vaddr + ph[i].p_filesz) {
            *off = vaddr - ph[i].p_vaddr + ph[i].p_offset;
            return 0;
        }
    }
    return -1;
}

int tandem_find_functions(const void *anchor, const char *base_name, tandem_function *out, int max_out,
                          char *err, size_t errlen) {
    object_query q;
    if (locate_object(anchor, &q) != 0) {
        snprintf(err, errlen, "cannot tell which loaded object holds the interpreter");
        return -1;
    }
    int fd = open(q.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s to read its symbols", q.path);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(ElfW(Ehdr))) {
        close(fd);
        snprintf(err, errlen, "%s is too small to be an ELF file", q.path);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    const unsigned char *file = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s", q.path);
        return -1;
    }
    int found = 0;
    const ElfW(Ehdr) *eh = (const void *)file;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) ||
        eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(ElfW(Shdr)) > size) {
        snprintf(err, errlen, "%s is not a 64-bit ELF file we can read", q.path);
        found = -1;
        goto done;
    }
    const ElfW(Shdr) *sh = (const void *)(file + eh->e_shoff);
    for (int s = 0; s < eh->e_shnum && found >= 0; s++) {
        if (sh[s].sh_type != SHT_SYMTAB) continue;      /* stripped files have none: 0 found */
        if (sh[s].sh_link >= eh->e_shnum) continue;
        const ElfW(Shdr) *strsec = &sh[sh[s].sh_link];
        if (sh[s].sh_offset + sh[s].sh_size > size || strsec->sh_offset + strsec->sh_size > size) continue;
        const ElfW(Sym) *syms = (const void *)(file + sh[s].sh_offset);
        size_t nsyms = sh[s].sh_size / sizeof(ElfW(Sym));
        const char *strtab = (const char *)file + strsec->sh_offset;
        for (size_t i = 0; i < nsyms; i++) {
            if (ELF64_ST_TYPE(syms[i].st_info) != STT_FUNC || syms[i].st_value == 0) continue;
            if (syms[i].st_name >= strsec->sh_size) continue;
            const char *name = strtab + syms[i].st_name;
            if (memchr(name, '\0', strsec->sh_size - syms[i].st_name) == NULL) continue;
            if (!is_copy_of(name, base_name)) continue;
            if (found >= max_out) break;
            uintptr_t address = q.bias + syms[i].st_value;
            /* The file must be the one mapped: compare the function's first bytes. */
            uint64_t off;
            if (file_offset_of(eh, size, syms[i].st_value, &off) != 0 || off + 16 > size ||
                memcmp(file + off, (const void *)address, 16) != 0) {
                snprintf(err, errlen, "%s on disk does not match the mapped copy (%s differs)", q.path, name);
                found = -1;
                break;
            }
            out[found].address = address;
            out[found].size = syms[i].st_size;
            snprintf(out[found].name, sizeof out[found].name, "%s", name);
            found++;
        }
    }
done:
    munmap((void *)file, size);
    return found;
}

/* ---- GOT slots of an exported function, in every loaded object --------------------- */

typedef struct {
    const char *name;
    tandem_got_visitor visit;
    void *ctx;
    int count;
} got_query;

/* glibc rewrites some d_ptr values of the in-memory dynamic section to run-time addresses,
 * others (and other loaders) keep file addresses: accept both. */
static uintptr_t dyn_address(uintptr_t d_ptr, uintptr_t bias) {
    return d_ptr < bias ? d_ptr + bias : d_ptr;
}

static void visit_relocs(const ElfW(Rela) *rel, size_t count, const ElfW(Sym) *symtab, const char *strtab,
                         uintptr_t bias, uintptr_t relro_start, uintptr_t relro_end, const char *object,
                         got_query *q) {
    for (size_t i = 0; i < count; i++) {
        unsigned type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
        const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(rel[i].r_info)];
        if (strcmp(strtab + sym->st_name, q->name) != 0) continue;
        uintptr_t slot = bias + rel[i].r_offset;
        q->visit((void **)slot, slot >= relro_start && slot < relro_end, object, q->ctx);
        q->count++;
    }
}

static int got_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    got_query *q = data;
    const char *object = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "(executable)";
    if (strstr(object, "linux-vdso") || strstr(object, "linux-gate")) return 0;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro_start = 0, relro_end = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const void *)(info->dlpi_addr + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro_start = info->dlpi_addr + ph->p_vaddr;
            relro_end = relro_start + ph->p_memsz;
        }
    }
    if (dyn == NULL) return 0;
    uintptr_t bias = info->dlpi_addr;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmprel_size = 0, rela_size = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const void *)dyn_address(d->d_un.d_ptr, bias); break;
        case DT_STRTAB: strtab = (const void *)dyn_address(d->d_un.d_ptr, bias); break;
        case DT_JMPREL: jmprel = (const void *)dyn_address(d->d_un.d_ptr, bias); break;
        case DT_PLTRELSZ: jmprel_size = d->d_un.d_val; break;
        case DT_RELA: rela = (const void *)dyn_address(d->d_un.d_ptr, bias); break;
        case DT_RELASZ: rela_size = d->d_un.d_val; break;
        default: break;
        }
    }
    if (symtab == NULL || strtab == NULL) return 0;
    if (jmprel) visit_relocs(jmprel, jmprel_size / sizeof(ElfW(Rela)), symtab, strtab, bias, relro_start, relro_end, object, q);
    if (rela) visit_relocs(rela, rela_size / sizeof(ElfW(Rela)), symtab, strtab, bias, relro_start, relro_end, object, q);
    return 0;
}

int tandem_for_each_got_slot(const char *name, tandem_got_visitor visit, void *ctx) {
    got_query q = {name, visit, ctx, 0};
    dl_iterate_phdr(got_cb, &q);
    return q.count;
}
