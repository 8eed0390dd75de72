/* The open-addressing hash table under both compiled stores (table.h's LRU for lru.c,
 * kvpool.h's KV block pool for kvcache.c), written once.
 *
 * Linear probing with backward-shift deletion (no tombstones, so lookups never slow down as
 * keys come and go). Keys are already hashes, but tests and callers may use small integers, so
 * the home slot comes from a Fibonacci multiply, which spreads 1, 2, 3... as well as random keys.
 *
 * A template by macros, since C has no generics: define these, then include this file (once per
 * translation unit):
 *   OA_TABLE    the table struct: fields `slots` (OA_SLOT *) and `bits` (log2 of the slot count)
 *   OA_SLOT     its slot struct: fields `key` (uint64_t) and OA_FULL
 *   OA_FULL     the slot field that is 0 exactly when the slot is empty
 *   OA_COUNT    the table field counting live keys
 *   OA_NAME(x)  the name each function gets (a prefix keeps two tables apart)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if !defined(OA_TABLE) || !defined(OA_SLOT) || !defined(OA_FULL) || !defined(OA_COUNT) \
    || !defined(OA_NAME)
#error "define OA_TABLE, OA_SLOT, OA_FULL, OA_COUNT and OA_NAME before including oatable.h"
#endif

static inline size_t
OA_NAME(home)(const OA_TABLE *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - t->bits));
}

static inline size_t
OA_NAME(slot_mask)(const OA_TABLE *t)
{
    return ((size_t)1 << t->bits) - 1;
}

/* The slot holding key, or the empty slot where it would go. */
static inline OA_SLOT *
OA_NAME(probe)(const OA_TABLE *t, uint64_t key)
{
    size_t mask = OA_NAME(slot_mask)(t), i = OA_NAME(home)(t, key);
    while (t->slots[i].OA_FULL != 0 && t->slots[i].key != key)
        i = (i + 1) & mask;
    return &t->slots[i];
}

/* Rehash into 2**bits zeroed slots; -1 with MemoryError set (and the table unchanged). */
static inline int
OA_NAME(resize)(OA_TABLE *t, int bits)
{
    OA_SLOT *old = t->slots;
    size_t old_n = old == NULL ? 0 : (size_t)1 << t->bits;
    OA_SLOT *slots = PyMem_Calloc((size_t)1 << bits, sizeof(OA_SLOT));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->slots = slots;
    t->bits = bits;
    for (size_t i = 0; i < old_n; i++)
        if (old[i].OA_FULL != 0)
            *OA_NAME(probe)(t, old[i].key) = old[i];
    PyMem_Free(old);
    return 0;
}

/* A new Python object of `type` holding an empty table of 2**bits slots; NULL with an error
 * set. Its other fields are zero, as tp_alloc leaves them. */
static inline OA_TABLE *
OA_NAME(new_table)(PyTypeObject *type, int bits)
{
    OA_TABLE *t = (OA_TABLE *)type->tp_alloc(type, 0);
    if (t != NULL && OA_NAME(resize)(t, bits) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

/* Backward-shift deletion: pull later members of the probe run into the hole. */
static inline void
OA_NAME(delete_slot)(OA_TABLE *t, OA_SLOT *s)
{
    size_t mask = OA_NAME(slot_mask)(t), hole = (size_t)(s - t->slots), i = hole;
    for (;;) {
        i = (i + 1) & mask;
        if (t->slots[i].OA_FULL == 0)
            break;
        size_t h = OA_NAME(home)(t, t->slots[i].key);
        /* slot i may move to the hole unless its home lies cyclically in (hole, i] */
        if (((i - h) & mask) >= ((i - hole) & mask)) {
            t->slots[hole] = t->slots[i];
            hole = i;
        }
    }
    t->slots[hole].OA_FULL = 0;
    t->OA_COUNT--;
}

#ifndef PREFIXROUTE_OA_KEY_OF
#define PREFIXROUTE_OA_KEY_OF
/* A key from a Python int; 0 with an exception set when it is not one in [0, 2**64). */
static inline int
key_of(PyObject *obj, uint64_t *key)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "block hashes must be ints in [0, 2**64)");
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *key = (uint64_t)v;
    return 1;
}
#endif

/* Held means a key in the table; anything that is not a valid key is simply not held, as
 * `x in dict` is False for it. */
static inline int
OA_NAME(holds)(const OA_TABLE *t, PyObject *obj)
{
    uint64_t key;
    if (!key_of(obj, &key)) {
        PyErr_Clear();
        return 0;
    }
    return OA_NAME(probe)(t, key)->OA_FULL != 0;
}

#undef OA_TABLE
#undef OA_SLOT
#undef OA_FULL
#undef OA_COUNT
#undef OA_NAME
