/* The compact encoder's row pass (compact_np._width_stats_np, the reference): every width's row bases, base codes
and per-chunk exception counts in one pass over the rows. */
#include "native_rowbase.h"

#define SAME_CODE 0
#define UP_CODE 1
#define DOWN_CODE 2
#define ESCAPE_BASE 3
#define SEGMENT_ROWS 128

/* the row's scales [j0, j1) outside its window [base - reach, base + top + reach] (the byte range clips it without
changing the test), at reach 0, K + 1 and K + 8 (compact_np._chunk_counts' rule) */
static inline void count_outside(const uint8_t *row, int64_t j0, int64_t j1, int base, int width, int64_t *out) {
    const int top = (1 << width) - 1, k1 = (1 << (width - 1)) - 1 + 1, k8 = k1 + ESCAPE_CODE;
    const uint32_t lo0 = (uint32_t)base, lo1 = lo0 - k1, lo8 = lo0 - k8;
    const uint32_t w0 = top, w1 = top + 2 * k1, w8 = top + 2 * k8;
    int32_t s0 = 0, s1 = 0, s8 = 0;
    for (int64_t q = j0; q < j1; q++) {
        const uint32_t v = row[q];
        s0 += v - lo0 > w0, s1 += v - lo1 > w1, s8 += v - lo8 > w8;
    }
    out[0] += s0, out[1] += s1, out[2] += s8;
}

/* compact_rows(rows, cols, widths, a, b, bases, codes, counts): rows [a, b) of a uint8 [R, cols] plane (a a
multiple of 256), for each width w in widths (1, 2 or 4): the row bases into bases[i] (uint8 [nw, R]); the base
codes into codes[i] (uint8 [nw, R]: 0 the row above's base, 1 one more, 2 one less, 3 escaped, as every 128-row
segment's first row); and per 256-scale chunk of the span's scales into counts[i] (uint16 [nw, 3, chunks]) the scales
outside the base's window widened by 0, K + 1 and K + 8 (exceptions, far ones, escaped ones). A row's counts come from
its cumulative counts (native_rowbase.h); only the part of a row before a chunk edge is counted byte by byte. */
PyObject *compact_rows(PyObject *self, PyObject *args) {
    PyObject *o[5];
    Py_ssize_t cols, ra, rb;
    if (!PyArg_ParseTuple(args, "OnOnnOOO", &o[0], &cols, &o[1], &ra, &rb, &o[2], &o[3], &o[4])) return NULL;
    static const Py_ssize_t sizes[5] = {1, 8, 1, 1, 2};
    static const char *const names[5] = {"rows", "widths", "bases", "codes", "counts"};
    Buf bufs[5];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 5, sizes, names, 1u << 2 | 1u << 3 | 1u << 4)) goto done;
    const uint8_t *x = bufs[0].b.buf;
    const int64_t *widths = bufs[1].b.buf, nw = N_OF(bufs[1]);
    uint8_t *bases = bufs[2].b.buf, *codes = bufs[3].b.buf;
    uint16_t *counts = bufs[4].b.buf; /* at most 256 a chunk */
    const int64_t n_rows = nw ? bufs[2].b.len / nw : 0, chunks = ((rb - ra) * cols + CHUNK - 1) / CHUNK;
    int bad = nw < 1 || nw > 3 || cols < 0 || ra < 0 || rb < ra || ra % 256 || rb > n_rows ||
              bufs[2].b.len != nw * n_rows || bufs[3].b.len != nw * n_rows || rb * cols > bufs[0].b.len ||
              N_OF(bufs[4]) != nw * 3 * chunks;
    for (int64_t i = 0; i < nw; i++) bad |= widths[i] != 1 && widths[i] != 2 && widths[i] != 4;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "compact_rows: inconsistent arguments");
        goto done;
    }
    RowRule *R = malloc(sizeof(RowRule));
    if (!R) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    row_rule_init(R, cols);
    memset(counts, 0, sizeof(uint16_t) * nw * 3 * chunks);
    int span[3], K[3], prev[3] = {0, 0, 0}; /* prev: each width's base of the row above */
    for (int64_t i = 0; i < nw; i++) span[i] = 1 << widths[i], K[i] = (1 << (widths[i] - 1)) - 1;
    static const uint8_t code_of_step[3] = {DOWN_CODE, SAME_CODE, UP_CODE}; /* by the base's step + 1 */
    for (int64_t r = ra; r < rb; r++) {
        const uint8_t *row = x + r * cols;
        const int64_t i0 = (r - ra) * cols, k0 = i0 / CHUNK, k1 = (i0 + cols - 1) / CHUNK;
        int mn = 0, mx = 0;
        if (cols) row_rule_start(R, row), mn = R->mn, mx = R->mx;
        const int first = r % SEGMENT_ROWS == 0; /* a segment's first row escapes */
        for (int64_t i = 0; i < nw; i++) {
            int b;
            int64_t out[3] = {0, 0, 0}; /* the row's scales outside at each reach */
            if (mx - mn < span[i]) {
                b = mx - span[i] + 1 > 0 ? mx - span[i] + 1 : 0; /* one window holds the row: no exceptions */
            } else {
                b = row_rule_base(R, row, span[i]);
                out[0] = row_rule_outside(R, b, span[i], 0);
                out[1] = row_rule_outside(R, b, span[i], K[i] + 1);
                out[2] = row_rule_outside(R, b, span[i], K[i] + 1 + ESCAPE_CODE);
            }
            const unsigned step = first ? 3 : (unsigned)(b - prev[i] + 1);
            bases[i * n_rows + r] = (uint8_t)b, codes[i * n_rows + r] = step < 3 ? code_of_step[step] : ESCAPE_BASE;
            prev[i] = b;
            if (!(out[0] | out[1] | out[2])) continue;
            uint16_t *n = counts + i * 3 * chunks;
            for (int64_t k = k0; k < k1; k++) { /* the row's part in each chunk but its last, byte by byte */
                int64_t part[3] = {0, 0, 0};
                const int64_t j0 = k == k0 ? 0 : k * CHUNK - i0, j1 = (k + 1) * CHUNK - i0;
                count_outside(row, j0, j1, b, (int)widths[i], part);
                for (int q = 0; q < 3; q++) n[q * chunks + k] += (uint16_t)part[q], out[q] -= part[q];
            }
            for (int q = 0; q < 3; q++) n[q * chunks + k1] += (uint16_t)out[q]; /* the rest: its last chunk */
        }
    }
    Py_END_ALLOW_THREADS;
    free(R);
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 5);
    return ret;
}
