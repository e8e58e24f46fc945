/* The inline encoder's loop: each tile's biased offsets at or below each level (inline_np._window_counts' level
counts; inline_np._level_counts_np, the reference). */
#include "native_common.h"

#define LEVEL_BINS 64 /* levels lie below this; larger offsets are counted in the last bin */

/* level_counts(e, size, levels, out): for each tile of size bytes of e (uint8 [T * size]) and each level k of
levels (int64 [L], each below LEVEL_BINS - 1), how many of its bytes are <= k, into out (int64 [L, T]). */
PyObject *level_counts(PyObject *self, PyObject *args) {
    PyObject *o[3];
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OnOO", &o[0], &size, &o[1], &o[2])) return NULL;
    static const Py_ssize_t sizes[3] = {1, 8, 8};
    static const char *const names[3] = {"e", "levels", "out"};
    Buf bufs[3];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 3, sizes, names, 1u << 2)) goto done;
    const uint8_t *e = bufs[0].b.buf;
    const int64_t *levels = bufs[1].b.buf, nl = N_OF(bufs[1]);
    int64_t *out = bufs[2].b.buf;
    const int64_t tiles = size > 0 ? bufs[0].b.len / size : 0;
    int bad = size < 1 || size % 4 || bufs[0].b.len != tiles * size || N_OF(bufs[2]) != nl * tiles;
    for (int64_t i = 0; i < nl; i++) bad |= levels[i] >= LEVEL_BINS - 1;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "level_counts: inconsistent arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (int64_t t = 0; t < tiles; t++) {
        int32_t h[4][LEVEL_BINS]; /* four counters a bin, a byte each in turn */
        memset(h, 0, sizeof h);
        const uint8_t *x = e + t * size;
        for (int64_t i = 0; i < size; i += 4) {
            h[0][x[i] < LEVEL_BINS ? x[i] : LEVEL_BINS - 1]++;
            h[1][x[i + 1] < LEVEL_BINS ? x[i + 1] : LEVEL_BINS - 1]++;
            h[2][x[i + 2] < LEVEL_BINS ? x[i + 2] : LEVEL_BINS - 1]++;
            h[3][x[i + 3] < LEVEL_BINS ? x[i + 3] : LEVEL_BINS - 1]++;
        }
        int64_t le[LEVEL_BINS], acc = 0;
        for (int v = 0; v < LEVEL_BINS; v++) acc += h[0][v] + h[1][v] + h[2][v] + h[3][v], le[v] = acc;
        for (int64_t i = 0; i < nl; i++) out[i * tiles + t] = levels[i] < 0 ? 0 : le[levels[i]];
    }
    Py_END_ALLOW_THREADS;
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 3);
    return ret;
}
