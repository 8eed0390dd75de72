/* Matching one chain of block hashes against LRUs (lru.c: one; lrus.c: many at once): the
 * chain's keys read once, and the longest held prefix found by binary search. Static inline, as
 * in oatable.h: each file that includes it gets its own copy. */
#ifndef PREFIXROUTE_MATCH_H
#define PREFIXROUTE_MATCH_H

#include "glue.h"
#include "table.h"

/* A chain being matched: its hashes' keys, each converted on first use and kept for the next
 * LRU. A decision matches one chain against every candidate's LRU, and their binary searches
 * probe mostly the same blocks, so each block's int is read once, not once per replica. */
typedef struct {
    PyObject **items;
    uint64_t *keys;
    unsigned char *state; /* per block: 0 not read yet, 1 a key, 2 not a key (never held) */
    int owned;            /* keys and state were allocated (the chain did not fit the buffer) */
} Chain;

/* A caller's buffer on its stack for a chain of up to CHAIN_BUF_BLOCKS blocks (8k tokens in
 * 16-token blocks, 4.5 KiB): the chains of most decisions are matched with no allocation. */
#define CHAIN_BUF_BLOCKS 512
typedef struct {
    uint64_t keys[CHAIN_BUF_BLOCKS];
    unsigned char state[CHAIN_BUF_BLOCKS];
} ChainBuf;

/* 0 with MemoryError set. A chain that fits `buf` uses it; a longer one allocates. */
static inline int
chain_open(Chain *c, PyObject **items, Py_ssize_t n, ChainBuf *buf)
{
    size_t m = (size_t)(n ? n : 1);
    c->items = items;
    c->owned = m > CHAIN_BUF_BLOCKS;
    if (!c->owned) {
        c->keys = buf->keys;
        c->state = buf->state;
    }
    else {
        c->keys = PyMem_Malloc(m * (sizeof(uint64_t) + 1));
        if (c->keys == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        c->state = (unsigned char *)(c->keys + m);
    }
    memset(c->state, 0, m);
    return 1;
}

static inline void
chain_close(Chain *c)
{
    if (c->owned)
        PyMem_Free(c->keys);
}

/* A chain's key i, converted on first use; 0 when it is not a key (never held). */
static inline int
chain_key(Chain *c, Py_ssize_t i, uint64_t *key)
{
    if (c->state[i] == 0) {
        if (key_of(c->items[i], &c->keys[i]))
            c->state[i] = 1;
        else {
            PyErr_Clear();
            c->state[i] = 2;
        }
    }
    *key = c->keys[i];
    return c->state[i] == 1;
}

/* Whether t holds block i of the chain; anything that is not a valid key is simply not held,
 * as `x in dict` is False for it (holds() in oatable.h). */
static inline int
chain_holds(const LRU *t, Chain *c, Py_ssize_t i)
{
    uint64_t key;
    return chain_key(c, i, &key) && probe(t, key)->stamp != 0;
}

/* Blocks of the chain held, counted from the first, given the first `known` (>= 1) are held:
 * a linear walk when gapped, else binary search (the held blocks are a prefix). */
static inline Py_ssize_t
held_run(const LRU *t, Chain *c, Py_ssize_t n, Py_ssize_t known)
{
    if (t->gapped) {
        Py_ssize_t m = known;
        while (m < n && chain_holds(t, c, m))
            m++;
        return m;
    }
    if (chain_holds(t, c, n - 1))
        return n;
    Py_ssize_t lo = known, hi = n - 1; /* block lo - 1 is held, block hi is not */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (chain_holds(t, c, mid))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ReplicaLRU.match: the chain's blocks held from the first, given the first `known` are. */
static inline Py_ssize_t
chain_match(const LRU *t, Chain *c, Py_ssize_t n, Py_ssize_t known)
{
    if (known > n)
        known = n;
    if (n == 0 || (known < 1 && !chain_holds(t, c, 0)))
        return 0;
    return held_run(t, c, n, known >= 1 ? known : 1);
}

#endif
