/* Engine records' loops (engine_records_decode_c.py). */
#include "native_common.h"

/* ------------------------------------------------------------------------------------ engine records' decoder */

/* Fault ranks of decode_engine_span, in the order engine_records_decode_np.decode_records checks them (its
whole-array passes report the first check any tile fails: the least rank over tiles). */
#define EF_UNITS 1    /* a record header's length disagrees with its offsets byte */
#define EF_RESERVED 2 /* reserved bits */
#define EF_MODE(m, k) (3 + 16 * (m) + (k)) /* per selector width, k = 0..12 in the numpy order */
#define EF_RAW(k) (51 + (k))               /* raw records, k = 0..3 */
#define EF_CHOICE 60
#define EF_BOUNDS 61 /* a record longer than its staged row, or a table index numpy would refuse: the wrapper
                        takes the numpy path, whatever it decides */

static inline int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t units_of(int64_t used) { return -floordiv(-used, 16); }

/* decode_engine_span(vals, rec, units, base, valid, windows, thresholds, at, count, cols, base_width) -> (fault,
tile): engine_records_decode_np.decode_records for one column class of a span, a tile at a time: rec uint8 records,
units int64 [T], base int16 / valid bool [blocks, 128], windows int64 [W, 2] (width, origin),
thresholds int32 (engine_records_np.thresholds), at int64 [T] each record's first byte in rec (staged rows, or the
body itself); vals uint8 [T, 128 cols] gets the tiles (slot order). Each tile's
C(k) (its positions at offset <= k from the row base, padding at 0) is counted as numpy counts it, and the window
choice checked from it (window_units, pick_windows). */
PyObject *decode_engine_span(PyObject *self, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t count, cols, base_width;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &count,
                          &cols, &base_width))
        return NULL;
    static const Py_ssize_t sizes[8] = {1, 1, 8, 2, 1, 8, 4, 8};
    static const char *names[8] = {"vals", "rec", "units", "base", "valid", "windows", "thresholds", "at"};
    Buf bufs[8];
    memset(bufs, 0, sizeof bufs);
    PyObject *ret = NULL;
    for (int i = 0; i < 8; i++)
        if (get_buf(o[i], &bufs[i], i == 0, sizes[i], names[i])) goto done;
    const int64_t size = 128 * (int64_t)cols;
    uint8_t *vals = bufs[0].b.buf;
    const uint8_t *rec = bufs[1].b.buf, *valid = bufs[4].b.buf;
    const int64_t *rec_at = bufs[7].b.buf, rec_len = bufs[1].b.len;
    const int64_t *units = bufs[2].b.buf, *win = bufs[5].b.buf;
    const int16_t *base = bufs[3].b.buf;
    const int32_t *ks = bufs[6].b.buf;
    const int64_t T = N_OF(bufs[2]), nw = N_OF(bufs[5]) / 2, nk = N_OF(bufs[6]);
    const int64_t blocks = N_OF(bufs[3]) / 128;
    if (cols < 1 || cols > 4 || count < 1 || base_width < 0 || base_width > 8 || nw < 1 || nw > 64 || nk < 1 ||
        nk > 250 || N_OF(bufs[3]) != blocks * 128 || bufs[4].b.len != blocks * 128 || T != blocks * count ||
        N_OF(bufs[0]) != T * size || N_OF(bufs[7]) != T || N_OF(bufs[5]) != 2 * nw) {
        PyErr_SetString(PyExc_ValueError, "decode_engine_span: inconsistent arguments");
        goto done;
    }
    for (int64_t j = 0; j < nw; j++) {
        int64_t w = win[2 * j], org = win[2 * j + 1];
        if ((w != 1 && w != 2 && w != 4) || org < -128 || org > 127) {
            PyErr_SetString(PyExc_ValueError, "decode_engine_span: a window is not (1|2|4, int8)");
            goto done;
        }
    }
    int fault = 0;
    int64_t where = -1;
    int nomem = 0, bad_rows = 0;
    Py_BEGIN_ALLOW_THREADS;
    /* lut[v + 256]: how many thresholds lie below v (numpy's searchsorted over [-256, 256)); the windows' rows */
    int32_t lut[512];
    for (int v = 0; v < 512; v++) {
        int32_t c = 0;
        while (c < nk && ks[c] < v - 256) c++;
        lut[v] = c;
    }
    int rows[64][4], pad_out[64];
    for (int64_t j = 0; j < nw; j++) {
        const int64_t w = win[2 * j], lo = win[2 * j + 1], hi = lo + (1 << w) - 1;
        const int64_t want[4] = {lo - 1, hi, lo - 5, hi + 3};
        for (int q = 0; q < 4; q++) {
            rows[j][q] = -1;
            for (int64_t i = 0; i < nk; i++)
                if (ks[i] == want[q]) rows[j][q] = (int)i;
        }
        pad_out[j] = !(lo <= 0 && 0 <= hi);
    }
    for (int64_t j = 0; j < nw; j++)
        for (int q = 0; q < 4; q++) bad_rows |= rows[j][q] < 0;
    const int64_t raw_u = units_of(4 + size);
    const int span = 1 << base_width;
    int64_t *bmin = malloc(sizeof(int64_t) * (blocks ? blocks : 1)), *bmax = malloc(sizeof(int64_t) * (blocks ? blocks : 1));
    int64_t *npad = malloc(sizeof(int64_t) * (blocks ? blocks : 1));
    uint8_t *fld = malloc(size);
    if (!bmin || !bmax || !npad || !fld || bad_rows) {
        nomem = 1;
        goto engine_out;
    }
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = 1 << 20, hi = -(1 << 20), nv = 0;
        for (int s = 0; s < 128; s++)
            if (valid[b * 128 + s]) {
                int64_t v = base[b * 128 + s];
                lo = v < lo ? v : lo, hi = v > hi ? v : hi, nv++;
            }
        bmin[b] = lo, bmax[b] = hi, npad[b] = size - nv * cols;
    }
    int fail_rank = 1 << 30;
    for (int64_t t = 0; t < T; t++)
        if (units[t] < 1 || rec_at[t] < 0 || rec_at[t] > rec_len - units[t] * 16)
            fail_rank = EF_BOUNDS; /* never staged so: numpy decides */
    for (int64_t t = 0; t < T && fail_rank != EF_BOUNDS; t++) {
        const uint8_t *r = rec + rec_at[t];
        const int64_t blk = t / count, u = units[t];
        const uint8_t *vb = valid + blk * 128;
        const int16_t *bb = base + blk * 128;
        const int padded = npad[blk] != 0;
        uint8_t *v = vals + t * size;
        uint32_t h;
        memcpy(&h, r, 4);
        int rank = 0;
        int32_t hist[256];
        memset(hist, 0, sizeof(int32_t) * (nk + 1));
        const int mode = h & 3;
        int64_t chosen = -1;
#define FAIL(x)         \
    {                   \
        rank = (x);     \
        goto tile_done; \
    }
        if (((h >> 2) & 0x3F) != u) FAIL(EF_UNITS);
        if (h >> 25) FAIL(EF_RESERVED);
        if (mode != 3) {
            const int w = 1 << mode, top = (1 << w) - 1;
            const int org = (int8_t)((h >> 8) & 0xFF);
            const int64_t n = (h >> 16) & 0x1FF;
            for (int64_t j = 0; j < nw; j++)
                if (win[2 * j] == w && (win[2 * j + 1] & 0xFF) == (org & 0xFF)) chosen = j;
            if (chosen < 0) FAIL(EF_MODE(mode, 0));
            if (bmin[blk] + org < 0 || bmax[blk] + org + top > 255) FAIL(EF_MODE(mode, 1));
            const int64_t sb = 16 * cols * w, ee = 4 + sb + (3 * n + 1) / 2;
            if (ee > u * 16) FAIL(EF_MODE(mode, 2));
            const uint8_t *sel = r + 4;
            if (w == 1)
                for (int64_t i = 0; i < sb; i++) memcpy(fld + 8 * i, &UNPACK1[sel[i]], 8);
            else if (w == 2)
                for (int64_t i = 0; i < sb; i++) memcpy(fld + 4 * i, &UNPACK2[sel[i]], 4);
            else
                for (int64_t i = 0; i < sb; i++) memcpy(fld + 2 * i, &UNPACK4[sel[i]], 2);
            if (padded)
                for (int s = 0; s < 128; s++)
                    if (!vb[s])
                        for (int c = 0; c < cols; c++)
                            if (fld[s * cols + c]) FAIL(EF_MODE(mode, 3));
            if ((n & 1) && (r[ee - 1] >> 4)) FAIL(EF_MODE(mode, 4));
            int32_t pos[512], code[512];
            const uint8_t *ent = r + 4 + sb;
            for (int64_t i = 0; i < n; i++) {
                const int64_t at = (i * 3) >> 1;
                const int word = ent[at] | (ent[at + 1] << 8);
                const int e = (word >> ((i & 1) << 2)) & 0xFFF;
                pos[i] = e & 0x1FF, code[i] = e >> 9;
            }
            for (int64_t i = 0; i < n; i++)
                if (pos[i] >= size) FAIL(EF_MODE(mode, 5));
            for (int64_t i = 1; i < n; i++)
                if (pos[i] <= pos[i - 1]) FAIL(EF_MODE(mode, 6));
            int64_t nesc = 0;
            for (int64_t i = 0; i < n; i++) {
                if (fld[pos[i]] || (padded && !vb[pos[i] / cols])) FAIL(EF_MODE(mode, 7));
                nesc += code[i] == 7;
            }
            const int64_t used = ee + nesc;
            if (units_of(used) != u) FAIL(EF_MODE(mode, 8));
            int32_t value[512], lo_of[512];
            for (int64_t i = 0, er = 0; i < n; i++) {
                const int32_t lo = ((uint8_t)bb[pos[i] / cols] + org) & 0xFF;
                const int c = code[i];
                lo_of[i] = lo;
                value[i] = c == 7 ? r[ee + er++] : c < 4 ? lo - 1 - c : lo + (1 << w) + (c - 4);
            }
            for (int64_t i = 0; i < n; i++)
                if (code[i] == 7 && value[i] >= lo_of[i] && value[i] <= lo_of[i] + top) FAIL(EF_MODE(mode, 9));
            for (int64_t i = 0; i < n; i++)
                if (code[i] == 7 && value[i] >= lo_of[i] - 4 && value[i] <= lo_of[i] + top + 3) FAIL(EF_MODE(mode, 10));
            for (int64_t i = 0; i < n; i++)
                if (value[i] < 0 || value[i] > 255) FAIL(EF_MODE(mode, 11));
            for (int64_t i = used; i < u * 16; i++)
                if (r[i]) FAIL(EF_MODE(mode, 12));
            /* values and C(k): fields by a histogram (exceptions and padding hold field 0), exceptions listed */
            /* the fields' histogram from the packed selectors (popcounts for 1 and 2 bits, four tables for 4), then
            the values: the window's low end plus the field, in bytes */
            int32_t fh[16] = {0};
            if (w == 1) {
                int32_t ones = 0;
                for (int64_t i = 0; i + 8 <= sb; i += 8) {
                    uint64_t x;
                    memcpy(&x, sel + i, 8);
                    ones += popcount64(x);
                }
                fh[1] = ones, fh[0] = (int32_t)size - ones;
            } else if (w == 2) {
                const uint64_t L = 0x5555555555555555ULL;
                int32_t c1 = 0, c2 = 0, c3 = 0;
                for (int64_t i = 0; i + 8 <= sb; i += 8) {
                    uint64_t x;
                    memcpy(&x, sel + i, 8);
                    const uint64_t hi = (x >> 1) & L, lo = x & L;
                    c3 += popcount64(hi & lo), c2 += popcount64(hi & ~lo), c1 += popcount64(lo & ~hi);
                }
                fh[1] = c1, fh[2] = c2, fh[3] = c3, fh[0] = (int32_t)size - c1 - c2 - c3;
            } else {
                int32_t h4[4][16];
                memset(h4, 0, sizeof h4);
                for (int64_t i = 0; i + 2 <= sb; i += 2) {
                    h4[0][sel[i] & 15]++, h4[1][sel[i] >> 4]++;
                    h4[2][sel[i + 1] & 15]++, h4[3][sel[i + 1] >> 4]++;
                }
                for (int f = 0; f < 16; f++) fh[f] = h4[0][f] + h4[1][f] + h4[2][f] + h4[3][f];
            }
            if (cols == 4) {
                for (int s = 0; s < 128; s++) {
                    uint32_t a, b = (uint32_t)(uint8_t)((uint8_t)bb[s] + org) * 0x01010101u;
                    memcpy(&a, fld + 4 * s, 4);
                    const uint32_t sum = ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u);
                    memcpy(v + 4 * s, &sum, 4);
                }
            } else {
                for (int s = 0; s < 128; s++) {
                    const uint8_t add = (uint8_t)((uint8_t)bb[s] + org);
                    for (int c = 0; c < cols; c++) v[s * cols + c] = fld[s * cols + c] + add;
                }
            }
            fh[0] -= (int32_t)(n + npad[blk]);
            for (int f = 0; f <= top; f++) hist[lut[org + f + 256]] += fh[f];
            for (int64_t i = 0; i < n; i++) {
                int idx = value[i] - lo_of[i] + org + 256; /* numpy's index, negative ones wrapping */
                if (idx < 0) idx += 512;
                if (idx >= 512) FAIL(EF_BOUNDS); /* numpy's IndexError; a byte-range window rules it out */
                hist[lut[idx]]++;
                v[pos[i]] = (uint8_t)value[i];
            }
        } else {
            if ((h >> 8) & 0xFFFF) FAIL(EF_RAW(0));
            if (u != raw_u) FAIL(EF_RAW(1));
            for (int64_t i = 4 + size; i < u * 16; i++)
                if (r[i]) FAIL(EF_RAW(2));
            memcpy(v, r + 4, size);
            if (padded)
                for (int s = 0; s < 128; s++)
                    if (!vb[s])
                        for (int c = 0; c < cols; c++)
                            if (v[s * cols + c]) FAIL(EF_RAW(3));
            for (int s = 0; s < 128; s++) {
                const uint8_t bp = (uint8_t)bb[s];
                for (int c = 0; c < cols; c++) {
                    if (!vb[s]) {
                        hist[lut[256]]++; /* padding: offset 0 */
                        continue;
                    }
                    const uint8_t x = v[s * cols + c], e = (uint8_t)(x - bp);
                    const int off = e < span ? e : (int)x - bp;
                    hist[lut[off + 256]]++;
                }
            }
        }
        /* the window choice: window_units and pick_windows of engine_records_np on this tile's C(k) */
        {
            int64_t C[256], acc = 0;
            for (int64_t i = 0; i < nk; i++) acc += hist[i], C[i] = acc;
            const int64_t np_ = npad[blk];
            if (mode != 3)
                for (int64_t i = 0; i < nk; i++) C[i] += ks[i] >= 0 ? np_ : 0;
            int64_t best = -1, best_key = 0;
            for (int64_t j = 0; j < nw; j++) {
                const int64_t w = win[2 * j], lo = win[2 * j + 1], hi = lo + (1 << w) - 1;
                int64_t uu = 1 << 20;
                if (bmin[blk] + lo >= 0 && bmax[blk] + hi <= 255) {
                    const int64_t nn = size - (C[rows[j][1]] - C[rows[j][0]]) - pad_out[j] * np_;
                    const int64_t esc = C[rows[j][2]] + size - C[rows[j][3]];
                    uu = units_of(4 + 16 * cols * w + floordiv(3 * nn + 1, 2) + esc);
                }
                const int64_t key = uu * nw + j;
                if (best < 0 || key < best_key) best = j, best_key = key;
            }
            const int64_t bu = best_key / nw;
            const int raw = bu >= raw_u;
            if (mode != 3 ? (raw || best != chosen || bu != u) : !raw) FAIL(EF_CHOICE);
        }
    tile_done:
#undef FAIL
        if (rank == EF_BOUNDS) {
            fail_rank = rank, where = t;
            break;
        }
        if (rank && rank < fail_rank) {
            fail_rank = rank, where = t;
            if (rank == EF_UNITS) break; /* the least rank */
        }
    }
    fault = fail_rank == (1 << 30) ? 0 : fail_rank;
engine_out:
    free(bmin), free(bmax), free(npad), free(fld);
    Py_END_ALLOW_THREADS;
    if (nomem) {
        PyErr_SetString(bad_rows ? PyExc_ValueError : PyExc_MemoryError,
                        bad_rows ? "decode_engine_span: a window's threshold is missing" : "decode_engine_span");
        goto done;
    }
    ret = Py_BuildValue("(iL)", fault, (long long)where);
done:
    release(bufs, 8);
    return ret;
}
