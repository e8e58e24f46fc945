/* The compact decoder's loops: far flags per chunk, a span of rows, the row-base scan (compact_decode_c.py). */
#include "native_common.h"

/* fault codes of decode_compact_span, in the order the numpy decoder checks them (see compact_native.py) */
enum {
    E_COUNT = 1,     /* a chunk's position code does not hold its count of exceptions */
    E_PAST_END = 2,  /* an exception position lies past the end of its chunk */
    E_ORDER = 3,     /* exception positions are not strictly ascending */
    E_FAR_EXACT = 4, /* an exception placed by its selector is flagged far */
    E_NEAR_RANGE = 5,
    E_ESC_REACH = 6, /* an escaped exception byte lies within reach of its far code */
    E_FAR_RANGE = 7,
    E_RAW_FIELDS = 8, /* a raw chunk's selectors differ from the scales it stores */
    E_RAW_FEW = 9,    /* a raw chunk holds few enough exceptions to be listed */
    E_BOUNDS = 10,    /* an index the payload gives lies outside its section (structural) */
    E_NOMEM = 11,
};

/* set bits in [p, q) of the stream */
static int64_t count_bits(const uint8_t *s, int64_t nbytes, int64_t p, int64_t q) {
    int64_t n = 0;
    while (p < q) {
        int64_t k = q - p < 56 ? q - p : 56;
        n += popcount64(bits_at(s, nbytes, p) & ((((uint64_t)1) << k) - 1));
        p += k;
    }
    return n;
}

/* far flags set per listed chunk: out[k] for chunk k (int64 [chunks]) */
PyObject *far_counts(PyObject *self, PyObject *args) {
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
    static const Py_ssize_t sizes[4] = {1, 8, 8, 8};
    static const char *const names[4] = {"stream", "listed", "bit_offsets", "out"};
    Buf bufs[4];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 4, sizes, names, 1u << 3)) goto done;
    const uint8_t *s = bufs[0].b.buf;
    int64_t nbytes = bufs[0].b.len, chunks = N_OF(bufs[1]);
    const int64_t *listed = bufs[1].b.buf, *bit0 = bufs[2].b.buf;
    int64_t *out = bufs[3].b.buf;
    if (N_OF(bufs[2]) != chunks || N_OF(bufs[3]) != chunks) {
        PyErr_SetString(PyExc_ValueError, "far_counts: table lengths differ");
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS for (int64_t k = 0; k < chunks; k++) {
        int64_t n = listed[k];
        if (n <= 0) {
            out[k] = 0;
            continue;
        }
        if (n > CHUNK) {
            bad = 1;
            break;
        }
        int l = LOW_BITS[n];
        int64_t f = bit0[k] + n + (CHUNK >> l) + n * l;
        if (f < 0 || f + n > 8 * nbytes) {
            bad = 1;
            break;
        }
        out[k] = count_bits(s, nbytes, f, f + n);
    }
    Py_END_ALLOW_THREADS if (bad) {
        PyErr_SetString(PyExc_ValueError, "far_counts: a chunk's flags lie outside the stream");
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 4);
    return ret;
}

