/* csf_codec._native: the codec's per-element loops in C99 (the numpy modules stay the reference).

Every function takes contiguous buffers (numpy arrays through the buffer protocol), checks their sizes
against what it will index, releases the GIL for its loops, and reports a fault as a small integer code
(and the position where it was found) that the Python wrapper turns into the numpy path's typed error and
message. Reads of payload bytes are bounds-checked: a corrupt payload never reads outside its buffers.

Bit streams are LSB first: bit i is bit i % 8 of byte i / 8.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256
#define ESCAPE_CODE 7
#define MAX_LISTED 254

/* fault codes of decode_compact_span, in the order the numpy decoder checks them (see compact_native.py) */
enum {
    OK = 0,
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

static int low_bits_of(int n) {
    /* the Elias-Fano low-part width that makes n positions in [0, 256) shortest (ties: the smaller) */
    int best = 0;
    long best_cost = -1;
    for (int l = 0; l < 8; l++) {
        long cost = (long)n * l + (CHUNK >> l);
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best = l;
        }
    }
    return best;
}

static int LOW_BITS[CHUNK + 1];
static long LISTED_BITS[CHUNK + 1];

static uint64_t UNPACK1[256]; /* a byte's fields as the bytes they unpack to (little-endian) */
static uint32_t UNPACK2[256];
static uint16_t UNPACK4[256];

static void init_tables(void) {
    for (int v = 0; v < 256; v++) {
        uint8_t b[8];
        for (int i = 0; i < 8; i++) b[i] = (v >> i) & 1;
        memcpy(&UNPACK1[v], b, 8);
        for (int i = 0; i < 4; i++) b[i] = (v >> (2 * i)) & 3;
        memcpy(&UNPACK2[v], b, 4);
        for (int i = 0; i < 2; i++) b[i] = (v >> (4 * i)) & 15;
        memcpy(&UNPACK4[v], b, 2);
    }
    for (int n = 0; n <= CHUNK; n++) {
        LOW_BITS[n] = low_bits_of(n);
        LISTED_BITS[n] = n ? n + (CHUNK >> LOW_BITS[n]) + (long)n * LOW_BITS[n] + n : 0;
    }
}

/* up to 57 bits of a stream of nbytes bytes from bit p (bits past its end read as zero) */
static inline uint64_t bits_at(const uint8_t *s, int64_t nbytes, int64_t p) {
    int64_t b = p >> 3;
    uint64_t w = 0;
    if (b + 8 <= nbytes) {
        memcpy(&w, s + b, 8); /* little-endian hosts only (checked at import) */
    } else {
        for (int i = 0; i < 8 && b + i < nbytes; i++) w |= (uint64_t)s[b + i] << (8 * i);
    }
    return w >> (p & 7);
}

/* the w-bit field k of packed fields (the caller checked that k lies inside them) */
static inline int field_at(const uint8_t *sel, int64_t k, int w) {
    int64_t bit = k * w;
    return (sel[bit >> 3] >> (bit & 7)) & ((1 << w) - 1);
}

static inline int popcount64(uint64_t x) { return __builtin_popcountll(x); }

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

typedef struct {
    Py_buffer b;
    int held;
} Buf;

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].b);
}

static int get_buf(PyObject *o, Buf *out, int writable, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, &out->b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0) return -1;
    out->held = 1;
    if (out->b.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected, got %zd", what, itemsize, out->b.itemsize);
        return -1;
    }
    return 0;
}

static inline int64_t b_len_div(Py_ssize_t len, Py_ssize_t s) { return s > 0 ? len / s : 0; }

#define N_OF(buf) ((buf).b.len / (buf).b.itemsize)

