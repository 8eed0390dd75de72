/* One replica's LRU: its layout and the open-addressing table under it (used by lru.c). */
#ifndef PREFIXROUTE_TABLE_H
#define PREFIXROUTE_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* --- one replica's LRU ------------------------------------------------------------------- *
 *
 * The same design as ReplicaLRU: every key has the tick of its last touch (one tick per
 * insert), and a FIFO of (key, tick) touches in insert order, each insert's chain tail first,
 * is consumed lazily by eviction: a touch evicts its key only if the key's stamp still equals
 * the touch's tick. The FIFO is one flat array instead of a deque of per-insert lists.
 *
 * The table is open addressing with linear probing and backward-shift deletion (no tombstones,
 * so lookups never slow down as keys come and go). Keys are already hashes, but tests and
 * callers may use small integers, so the home slot comes from a Fibonacci multiply, which
 * spreads 1, 2, 3... as well as random keys. A stamp is tick + 1 so that 0 can mark an empty
 * slot: every 64-bit key stays usable, 0 included.
 */

typedef struct {
    uint64_t key;
    uint64_t stamp; /* tick of the last touch + 1; 0: the slot is empty */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    int bits;            /* log2 of the slot count */
    size_t used;         /* live keys */
    Slot *queue;         /* touches in eviction order, [head, tail); stamp = tick + 1 */
    size_t head, tail, qcap;
    Py_ssize_t capacity; /* blocks; -1: unbounded, and then no queue is kept */
    uint64_t tick;       /* the next insert's tick */
    int gapped;          /* set by the index: prefix closure not guaranteed */
} LRU;

#define MIN_BITS 4
#define COMPACT_FACTOR 4   /* compact the FIFO once it holds this many times the live keys */
#define COMPACT_MIN 4096   /* ... plus this many touches (as ReplicaLRU does) */
#define PREFETCH_AHEAD 8   /* probes of a chain issued ahead of the one being written */

static inline size_t
home(const LRU *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - t->bits));
}

static inline size_t
slot_mask(const LRU *t)
{
    return ((size_t)1 << t->bits) - 1;
}

/* The slot holding key, or the empty slot where it would go. */
static inline Slot *
probe(const LRU *t, uint64_t key)
{
    size_t mask = slot_mask(t), i = home(t, key);
    while (t->slots[i].stamp != 0 && t->slots[i].key != key)
        i = (i + 1) & mask;
    return &t->slots[i];
}

static inline int
resize(LRU *t, int bits)
{
    Slot *old = t->slots;
    size_t old_n = old == NULL ? 0 : (size_t)1 << t->bits;
    Slot *slots = PyMem_Calloc((size_t)1 << bits, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->slots = slots;
    t->bits = bits;
    for (size_t i = 0; i < old_n; i++)
        if (old[i].stamp != 0)
            *probe(t, old[i].key) = old[i];
    PyMem_Free(old);
    return 0;
}

/* Room for `more` new keys at a load of at most 0.7 (probes stay short). */
static inline int
reserve(LRU *t, size_t more)
{
    int bits = t->bits;
    while ((t->used + more) * 10 > ((size_t)7 << bits))
        bits++;
    return bits == t->bits ? 0 : resize(t, bits);
}

/* Backward-shift deletion: pull later members of the probe run into the hole. */
static inline void
delete_slot(LRU *t, Slot *s)
{
    size_t mask = slot_mask(t), hole = (size_t)(s - t->slots), i = hole;
    for (;;) {
        i = (i + 1) & mask;
        if (t->slots[i].stamp == 0)
            break;
        size_t h = home(t, t->slots[i].key);
        /* slot i may move to the hole unless its home lies cyclically in (hole, i] */
        if (((i - h) & mask) >= ((i - hole) & mask)) {
            t->slots[hole] = t->slots[i];
            hole = i;
        }
    }
    t->slots[hole].stamp = 0;
    t->used--;
}

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

/* Held means a key in the table; anything that is not a valid key is simply not held,
 * as `x in dict` is False for it. */
static inline int
holds(const LRU *t, PyObject *obj)
{
    uint64_t key;
    if (!key_of(obj, &key)) {
        PyErr_Clear();
        return 0;
    }
    return probe(t, key)->stamp != 0;
}

#endif
