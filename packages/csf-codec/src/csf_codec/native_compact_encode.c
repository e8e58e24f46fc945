/* The compact encoder's loop: exceptions, far ones and escaped ones per chunk (compact_np._chunk_counts, the
reference). */
#include "native_common.h"

/* chunk_counts(rows, bases, cols, width, a, b, n, far, esc): for rows [a, b) of a uint8 [R, cols] plane (bases
uint8 [R] for width w), per chunk of 256 span-flat scales (a * cols a multiple of 256; the last chunk may be
short), into n, far, esc (int64 [chunks]): the scales more than 0, K + 1 and K + 8 below or above their row's
window [base, base + 2**w - 1] (K = 2**(w - 1) - 1), clipped to the byte range as the numpy code clips it. */
PyObject *chunk_counts(PyObject *self, PyObject *args) {
    PyObject *o[5];
    Py_ssize_t cols, ra, rb;
    int width;
    if (!PyArg_ParseTuple(args, "OOninnOOO", &o[0], &o[1], &cols, &width, &ra, &rb, &o[2], &o[3], &o[4]))
        return NULL;
    static const Py_ssize_t sizes[5] = {1, 1, 8, 8, 8};
    static const char *const names[5] = {"rows", "bases", "n", "far", "esc"};
    Buf bufs[5];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 5, sizes, names, 1u << 2 | 1u << 3 | 1u << 4)) goto done;
    const uint8_t *x = bufs[0].b.buf, *bases = bufs[1].b.buf;
    int64_t *n = bufs[2].b.buf, *far = bufs[3].b.buf, *esc = bufs[4].b.buf;
    const int64_t scales = (rb - ra) * cols, chunks = (scales + CHUNK - 1) / CHUNK;
    if (width < 1 || width > 8 || cols < 0 || ra < 0 || rb < ra || rb > bufs[1].b.len || rb * cols > bufs[0].b.len ||
        N_OF(bufs[2]) != chunks || N_OF(bufs[3]) != chunks || N_OF(bufs[4]) != chunks) {
        PyErr_SetString(PyExc_ValueError, "chunk_counts: inconsistent arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    memset(n, 0, sizeof(int64_t) * chunks), memset(far, 0, sizeof(int64_t) * chunks);
    memset(esc, 0, sizeof(int64_t) * chunks);
    const int top = (1 << width) - 1, k1 = (1 << (width - 1)) - 1 + 1, k8 = k1 + ESCAPE_CODE;
    int64_t i = 0; /* span-flat index of the row's first scale */
    for (int64_t r = ra; r < rb; r++, i += cols) {
        const uint8_t *row = x + r * cols;
        /* outside [base - reach, base + top + reach] (the byte range clips it without changing the test) */
        const uint32_t lo0 = bases[r], lo1 = lo0 - k1, lo8 = lo0 - k8;
        const uint32_t w0 = top, w1 = top + 2 * k1, w8 = top + 2 * k8;
        for (int64_t j = 0; j < cols;) { /* the row's part in one chunk at a time */
            const int64_t c = (i + j) / CHUNK, end = (c + 1) * CHUNK - i < cols ? (c + 1) * CHUNK - i : cols;
            int32_t s0 = 0, s1 = 0, s8 = 0;
            for (int64_t q = j; q < end; q++) {
                const uint32_t v = row[q];
                s0 += v - lo0 > w0, s1 += v - lo1 > w1, s8 += v - lo8 > w8;
            }
            n[c] += s0, far[c] += s1, esc[c] += s8;
            j = end;
        }
    }
    Py_END_ALLOW_THREADS;
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 5);
    return ret;
}