/* far flags set per listed chunk: out[k] for chunk k (int64 [chunks]) */
static PyObject *far_counts(PyObject *self, PyObject *args) {
    PyObject *o_stream, *o_listed, *o_bits, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO", &o_stream, &o_listed, &o_bits, &o_out)) return NULL;
    Buf bufs[4];
    memset(bufs, 0, sizeof bufs);
    PyObject *ret = NULL;
    if (get_buf(o_stream, &bufs[0], 0, 1, "stream") || get_buf(o_listed, &bufs[1], 0, 8, "listed") ||
        get_buf(o_bits, &bufs[2], 0, 8, "bit_offsets") || get_buf(o_out, &bufs[3], 1, 8, "out"))
        goto done;
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
static PyObject *decode_compact_span(PyObject *self, PyObject *args) {
    PyObject *o[13];
    Py_ssize_t stream_bytes, ra, rb, cols;
    int width;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOnnnni", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12], &stream_bytes, &ra, &rb, &cols, &width))
        return NULL;
    static const Py_ssize_t sizes[13] = {1, 1, 4, 1, 8, 8, 8, 1, 8, 1, 1, 8, 8};
    static const char *names[13] = {"out",  "selectors",   "bases", "exceptions", "listed",     "bit_offsets", "lens",
                                    "raw",  "raw_offsets", "codes", "escaped",    "esc_before", "far_before"};
    Buf bufs[13];
    memset(bufs, 0, sizeof bufs);
    PyObject *ret = NULL;
    for (int i = 0; i < 13; i++)
        if (get_buf(o[i], &bufs[i], i == 0, sizes[i], names[i])) goto done;
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
    int32_t *idx = total ? malloc(sizeof(int32_t) * total) : NULL;
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
                x &= 0xFF;
                x = (x | x << 28) & 0x0000000F0000000Full;
                x = (x | x << 14) & 0x0003000300030003ull;
                v = (x | x << 7) & 0x0101010101010101ull;
            } else if (width == 2) {
                x &= 0xFFFF;
                x = (x | x << 24) & 0x000000FF000000FFull;
                x = (x | x << 12) & 0x000F000F000F000Full;
                v = (x | x << 6) & 0x0303030303030303ull;
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
                    idx[e + rank] = (int32_t)(base_idx + pos);
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


/* faults of decode_inline_span, in the numpy decoder's order (inline_native in inline.py's caller maps them) */
enum {
    I_HEADER = 1,   /* a {w}-bit tile header is impossible for {s}-byte records */
    I_WINDOW = 2,   /* a tile window leaves the byte range */
    I_UNUSED = 3,   /* a record's unused exception slots or padding are not zero */
    I_PAD_SEL = 4,  /* a padding slot's selector is not zero */
    I_POS = 5,      /* an exception position lies outside its tile */
    I_ORDER = 6,    /* exception positions are not strictly ascending */
    I_ON_PAD = 7,   /* an exception sits on padding or on a non-zero selector */
    I_REPEAT = 8,   /* an exception repeats a value its selector could express */
    I_RAW_IDX = 9,  /* a raw tile index points past the raw tiles */
    I_RAW_REC = 10, /* a raw tile's record holds bytes besides its header */
    I_RAW_PAD = 11, /* a raw tile stores non-zero bytes for padding slots */
    I_BOUNDS = 12,
};

#define INLINE_HEADER 4
#define INLINE_MAX_EXCEPTIONS 63

/* The inline decoder's span: records [a * count, b * count) of one column class into vals (uint8 [records of
the span, 128 cols], slot * cols + column order), every check of inline_np.decode_class_np in its order.

Arguments: vals, records (uint8 [R, s]), raw (uint8 [raw tiles, 128 cols]), base (int16 [blocks, 128]), valid
(bool [blocks, 128]), bmin, bmax (int64 [blocks]), caps (int64 [3]: the exception capacity of modes 0, 1, 2),
a, b, count, cols, s. Returns (fault, mode of the fault's records (3: raw), record index within the span). */
static PyObject *decode_inline_span(PyObject *self, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t ra, rb, count, cols, s;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnnnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &ra, &rb,
                          &count, &cols, &s))
        return NULL;
    static const Py_ssize_t sizes[8] = {1, 1, 1, 2, 1, 8, 8, 8};
    static const char *names[8] = {"vals", "records", "raw", "base", "valid", "bmin", "bmax", "caps"};
    Buf bufs[8];
    memset(bufs, 0, sizeof bufs);
    PyObject *ret = NULL;
    for (int i = 0; i < 8; i++)
        if (get_buf(o[i], &bufs[i], i == 0, sizes[i], names[i])) goto done;
    const int64_t size = 128 * (int64_t)cols;
    uint8_t *vals = bufs[0].b.buf;
    const uint8_t *rec = bufs[1].b.buf, *raw = bufs[2].b.buf, *valid = bufs[4].b.buf;
    const int16_t *base = bufs[3].b.buf;
    const int64_t *bmin = bufs[5].b.buf, *bmax = bufs[6].b.buf, *caps = bufs[7].b.buf;
    const int64_t blocks = N_OF(bufs[5]), n_rec = (b_len_div(bufs[1].b.len, s));
    const int64_t n_raw = size ? bufs[2].b.len / size : 0;
    const int64_t T = (rb - ra) * count;
    if (cols < 1 || cols > 4 || s < INLINE_HEADER || count < 0 || ra < 0 || rb < ra || rb > blocks ||
        rb * count > n_rec || N_OF(bufs[0]) != T * size || N_OF(bufs[3]) != blocks * 128 ||
        bufs[4].b.len != blocks * 128 || N_OF(bufs[6]) != blocks || N_OF(bufs[7]) != 3 || bufs[2].b.len % size) {
        PyErr_SetString(PyExc_ValueError, "decode_inline_span: inconsistent arguments");
        goto done;
    }
    int fault = OK, fmode = -1;
    int64_t where = -1;
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *r0 = rec + ra * count * s;
    for (int m = 0; m < 3 && fault == OK; m++) {
        const int w = 1 << m, top = (1 << w) - 1;
        const int64_t cap = caps[m], sb = size * w / 8;
        int any = 0;
        for (int64_t t = 0; t < T; t++) any |= (r0[t * s + s - 4] & 3) == m;
        if (!any) continue;
        if (cap < 0 || sb + 3 * cap > s - INLINE_HEADER) {
            fault = cap < 0 ? I_HEADER : I_BOUNDS, fmode = m;
            break;
        }
        /* headers, windows, unused bytes, padding selectors */
        int64_t first[5] = {-1, -1, -1, -1, -1};
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *r = r0 + t * s;
            uint32_t h = (uint32_t)r[s - 4] | (uint32_t)r[s - 3] << 8 | (uint32_t)r[s - 2] << 16 | (uint32_t)r[s - 1] << 24;
            if ((int)(h & 3) != m) continue;
            int64_t cnt = (h >> 2) & 63, blk = ra + t / count;
            int org = (int)(int8_t)(uint8_t)(h >> 8);
            if ((h >> 16) || cnt > cap) {
                if (first[1] < 0) first[1] = t;
                continue;
            }
            if (bmin[blk] + org < 0 || bmax[blk] + org + top > 255)
                if (first[2] < 0) first[2] = t;
            if (first[3] < 0) {
                const uint8_t *rest = r + sb;
                int64_t len = s - INLINE_HEADER - sb;
                for (int64_t k = 0; k < len; k++) {
                    int64_t slot = k < 2 * cap ? k / 2 : (k < 3 * cap ? k - 2 * cap : INLINE_MAX_EXCEPTIONS);
                    if (rest[k] && cnt <= slot) {
                        first[3] = t;
                        break;
                    }
                }
            }
            if (first[4] < 0) {
                const uint8_t *v = valid + blk * 128;
                for (int64_t q = 0; q < 128 && first[4] < 0; q++) {
                    if (v[q]) continue;
                    for (int64_t p = q * cols; p < (q + 1) * cols; p++)
                        if ((r[(p * w) >> 3] >> ((p * w) & 7)) & top) {
                            first[4] = t;
                            break;
                        }
                }
            }
        }
        for (int k = 1; k <= 4; k++)
            if (first[k] >= 0) {
                fault = k, fmode = m, where = first[k];
                break;
            }
        if (fault != OK) break;
        /* values: the window's low end plus the field, then the exceptions */
        int64_t ef[5] = {-1, -1, -1, -1, -1}; /* I_POS .. I_REPEAT, by fault - 4 */
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *r = r0 + t * s;
            uint32_t h = (uint32_t)r[s - 4] | (uint32_t)r[s - 3] << 8 | (uint32_t)r[s - 2] << 16 | (uint32_t)r[s - 1] << 24;
            if ((int)(h & 3) != m) continue;
            int64_t cnt = (h >> 2) & 63, blk = ra + t / count;
            uint8_t org = (uint8_t)(h >> 8);
            uint8_t *out = vals + t * size;
            const int16_t *bs = base + blk * 128;
            const uint8_t *v = valid + blk * 128;
            if (cols == 4) { /* a slot's four fields as one word */
                for (int64_t q = 0; q < 128; q++) {
                    uint32_t x = w == 4 ? (uint32_t)r[2 * q] | (uint32_t)r[2 * q + 1] << 8
                                        : (w == 2 ? r[q] : (uint32_t)(r[q >> 1] >> ((q & 1) << 2)) & 15);
                    uint32_t f;
                    if (w == 1)
                        f = (x & 1) | (x & 2) << 7 | (x & 4) << 14 | (x & 8) << 21;
                    else if (w == 2)
                        f = (x & 3) | (x & 12) << 6 | (x & 48) << 12 | (x & 192) << 18;
                    else
                        f = (x & 15) | (x & 0xF0) << 4 | (x & 0xF00) << 8 | (x & 0xF000) << 12;
                    f += (uint32_t)(uint8_t)((uint8_t)bs[q] + org) * 0x01010101u; /* fields + low end < 256 */
                    memcpy(out + 4 * q, &f, 4);
                }
            } else {
                for (int64_t q = 0; q < 128; q++) {
                    uint8_t lo8 = (uint8_t)((uint8_t)bs[q] + org);
                    for (int64_t p = q * cols; p < (q + 1) * cols; p++)
                        out[p] = (uint8_t)(((r[(p * w) >> 3] >> ((p * w) & 7)) & top) + lo8);
                }
            }
            int64_t prev = -1;
            for (int64_t k = 0; k < cnt; k++) {
                int64_t pos = (int64_t)r[sb + 2 * k] | (int64_t)r[sb + 2 * k + 1] << 8;
                uint8_t val = r[sb + 2 * cap + k];
                if (pos >= size) {
                    if (ef[1] < 0) ef[1] = t;
                    prev = INT64_MAX;
                    continue;
                }
                if (pos <= prev && ef[2] < 0) ef[2] = t;
                prev = pos;
                int fld = (r[(pos * w) >> 3] >> ((pos * w) & 7)) & top;
                if ((!v[pos / cols] || fld) && ef[3] < 0) ef[3] = t; /* a division an exception, not a scale */
                if ((uint8_t)(val - out[pos]) < (1 << w) && ef[4] < 0) ef[4] = t;
            }
            /* values written after every check of the record: positions are distinct once checked */
            for (int64_t k = 0; k < cnt; k++) {
                int64_t pos = (int64_t)r[sb + 2 * k] | (int64_t)r[sb + 2 * k + 1] << 8;
                if (pos < size) out[pos] = r[sb + 2 * cap + k];
            }
        }
        for (int k = 1; k <= 4; k++)
            if (ef[k] >= 0) {
                fault = 4 + k, fmode = m, where = ef[k];
                break;
            }
    }
    if (fault == OK) {
        int64_t rf[4] = {-1, -1, -1, -1};
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *r = r0 + t * s;
            uint32_t h = (uint32_t)r[s - 4] | (uint32_t)r[s - 3] << 8 | (uint32_t)r[s - 2] << 16 | (uint32_t)r[s - 1] << 24;
            if ((h & 3) != 3) continue;
            int64_t idx = h >> 2, blk = ra + t / count;
            if (idx >= n_raw) {
                if (rf[1] < 0) rf[1] = t;
                continue;
            }
            if (rf[2] < 0)
                for (int64_t k = 0; k < s - INLINE_HEADER; k++)
                    if (r[k]) {
                        rf[2] = t;
                        break;
                    }
            uint8_t *out = vals + t * size;
            memcpy(out, raw + idx * size, size);
            if (rf[3] < 0) {
                const uint8_t *v = valid + blk * 128;
                for (int64_t q = 0; q < 128 && rf[3] < 0; q++) {
                    if (v[q]) continue;
                    for (int64_t p = q * cols; p < (q + 1) * cols; p++)
                        if (out[p]) {
                            rf[3] = t;
                            break;
                        }
                }
            }
        }
        for (int k = 1; k <= 3; k++)
            if (rf[k] >= 0) {
                fault = 8 + k, fmode = 3, where = rf[k];
                break;
            }
    }
    Py_END_ALLOW_THREADS;
    ret = Py_BuildValue("(iiL)", fault, fmode, (long long)where);
