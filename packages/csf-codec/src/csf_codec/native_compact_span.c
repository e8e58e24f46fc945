/* The compact encoder's span (compact_np._span_sections_np, the reference): a span's selectors, listed streams,
far codes, escaped bytes and raw chunks, a 256-scale chunk at a time. */
#include "native_common.h"

/* faults of encode_compact_span: what the rows hold disagrees with the chunk tables the caller derived from the
chunk counts (the encoder's own error, never the data's) */
enum {
    S_COUNT = 1,  /* a listed chunk's count is not its exceptions, or past MAX_LISTED */
    S_STREAM = 2, /* a listed chunk's bits lie outside the span's stream */
    S_LENS = 3,   /* a raw chunk's length is not its scales */
    S_OUT = 4,    /* far codes, escapes or raw bytes past (or short of) their outputs */
};

/* v (< 256) or-ed into a zeroed bit stream at bit p; the field's set bits lie inside the stream (the caller checked
its chunk's bits) */
static inline void put_bits(uint8_t *s, int64_t p, unsigned v) {
    const int sh = (int)(p & 7);
    s[p >> 3] |= (uint8_t)(v << sh);
    if (sh && (v >> (8 - sh))) s[(p >> 3) + 1] |= (uint8_t)(v >> (8 - sh));
}

