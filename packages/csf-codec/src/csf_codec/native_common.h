/* The C extension csf_codec._native, split by job into native_*.c (one module: native_module.c holds its method
table), and what those files share: buffer arguments, the byte tables, bit-stream reads.

Every function takes contiguous buffers (numpy arrays through the buffer protocol), checks their sizes
against what it will index, releases the GIL for its loops, and reports a fault as a small integer code
(and the position where it was found) that the Python wrapper turns into the numpy path's typed error and
message. Reads of payload bytes are bounds-checked: a corrupt payload never reads outside its buffers.

Bit streams are LSB first: bit i is bit i % 8 of byte i / 8.
*/
#ifndef CSF_NATIVE_COMMON_H
#define CSF_NATIVE_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256
#define ESCAPE_CODE 7
#define MAX_LISTED 254

enum { OK = 0 }; /* every entry's fault code for "decoded" */

/* byte tables, filled once at import (native_module.c) */
extern int LOW_BITS[CHUNK + 1];      /* the Elias-Fano low-part width of n positions in a chunk */
extern long LISTED_BITS[CHUNK + 1];  /* the bits of a listed chunk of n exceptions, flags included */
extern uint64_t UNPACK1[256]; /* a byte's fields as the bytes they unpack to (little-endian) */
extern uint32_t UNPACK2[256];
extern uint16_t UNPACK4[256];

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

/* size fields (uint8, one a byte, < 2**w; size a multiple of 8) into packed w-bit fields, LSB first: field p at
bit p * w (w: 1, 2 or 4) */
static inline void pack_fields(const uint8_t *fld, int64_t size, int w, uint8_t *sel) {
    if (w == 1) {
        for (int64_t i = 0; i < size / 8; i++) {
            uint64_t x;
            memcpy(&x, fld + 8 * i, 8);
            sel[i] = (uint8_t)((x * 0x0102040810204080ull) >> 56); /* byte k's bit 0 to bit 56 + k: no carries */
        }
    } else if (w == 2) {
        for (int64_t i = 0; i < size / 4; i++) {
            uint32_t x;
            memcpy(&x, fld + 4 * i, 4);
            sel[i] = (uint8_t)((x & 3) | ((x >> 6) & 0xC) | ((x >> 12) & 0x30) | ((x >> 18) & 0xC0));
        }
    } else {
        for (int64_t i = 0; i < size / 2; i++) sel[i] = (uint8_t)(fld[2 * i] | fld[2 * i + 1] << 4);
    }
}

/* inline: without -mpopcnt, __builtin_popcountll is a call into libgcc */
static inline int popcount64(uint64_t x) {
#if defined(__POPCNT__) || !defined(__x86_64__)
    return __builtin_popcountll(x);
#else
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}

typedef struct {
    Py_buffer b;
    int held;
} Buf;

void release(Buf *bufs, int n);
int get_buf(PyObject *o, Buf *out, int writable, Py_ssize_t itemsize, const char *what);
/* an entry's n buffer arguments: o[i] into bufs[i] (zeroed first) as items of sizes[i] bytes, writable where bit i
of writable is set; -1 with the exception set on the first that is not (bufs is released by the caller, always) */
int get_bufs(PyObject *const *o, Buf *bufs, int n, const Py_ssize_t *sizes, const char *const *names,
             unsigned writable);

static inline int64_t b_len_div(Py_ssize_t len, Py_ssize_t s) { return s > 0 ? len / s : 0; }

#define N_OF(buf) ((buf).b.len / (buf).b.itemsize)

/* the module's entries, by file */
PyObject *far_counts(PyObject *self, PyObject *args);          /* native_compact.c */
PyObject *decode_compact_span(PyObject *self, PyObject *args); /* native_compact.c */
PyObject *scan_bases(PyObject *self, PyObject *args);          /* native_compact.c */
PyObject *compact_rows(PyObject *self, PyObject *args);        /* native_compact_encode.c */
PyObject *encode_compact_span(PyObject *self, PyObject *args); /* native_compact_span.c */
PyObject *decode_inline_span(PyObject *self, PyObject *args);  /* native_inline.c */
PyObject *level_counts(PyObject *self, PyObject *args);        /* native_inline_encode.c */
PyObject *row_bases(PyObject *self, PyObject *args);           /* native_rowbase.c */
PyObject *decode_engine_rows(PyObject *self, PyObject *args);  /* native_engine_decode.c */
PyObject *encode_engine_rows(PyObject *self, PyObject *args);  /* native_engine_encode.c */

#endif
