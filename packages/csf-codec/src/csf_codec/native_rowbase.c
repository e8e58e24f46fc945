/* Row bases (rowbase.py's rule, rowbase.row_bases_c). */
#include "native_common.h"

/* Row bases (rowbase.py's rule): for each row of a uint8 [R, C] plane and each width w in widths, the smallest b
in [0, 256 - 2**w] that maximises the row's bytes in [b, b + 2**w - 1], into outs[i] (uint8 [R]), rows [a, b).
A row spanning fewer than 2**w values takes max(0, max - 2**w + 1); the others a sliding window over their
histogram: on narrow rows every window from the first that reaches the row's minimum, by its cumulative counts
(branch-free), on wide ones only the windows whose top holds a value, by two pointers over the distinct values. */
#define PAD 256   /* le's index of k = 0 */
#define NARROW 64 /* rows of at most this many bytes scan every window; wider ones the windows at their values */

PyObject *row_bases(PyObject *self, PyObject *args) {
    PyObject *o_rows, *o_widths, *o_outs;
    Py_ssize_t ra, rb, cols;
    if (!PyArg_ParseTuple(args, "OOOnnn", &o_rows, &o_widths, &o_outs, &ra, &rb, &cols)) return NULL;
    Py_ssize_t nw = PySequence_Size(o_widths);
    if (nw < 0 || nw > 9 || PySequence_Size(o_outs) != nw) {
        PyErr_SetString(PyExc_ValueError, "row_bases: up to 9 widths, one output each");
        return NULL;
    }
    Buf bufs[10];
    memset(bufs, 0, sizeof bufs);
    int widths[9];
    uint8_t *outs[9];
    PyObject *ret = NULL;
    if (get_buf(o_rows, &bufs[0], 0, 1, "rows")) goto done;
    for (Py_ssize_t i = 0; i < nw; i++) {
        PyObject *wo = PySequence_GetItem(o_widths, i), *oo = PySequence_GetItem(o_outs, i);
        long w = wo ? PyLong_AsLong(wo) : -1;
        int bad = !oo || get_buf(oo, &bufs[1 + i], 1, 1, "out");
        Py_XDECREF(wo);
        Py_XDECREF(oo);
        if (bad) goto done;
        if (w < 0 || w > 8) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "row_bases: widths lie in [0, 8]");
            goto done;
        }
        widths[i] = (int)w;
        outs[i] = bufs[1 + i].b.buf;
        if (bufs[1 + i].b.len < rb) {
            PyErr_SetString(PyExc_ValueError, "row_bases: an output is shorter than the rows");
            goto done;
        }
    }
    if (ra < 0 || rb < ra || cols < 0 || rb * cols > bufs[0].b.len) {
        PyErr_SetString(PyExc_ValueError, "row_bases: rows out of range");
        goto done;
    }
    const uint8_t *x = bufs[0].b.buf;
    Py_BEGIN_ALLOW_THREADS;
    int32_t h[256], le[PAD + 256 + 256 + 1], dc[256];
    uint8_t dv[256];
    memset(h, 0, sizeof h);
    for (int64_t r = ra; r < rb; r++) {
        const uint8_t *row = x + r * cols;
        if (cols == 0) {
            for (int i = 0; i < nw; i++) outs[i][r] = 0;
            continue;
        }
        int mn = 255, mx = 0;
        for (int64_t j = 0; j < cols; j++) {
            int v = row[j];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        /* le[PAD + k]: the row's bytes <= mn + k - 1 (none for k <= 0, all from k = mx - mn + 1 on), filled once a
           row, when needed, for k in [-smax, mx - mn + smax] */
        int filled = 0, nd = -1; /* nd: the wide rows' distinct values, ascending, and their counts */
        for (int i = 0; i < nw; i++) {
            const int span = 1 << widths[i];
            if (mx - mn < span) {
                outs[i][r] = (uint8_t)(mx - span + 1 > 0 ? mx - span + 1 : 0);
                continue;
            }
            int at;
            if (cols > NARROW) {
                if (nd < 0) {
                    for (int64_t j = 0; j < cols; j++) h[row[j]]++;
                    nd = 0;
                    for (int v = mn; v <= mx; v++) { /* branch-free: a row's values are unpredictable */
                        dv[nd] = (uint8_t)v;
                        dc[nd] = h[v];
                        nd += h[v] != 0;
                        h[v] = 0;
                    }
                }
                /* the smallest maximising b is 0 or has a value at its window's top (else b - 1 held as many):
                   b = 0 first, then b = v - span + 1 for each value v >= span - 1, ascending, by two pointers */
                int32_t best = 0, c = 0;
                int left = 0;
                at = 0;
                for (int j = 0; j < nd && dv[j] <= span - 1; j++) best += dc[j];
                for (int j = 0; j < nd; j++) {
                    c += dc[j]; /* c: the counts of dv[left..j] */
                    if (dv[j] < span - 1) continue;
                    const int b = dv[j] - span + 1;
                    while (dv[left] < b) c -= dc[left++];
                    const int better = c > best;
                    best = better ? c : best;
                    at = better ? b : at;
                }
            } else {
                if (!filled) {
                    int smax = 0;
                    for (int q = 0; q < nw; q++) smax = (1 << widths[q]) > smax ? (1 << widths[q]) : smax;
                    for (int64_t j = 0; j < cols; j++) h[row[j]]++;
                    for (int k = -smax; k <= 0; k++) le[PAD + k] = 0;
                    int32_t acc = 0;
                    for (int v = mn; v <= mx; v++) {
                        acc += h[v];
                        le[PAD + v - mn + 1] = acc;
                        h[v] = 0;
                    }
                    for (int k = mx - mn + 2; k <= mx - mn + smax; k++) le[PAD + k] = acc;
                    filled = 1;
                }
                /* every window that can hold a byte, [b, b + span - 1] for b in [max(0, mn - span + 1), min(mx, 256 -
                   span)], in order: the first of the most bytes */
                const int lo = mn - span + 1 > 0 ? mn - span + 1 : 0, hi = mx < 256 - span ? mx : 256 - span;
                const int32_t *top = le + PAD - mn + span, *below = le + PAD - mn;
                int32_t best = -1;
                at = lo;
                for (int b = lo; b <= hi; b++) {
                    const int32_t c = top[b] - below[b];
                    const int better = c > best;
                    best = better ? c : best;
                    at = better ? b : at;
                }
            }
            outs[i][r] = (uint8_t)at;
        }
    }
    Py_END_ALLOW_THREADS;
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 10);
    return ret;
}
