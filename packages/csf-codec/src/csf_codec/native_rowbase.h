/* The row base rule (rowbase.py) for one row, shared by the row-base entry (native_rowbase.c), the compact encoder's
row pass (native_compact_encode.c) and the engine decoder's base check (native_engine_decode.c): for width w, the
smallest b in [0, 256 - 2**w] that maximises the row's bytes in [b, b + 2**w - 1], and how many bytes lie outside
that window widened by a reach on each side. */
#ifndef CSF_NATIVE_ROWBASE_H
#define CSF_NATIVE_ROWBASE_H

#include "native_common.h"

#define RB_NARROW 64 /* rows of at most this many bytes scan every window; wider ones the windows at their values */

/* A row's state while its bases are found: its least and greatest byte and, once a width needs them (filled), its
cumulative counts. Histograms go to four banks a row's consecutive bytes alternate between, so that runs of one
value do not wait on each other's increments; every bank is zero again when the row is done. */
typedef struct {
    int64_t cols;
    int mn, mx, filled;
    uint8_t h8[4][256];    /* narrow rows' histogram banks (at most 16 bytes a bank) */
    int64_t h64[4][256];   /* wide rows' (64-bit: a row may hold more bytes than an int32 counts) */
    uint8_t lev8[256 + 1]; /* narrow rows: lev8[k] = bytes <= mn + k - 1 for k in [0, spread + 1] */
    int64_t lev[256 + 1];  /* wide rows' */
    uint8_t dv[256];       /* wide rows: the distinct values, ascending, and their counts */
    int64_t dc[256];
    int nd;
} RowRule;

/* a RowRule for rows of cols bytes (zeroed banks) */
static void row_rule_init(RowRule *R, int64_t cols) {
    memset(R, 0, sizeof *R);
    R->cols = cols;
}

/* starts a row: its least and greatest byte (cols >= 1) */
static inline void row_rule_start(RowRule *R, const uint8_t *restrict row) {
    uint8_t mn = 255, mx = 0; /* bytes, so that the compiler keeps 16 of them in a register */
    const int64_t cols = R->cols;
    for (int64_t j = 0; j < cols; j++) {
        mn = row[j] < mn ? row[j] : mn;
        mx = row[j] > mx ? row[j] : mx;
    }
    R->mn = mn, R->mx = mx, R->filled = 0;
}

/* the row's cumulative counts (and for wide rows its distinct values), once a row */
static inline void row_rule_fill(RowRule *R, const uint8_t *restrict row) {
    const int64_t cols = R->cols;
    const int mn = R->mn, mx = R->mx;
    if (cols <= RB_NARROW && mx - mn < 8) {
        /* a spread under 8 levels: the counts as eight byte lanes of one word (a lane holds at most 64), their
           running sums by one multiply: lane k of the product is the row's bytes <= mn + k */
        uint64_t h = 0;
        for (int64_t j = 0; j < cols; j++) h += 1ull << (8 * (row[j] - mn));
        const uint64_t le = h * 0x0101010101010101ull;
        R->lev8[0] = 0;
        memcpy(R->lev8 + 1, &le, 8);
    } else if (cols <= RB_NARROW) {
        uint8_t(*restrict h)[256] = R->h8, *restrict lev = R->lev8;
        int64_t j = 0;
        for (; j + 4 <= cols; j += 4) {
            const uint8_t a = row[j], b = row[j + 1], c = row[j + 2], d = row[j + 3];
            h[0][a]++, h[1][b]++, h[2][c]++, h[3][d]++;
        }
        for (; j < cols; j++) h[j & 3][row[j]]++;
        uint8_t acc = 0;
        lev[0] = 0;
        for (int v = mn; v <= mx; v++) {
            acc += h[0][v] + h[1][v] + h[2][v] + h[3][v];
            lev[v - mn + 1] = acc;
            h[0][v] = h[1][v] = h[2][v] = h[3][v] = 0;
        }
    } else {
        int64_t j = 0;
        for (; j + 4 <= cols; j += 4)
            R->h64[0][row[j]]++, R->h64[1][row[j + 1]]++, R->h64[2][row[j + 2]]++, R->h64[3][row[j + 3]]++;
        for (; j < cols; j++) R->h64[j & 3][row[j]]++;
        int64_t acc = 0;
        int nd = 0;
        R->lev[0] = 0;
        for (int v = mn; v <= mx; v++) { /* branch-free: a row's values are unpredictable */
            const int64_t c = R->h64[0][v] + R->h64[1][v] + R->h64[2][v] + R->h64[3][v];
            R->h64[0][v] = R->h64[1][v] = R->h64[2][v] = R->h64[3][v] = 0;
            acc += c;
            R->lev[v - mn + 1] = acc;
            R->dv[nd] = (uint8_t)v, R->dc[nd] = c;
            nd += c != 0;
        }
        R->nd = nd;
    }
    R->filled = 1;
}

