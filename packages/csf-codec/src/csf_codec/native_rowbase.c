/* Row bases (rowbase.py's rule, rowbase.row_bases_c; the rule itself: native_rowbase.h). */
#include "native_rowbase.h"

/* Row bases (rowbase.py's rule): for each row of a uint8 [R, C] plane and each width w in widths, the smallest b
in [0, 256 - 2**w] that maximises the row's bytes in [b, b + 2**w - 1], into outs[i] (uint8 [R]), rows [a, b).
A row spanning fewer than 2**w values takes max(0, max - 2**w + 1); the others a sliding window over their
histogram (row_rule_base). */
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
    RowRule *R = malloc(sizeof(RowRule));
    if (!R) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    row_rule_init(R, cols);
    for (int64_t r = ra; r < rb; r++) {
        const uint8_t *row = x + r * cols;
        if (cols == 0) {
            for (int i = 0; i < nw; i++) outs[i][r] = 0;
            continue;
        }
        row_rule_start(R, row);
        for (int i = 0; i < nw; i++) outs[i][r] = (uint8_t)row_rule_base(R, row, 1 << widths[i]);
    }
    Py_END_ALLOW_THREADS;
    free(R);
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 10);
    return ret;
}
