/* Symbol lookup for the GIL probe: find CPython's static functions (take_gil, drop_gil)
 * in the ELF file that is mapped into this process, and GOT slots of exported ones.
 *
 * take_gil/drop_gil are local symbols: they are only in .symtab of the file on disk (the
 * dynamic table the loader uses does not have them), so we read the file ourselves.
 */
#ifndef TANDEM_SYMBOLS_H
#define TANDEM_SYMBOLS_H

#include <stddef.h>
#include <stdint.h>

#define TANDEM_MAX_COPIES 4   /* a function plus its compiler clones (.constprop.N, .isra.N) */

typedef struct {
    uintptr_t address;        /* run-time address (file value + load bias)   */
    uint64_t size;            /* st_size from .symtab                        */
    char name[64];            /* e.g. "take_gil" or "take_gil.constprop.0"   */
} tandem_function;

/* Find every copy of local or global function BASE_NAME (exact name, or BASE_NAME followed by
 * ".constprop.N"/".isra.N"; ".cold"/".part" fragments are not entry points) in the object
 * mapped at the address ANCHOR (any address inside libpython, or the executable for a
 * static build). Each copy's first 16 bytes are compared with the file to make sure the
 * file read is the one mapped. Returns the number found (0 when the file has no .symtab,
 * i.e. it is stripped), or -1 with a reason in err. */
int tandem_find_functions(const void *anchor, const char *base_name, tandem_function *out, int max_out,
                          char *err, size_t errlen);

/* Path of the object that contains ANCHOR ("/proc/self/exe" resolved for the executable). */
int tandem_object_path(const void *anchor, char *path, size_t pathlen);

/* Callback for every GOT slot (R_X86_64_JUMP_SLOT or R_X86_64_GLOB_DAT) bound to symbol NAME,
 * in every loaded object. SLOT is the address of the pointer; IN_RELRO says whether the page
 * is made read-only after relocation (then it must be made writable to patch it). */
typedef void (*tandem_got_visitor)(void **slot, int in_relro, const char *object, void *ctx);
int tandem_for_each_got_slot(const char *name, tandem_got_visitor visit, void *ctx);

#endif