done:
    release(bufs, 8);
    return ret;
}

/* Row bases (rowbase.py's rule): for each row of a uint8 [R, C] plane and each width w in widths, the smallest b
in [0, 256 - 2**w] that maximises the row's bytes in [b, b + 2**w - 1], into outs[i] (uint8 [R]), rows [a, b).
A row spanning fewer than 2**w values takes max(0, max - 2**w + 1); the others a sliding window over their
histogram, from the first window that reaches the row's minimum. */
static PyObject *row_bases(PyObject *self, PyObject *args) {
    PyObject *o_rows, *o_widths, *o_outs;
    Py_ssize_t ra, rb, cols;
    if (!PyArg_ParseTuple(args, "OOOnnn", &o_rows, &o_widths, &o_outs, &ra, &rb, &cols)) return NULL;
    Py_ssize_t nw = PySequence_Size(o_widths);
    if (nw < 0 || nw > 9 || PySequence_Size(o_outs) != nw) {
        PyErr_SetString(PyExc_ValueError, "row_bases: up to 9 widths, one output each");
        return NULL;
    }
    Buf bufs[10];
    memset(bufs, 0, sizeof bufs);
    int widths[9];
    uint8_t *outs[9];
    PyObject *ret = NULL;
    if (get_buf(o_rows, &bufs[0], 0, 1, "rows")) goto done;
    for (Py_ssize_t i = 0; i < nw; i++) {
        PyObject *wo = PySequence_GetItem(o_widths, i), *oo = PySequence_GetItem(o_outs, i);
        long w = wo ? PyLong_AsLong(wo) : -1;
        int bad = !oo || get_buf(oo, &bufs[1 + i], 1, 1, "out");
        Py_XDECREF(wo);
        Py_XDECREF(oo);
        if (bad) goto done;
        if (w < 0 || w > 8) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "row_bases: widths lie in [0, 8]");
            goto done;
        }
        widths[i] = (int)w;
        outs[i] = bufs[1 + i].b.buf;
        if (bufs[1 + i].b.len < rb) {
            PyErr_SetString(PyExc_ValueError, "row_bases: an output is shorter than the rows");
            goto done;
        }
    }
    if (ra < 0 || rb < ra || cols < 0 || rb * cols > bufs[0].b.len) {
        PyErr_SetString(PyExc_ValueError, "row_bases: rows out of range");
        goto done;
    }
    const uint8_t *x = bufs[0].b.buf;
    Py_BEGIN_ALLOW_THREADS;
    int32_t h[256], dc[256];
    uint8_t dv[256];
    memset(h, 0, sizeof h);
    for (int64_t r = ra; r < rb; r++) {
        const uint8_t *row = x + r * cols;
        if (cols == 0) {
            for (int i = 0; i < nw; i++) outs[i][r] = 0;
            continue;
        }
        int mn = 255, mx = 0;
        for (int64_t j = 0; j < cols; j++) {
            int v = row[j];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        int nd = -1; /* distinct values of the row, ascending, and their counts: once a row, when needed */
        for (int i = 0; i < nw; i++) {
            const int span = 1 << widths[i];
            if (mx - mn < span) {
                outs[i][r] = (uint8_t)(mx - span + 1 > 0 ? mx - span + 1 : 0);
                continue;
            }
            if (nd < 0) {
                for (int64_t j = 0; j < cols; j++) h[row[j]]++;
                nd = 0;
                for (int v = mn; v <= mx; v++) { /* branch-free: a row's values are unpredictable */
                    dv[nd] = (uint8_t)v;
                    dc[nd] = h[v];
                    nd += h[v] != 0;
                    h[v] = 0;
                }
            }
            /* the smallest maximising b is 0 or has a value at its window's top (else b - 1 held as many):
               b = 0 first, then b = v - span + 1 for each value v >= span - 1, ascending, by two pointers */
            int32_t best = 0, c = 0;
            int at = 0, left = 0;
            for (int j = 0; j < nd && dv[j] <= span - 1; j++) best += dc[j];
            for (int j = 0; j < nd; j++) {
                c += dc[j]; /* c: the counts of dv[left..j] */
                if (dv[j] < span - 1) continue;
                const int b = dv[j] - span + 1;
                while (dv[left] < b) c -= dc[left++];
                const int better = c > best;
                best = better ? c : best;
                at = better ? b : at;
            }
            outs[i][r] = (uint8_t)at;
        }
    }
    Py_END_ALLOW_THREADS;
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(bufs, 10);
    return ret;
}

