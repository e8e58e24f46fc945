/* Engine records' decoder (engine_records_decode_c.py): a tile at a time, every check of the numpy reference. */
#include "native_engine.h"

/* ------------------------------------------------------------------------------------ engine records' decoder */

/* Fault ranks of a tile (decode_tile), in the order engine_records_decode_np.decode_records checks them (its
whole-array passes report the first check any tile fails: the least rank over tiles). */
#define EF_UNITS 1    /* a record header's length disagrees with its offsets byte */
#define EF_RESERVED 2 /* reserved bits */
#define EF_MODE(m, k) (3 + 16 * (m) + (k)) /* per selector width, k = 0..12 in the numpy order */
#define EF_RAW(k) (51 + (k))               /* raw records, k = 0..3 */
#define EF_CHOICE 60
#define EF_BOUNDS 61 /* a record length below one unit, or a table index numpy would refuse: the wrapper takes
                        the numpy path, whatever it decides */
/* One record (r, u units) of a tile of cols columns into v (uint8 [128 cols], slot order), every check of
engine_records_decode_np.decode_records and the canonical choice from the tile's C(k); vb, bb: its block's valid
flags and row bases; bmin, bmax, npad: block_limits. Returns 0, or the least fault rank the tile fails (fld: a
scratch of 128 cols bytes). */
static int decode_tile(const Windows *E, const uint8_t *r, int64_t u, const uint8_t *vb, const int16_t *bb,
                       int64_t bmin, int64_t bmax, int64_t npad, int64_t cols, int span, uint8_t *v, uint8_t *fld) {
    const int64_t size = 128 * cols, raw_u = units_of(4 + size);
    const int padded = npad != 0;
    uint32_t h;
    memcpy(&h, r, 4);
    int32_t hist[256];
    memset(hist, 0, sizeof(int32_t) * (E->nk + 1));
    const int mode = h & 3;
    int64_t chosen = -1;
    if (((h >> 2) & 0x3F) != u) return (EF_UNITS);
    if (h >> 25) return (EF_RESERVED);
    if (mode != 3) {
        const int w = 1 << mode, top = (1 << w) - 1;
        const int org = (int8_t)((h >> 8) & 0xFF);
        const int64_t n = (h >> 16) & 0x1FF;
        for (int64_t j = 0; j < E->nw; j++)
            if (E->win[2 * j] == w && (E->win[2 * j + 1] & 0xFF) == (org & 0xFF)) chosen = j;
        if (chosen < 0) return (EF_MODE(mode, 0));
        if (bmin + org < 0 || bmax + org + top > 255) return (EF_MODE(mode, 1));
        const int64_t sb = 16 * cols * w, ee = 4 + sb + (3 * n + 1) / 2;
        if (ee > u * 16) return (EF_MODE(mode, 2));
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
                        if (fld[s * cols + c]) return (EF_MODE(mode, 3));
        if ((n & 1) && (r[ee - 1] >> 4)) return (EF_MODE(mode, 4));
        int32_t pos[512], code[512];
        const uint8_t *ent = r + 4 + sb;
        for (int64_t i = 0; i < n; i++) {
            const int64_t at = (i * 3) >> 1;
            const int word = ent[at] | (ent[at + 1] << 8);
            const int e = (word >> ((i & 1) << 2)) & 0xFFF;
            pos[i] = e & 0x1FF, code[i] = e >> 9;
        }
        for (int64_t i = 0; i < n; i++)
            if (pos[i] >= size) return (EF_MODE(mode, 5));
        for (int64_t i = 1; i < n; i++)
            if (pos[i] <= pos[i - 1]) return (EF_MODE(mode, 6));
        int64_t nesc = 0;
        for (int64_t i = 0; i < n; i++) {
            if (fld[pos[i]] || (padded && !vb[pos[i] / cols])) return (EF_MODE(mode, 7));
            nesc += code[i] == 7;
        }
        const int64_t used = ee + nesc;
        if (units_of(used) != u) return (EF_MODE(mode, 8));
        int32_t value[512], lo_of[512];
        for (int64_t i = 0, er = 0; i < n; i++) {
            const int32_t lo = ((uint8_t)bb[pos[i] / cols] + org) & 0xFF;
            const int c = code[i];
            lo_of[i] = lo;
            value[i] = c == 7 ? r[ee + er++] : c < 4 ? lo - 1 - c : lo + (1 << w) + (c - 4);
        }
        for (int64_t i = 0; i < n; i++)
            if (code[i] == 7 && value[i] >= lo_of[i] && value[i] <= lo_of[i] + top) return (EF_MODE(mode, 9));
        for (int64_t i = 0; i < n; i++)
            if (code[i] == 7 && value[i] >= lo_of[i] - 4 && value[i] <= lo_of[i] + top + 3) return (EF_MODE(mode, 10));
        for (int64_t i = 0; i < n; i++)
            if (value[i] < 0 || value[i] > 255) return (EF_MODE(mode, 11));
        for (int64_t i = used; i < u * 16; i++)
            if (r[i]) return (EF_MODE(mode, 12));
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
        fh[0] -= (int32_t)(n + npad);
        for (int f = 0; f <= top; f++) hist[E->lut[org + f + 256]] += fh[f];
        for (int64_t i = 0; i < n; i++) {
            int idx = value[i] - lo_of[i] + org + 256; /* numpy's index, negative ones wrapping */
            if (idx < 0) idx += 512;
            if (idx >= 512) return (EF_BOUNDS); /* numpy's IndexError; a byte-range window rules it out */
            hist[E->lut[idx]]++;
            v[pos[i]] = (uint8_t)value[i];
        }
    } else {
        if ((h >> 8) & 0xFFFF) return (EF_RAW(0));
        if (u != raw_u) return (EF_RAW(1));
        for (int64_t i = 4 + size; i < u * 16; i++)
            if (r[i]) return (EF_RAW(2));
        memcpy(v, r + 4, size);
        if (padded)
            for (int s = 0; s < 128; s++)
                if (!vb[s])
                    for (int c = 0; c < cols; c++)
                        if (v[s * cols + c]) return (EF_RAW(3));
        for (int s = 0; s < 128; s++) {
            const uint8_t bp = (uint8_t)bb[s];
            for (int c = 0; c < cols; c++) {
                if (!vb[s]) {
                    hist[E->lut[256]]++; /* padding: offset 0 */
                    continue;
                }
                const uint8_t x = v[s * cols + c], e = (uint8_t)(x - bp);
                const int off = e < span ? e : (int)x - bp;
                hist[E->lut[off + 256]]++;
            }
        }
    }
    /* the window choice: window_units and pick_windows of engine_records_np on this tile's C(k) */
    int64_t C[256], acc = 0;
    for (int64_t i = 0; i < E->nk; i++) acc += hist[i], C[i] = acc;
    if (mode != 3)
        for (int64_t i = 0; i < E->nk; i++) C[i] += E->ks[i] >= 0 ? npad : 0;
    int64_t bu;
    const int64_t best = pick_window(E, C, cols, npad, bmin, bmax, &bu);
    const int raw = bu >= raw_u;
    if (mode != 3 ? (raw || best != chosen || bu != u) : !raw) return EF_CHOICE;
    return 0;
}