/* The compact decoder's span: rows [a, b) of the plane into out (uint8 [rows * cols], the span's part written).

Arguments: out, selectors (packed fields), bases (int32 per row), exceptions section (uint8; the listed
streams are its first stream_bytes bytes), listed (int64 per chunk), bit_offsets (int64), lens (int64),
raw (bool), raw_offsets (int64), codes (uint8 per far exception), escaped (uint8, the escape list),
esc_before (int64 [n_far + 1]), far_before (int64 [chunks + 1]), stream_bytes, a, b, cols, width.
Returns (fault, position): fault 0 when the span decoded; position is the span-flat index involved. */
PyObject *decode_compact_span(PyObject *self, PyObject *args) {
    PyObject *o[13];
    Py_ssize_t stream_bytes, ra, rb, cols;
    int width;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOnnnni", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12], &stream_bytes, &ra, &rb, &cols, &width))
        return NULL;
    static const Py_ssize_t sizes[13] = {1, 1, 4, 1, 8, 8, 8, 1, 8, 1, 1, 8, 8};
    static const char *const names[13] = {"out",  "selectors",   "bases", "exceptions", "listed",     "bit_offsets", "lens",
                                    "raw",  "raw_offsets", "codes", "escaped",    "esc_before", "far_before"};
    Buf bufs[13];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 13, sizes, names, 1u << 0)) goto done;
    if (width != 1 && width != 2 && width != 4) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2 or 4");
        goto done;
    }
    uint8_t *out = bufs[0].b.buf;
    const uint8_t *sel = bufs[1].b.buf;
    const int32_t *bases = bufs[2].b.buf;
    const uint8_t *exc = bufs[3].b.buf;
    const int64_t *listed = bufs[4].b.buf, *bit0 = bufs[5].b.buf, *lens = bufs[6].b.buf;
    const uint8_t *raw = bufs[7].b.buf;
    const int64_t *raw_off = bufs[8].b.buf;
    const uint8_t *codes = bufs[9].b.buf, *escaped = bufs[10].b.buf;
    const int64_t *esc_before = bufs[11].b.buf, *far_before = bufs[12].b.buf;
    int64_t n_out = N_OF(bufs[0]), n_sel = bufs[1].b.len, n_rows = N_OF(bufs[2]), n_exc = bufs[3].b.len;
    int64_t chunks = N_OF(bufs[4]), n_codes = bufs[9].b.len, n_escaped = bufs[10].b.len;
    if (N_OF(bufs[5]) != chunks || N_OF(bufs[6]) != chunks || bufs[7].b.len != chunks || N_OF(bufs[8]) != chunks ||
        N_OF(bufs[12]) != chunks + 1 || N_OF(bufs[11]) != n_codes + 1 || stream_bytes < 0 || stream_bytes > n_exc ||
        ra < 0 || rb < ra || rb > n_rows || cols < 0 || rb * cols > n_out || (rb * cols * width + 7) / 8 > n_sel ||
        (ra * cols) % CHUNK != 0 || chunks != (n_out + CHUNK - 1) / CHUNK) {
        PyErr_SetString(PyExc_ValueError, "decode_compact_span: inconsistent arguments");
        goto done;
    }
    const int64_t lo = ra * cols, hi = rb * cols;
    const int64_t c0 = lo / CHUNK, c1 = (hi + CHUNK - 1) / CHUNK;
    const int K = (1 << (width - 1)) - 1, top = (1 << width) - 1;
    int fault = OK;
    int64_t where = -1;
    int64_t total = 0;
    for (int64_t c = c0; c < c1; c++) total += (listed[c] > 0 && listed[c] <= CHUNK) ? listed[c] : 0;
    int64_t *idx = total ? malloc(sizeof(int64_t) * total) : NULL; /* span-flat: a span may outgrow int32 */
    uint8_t *far = total ? malloc(total) : NULL;
    if (total && (!idx || !far)) {
        free(idx);
        free(far);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    /* the selectors plus each row's base, eight scales a word (a row's last word may spill into the next row,
       which is written after it; never past the span) */
    for (int64_t r = ra; r < rb && fault == OK; r++) {
        const int32_t b = bases[r];
        if (b < 0 || b > 256 - (1 << width)) { /* the caller checked the bases: base + field stays a byte */
            fault = E_BOUNDS;
            where = (r - ra) * cols;
            break;
        }
        const uint64_t add = (uint64_t)b * 0x0101010101010101ull;
        uint8_t *row = out + r * cols;
        int64_t j0 = r * cols;
        for (int64_t j = 0; j < cols; j += 8) {
            uint64_t x = bits_at(sel, n_sel, (j0 + j) * width), v;
            if (width == 1) {
                v = UNPACK1[x & 0xFF];
            } else if (width == 2) {
                v = (uint64_t)UNPACK2[x & 0xFF] | (uint64_t)UNPACK2[(x >> 8) & 0xFF] << 32;
            } else {
                x &= 0xFFFFFFFF;
                x = (x | x << 16) & 0x0000FFFF0000FFFFull;
                x = (x | x << 8) & 0x00FF00FF00FF00FFull;
                v = (x | x << 4) & 0x0F0F0F0F0F0F0F0Full;
            }
            v += add;
            if (j0 + j + 8 <= hi) {
                memcpy(row + j, &v, 8);
            } else {
                for (int64_t i = 0; j0 + j + i < hi; i++) row[j + i] = (uint8_t)(v >> (8 * i));
            }
        }
    }
    /* positions: each listed chunk's unary buckets hold exactly its count of ones */
    const uint8_t *stream = exc;
    int64_t e = 0;
    int err_end = 0, err_order = 0;
    int64_t end_at = -1, order_at = -1;
    for (int64_t c = c0; c < c1 && fault == OK; c++) {
        int64_t n = listed[c];
        if (n <= 0) continue;
        if (n > CHUNK) {
            fault = E_BOUNDS;
            where = (c - c0) * CHUNK;
            break;
        }
        int l = LOW_BITS[n];
        int64_t start = bit0[c], tail = start + n + (CHUNK >> l), flags = tail + n * l;
        if (start < 0 || flags + n > 8 * stream_bytes) {
            fault = E_BOUNDS;
            where = (c - c0) * CHUNK;
            break;
        }
        int64_t rank = 0, p = start;
        int64_t base_idx = (c - c0) * CHUNK;
        while (p < tail) {
            int64_t k = tail - p < 56 ? tail - p : 56;
            uint64_t w = bits_at(stream, stream_bytes, p) & ((((uint64_t)1) << k) - 1);
            while (w) {
                int t = __builtin_ctzll(w);
                w &= w - 1;
                if (rank < n) {
                    int64_t high = p + t - start - rank;
                    int64_t at = tail + (int64_t)l * rank;
                    int64_t lowv = (int64_t)(bits_at(stream, stream_bytes, at) & ((1u << l) - 1));
                    int64_t pos = (high << l) | lowv;
                    idx[e + rank] = base_idx + pos;
                    far[e + rank] = (uint8_t)((bits_at(stream, stream_bytes, flags + rank)) & 1);
                    if (rank == n - 1 && pos >= lens[c] && !err_end) {
                        err_end = 1;
                        end_at = base_idx + pos;
                    }
                }
                rank++;
            }
            p += k;
        }
        if (rank != n) {
            fault = E_COUNT;
            where = base_idx;
        }
        e += n;
    }
    if (fault == OK && err_end) {
        fault = E_PAST_END;
        where = end_at;
    }
    if (fault == OK) {
        for (int64_t i = 1; i < total; i++)
            if (idx[i] <= idx[i - 1]) {
                err_order = 1;
                order_at = idx[i];
                break;
            }
        if (err_order) {
            fault = E_ORDER;
            where = order_at;
        }
    }
    if (fault == OK && total) {
        /* values: near from the selector field, far from the far codes and escapes */
        int64_t f_at = far_before[c0], f_end = far_before[c1];
        int64_t x_at = (f_at >= 0 && f_at <= n_codes) ? esc_before[f_at] : -1;
        int e4 = 0, e5 = 0, e6 = 0, e7 = 0, eb = 0;
        int64_t w4 = -1, w5 = -1, w6 = -1, w7 = -1;
        if (f_at < 0 || f_end > n_codes || f_end < f_at || x_at < 0) eb = 1;
        for (int64_t i = 0; i < total && !eb; i++) {
            int64_t g = idx[i]; /* span-flat; < 256 * chunks of the span and < hi - lo: checked above */
            if (g < 0 || g >= hi - lo) {
                eb = 1;
                break;
            }
            int f = field_at(sel, lo + g, width); /* the row's base is what the plane holds less it */
            int b = (uint8_t)(out[lo + g] - f);
            int side = f & 1, step = f >> 1;
            int near = b + (side ? (1 << width) + step : -1 - step);
            if (near < 0 || near > 255) {
                if (!e5) w5 = g;
                e5 = 1;
            }
            int value = near;
            if (far[i]) {
                if (step != K) {
                    if (!e4) w4 = g;
                    e4 = 1;
                }
                if (f_at >= f_end) {
                    eb = 1;
                    break;
                }
                int code = codes[f_at++];
                if (code == ESCAPE_CODE) {
                    if (x_at >= n_escaped) {
                        eb = 1;
                        break;
                    }
                    int ev = escaped[x_at++];
                    int base = side ? near - (1 << width) - K : near + 1 + K;
                    int above = ev > base;
                    int dist = above ? ev - base - top : base - ev;
                    if (above != side || dist < K + 2 + ESCAPE_CODE) {
                        if (!e6) w6 = g;
                        e6 = 1;
                    }
                    value = ev;
                } else {
                    value = near + (side ? 1 : -1) * (1 + code);
                    if (value < 0 || value > 255) {
                        if (!e7) w7 = g;
                        e7 = 1;
                    }
                }
            }
            out[lo + g] = (uint8_t)value;
        }
        if (eb) {
            fault = E_BOUNDS;
        } else if (f_at != f_end) {
            fault = E_BOUNDS; /* the flags of the span and the far counts disagree */
        } else if (e4) {
            fault = E_FAR_EXACT, where = w4;
        } else if (e5) {
            fault = E_NEAR_RANGE, where = w5;
        } else if (e6) {
            fault = E_ESC_REACH, where = w6;
        } else if (e7) {
            fault = E_FAR_RANGE, where = w7;
        }
    }
    if (fault == OK) {
        /* raw chunks: their native bytes, canonical */
        int e8 = 0, e9 = 0;
        int64_t w8 = -1, w9 = -1;
        for (int64_t c = c0; c < c1 && fault == OK; c++) {
            if (!raw[c]) continue;
            int64_t len = lens[c], src = raw_off[c];
            if (len < 0 || len > CHUNK || src < 0 || src + len > n_exc || lo + (c - c0) * CHUNK + len > hi) {
                fault = E_BOUNDS;
                where = (c - c0) * CHUNK;
                break;
            }
            int64_t n = 0, nf = 0, ne = 0;
            int64_t g0 = (c - c0) * CHUNK;
            for (int64_t j = 0; j < len; j++) {
                int64_t g = g0 + j;
                int f = field_at(sel, lo + g, width);
                int b = (uint8_t)(out[lo + g] - f);
                int v = exc[src + j];
                int u = (uint8_t)(v - b);
                int want = u;
                if (u > top) {
                    int above = v > b;
                    int dist = above ? v - b - top : b - v;
                    want = above + ((dist - 1 < K ? dist - 1 : K) << 1);
                    n++;
                    nf += dist >= K + 2;
                    ne += dist >= K + 2 + ESCAPE_CODE;
                }
                if (f != want && !e8) {
                    e8 = 1;
                    w8 = g;
                }
                out[lo + g] = (uint8_t)v;
            }
            int is_raw = n > MAX_LISTED || LISTED_BITS[n < CHUNK ? n : CHUNK] + 3 * nf + 8 * ne >= 8 * len;
            if (!is_raw && !e9) {
                e9 = 1;
                w9 = (c - c0) * CHUNK;
            }
        }
        if (fault == OK) {
            if (e8)
                fault = E_RAW_FIELDS, where = w8;
            else if (e9)
                fault = E_RAW_FEW, where = w9;
        }
    }
    Py_END_ALLOW_THREADS;
    free(idx);
    free(far);
    ret = Py_BuildValue("(iL)", fault, (long long)where);
done:
    release(bufs, 13);
    return ret;
}

