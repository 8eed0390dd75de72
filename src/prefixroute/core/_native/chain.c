/* Chained block hashing: the compiled twin of BlockHasher._hash_bytes (core/hashing.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "hotpath.h"

#define XXH_INLINE_ALL /* the whole of xxHash in this translation unit: no library to link */
#include "vendor/xxhash.h"

/* --- chained block hashing --------------------------------------------------------------- */

PyDoc_STRVAR(chain_xxh3_doc,
"chain_xxh3(data, step, start, stop, chain) -> list[int]\n\n"
"Hashes of blocks start..stop-1 of data (step bytes each), each xxh3_64 seeded with the\n"
"previous block's hash, the first with chain.");

static PyObject *
chain_xxh3(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t step, start, stop;
    unsigned long long chain;
    if (!PyArg_ParseTuple(args, "y*nnnK", &buf, &step, &start, &stop, &chain))
        return NULL;
    if (step < 1 || start < 0 || stop < start || stop > buf.len / step) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "blocks out of the buffer's range");
        return NULL;
    }
    PyObject *out = PyList_New(stop - start);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const char *data = (const char *)buf.buf;
    XXH64_hash_t h = (XXH64_hash_t)chain;
    for (Py_ssize_t i = start; i < stop; i++) {
        h = XXH3_64bits_withSeed(data + i * step, (size_t)step, h);
        PyObject *value = PyLong_FromUnsignedLongLong(h);
        if (value == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&buf);
            return NULL;
        }
        PyList_SET_ITEM(out, i - start, value);
    }
    PyBuffer_Release(&buf);
    return out;
}

PyDoc_STRVAR(pack_u32_doc,
"pack_u32(ids) -> bytes | None\n\n"
"A list or tuple of ids, or a 1-d array of integers, as little-endian uint32 bytes, with\n"
"BlockHasher's errors (TypeError for a non-integer, OverflowError outside [0, 2**32));\n"
"None for anything else, which the Python path then converts.");

static inline void
put_le32(unsigned char *p, uint32_t x)
{
    p[0] = (unsigned char)x;
    p[1] = (unsigned char)(x >> 8);
    p[2] = (unsigned char)(x >> 16);
    p[3] = (unsigned char)(x >> 24);
}

static int
out_of_range(void)
{
    PyErr_SetString(PyExc_OverflowError, "token id does not fit in 32 bits");
    return -1;
}

/* Python ints (or anything with __index__, as array('I') takes numpy scalars) into p. */
static int
pack_items(PyObject **items, Py_ssize_t n, unsigned char *p)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        unsigned long x;
        if (PyLong_Check(v)) {
            x = PyLong_AsUnsignedLong(v);
        } else {
            PyObject *index = PyNumber_Index(v);
            if (index == NULL)
                return -1;
            x = PyLong_AsUnsignedLong(index);
            Py_DECREF(index);
        }
        if (x == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        if (x > 0xFFFFFFFFUL)
            return out_of_range();
        put_le32(p + 4 * i, (uint32_t)x);
    }
    return 0;
}

/* Bytes per element of a struct-module integer code; 0 for any other code. */
static int
int_size(char code)
{
    switch (code) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': return 4;
    case 'l': case 'L': return (int)sizeof(long);
    case 'q': case 'Q': return 8;
    default: return 0;
    }
}

/* The two dtypes prompts come in, little-endian on a little-endian machine, without the
 * byte-by-byte loop: uint32 is copied whole, int64 (numpy's default) range-checked and
 * narrowed. 1 when done (out cleared on an id out of range), 0 for the general loop. */
static int
packed_fast(const Py_buffer *buf, char code, Py_ssize_t n, unsigned char *p, PyObject **out)
{
    int size = int_size(code);
    if ((code == 'I' || code == 'L') && size == 4 && buf->strides[0] == 4) {
        memcpy(p, buf->buf, (size_t)n * 4);
        return 1;
    }
    if ((code != 'l' && code != 'q') || size != 8)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const char *)buf->buf + i * buf->strides[0], 8);
        if (v < 0 || v > 0xFFFFFFFFLL) {
            out_of_range();
            Py_CLEAR(*out);
            return 1;
        }
        uint32_t w = (uint32_t)v;
        memcpy(p + 4 * i, &w, 4);
    }
    return 1;
}

/* A 1-d integer array (numpy's buffer) into bytes; Py_None when it is not one. */
static PyObject *
pack_buffer(PyObject *obj)
{
    Py_buffer buf;
    if (PyObject_GetBuffer(obj, &buf, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const char *f = buf.format ? buf.format : "B";
    const uint16_t probe = 1;
    const int host_big = *(const unsigned char *)&probe == 0;
    int big = host_big; /* '@' and '=' are this machine's order */
    if (*f == '<' || *f == '>' || *f == '!' || *f == '=' || *f == '@') {
        big = *f == '>' || *f == '!' ? 1 : *f == '<' ? 0 : big;
        f++;
    }
    int size = int_size(f[0]);
    if (buf.ndim != 1 || size == 0 || f[1] != '\0') {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    int is_signed = f[0] >= 'a'; /* lower-case codes are the signed ones */
    Py_ssize_t n = buf.shape[0];
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    unsigned char *p = out == NULL ? NULL : (unsigned char *)PyBytes_AS_STRING(out);
    if (p != NULL && !big && !host_big && packed_fast(&buf, f[0], n, p, &out))
        goto done;
    for (Py_ssize_t i = 0; p != NULL && i < n; i++) {
        const unsigned char *src = (const unsigned char *)buf.buf + i * buf.strides[0];
        uint64_t u = 0;
        for (int k = 0; k < size; k++) /* assemble the value from its bytes, lowest first */
            u |= (uint64_t)src[big ? size - 1 - k : k] << (8 * k);
        int negative = is_signed && (u >> (8 * size - 1)) & 1;
        if (negative || u > 0xFFFFFFFFULL) {
            out_of_range();
            Py_CLEAR(out);
            break;
        }
        put_le32(p + 4 * i, (uint32_t)u);
    }
done:
    PyBuffer_Release(&buf);
    return out;
}

/* A tokenizer hands over a list of ints, a client maybe a numpy array: packing either here
 * is one pass, with no array object or range scans between (array('I', ids), or numpy's
 * min, max and astype). */
static PyObject *
pack_u32(PyObject *self, PyObject *ids)
{
    if (PyList_Check(ids) || PyTuple_Check(ids)) {
        PyObject *seq = PySequence_Fast(ids, "token ids");
        if (seq == NULL)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
        if (out != NULL &&
            pack_items(PySequence_Fast_ITEMS(seq), n, (unsigned char *)PyBytes_AS_STRING(out)) < 0)
            Py_CLEAR(out);
        Py_DECREF(seq);
        return out;
    }
    if (PyObject_CheckBuffer(ids))
        return pack_buffer(ids);
    Py_RETURN_NONE;
}

PyMethodDef chain_methods[] = {
    {"chain_xxh3", chain_xxh3, METH_VARARGS, chain_xxh3_doc},
    {"pack_u32", pack_u32, METH_O, pack_u32_doc},
    {NULL},
};
