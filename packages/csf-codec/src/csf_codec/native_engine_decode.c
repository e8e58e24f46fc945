/* Engine records' decoder (engine_records_decode_c.py): a tile at a time, every check of the numpy reference. */
#include "native_engine.h"
#include "native_rowbase.h"

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
    const int32_t slot_mul = (65536 + (int32_t)cols - 1) / (int32_t)cols; /* (p * slot_mul) >> 16 = p / cols, p < 512 */
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
            if (fld[pos[i]] || (padded && !vb[(pos[i] * slot_mul) >> 16])) return (EF_MODE(mode, 7));
            nesc += code[i] == 7;
        }
        const int64_t used = ee + nesc;
        if (units_of(used) != u) return (EF_MODE(mode, 8));
        int32_t value[512], lo_of[512];
        for (int64_t i = 0, er = 0; i < n; i++) {
            const int32_t lo = ((uint8_t)bb[(pos[i] * slot_mul) >> 16] + org) & 0xFF;
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
        if (cols == 4) { /* a slot's fields as one word: bytewise adds without carries */
            for (int s = 0; s < 128; s++) {
                uint32_t a, b = (uint32_t)(uint8_t)((uint8_t)bb[s] + org) * 0x01010101u;
                memcpy(&a, fld + 4 * s, 4);
                const uint32_t sum = ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u);
                memcpy(v + 4 * s, &sum, 4);
            }
        } else if (cols == 2) {
            for (int s = 0; s < 128; s++) {
                uint16_t a, b = (uint16_t)((uint8_t)((uint8_t)bb[s] + org) * 0x0101u);
                memcpy(&a, fld + 2 * s, 2);
                const uint16_t sum = (uint16_t)(((a & 0x7F7Fu) + (b & 0x7F7Fu)) ^ ((a ^ b) & 0x8080u));
                memcpy(v + 2 * s, &sum, 2);
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

/* The tile's decoded values v (uint8 [128 tc], slot order) to their rows of out (uint8 [plane rows, cols], from
column c0; rows: each slot's plane row, negative for padding), as inline_np._scatter writes them. */
static inline void write_rows(uint8_t *out, int64_t cols, int64_t c0, const int64_t *rows, const uint8_t *v,
                              int64_t tc) {
    uint8_t *dst = out + c0;
    if (tc == 4) { /* a word a row */
        for (int s = 0; s < 128; s++)
            if (rows[s] >= 0) memcpy(dst + rows[s] * cols, v + 4 * s, 4);
    } else if (tc == 2) {
        for (int s = 0; s < 128; s++)
            if (rows[s] >= 0) memcpy(dst + rows[s] * cols, v + 2 * s, 2);
    } else {
        for (int s = 0; s < 128; s++)
            if (rows[s] >= 0)
                for (int c = 0; c < tc; c++) dst[rows[s] * cols + c] = v[s * tc + c];
    }
}

/* Adds a tile's per-slot counts (engine_records_decode_np.base_window_counts): the slot's decoded scales at its row
base (at), at its window's top (top) and inside it (in), the window [base, base + span - 1] taken mod 256 as numpy
takes it (forged bases wrap; the proof refuses them). */
static inline void add_counts(const uint8_t *v, const int16_t *bb, int64_t tc, int span, int32_t *at, int32_t *top,
                              int32_t *in) {
    if (tc == 4 && span <= 128) {
        const uint32_t t = (uint32_t)(span - 1) * ONES32;
        for (int s = 0; s < 128; s++) {
            uint32_t x;
            memcpy(&x, v + 4 * s, 4);
            const uint32_t e = sub_bytes(x, (uint32_t)(uint8_t)bb[s] * ONES32); /* from the base, mod 256 */
            at[s] += count_flags(lt_bytes(e, 1)), top[s] += count_flags(lt_bytes(e ^ t, 1));
            in[s] += count_flags(lt_bytes(e, span));
        }
    } else if (tc == 2 && span <= 128) { /* two bytes a slot, in the low half of a word */
        const uint32_t t = (uint32_t)(span - 1) * 0x0101u, pad = 0xFFFF0000u; /* high half: never counted */
        for (int s = 0; s < 128; s++) {
            uint16_t x16;
            memcpy(&x16, v + 2 * s, 2);
            const uint32_t e = sub_bytes(x16, (uint32_t)(uint8_t)bb[s] * 0x0101u) & 0xFFFFu;
            at[s] += count_flags(lt_bytes(e | pad, 1)), top[s] += count_flags(lt_bytes((e ^ t) | pad, 1));
            in[s] += count_flags(lt_bytes(e | pad, span));
        }
    } else {
        for (int s = 0; s < 128; s++) {
            const uint8_t bp = (uint8_t)bb[s];
            int32_t n0 = 0, n1 = 0, n2 = 0;
            for (int c = 0; c < tc; c++) {
                const uint8_t e = (uint8_t)(v[s * tc + c] - bp); /* from the base, mod 256 */
                n0 += e == 0, n1 += e == span - 1, n2 += e < span;
            }
            at[s] += n0, top[s] += n1, in[s] += n2;
        }
    }
}

/* Whether a decoded block's stored bases are the ones its rows give (format section 6; engine_records._span_bases_ok):
each real slot's row base (width 2**wb = span) is its stored base where the counts prove it (proven, or NULL), else
the rule's on its row of out; the block's reference and deltas of those bases (inline.block_references_np: padding
slots repeat slot 0, the reference is the rule's at delta_bits over the block's 128 bases, 0 at 8 bits, deltas
clipped to delta_bits) must be the stored ones: ref, and base less ref at every slot (0 at padding). */
static int block_bases_ok(const uint8_t *out, int64_t cols, const int64_t *rows, const uint8_t *vb, const int16_t *bb,
                          const uint8_t *proven, int span, int ref, int delta_bits, RowRule *Rrow, RowRule *Rblock) {
    uint8_t nat[128] = {0}; /* padding slots copy slot 0, which the geometry makes real: never read unset */
    for (int s = 0; s < 128; s++) {
        if (!vb[s]) continue;
        if (proven && proven[s]) {
            nat[s] = (uint8_t)bb[s]; /* proven bases lie in [0, 256 - span] */
        } else if (cols == 0) {
            nat[s] = 0;
        } else {
            const uint8_t *row = out + rows[s] * cols;
            row_rule_start(Rrow, row);
            nat[s] = (uint8_t)row_rule_base(Rrow, row, span);
        }
    }
    for (int s = 1; s < 128; s++)
        if (!vb[s]) nat[s] = nat[0]; /* slot 0 of a block is always real */
    int r = 0;
    if (delta_bits < 8) {
        row_rule_start(Rblock, nat);
        r = row_rule_base(Rblock, nat, 1 << delta_bits);
    }
    if (r != ref) return 0;
    const int top = (1 << delta_bits) - 1;
    for (int s = 0; s < 128; s++) {
        int d = vb[s] ? nat[s] - r : 0;
        d = d < 0 ? 0 : d > top ? top : d;
        if (d != bb[s] - ref) return 0;
    }
    return 1;
}

/* A class's verdict as its tiles are decoded in order: the least fault rank so far and the tile, and whether it is
settled (a record length below one unit or an EF_BOUNDS tile: numpy decides; EF_UNITS: the least rank). */
typedef struct {
    int rank, settled;
    int64_t where;
} ClassFault;

static inline void class_fault(ClassFault *F, int rank, int64_t t) {
    if (!rank) return;
    if (rank == EF_BOUNDS) {
        F->rank = EF_BOUNDS, F->where = t, F->settled = 1;
        return;
    }
    if (!F->rank || rank < F->rank) F->rank = rank, F->where = t;
    if (rank == EF_UNITS) F->settled = 1;
}

/* decode_engine_rows(out, body, units, base, valid, br, windows, thresholds, cols, base_width, count, base_ref,
delta_bits) -> (fault, tile, bases_ok): engine_records._decode_engine's span, whole, in one call, row block by row
block: each of the block's tiles (its full 4-column tiles, then its tail tile) checked and decoded as
engine_records_decode_np.decode_records checks it (decode_tile), reading the records in place from the span's body
(uint8: the records of its row blocks, in body order; units int64 [blocks, col tiles] their lengths / 16), and
written to its rows of out (uint8 [plane rows, cols]; br int64 [blocks, 128]: each slot's plane row, or -1 for
padding). Faults are those of the numpy passes, which decode the full tiles of the span before its tail tiles: the
least rank of the first class that has one (tile: its index in the class). With no fault, each block's stored bases
are checked (block_bases_ok) while its rows are in cache: with count set, a slot's base is proven from its row's
decoded scales at its base, at its window's top and inside it (engine_records_decode_np.base_window_counts and
rowbase.proven_bases), else recomputed from the row; base_ref (uint8 [blocks]) and delta_bits are the stored
references' and the format's. bases_ok is 0 when some block's bases are not the ones its rows give. */
PyObject *decode_engine_rows(PyObject *self, PyObject *args) {
    PyObject *o[9];
    Py_ssize_t cols, base_width;
    int count, delta_bits;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnniOi", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &cols,
                          &base_width, &count, &o[8], &delta_bits))
        return NULL;
    static const Py_ssize_t sizes[9] = {1, 1, 8, 2, 1, 8, 8, 4, 1};
    static const char *const names[9] = {"out", "body",    "units",      "base",    "valid",
                                         "br",  "windows", "thresholds", "base_ref"};
    Buf bufs[9];
    PyObject *ret = NULL;
    EngineSpan S;
    if (get_bufs(o, bufs, 9, sizes, names, 1u << 0) ||
        engine_span_args("decode_engine_rows", cols, base_width, &bufs[0], &bufs[5], &bufs[3], &bufs[4], &bufs[2],
                         &bufs[6], &bufs[7], &S))
        goto done;
    uint8_t *out = bufs[0].b.buf;
    const uint8_t *body = bufs[1].b.buf, *valid = bufs[4].b.buf, *base_ref = bufs[8].b.buf;
    const int64_t *units = bufs[2].b.buf, *br = bufs[5].b.buf;
    const int16_t *base = bufs[3].b.buf;
    const int64_t blocks = S.blocks, full = S.full, tail = S.tail, ct = S.ct;
    int64_t total = 0;
    for (int64_t i = 0; i < blocks * ct; i++) total += units[i] > 0 ? units[i] : 0;
    if (total * 16 > bufs[1].b.len || bufs[8].b.len != blocks || delta_bits < 1 || delta_bits > 8) {
        PyErr_SetString(PyExc_ValueError, "decode_engine_rows: inconsistent arguments");
        goto done;
    }
    RowRule *R = malloc(2 * sizeof(RowRule)); /* a plane row's rule, and a block's bases' */
    if (!R) {
        PyErr_NoMemory();
        goto done;
    }
    const Windows *E = &S.E;
    ClassFault F[2];
    memset(F, 0, sizeof F);
    int bases_ok = 1;
    Py_BEGIN_ALLOW_THREADS;
    const int span = S.span;
    row_rule_init(&R[0], cols), row_rule_init(&R[1], 128);
    for (int64_t b = 0; b < blocks; b++) /* a length below one unit: numpy decides (never past the body's end) */
        for (int64_t j = 0; j < ct; j++)
            if (units[b * ct + j] < 1) F[j >= full].settled = 1, F[j >= full].rank = EF_BOUNDS;
    int64_t at = 0; /* the block's first record in the body */
    for (int64_t b = 0; b < blocks && !F[0].settled; b++) {
        const uint8_t *vb = valid + b * 128;
        const int16_t *bb = base + b * 128;
        const int64_t *rows = br + b * 128;
        int64_t bmin = 1 << 20, bmax = -(1 << 20), nv = 0; /* block_limits */
        for (int s = 0; s < 128; s++)
            if (vb[s]) bmin = bb[s] < bmin ? bb[s] : bmin, bmax = bb[s] > bmax ? bb[s] : bmax, nv++;
        int32_t cnt[3][128];
        memset(cnt, 0, sizeof cnt);
        for (int64_t j = 0; j < ct; j++) {
            const int k = j >= full; /* the class: full tiles, or the tail */
            const int64_t id = b * ct + j, u = units[id], tc = k ? tail : 4, t = k ? b : b * full + j;
            const uint8_t *rec = body + at;
            at += 16 * (u > 0 ? u : 0);
            if (F[k].settled || (k && F[0].rank)) continue; /* a class that fails first stops the later one */
            uint8_t v[512], fld[512];
            class_fault(&F[k], decode_tile(E, rec, u, vb, bb, bmin, bmax, (128 - nv) * tc, tc, span, v, fld), t);
            if (F[0].rank || F[1].rank) continue; /* the span fails: its rows are not used */
            write_rows(out, cols, 4 * j, rows, v, tc);
            if (count) add_counts(v, bb, tc, span, cnt[0], cnt[1], cnt[2]);
        }
        if (F[0].rank || F[1].rank || !bases_ok) continue;
        uint8_t proven[128];
        if (count)
            for (int s = 0; s < 128; s++) { /* rowbase.proven_bases */
                const int64_t x = bb[s], outside = cols - cnt[2][s];
                proven[s] = x >= 0 && x <= 256 - span && (x == 0 || cnt[1][s] > outside) &&
                            (x == 256 - span || cnt[0][s] >= outside);
            }
        bases_ok = block_bases_ok(out, cols, rows, vb, bb, count ? proven : NULL, span, base_ref[b], delta_bits, &R[0],
                                  &R[1]);
    }
    Py_END_ALLOW_THREADS;
    free(R);
    const ClassFault *f = F[0].rank ? &F[0] : &F[1];
    ret = Py_BuildValue("(iLi)", f->rank, (long long)(f->rank ? f->where : -1), bases_ok);
done:
    release(bufs, 9);
    return ret;
}
