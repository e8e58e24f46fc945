/* Engine records' encoder (engine_records.encode_engine_records' span): a tile at a time, the same bytes as the
numpy passes of engine_records_np (offsets, choose_windows, build_records, join_records), which stay the
reference. */
#include "native_engine.h"

/* One tile's record at rec (zeroed, raw length or more), from its native bytes v (uint8 [128 cols], slot order,
padding 0): C(k) counted from each position's offset (value less the row base; padding at 0), the window of
fewest bytes, then its fields, 12-bit exception entries and escapes, or the raw bytes. Returns the record's
length / 16, or -1 when the fields it wrote disagree with the length the counts gave. */
static int64_t encode_tile(const Windows *E, const uint8_t *v, const uint8_t *vb, const int16_t *bb, int64_t bmin,
                           int64_t bmax, int64_t npad, int64_t cols, int span, uint8_t *rec) {
    const int64_t size = 128 * cols, raw_u = units_of(4 + size);
    int32_t hist[256], dense[4][256]; /* offsets in the base window by their value, four counters apart */
    memset(hist, 0, sizeof(int32_t) * (E->nk + 1));
    for (int k = 0; k < 4; k++) memset(dense[k], 0, sizeof(int32_t) * span);
    int32_t ones = 0, words = 0; /* span 2, four columns: the words whose bytes all lie in the window */
    for (int s = 0; s < 128; s++) {
        const uint8_t bp = (uint8_t)bb[s];
        if (!vb[s]) {
            hist[E->lut[256]] += (int32_t)cols; /* padding: offset 0 */
            continue;
        }
        if (cols == 4 && span <= 128) {
            uint32_t x;
            memcpy(&x, v + 4 * s, 4);
            const uint32_t e = sub_bytes(x, (uint32_t)bp * ONES32);
            if (lt_bytes(e, span) == HIGH32) { /* every byte in the base window: offset e exactly */
                if (span == 2) {
                    ones += (int32_t)((e * ONES32) >> 24), words++; /* bytes of 0 or 1: their sum */
                } else {
                    dense[0][e & 0xFF]++, dense[1][(e >> 8) & 0xFF]++;
                    dense[2][(e >> 16) & 0xFF]++, dense[3][e >> 24]++;
                }
                continue;
            }
        }
        for (int c = 0; c < cols; c++) {
            const uint8_t x = v[s * cols + c], e = (uint8_t)(x - bp);
            if (e < span)
                dense[c & 3][e]++;
            else
                hist[E->lut[(int)x - bp + 256]]++;
        }
    }
    dense[0][1] += ones, dense[0][0] += 4 * words - ones;
    for (int e = 0; e < span; e++) hist[E->lut[e + 256]] += dense[0][e] + dense[1][e] + dense[2][e] + dense[3][e];
    int64_t C[256], acc = 0;
    for (int64_t i = 0; i < E->nk; i++) acc += hist[i], C[i] = acc;
    int64_t u;
    const int64_t best = pick_window(E, C, cols, npad, bmin, bmax, &u);
    if (u >= raw_u) {
        const uint32_t h = (uint32_t)raw_u << 2 | 3;
        memcpy(rec, &h, 4);
        memcpy(rec + 4, v, size);
        return raw_u;
    }
    const int w = (int)E->win[2 * best], o = (int)E->win[2 * best + 1], mode = w == 1 ? 0 : w == 2 ? 1 : 2;
    const int64_t sb = 16 * cols * w;
    uint8_t fld[512];
    int32_t pos[512];
    uint8_t val[512], lo_of[512];
    int64_t n = 0;
    for (int s = 0; s < 128; s++) {
        if (!vb[s]) { /* padding stores field 0 and no exception */
            memset(fld + s * cols, 0, cols);
            continue;
        }
        const uint8_t lo = (uint8_t)((uint8_t)bb[s] + o); /* the window's low end */
        if (cols == 4) {
            uint32_t x;
            memcpy(&x, v + 4 * s, 4);
            const uint32_t f = sub_bytes(x, (uint32_t)lo * ONES32);
            if (lt_bytes(f, 1u << w) == HIGH32) { /* no exception in the row */
                memcpy(fld + 4 * s, &f, 4);
                continue;
            }
        }
        for (int c = 0; c < cols; c++) {
            const int64_t p = s * cols + c;
            const uint8_t x = v[p], f = (uint8_t)(x - lo);
            if (f < (1 << w)) {
                fld[p] = f;
            } else {
                fld[p] = 0;
                pos[n] = (int32_t)p, val[n] = x, lo_of[n] = lo;
                n++;
            }
        }
    }
    pack_fields(fld, size, w, rec + 4);
    uint8_t *ent = rec + 4 + sb;
    const int64_t ee = 4 + sb + (3 * n + 1) / 2;
    if (ee > 16 * u) return -1;
    int64_t nesc = 0;
    for (int64_t i = 0; i < n; i++) {
        const int d = (int)val[i] - (int)lo_of[i], above = d - ((1 << w) - 1);
        const int code = d < 0 ? (-d <= 4 ? -d - 1 : 7) : (above <= 3 ? above + 3 : 7);
        const int e = pos[i] | code << 9;
        const int64_t at = (i * 3) >> 1;
        if (i & 1) {
            ent[at] |= (uint8_t)((e & 0xF) << 4);
            ent[at + 1] = (uint8_t)(e >> 4);
        } else {
            ent[at] = (uint8_t)(e & 0xFF);
            ent[at + 1] = (uint8_t)(e >> 8);
        }
        if (code == 7) {
            if (units_of(ee + nesc + 1) > u) return -1;
            rec[ee + nesc++] = val[i];
        }
    }
    if (units_of(ee + nesc) != u) return -1;
    const uint32_t h = (uint32_t)u << 2 | (uint32_t)mode | (uint32_t)(o & 0xFF) << 8 | (uint32_t)n << 16;
    memcpy(rec, &h, 4);
    return u;
}