/* decode_engine_rows(out, body, units, base, valid, br, windows, thresholds, cols, base_width, count, proven) ->
(fault, tile): engine_records._decode_engine's span, whole, in one call: every column class (the full 4-column
tiles, then the tail tile) in turn, each tile as engine_records_decode_np.decode_records decodes it (decode_tile),
reading the records in place from the span's body (uint8: the records of its row blocks, in body order; units
int64 [blocks, col tiles] their lengths / 16), then each decoded tile written to its rows of out (uint8 [plane rows, cols]; br int64 [blocks, 128]: each slot's
plane row, or -1 for padding) as inline_np._scatter writes it. A class that fails a check stops the span before the
next class (fault: the class's least rank, tile: its index in the class). With count set, the row-base proof of
engine_records_decode_np.base_window_counts and rowbase.proven_bases: per slot, the row's decoded scales at its
base, at its window's top and inside it, over every class, and into proven (bool [blocks, 128]) whether those
counts prove the stored base. */
PyObject *decode_engine_rows(PyObject *self, PyObject *args) {
    PyObject *o[9];
    Py_ssize_t cols, base_width;
    int count;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnniO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &cols,
                          &base_width, &count, &o[8]))
        return NULL;
    static const Py_ssize_t sizes[9] = {1, 1, 8, 2, 1, 8, 8, 4, 1};
    static const char *const names[9] = {"out",  "body",    "units",      "base",  "valid",
                                         "br",   "windows", "thresholds", "proven"};
    Buf bufs[9];
    PyObject *ret = NULL;
    EngineSpan S;
    if (get_bufs(o, bufs, 9, sizes, names, 1u << 0 | 1u << 8) ||
        engine_span_args("decode_engine_rows", cols, base_width, &bufs[0], &bufs[5], &bufs[3], &bufs[4], &bufs[2],
                         &bufs[6], &bufs[7], &S))
        goto done;
    uint8_t *out = bufs[0].b.buf, *proven = bufs[8].b.buf;
    const uint8_t *body = bufs[1].b.buf, *valid = bufs[4].b.buf;
    const int64_t *units = bufs[2].b.buf, *br = bufs[5].b.buf;
    const int16_t *base = bufs[3].b.buf;
    const int64_t blocks = S.blocks, full = S.full, tail = S.tail, ct = S.ct;
    int64_t total = 0;
    for (int64_t i = 0; i < blocks * ct; i++) total += units[i] > 0 ? units[i] : 0;
    if (total * 16 > bufs[1].b.len || bufs[8].b.len != blocks * 128) {
        PyErr_SetString(PyExc_ValueError, "decode_engine_rows: inconsistent arguments");
        goto done;
    }
    const Windows E = S.E;
    int fault = 0, nomem = 0;
    int64_t where = -1;
    Py_BEGIN_ALLOW_THREADS;
    const int span = S.span;
    const int64_t nb1 = blocks ? blocks : 1;
    int64_t *bmin = malloc(sizeof(int64_t) * nb1), *bmax = malloc(sizeof(int64_t) * nb1);
    int64_t *npad = malloc(sizeof(int64_t) * nb1), *at = malloc(sizeof(int64_t) * (blocks * ct + 1));
    int32_t *cnt = count ? calloc(3 * nb1 * 128, sizeof(int32_t)) : NULL;
    if (!bmin || !bmax || !npad || !at || (count && !cnt)) {
        nomem = 1;
        goto rows_out;
    }
    at[0] = 0; /* each record's first byte in the body */
    for (int64_t i = 0; i < blocks * ct; i++) at[i + 1] = at[i] + 16 * units[i];
    for (int k = 0; k < 2 && !fault; k++) {
        const int64_t tc = k ? tail : 4, n_t = k ? (tail != 0) : full, c0 = k ? 4 * full : 0;
        if (!n_t) continue;
        uint8_t v[512], fld[512];
        block_limits(base, valid, blocks, tc, bmin, bmax, npad);
        int fail_rank = 1 << 30;
        for (int64_t b = 0; b < blocks; b++)
            for (int64_t j = 0; j < n_t; j++)
                if (units[b * ct + (k ? full : j)] < 1) fail_rank = EF_BOUNDS; /* numpy decides */
        int64_t t = 0;
        for (int64_t b = 0; b < blocks && fail_rank != EF_BOUNDS && fail_rank != EF_UNITS; b++)
            for (int64_t j = 0; j < n_t; j++, t++) {
                const int64_t id = b * ct + (k ? full : j);
                const uint8_t *vb = valid + b * 128;
                const int16_t *bb = base + b * 128;
                const int rank =
                    decode_tile(&E, body + at[id], units[id], vb, bb, bmin[b], bmax[b], npad[b], tc, span, v, fld);
                if (rank == EF_BOUNDS) {
                    fail_rank = rank, where = t;
                    break;
                }
                if (rank) {
                    if (rank < fail_rank) fail_rank = rank, where = t;
                    if (rank == EF_UNITS) break; /* the least rank */
                    continue;
                }
                if (fail_rank != (1 << 30)) continue; /* the class fails: its rows and counts are not used */
                const int64_t *rows = br + b * 128;
                uint8_t *dst = out + c0 + j * tc;
                if (tc == 4) /* a word a row */
                    for (int s = 0; s < 128; s++) {
                        if (rows[s] >= 0) memcpy(dst + rows[s] * cols, v + 4 * s, 4);
                    }
                else
                    for (int s = 0; s < 128; s++)
                        if (rows[s] >= 0)
                            for (int c = 0; c < tc; c++) dst[rows[s] * cols + c] = v[s * tc + c];
                if (count && tc == 4 && span <= 128) {
                    int32_t *c_base = cnt + b * 128, *c_top = c_base + nb1 * 128, *c_in = c_top + nb1 * 128;
                    const uint32_t top = (uint32_t)(span - 1) * ONES32;
                    for (int s = 0; s < 128; s++) {
                        uint32_t x;
                        memcpy(&x, v + 4 * s, 4);
                        const uint32_t e = sub_bytes(x, (uint32_t)(uint8_t)bb[s] * ONES32); /* from the base, mod 256 */
                        c_base[s] += count_flags(lt_bytes(e, 1));
                        c_top[s] += count_flags(lt_bytes(e ^ top, 1));
                        c_in[s] += count_flags(lt_bytes(e, span));
                    }
                } else if (count) {
                    int32_t *c_base = cnt + b * 128, *c_top = c_base + nb1 * 128, *c_in = c_top + nb1 * 128;
                    for (int s = 0; s < 128; s++) {
                        const uint8_t bp = (uint8_t)bb[s];
                        int32_t n0 = 0, n1 = 0, n2 = 0;
                        for (int c = 0; c < tc; c++) {
                            const uint8_t e = (uint8_t)(v[s * tc + c] - bp); /* from the base, mod 256 */
                            n0 += e == 0, n1 += e == span - 1, n2 += e < span;
                        }
                        c_base[s] += n0, c_top[s] += n1, c_in[s] += n2;
                    }
                }
            }
        if (fail_rank != (1 << 30)) fault = fail_rank;
    }
    if (!fault && count)
        for (int64_t i = 0; i < blocks * 128; i++) {
            const int64_t b = base[i], outside = cols - cnt[2 * nb1 * 128 + i];
            int ok = b >= 0 && b <= 256 - span;
            ok &= b == 0 || cnt[nb1 * 128 + i] > outside;
            ok &= b == 256 - span || cnt[i] >= outside;
            proven[i] = (uint8_t)ok;
        }
rows_out:
    free(bmin), free(bmax), free(npad), free(at), free(cnt);
    Py_END_ALLOW_THREADS;
    if (nomem) {
        PyErr_SetString(PyExc_MemoryError, "decode_engine_rows");
        goto done;
    }
    ret = Py_BuildValue("(iL)", fault, (long long)where);
done:
    release(bufs, 9);
    return ret;
}
