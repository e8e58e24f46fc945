/* Engine records' window tables and window choice, shared by their decoder (native_engine_decode.c) and encoder
(native_engine_encode.c): engine_records_np.thresholds, window_units and pick_windows for one tile at a time. */
#ifndef CSF_NATIVE_ENGINE_H
#define CSF_NATIVE_ENGINE_H

#include "native_common.h"

#define MAX_WINDOWS 64
#define MAX_THRESHOLDS 250

static inline int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t units_of(int64_t used) { return -floordiv(-used, 16); }

/* Four bytes at a time (a tile row of four columns as one word). */
#define ONES32 0x01010101u
#define HIGH32 0x80808080u

/* each byte of a less the same byte of b, mod 256 */
static inline uint32_t sub_bytes(uint32_t a, uint32_t b) { return ((a | HIGH32) - (b & ~HIGH32)) ^ ((a ^ ~b) & HIGH32); }

/* 0x80 in each byte of x below n (1 <= n <= 128), else 0 */
static inline uint32_t lt_bytes(uint32_t x, uint32_t n) { return ~x & ~((x | HIGH32) - n * ONES32) & HIGH32; }

/* how many bytes of x hold 0x80 (x: lt_bytes' flags) */
static inline int count_flags(uint32_t x) { return (int)(((x >> 7) * ONES32) >> 24); }

/* The candidate windows and the thresholds k whose C(k) (a tile's positions at offset <= k from the row base,
padding at 0) their record lengths read. */
typedef struct {
    int64_t nw, nk;
    const int64_t *win; /* [nw, 2]: width, origin */
    const int32_t *ks;  /* ascending */
    int32_t lut[512];   /* lut[v + 256]: how many thresholds lie below v (numpy's searchsorted over [-256, 256)) */
    int rows[MAX_WINDOWS][4]; /* per window: the thresholds' rows at lo - 1, hi, lo - 5 and hi + 3 */
    int pad_out[MAX_WINDOWS]; /* offset 0 lies outside the window */
} Windows;

/* NULL when the windows are (1|2|4, int8) pairs and the thresholds hold every one their lengths read; else
what is wrong (a ValueError's message). */
static const char *windows_init(Windows *E, const int64_t *win, int64_t nw, const int32_t *ks, int64_t nk) {
    if (nw < 1 || nw > MAX_WINDOWS || nk < 1 || nk > MAX_THRESHOLDS) return "too many or too few windows";
    for (int64_t j = 0; j < nw; j++) {
        int64_t w = win[2 * j], org = win[2 * j + 1];
        if ((w != 1 && w != 2 && w != 4) || org < -128 || org > 127) return "a window is not (1|2|4, int8)";
    }
    E->nw = nw, E->nk = nk, E->win = win, E->ks = ks;
    for (int v = 0; v < 512; v++) {
        int32_t c = 0;
        while (c < nk && ks[c] < v - 256) c++;
        E->lut[v] = c;
    }
    for (int64_t j = 0; j < nw; j++) {
        const int64_t w = win[2 * j], lo = win[2 * j + 1], hi = lo + (1 << w) - 1;
        const int64_t want[4] = {lo - 1, hi, lo - 5, hi + 3};
        for (int q = 0; q < 4; q++) {
            E->rows[j][q] = -1;
            for (int64_t i = 0; i < nk; i++)
                if (ks[i] == want[q]) E->rows[j][q] = (int)i;
            if (E->rows[j][q] < 0) return "a window's threshold is missing";
        }
        E->pad_out[j] = !(lo <= 0 && 0 <= hi);
    }
    return NULL;
}

/* What the engine's span entries (decode_engine_rows, encode_engine_rows) share: a span of row blocks of a plane of
cols columns, in column tiles of four columns and a tail tile of tail columns, and the window tables. */
typedef struct {
    int64_t cols, blocks, full, tail, ct, n_rows; /* ct: column tiles a block (full, then the tail's one) */
    int span;                                     /* 2**base_width: the row base's window */
    Windows E;
} EngineSpan;