/* Row bases from the compact form's 2-bit codes (0 same, 1 up, 2 down, 3 escaped: the next escaped base), as
compact_np.scan_bases_np: int32 [R] into out. The caller checked that the escapes are as many as the codes say. */
PyObject *scan_bases(PyObject *self, PyObject *args) {
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    static const Py_ssize_t sizes[3] = {1, 1, 4};
    static const char *const names[3] = {"codes", "escapes", "out"};
    Buf bufs[3];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 3, sizes, names, 1u << 2)) goto done;
    const uint8_t *codes = bufs[0].b.buf, *esc = bufs[1].b.buf;
    int32_t *out = bufs[2].b.buf;
    const int64_t r = bufs[0].b.len, n_esc = bufs[1].b.len;
    if (N_OF(bufs[2]) != r) {
        PyErr_SetString(PyExc_ValueError, "scan_bases: one base a code");
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    int32_t base = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < r; i++) {
        const int c = codes[i] & 3;
        if (c == 3) {
            if (k >= n_esc) {
                bad = 1;
                break;
            }
            base = esc[k++];
        } else {
            base += c == 1 ? 1 : (c == 2 ? -1 : 0);
        }
        out[i] = base;
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "scan_bases: more escape codes than escaped bases");
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 3);
    return ret;
}
