/* The inline decoder's loop: the records of a span (inline_decode_c.py). */
#include "native_common.h"

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
PyObject *decode_inline_span(PyObject *self, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t ra, rb, count, cols, s;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnnnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &ra, &rb,
                          &count, &cols, &s))
        return NULL;
    static const Py_ssize_t sizes[8] = {1, 1, 1, 2, 1, 8, 8, 8};
    static const char *const names[8] = {"vals", "records", "raw", "base", "valid", "bmin", "bmax", "caps"};
    Buf bufs[8];
    PyObject *ret = NULL;
    if (get_bufs(o, bufs, 8, sizes, names, 1u << 0)) goto done;
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
