/* The code table (see codes.h; file layout: docs/ring.md, "Code table").
 *
 * Identity: every interned code object is kept alive (a strong reference, taken while its
 * thread holds the GIL) until the table is closed, so its address cannot be reused by
 * another code object while the table maps that address to its id. Only the main
 * interpreter's code objects are interned: one of a sub-interpreter could not be released
 * safely at close (that interpreter's GIL is not held then, or it is gone).
 *
 * Interning runs on the stamping thread, which holds its GIL but has no current thread
 * state (drop_gil runs after the interpreter cleared it): so nothing here allocates Python
 * objects or calls API that needs a current thread state. Strings are copied from the
 * unicode objects' own buffers.
 */
#include "code_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CODES_MAGIC "TNDMCODE"
#define CODES_VERSION 1u
#define CODES_HEADER_SIZE 64u
#define CODES_FILE_SIZE (16u << 20)   /* sparse: only what is written takes disk */
#define CODES_MAX 16384u              /* code objects per table (the map has twice the slots) */
#define MAP_SLOTS (2 * CODES_MAX)

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t capacity;                /* file size, bytes */
    _Atomic uint64_t used;            /* bytes of committed entries after the header */
    _Atomic uint32_t entries;
    uint32_t python_hex;              /* PY_VERSION_HEX of the interpreter (line table format) */
    unsigned char reserved[24];
} codes_header;
_Static_assert(sizeof(codes_header) == CODES_HEADER_SIZE, "code table header is 64 bytes");

typedef struct {
    uint32_t size;                    /* this entry, padding included (a multiple of 8) */
    uint32_t id;
    int32_t firstlineno;
    uint32_t qualname_len, filename_len, linetable_len;
} codes_entry;

typedef struct {
    PyCodeObject *code;               /* NULL: free */
    uint32_t id;
} map_slot;

static struct {
    codes_header *header;             /* NULL: no table */
    size_t size;
    map_slot *map;
    uint32_t next_id;
    atomic_int lock;                  /* interning threads may hold different GILs (sub-interpreters) */
    atomic_uint refused;
    PyInterpreterState *main_interp;
} table;

static void table_lock(void) {
    while (atomic_exchange_explicit(&table.lock, 1, memory_order_acquire)) sched_yield();
}

static void table_unlock(void) {
    atomic_store_explicit(&table.lock, 0, memory_order_release);
}

int tandem_codes_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create the code table %s: %s", path, strerror(errno));
        return -1;
    }
    if (ftruncate(fd, CODES_FILE_SIZE) != 0) {
        snprintf(err, errlen, "cannot size the code table %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    void *mem = mmap(NULL, CODES_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    /* A fault reads in its own page only, not a read-ahead window of zeroed pages (~3 ms
     * at the first store, into the start of every interpreter; ring.c does the same). */
    if (mem != MAP_FAILED) madvise(mem, CODES_FILE_SIZE, MADV_RANDOM);
    map_slot *map = calloc(MAP_SLOTS, sizeof *map);
    if (mem == MAP_FAILED || map == NULL) {
        snprintf(err, errlen, "cannot map the code table %s", path);
        if (mem != MAP_FAILED) munmap(mem, CODES_FILE_SIZE);
        free(map);
        return -1;
    }
    codes_header *h = mem;
    memcpy(h->magic, CODES_MAGIC, 8);
    h->version = CODES_VERSION;
    h->header_size = CODES_HEADER_SIZE;
    h->capacity = CODES_FILE_SIZE;
    h->python_hex = PY_VERSION_HEX;
    table.map = map;
    table.size = CODES_FILE_SIZE;
    table.next_id = TANDEM_CODE_FIRST_ID;
    atomic_store(&table.refused, 0);
    table.main_interp = PyInterpreterState_Main();
    __atomic_store_n(&table.header, h, __ATOMIC_RELEASE);
    return 0;
}

void tandem_codes_close(void) {
    codes_header *h = table.header;
    if (h == NULL) return;
    table_lock();
    table.header = NULL;
    table_unlock();
    for (uint32_t i = 0; i < MAP_SLOTS; i++) Py_XDECREF(table.map[i].code);
    free(table.map);
    table.map = NULL;
    munmap(h, table.size);
}

void tandem_codes_after_fork_child(void) {
    atomic_store(&table.lock, 0);
    table.header = NULL;   /* the parent's file (a shared mapping): never written from here */
    table.map = NULL;      /* its references stay taken: the child's copies are leaked */
}

uint32_t tandem_codes_count(void) {
    codes_header *h = table.header;
    return h ? atomic_load(&h->entries) : 0;
}

uint32_t tandem_codes_refused(void) { return atomic_load(&table.refused); }

/* UTF-8 of a str object, from its own buffer (no allocation, no thread state needed);
 * lone surrogates are encoded as they are. Returns the bytes written (at most CAP). */
