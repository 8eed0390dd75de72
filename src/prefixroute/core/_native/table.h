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
 * The table is oatable.h's open addressing. A stamp is tick + 1 so that 0 can mark an empty
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

#define OA_TABLE LRU
#define OA_SLOT Slot
#define OA_FULL stamp
#define OA_COUNT used
#define OA_NAME(x) x
#include "oatable.h"

/* Room for `more` new keys at a load of at most 0.7 (probes stay short). */
static inline int
reserve(LRU *t, size_t more)
{
    int bits = t->bits;
    while ((t->used + more) * 10 > ((size_t)7 << bits))
        bits++;
    return bits == t->bits ? 0 : resize(t, bits);
}

#endif