/* the row's bytes <= v (any int v; filled): level v - mn + 1 clamped to [0, spread + 1], which hold 0 and cols */
static inline int64_t row_rule_le(const RowRule *R, int v) {
    int k = v - R->mn + 1;
    k = k < 0 ? 0 : k;
    k = k > R->mx - R->mn + 1 ? R->mx - R->mn + 1 : k;
    return R->cols <= RB_NARROW ? R->lev8[k] : R->lev[k];
}

/* the row's base for windows of span = 2**w bytes (span <= 256) */
static inline int row_rule_base(RowRule *R, const uint8_t *restrict row, int span) {
    const int mn = R->mn, mx = R->mx;
    if (mx - mn < span) return mx - span + 1 > 0 ? mx - span + 1 : 0; /* one window holds the row */
    if (!R->filled) row_rule_fill(R, row);
    if (R->cols <= RB_NARROW) {
        /* relative to mn, a window at j < 0 holds lev[j + span] <= lev[span], one past spread + 1 - span no more than
           the one before it: only j in [0, spread + 1 - span] can win, the first of the greatest count. Where j = 0
           wins, the smallest window holding as many starts at k - span + 1, k the greatest level below span the row
           occupies (the byte range cuts it at 0) */
        const uint8_t *lev = R->lev8;
        const int last = mx - mn + 1 - span;
        int best = -1, at = 0;
        for (int j = 0; j <= last; j++) {
            const int c = lev[j + span] - lev[j], better = c > best;
            best = better ? c : best;
            at = better ? j : at;
        }
        if (at) return mn + at;
        int k = span - 1;
        while (lev[k + 1] == lev[k]) k--; /* level 0 holds mn */
        return mn + k - span + 1 > 0 ? mn + k - span + 1 : 0;
    }
    /* the smallest maximising b is 0 or has a value at its window's top (else b - 1 held as many): b = 0 first,
       then b = v - span + 1 for each value v >= span - 1, ascending, by two pointers over the distinct values */
    const uint8_t *dv = R->dv;
    const int64_t *dc = R->dc;
    int64_t best = 0, c = 0;
    int left = 0, at = 0;
    for (int j = 0; j < R->nd && dv[j] <= span - 1; j++) best += dc[j];
    for (int j = 0; j < R->nd; j++) {
        c += dc[j]; /* c: the counts of dv[left..j] */
        if (dv[j] < span - 1) continue;
        const int b = dv[j] - span + 1;
        while (dv[left] < b) c -= dc[left++];
        const int better = c > best;
        best = better ? c : best;
        at = better ? b : at;
    }
    return at;
}

/* the row's bytes outside [b - reach, b + span - 1 + reach] (the byte range clips it without changing the count) */
static inline int64_t row_rule_outside(const RowRule *R, int b, int span, int reach) {
    const int hi = b + span - 1 + reach < 255 ? b + span - 1 + reach : 255;
    return R->cols - (row_rule_le(R, hi) - row_rule_le(R, b - reach - 1));
}

#endif
