/* csf_codec._native's module: its byte tables, buffer arguments and method table (the loops: native_*.c). */
#include "native_common.h"

static int low_bits_of(int n) {
    /* the Elias-Fano low-part width that makes n positions in [0, 256) shortest (ties: the smaller) */
    int best = 0;
    long best_cost = -1;
    for (int l = 0; l < 8; l++) {
        long cost = (long)n * l + (CHUNK >> l);
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best = l;
        }
    }
    return best;
}

int LOW_BITS[CHUNK + 1];
long LISTED_BITS[CHUNK + 1];
uint64_t UNPACK1[256];
uint32_t UNPACK2[256];
uint16_t UNPACK4[256];

static void init_tables(void) {
    for (int v = 0; v < 256; v++) {
        uint8_t b[8];
        for (int i = 0; i < 8; i++) b[i] = (v >> i) & 1;
        memcpy(&UNPACK1[v], b, 8);
        for (int i = 0; i < 4; i++) b[i] = (v >> (2 * i)) & 3;
        memcpy(&UNPACK2[v], b, 4);
        for (int i = 0; i < 2; i++) b[i] = (v >> (4 * i)) & 15;
        memcpy(&UNPACK4[v], b, 2);
    }
    for (int n = 0; n <= CHUNK; n++) {
        LOW_BITS[n] = low_bits_of(n);
        LISTED_BITS[n] = n ? n + (CHUNK >> LOW_BITS[n]) + (long)n * LOW_BITS[n] + n : 0;
    }
}

void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].b);
}

int get_buf(PyObject *o, Buf *out, int writable, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, &out->b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0) return -1;
    out->held = 1;
    if (out->b.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected, got %zd", what, itemsize, out->b.itemsize);
        return -1;
    }
    return 0;
}

int get_bufs(PyObject *const *o, Buf *bufs, int n, const Py_ssize_t *sizes, const char *const *names,
             unsigned writable) {
    memset(bufs, 0, sizeof(Buf) * n);
    for (int i = 0; i < n; i++)
        if (get_buf(o[i], &bufs[i], (writable >> i) & 1, sizes[i], names[i])) return -1;
    return 0;
}

static PyMethodDef methods[] = {
    {"scan_bases", scan_bases, METH_VARARGS, "scan_bases(codes, escapes, out): compact row bases from their codes"},
    {"row_bases", row_bases, METH_VARARGS, "row_bases(rows, widths, outs, a, b, cols): rowbase.py's rule"},
    {"decode_inline_span", decode_inline_span, METH_VARARGS, "the inline decoder's blocks [a, b): (fault, mode, at)"},
    {"compact_rows", compact_rows, METH_VARARGS, "the compact encoder's row bases, base codes and chunk counts"},
    {"encode_compact_span", encode_compact_span, METH_VARARGS, "the compact encoder's sections of rows [a, b): fault"},
    {"level_counts", level_counts, METH_VARARGS, "the inline encoder's offsets at or below each level, per tile"},
    {"far_counts", far_counts, METH_VARARGS, "far_counts(stream, listed, bit_offsets, out): far flags per chunk"},
    {"decode_compact_span", decode_compact_span, METH_VARARGS, "the compact decoder's rows [a, b): (fault, position)"},
    {"decode_engine_rows", decode_engine_rows, METH_VARARGS, "engine records of a span into rows: (fault, tile)"},
    {"encode_engine_rows", encode_engine_rows, METH_VARARGS, "engine records of a span's rows: bytes written"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "csf's codec loops in C", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "csf_codec._native supports little-endian hosts only");
        return NULL;
    }
    init_tables();
    return PyModule_Create(&module);
}