/* encode_engine_rows(rows, br, base, valid, windows, thresholds, cols, base_width, units, body) -> bytes written:
the engine records of a span's row blocks. rows uint8 [plane rows, cols]; br int64 [blocks, 128] each slot's plane
row (-1: padding); base int16 / valid bool [blocks, 128] the slots' row bases; windows int64 [W, 2] and thresholds
int32 as engine_records_np has them. Each tile (block by block, column tile by column tile, the tail tile last) is
gathered from the rows, and its record written to body (uint8, at least blocks times every column tile's raw
length; zeroed here) in body order; units (int64 [blocks, col tiles]) gets their lengths / 16. */
PyObject *encode_engine_rows(PyObject *self, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t cols, base_width;
    if (!PyArg_ParseTuple(args, "OOOOOOnnOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &cols, &base_width, &o[6],
                          &o[7]))
        return NULL;
    static const Py_ssize_t sizes[8] = {1, 8, 2, 1, 8, 4, 8, 1};
    static const char *const names[8] = {"rows", "br", "base", "valid", "windows", "thresholds", "units", "body"};
    Buf bufs[8];
    PyObject *ret = NULL;
    EngineSpan S;
    if (get_bufs(o, bufs, 8, sizes, names, 1u << 6 | 1u << 7) ||
        engine_span_args("encode_engine_rows", cols, base_width, &bufs[0], &bufs[1], &bufs[2], &bufs[3], &bufs[6],
                         &bufs[4], &bufs[5], &S))
        goto done;
    const uint8_t *rows = bufs[0].b.buf, *valid = bufs[3].b.buf;
    const int64_t *br = bufs[1].b.buf;
    const int16_t *base = bufs[2].b.buf;
    int64_t *units = bufs[6].b.buf;
    uint8_t *body = bufs[7].b.buf;
    const int64_t blocks = S.blocks, full = S.full, tail = S.tail, ct = S.ct;
    const int64_t need = blocks * 16 * (full * units_of(4 + 512) + (tail ? units_of(4 + 128 * tail) : 0));
    if (bufs[7].b.len < need) {
        PyErr_SetString(PyExc_ValueError, "encode_engine_rows: inconsistent arguments");
        goto done;
    }
    const Windows E = S.E;
    int fault = 0;
    int64_t at = 0;
    Py_BEGIN_ALLOW_THREADS;
    const int span = S.span;
    memset(body, 0, need);
    for (int64_t b = 0; b < blocks && !fault; b++) {
        const uint8_t *vb = valid + b * 128;
        const int16_t *bb = base + b * 128;
        const int64_t *rb = br + b * 128;
        int64_t lo = 1 << 20, hi = -(1 << 20), nv = 0; /* block_limits */
        for (int s = 0; s < 128; s++)
            if (vb[s]) {
                const int64_t x = bb[s];
                lo = x < lo ? x : lo, hi = x > hi ? x : hi, nv++;
            }
        for (int64_t j = 0; j < ct; j++) {
            const int64_t tc = j < full ? 4 : tail, c0 = 4 * j;
            uint8_t v[512];
            if (tc == 4) /* a word a row */
                for (int s = 0; s < 128; s++) {
                    uint32_t x = 0;
                    if (rb[s] >= 0 && vb[s]) memcpy(&x, rows + rb[s] * cols + c0, 4);
                    memcpy(v + 4 * s, &x, 4);
                }
            else
                for (int s = 0; s < 128; s++)
                    for (int c = 0; c < tc; c++) v[s * tc + c] = rb[s] >= 0 && vb[s] ? rows[rb[s] * cols + c0 + c] : 0;
            const int64_t u = encode_tile(&E, v, vb, bb, lo, hi, 128 * tc - nv * tc, tc, span, body + at);
            if (u < 0) {
                fault = 1;
                break;
            }
            units[b * ct + j] = u;
            at += 16 * u;
        }
    }
    Py_END_ALLOW_THREADS;
    if (fault) {
        PyErr_SetString(PyExc_AssertionError, "encode_engine_rows: a record's fields disagree with its counts");
        goto done;
    }
    ret = PyLong_FromLongLong(at);
done:
    release(bufs, 8);
    return ret;
}
