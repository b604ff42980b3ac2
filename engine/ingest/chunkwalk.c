/* The structural walk of a JFR chunk's events (engine/ingest/jfr_chunks.py; spec:
 * docs/pauses.md, "Damage"): every event's size and type id, from a start offset to the
 * chunk's end, without interpreting events. In C rather than numba so that `tandem pauses`
 * does not load numba (a third of a second) to read one file; the GIL is released while it
 * walks, beside jdk.jfr reading the same file in the JVM. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* Why a walk stopped early: the codes of jfr_chunks._PROBLEMS. */
enum { WALK_OK = 0, WALK_BAD_SIZE = 1, WALK_CUT = 2, WALK_UNDECLARED_TYPE = 3 };

/* JFR's compressed integer at pos (7 bits a byte, the 9th byte whole): the position after
 * it, or -1 when the end cuts it. */
static int64_t read_varint(const uint8_t *b, int64_t pos, int64_t end, int64_t *value)
{
    uint64_t v = 0;
    for (int i = 0; i < 9; i++) {
        if (pos >= end)
            return -1;
        uint64_t byte = b[pos++];
        if (i == 8) {
            v += byte << 56;
            break;
        }
        v += (byte & 0x7F) << (7 * i);
        if (byte < 0x80)
            break;
    }
    *value = (int64_t)v;
    return pos;
}

/* The event header at pos: WALK_OK with its size and type id, else why it is not one. */
static int read_header(const uint8_t *b, int64_t pos, int64_t end, const uint8_t *known, int64_t n_known,
                       int64_t *size, int64_t *type_id)
{
    int64_t after_size, after_type;
    if (pos + 2 <= end && b[pos] < 0x80 && b[pos + 1] < 0x80) { /* most events: one byte each */
        *size = b[pos];
        *type_id = b[pos + 1];
        after_type = pos + 2;
    } else {
        after_size = read_varint(b, pos, end, size);
        if (after_size < 0)
            return WALK_CUT;
        after_type = read_varint(b, after_size, end, type_id);
        if (after_type < 0)
            return WALK_CUT;
    }
    if (*size <= 0 || *size > end - pos || after_type > pos + *size)
        return WALK_BAD_SIZE;
    if (*type_id < 0 || *type_id >= n_known || !known[*type_id])
        return WALK_UNDECLARED_TYPE;
    return WALK_OK;
}

typedef struct {
    int64_t *offsets, *types;
    Py_ssize_t count, capacity;
} Watched;

static int watched_add(Watched *w, int64_t offset, int64_t type_id)
{
    if (w->count == w->capacity) {
        Py_ssize_t capacity = w->capacity ? 2 * w->capacity : 1024;
        int64_t *offsets = realloc(w->offsets, capacity * sizeof(int64_t));
        if (!offsets)
            return -1;
        w->offsets = offsets;
        int64_t *types = realloc(w->types, capacity * sizeof(int64_t));
        if (!types)
            return -1;
        w->types = types;
        w->capacity = capacity;
    }
    w->offsets[w->count] = offset;
    w->types[w->count] = type_id;
    w->count++;
    return 0;
}

/* walk(buffer, start, end, known, watch) -> (offsets, type_ids, reached, code).
 * buffer: the file's bytes; known, watch: one byte per type id (declared; its events'
 * offsets are kept). offsets and type_ids: int64 in native order, as bytes. */
static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer buffer, known, watch;
    long long start, end;
    if (!PyArg_ParseTuple(args, "y*LLy*y*", &buffer, &start, &end, &known, &watch))
        return NULL;
    PyObject *result = NULL;
    if (start < 0 || end > buffer.len || known.len != watch.len) {
        PyErr_SetString(PyExc_ValueError, "walk: range outside the buffer, or known and watch of different lengths");
        goto done;
    }
    const uint8_t *b = buffer.buf, *is_known = known.buf, *is_watched = watch.buf;
    Watched w = {0};
    int64_t pos = start, size, type_id;
    int code = WALK_OK, failed = 0;
    Py_BEGIN_ALLOW_THREADS
    while (pos < end) {
        code = read_header(b, pos, end, is_known, known.len, &size, &type_id);
        if (code != WALK_OK)
            break;
        if (is_watched[type_id] && watched_add(&w, pos, type_id) < 0) {
            failed = 1;
            break;
        }
        pos += size;
    }
    Py_END_ALLOW_THREADS
    if (failed)
        PyErr_NoMemory();
    else
        result = Py_BuildValue("(y#y#Li)", w.count ? (const char *)w.offsets : "", w.count * (Py_ssize_t)sizeof(int64_t),
                               w.count ? (const char *)w.types : "", w.count * (Py_ssize_t)sizeof(int64_t),
                               (long long)pos, code);  /* (y# of NULL is None) */
    free(w.offsets);
    free(w.types);
done:
    PyBuffer_Release(&buffer);
    PyBuffer_Release(&known);
    PyBuffer_Release(&watch);
    return result;
}

/* resync(buffer, stop, end, known, min_events) -> the first offset after stop from which at
 * least min_events whole events chain to end exactly, or -1. A start inside the damage
 * either fails within an event or two or joins the true chain, so this costs little. */
static PyObject *resync(PyObject *self, PyObject *args)
{
    Py_buffer buffer, known;
    long long stop, end, min_events;
    if (!PyArg_ParseTuple(args, "y*LLy*L", &buffer, &stop, &end, &known, &min_events))
        return NULL;
    if (stop < -1 || end > buffer.len) {
        PyBuffer_Release(&buffer);
        PyBuffer_Release(&known);
        PyErr_SetString(PyExc_ValueError, "resync: range outside the buffer");
        return NULL;
    }
    const uint8_t *b = buffer.buf, *is_known = known.buf;
    int64_t found = -1;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t first = stop + 1; first < end && found < 0; first++) {
        int64_t pos = first, events = 0, size, type_id;
        while (pos < end && read_header(b, pos, end, is_known, known.len, &size, &type_id) == WALK_OK) {
            pos += size;
            events++;
        }
        if (pos == end && events >= min_events)
            found = first;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    PyBuffer_Release(&known);
    return PyLong_FromLongLong(found);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Follows event sizes: (offsets, type ids of watched events, reached, problem code)."},
    {"resync", resync, METH_VARARGS, "The first offset after stop from which whole events chain to end, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "engine.ingest._chunkwalk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chunkwalk(void) { return PyModule_Create(&module); }