/* Row bases from the compact form's 2-bit codes (0 same, 1 up, 2 down, 3 escaped: the next escaped base), as
compact_np.scan_bases_np: int32 [R] into out. The caller checked that the escapes are as many as the codes say. */
static PyObject *scan_bases(PyObject *self, PyObject *args) {
    PyObject *o_codes, *o_esc, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_codes, &o_esc, &o_out)) return NULL;
    Buf bufs[3];
    memset(bufs, 0, sizeof bufs);
    PyObject *ret = NULL;
    if (get_buf(o_codes, &bufs[0], 0, 1, "codes") || get_buf(o_esc, &bufs[1], 0, 1, "escapes") ||
        get_buf(o_out, &bufs[2], 1, 4, "out"))
        goto done;
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
static PyObject *decode_engine_span(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"scan_bases", scan_bases, METH_VARARGS, "scan_bases(codes, escapes, out): compact row bases from their codes"},
    {"row_bases", row_bases, METH_VARARGS, "row_bases(rows, widths, outs, a, b, cols): rowbase.py's rule"},
    {"decode_inline_span", decode_inline_span, METH_VARARGS, "the inline decoder's blocks [a, b): (fault, mode, at)"},
    {"far_counts", far_counts, METH_VARARGS, "far_counts(stream, listed, bit_offsets, out): far flags per chunk"},
    {"decode_compact_span", decode_compact_span, METH_VARARGS, "the compact decoder's rows [a, b): (fault, position)"},
    {"decode_engine_span", decode_engine_span, METH_VARARGS, "engine records of one class: (fault, tile)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "csf's codec loops in C", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "csf_codec._native supports little-endian hosts only");
        return NULL;
    }
    init_tables();
    return PyModule_Create(&module);
}