static size_t utf8_of(PyObject *text, char *out, size_t cap) {
    if (text == NULL || !PyUnicode_Check(text)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    size_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        char buf[4];
        size_t len;
        if (ch < 0x80) buf[0] = (char)ch, len = 1;
        else if (ch < 0x800) buf[0] = (char)(0xC0 | ch >> 6), buf[1] = (char)(0x80 | (ch & 0x3F)), len = 2;
        else if (ch < 0x10000)
            buf[0] = (char)(0xE0 | ch >> 12), buf[1] = (char)(0x80 | (ch >> 6 & 0x3F)), buf[2] = (char)(0x80 | (ch & 0x3F)), len = 3;
        else
            buf[0] = (char)(0xF0 | ch >> 18), buf[1] = (char)(0x80 | (ch >> 12 & 0x3F)), buf[2] = (char)(0x80 | (ch >> 6 & 0x3F)),
            buf[3] = (char)(0x80 | (ch & 0x3F)), len = 4;
        if (w + len > cap) break;
        memcpy(out + w, buf, len);
        w += len;
    }
    return w;
}

static uint32_t map_index(const void *code) {
    uint64_t x = (uint64_t)(uintptr_t)code >> 4;
    return (uint32_t)((x * 0x9E3779B97F4A7C15ull) >> 40) & (MAP_SLOTS - 1);
}

#define NAME_MAX_BYTES 4096

/* Append CODE's entry to the file; its id, or TANDEM_CODE_UNKNOWN when full. Lock held. */
static uint32_t append_entry(codes_header *h, PyCodeObject *code) {
    char qualname[NAME_MAX_BYTES], filename[NAME_MAX_BYTES];
    size_t qlen = utf8_of(code->co_qualname, qualname, sizeof qualname);
    size_t flen = utf8_of(code->co_filename, filename, sizeof filename);
    PyObject *lines = code->co_linetable;
    size_t llen = lines && PyBytes_Check(lines) ? (size_t)PyBytes_GET_SIZE(lines) : 0;
    size_t size = (sizeof(codes_entry) + qlen + flen + llen + 7) & ~(size_t)7;
    uint64_t used = atomic_load_explicit(&h->used, memory_order_relaxed);
    if (table.next_id - TANDEM_CODE_FIRST_ID >= CODES_MAX || CODES_HEADER_SIZE + used + size > table.size) return TANDEM_CODE_UNKNOWN;
    char *at = (char *)h + CODES_HEADER_SIZE + used;
    codes_entry e = {(uint32_t)size, table.next_id, code->co_firstlineno, (uint32_t)qlen, (uint32_t)flen, (uint32_t)llen};
    memcpy(at, &e, sizeof e);
    memcpy(at + sizeof e, qualname, qlen);
    memcpy(at + sizeof e + qlen, filename, flen);
    if (llen) memcpy(at + sizeof e + qlen + flen, PyBytes_AS_STRING(lines), llen);
    /* release: a reader that sees `used` sees the entry */
    atomic_store_explicit(&h->used, used + size, memory_order_release);
    atomic_fetch_add_explicit(&h->entries, 1, memory_order_release);
    return table.next_id++;
}

/* CODE's id, interning it at its first sight; lock held. */
static uint32_t intern_code(codes_header *h, PyCodeObject *code) {
    uint32_t i = map_index(code);
    for (;; i = (i + 1) & (MAP_SLOTS - 1)) {
        if (table.map[i].code == code) return table.map[i].id;
        if (table.map[i].code == NULL) break;
    }
    uint32_t id = append_entry(h, code);
    if (id == TANDEM_CODE_UNKNOWN) {
        atomic_fetch_add(&table.refused, 1);
        return id;
    }
    Py_INCREF(code);                  /* identity: this address names this code until close */
    table.map[i] = (map_slot){code, id};
    return id;
}

uint64_t tandem_code_slow(void *thread_state, uint64_t ring_id) {
    PyThreadState *tstate = thread_state;
    _PyInterpreterFrame *frame = tandem_innermost_frame(tstate);
    int innermost = 1;
    while (frame != NULL && (TANDEM_FRAME_IS_SHIM(frame) || _PyFrame_IsIncomplete(frame))) {
        frame = frame->previous;
        innermost = 0;
    }
    if (frame == NULL) return TANDEM_CODE_NO_FRAME;
    PyCodeObject *code = tandem_frame_code(frame);
    if (!PyCode_Check((PyObject *)code) || tstate->interp != table.main_interp) return TANDEM_CODE_UNKNOWN;
    uint32_t id = TANDEM_CODE_UNKNOWN;
    table_lock();
    codes_header *h = table.header;
    if (h != NULL) id = intern_code(h, code);
    table_unlock();
    if (id == TANDEM_CODE_UNKNOWN) return id;
    if (innermost) {
        lane_cache *c = &tandem_my_lane;
        c->code_key = code;
        c->code_min_instr = _PyCode_CODE(code) + code->_co_firsttraceable;
        c->code_id = id;
        c->code_ring = ring_id;
    }
    return id | (uint64_t)(uint32_t)(tandem_frame_instr(frame) - _PyCode_CODE(code)) << 32;
}