/* encode_compact_span(rows, bases, cols, width, a, b, raw, listed, bit_offsets, lens, sel, stream, far, far_bit0,
n_far, esc, rawb) -> fault: rows [a, b) of a uint8 [R, cols] plane (a * cols a multiple of 256) with their bases for
this width (uint8 [R]). The span's chunks' tables (raw bool, listed int64 (exceptions of listed chunks), bit_offsets
int64 (their first bit in stream), lens int64 (scales)) as compact_np.chunk_table has them, sliced to the span. Into
sel (uint8 [ceil((b - a) cols w / 8)]) the span's packed selector fields (an in-window scale's offset from its base,
an exception's side and distance up to K + 1); into stream (uint8, zeroed here) the listed chunks' position codes and
far flags; into far (uint8, zeroed here) the n_far far exceptions' 3-bit codes from bit far_bit0 on, and into esc the
escaped ones' bytes, listed chunks only, in order; into rawb the raw chunks' bytes. Each output is exactly as long as
the tables say. Returns 0 or a fault. */
PyObject *encode_compact_span(PyObject *self, PyObject *args) {
    PyObject *o[11];
    Py_ssize_t cols, ra, rb, n_far;
    int width, far_bit0;
    if (!PyArg_ParseTuple(args, "OOninnOOOOOOOinOO", &o[0], &o[1], &cols, &width, &ra, &rb, &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &far_bit0, &n_far, &o[9], &o[10]))
        return NULL;
    static const Py_ssize_t sizes[11] = {1, 1, 1, 8, 8, 8, 1, 1, 1, 1, 1};
    static const char *const names[11] = {"rows", "bases", "raw", "listed", "bit_offsets", "lens",
                                          "sel",  "stream", "far", "esc",   "rawb"};
    Buf bufs[11];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 11, sizes, names, 0x7C0u)) goto done;
    const uint8_t *x = bufs[0].b.buf, *bases = bufs[1].b.buf, *raw = bufs[2].b.buf;
    const int64_t *listed = bufs[3].b.buf, *bit0 = bufs[4].b.buf, *lens = bufs[5].b.buf;
    uint8_t *sel = bufs[6].b.buf, *stream = bufs[7].b.buf, *far = bufs[8].b.buf, *esc = bufs[9].b.buf;
    uint8_t *rawb = bufs[10].b.buf;
    const int64_t n_sc = (rb - ra) * cols, chunks = (n_sc + CHUNK - 1) / CHUNK;
    const int64_t n_stream = bufs[7].b.len, n_esc = bufs[9].b.len, n_raw = bufs[10].b.len;
    if ((width != 1 && width != 2 && width != 4) || cols < 0 || ra < 0 || rb < ra || rb > bufs[1].b.len ||
        far_bit0 < 0 || far_bit0 > 7 || n_far < 0 || bufs[8].b.len != (far_bit0 + 3 * n_far + 7) / 8 ||
        rb * cols > bufs[0].b.len || (ra * cols) % CHUNK || bufs[2].b.len != chunks || N_OF(bufs[3]) != chunks ||
        N_OF(bufs[4]) != chunks || N_OF(bufs[5]) != chunks || bufs[6].b.len != (n_sc * width + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "encode_compact_span: inconsistent arguments");
        goto done;
    }
    int fault = OK;
    Py_BEGIN_ALLOW_THREADS;
    const int span = 1 << width, K = (1 << (width - 1)) - 1;
    const uint8_t *flat = x + ra * cols;
    int64_t r = ra, j = 0, nf = 0, ne = 0, nr = 0;
    memset(stream, 0, n_stream), memset(far, 0, bufs[8].b.len);
    for (int64_t k = 0; k < chunks && fault == OK; k++) {
        const int64_t n_in = n_sc - k * CHUNK < CHUNK ? n_sc - k * CHUNK : CHUNK;
        uint8_t fld[CHUNK + 8], packed[CHUNK / 2];
        int16_t pos[CHUNK];
        for (int64_t q = 0; q < n_in;) { /* each scale's offset from its row's base, a row's part at a time */
            const int64_t seg = cols - j < n_in - q ? cols - j : n_in - q;
            const uint8_t bs = bases[r], *row = x + r * cols + j;
            for (int64_t t = 0; t < seg; t++) fld[q + t] = (uint8_t)(row[t] - bs); /* below the base wraps past */
            q += seg, j += seg;
            if (j == cols) j = 0, r++;
        }
        const int64_t n8 = (n_in + 7) & ~(int64_t)7;
        memset(fld + n_in, 0, n8 - n_in);
        int n_ex = 0; /* the exceptions: offsets of 2**w or more, found eight offsets at a time */
        const uint64_t outside = (uint64_t)(uint8_t)~(span - 1) * 0x0101010101010101ull;
        for (int64_t q = 0; q < n8; q += 8) {
            uint64_t word;
            memcpy(&word, fld + q, 8);
            for (uint64_t m = word & outside; m;) {
                const int byte = __builtin_ctzll(m) >> 3;
                pos[n_ex++] = (int16_t)(q + byte);
                m &= ~(0xFFull << (8 * byte));
            }
        }
        const int listed_chunk = !raw[k];
        const int64_t cnt = listed[k], o0 = bit0[k];
        const int low = cnt > 0 && cnt <= CHUNK ? LOW_BITS[cnt] : 0;
        const int64_t tail = o0 + cnt + (CHUNK >> low);
        if (listed_chunk) {
            if (cnt != n_ex || cnt > MAX_LISTED) {
                fault = S_COUNT;
                break;
            }
            if (cnt && (o0 < 0 || o0 + LISTED_BITS[cnt] > 8 * n_stream)) {
                fault = S_STREAM;
                break;
            }
        }
        for (int i = 0; i < n_ex; i++) { /* an exception's field: its side and its distance up to K + 1 */
            const int v = flat[k * CHUNK + pos[i]], bs = (uint8_t)(v - fld[pos[i]]);
            const int above = v > bs, dist = above ? v - bs - (span - 1) : bs - v;
            fld[pos[i]] = (uint8_t)(above + ((dist - 1 < K ? dist - 1 : K) << 1));
            if (!listed_chunk) continue;
            const int p = pos[i];
            put_bits(stream, o0 + (p >> low) + i, 1);                /* its unary bucket */
            put_bits(stream, tail + (int64_t)i * low, p & ((1 << low) - 1)); /* its low part */
            if (dist >= K + 2) {                                     /* far: its flag, code and maybe its byte */
                put_bits(stream, tail + cnt * low + i, 1);
                const int code = dist - (K + 2) < 7 ? dist - (K + 2) : 7;
                if (nf >= n_far || (code == 7 && ne >= n_esc)) {
                    fault = S_OUT;
                    break;
                }
                put_bits(far, far_bit0 + 3 * nf++, (unsigned)code);
                if (code == 7) esc[ne++] = (uint8_t)v;
            }
        }
        if (!listed_chunk) {
            if (lens[k] != n_in) {
                fault = S_LENS;
                break;
            }
            if (nr + n_in > n_raw) {
                fault = S_OUT;
                break;
            }
            memcpy(rawb + nr, flat + k * CHUNK, n_in);
            nr += n_in;
        }
        const int64_t nbytes = (n_in * width + 7) / 8;
        pack_fields(fld, n8, width, packed);
        memcpy(sel + k * (CHUNK / 8) * width, packed, nbytes);
    }
    if (fault == OK && (nf != n_far || ne != n_esc || nr != n_raw)) fault = S_OUT;
    Py_END_ALLOW_THREADS;
    ret = PyLong_FromLong(fault);
done:
    release(bufs, 11);
    return ret;
}