/* The arguments both entries take, checked (fn names the entry in the errors): plane uint8 [n_rows, cols] (the rows
read or written), br int64 [blocks, 128] (each slot's plane row, negative for padding), base int16 and valid bool
[blocks, 128] (a real slot has a row), units int64 [blocks, col tiles], windows int64 [W, 2] and thresholds int32
(the window tables). 0 with S filled, or -1 with a ValueError set. */
static int engine_span_args(const char *fn, Py_ssize_t cols, Py_ssize_t base_width, const Buf *plane, const Buf *br,
                            const Buf *base, const Buf *valid, const Buf *units, const Buf *win, const Buf *ks,
                            EngineSpan *S) {
    S->cols = cols, S->blocks = N_OF(*base) / 128, S->full = cols / 4, S->tail = cols % 4;
    S->ct = S->full + (S->tail != 0), S->n_rows = cols > 0 ? N_OF(*plane) / cols : 0;
    const int64_t nb = S->blocks * 128;
    int bad = cols < 1 || base_width < 0 || base_width > 8 || N_OF(*base) != nb || valid->b.len != nb ||
              N_OF(*br) != nb || N_OF(*units) != S->blocks * S->ct || N_OF(*plane) != S->n_rows * cols;
    const int64_t *rows = br->b.buf;
    const uint8_t *real = valid->b.buf;
    for (int64_t i = 0; i < nb && !bad; i++) bad |= rows[i] >= S->n_rows || (real[i] && rows[i] < 0);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent arguments", fn);
        return -1;
    }
    S->span = 1 << base_width;
    const char *why = N_OF(*win) % 2 ? "windows are not (width, origin) pairs"
                                     : windows_init(&S->E, win->b.buf, N_OF(*win) / 2, ks->b.buf, N_OF(*ks));
    if (why) {
        PyErr_Format(PyExc_ValueError, "%s: %s", fn, why);
        return -1;
    }
    return 0;
}

/* Per block: the least and greatest real row base (1 << 20 and -(1 << 20) when it has none) and its padding
positions in a tile of cols columns (engine_records_np.tile_limits). */
static void block_limits(const int16_t *base, const uint8_t *valid, int64_t blocks, int64_t cols, int64_t *bmin,
                         int64_t *bmax, int64_t *npad) {
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = 1 << 20, hi = -(1 << 20), nv = 0;
        for (int s = 0; s < 128; s++)
            if (valid[b * 128 + s]) {
                int64_t v = base[b * 128 + s];
                lo = v < lo ? v : lo, hi = v > hi ? v : hi, nv++;
            }
        bmin[b] = lo, bmax[b] = hi, npad[b] = 128 * cols - nv * cols;
    }
}

/* window_units and pick_windows for one tile from its C(k) (int64 [nk], padding counted at offset 0): the window
of fewest record bytes (ties: list order); *units gets its length / 16, which is the raw length or more when the
tile goes raw. A window that leaves the byte range for a real row of the block is never the shortest. */
static inline int64_t pick_window(const Windows *E, const int64_t *C, int64_t cols, int64_t npad, int64_t bmin,
                                  int64_t bmax, int64_t *units) {
    const int64_t size = 128 * cols, nw = E->nw;
    int64_t best = -1, best_key = 0;
    for (int64_t j = 0; j < nw; j++) {
        const int64_t w = E->win[2 * j], lo = E->win[2 * j + 1], hi = lo + (1 << w) - 1;
        int64_t uu = 1 << 20;
        if (bmin + lo >= 0 && bmax + hi <= 255) {
            const int *r = E->rows[j];
            const int64_t nn = size - (C[r[1]] - C[r[0]]) - E->pad_out[j] * npad;
            const int64_t esc = C[r[2]] + size - C[r[3]];
            uu = units_of(4 + 16 * cols * w + floordiv(3 * nn + 1, 2) + esc);
        }
        const int64_t key = uu * nw + j;
        if (best < 0 || key < best_key) best = j, best_key = key;
    }
    *units = best_key / nw;
    return best;
}

#endif
