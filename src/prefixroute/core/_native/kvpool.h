/* The simulator's KV block pool: its layout, table, node pool and chain operations, on C
 * values (kvcache.c wraps them for Python). Design notes at the top of kvcache.c. */
#ifndef PREFIXROUTE_KVPOOL_H
#define PREFIXROUTE_KVPOOL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define NONE ((int64_t)-1)

typedef struct {
    uint64_t key;
    int64_t refs;       /* running requests pinning it; 0: idle, in the LRU */
    int64_t prev, next; /* idle list (oldest first), or the free-node list (next only) */
    int idle;           /* linked in the idle list */
} Node;

typedef struct {
    uint64_t key;
    int64_t node; /* node index + 1; 0: empty */
} KSlot;

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity, free, evictions;
    char record_events; /* a char: T_BOOL reads one */
    PyObject *stored, *removed; /* lists of hashes since the last drain */
    KSlot *slots;
    int bits;
    Py_ssize_t cached; /* keys in the table */
    Node *nodes;
    int64_t ncap, nused, free_node; /* nodes allocated, ever handed out, free-list head */
    int64_t head, tail;             /* idle list: oldest, newest */
    Py_ssize_t idle_count;
} KV;

#define OA_TABLE KV
#define OA_SLOT KSlot
#define OA_FULL node
#define OA_COUNT cached
#define OA_NAME(x) k##x
#include "oatable.h"

static inline Node *
find(const KV *t, uint64_t key)
{
    KSlot *s = kprobe(t, key);
    return s->node ? &t->nodes[s->node - 1] : NULL;
}

/* The cached node of a hash, or NULL with KeyError set (as the reference's dict raises). */
static Node *
need(const KV *t, PyObject *obj)
{
    uint64_t key;
    if (!key_of(obj, &key))
        return NULL;
    Node *n = find(t, key);
    if (n == NULL)
        PyErr_SetObject(PyExc_KeyError, obj);
    return n;
}

static void
unlink_idle(KV *t, Node *n)
{
    if (n->prev == NONE)
        t->head = n->next;
    else
        t->nodes[n->prev].next = n->next;
    if (n->next == NONE)
        t->tail = n->prev;
    else
        t->nodes[n->next].prev = n->prev;
    n->idle = 0;
    t->idle_count--;
}

static void
append_idle(KV *t, Node *n)
{
    int64_t i = n - t->nodes;
    n->prev = t->tail;
    n->next = NONE;
    if (t->tail == NONE)
        t->head = i;
    else
        t->nodes[t->tail].next = i;
    t->tail = i;
    n->idle = 1;
    t->idle_count++;
}

/* Cache key with one user; the caller checked it is not cached. 0 with an error set. */
static int
insert(KV *t, uint64_t key)
{
    if ((size_t)(t->cached + 1) * 2 > ((size_t)1 << t->bits) && kresize(t, t->bits + 1) < 0)
        return 0;
    int64_t i = t->free_node;
    if (i != NONE) {
        t->free_node = t->nodes[i].next;
    } else {
        if (t->nused == t->ncap) {
            int64_t cap = t->ncap ? t->ncap * 2 : 64;
            Node *nodes = PyMem_Realloc(t->nodes, (size_t)cap * sizeof(Node));
            if (nodes == NULL) {
                PyErr_NoMemory();
                return 0;
            }
            t->nodes = nodes;
            t->ncap = cap;
        }
        i = t->nused++;
    }
    Node *n = &t->nodes[i];
    n->key = key;
    n->refs = 1;
    n->prev = n->next = NONE;
    n->idle = 0;
    KSlot *s = kprobe(t, key);
    s->key = key;
    s->node = i + 1;
    t->cached++;
    return 1;
}

/* Drop the oldest idle block (there is one); 0 with an error set if recording it failed. */
static int
evict_oldest(KV *t)
{
    Node *n = &t->nodes[t->head];
    uint64_t key = n->key;
    unlink_idle(t, n);
    kdelete_slot(t, kprobe(t, key));
    n->next = t->free_node;
    t->free_node = n - t->nodes;
    t->evictions++;
    if (!t->record_events)
        return 1;
    PyObject *v = PyLong_FromUnsignedLongLong(key);
    if (v == NULL)
        return 0;
    int rc = PyList_Append(t->removed, v);
    Py_DECREF(v);
    return rc == 0;
}

static Py_ssize_t
available(const KV *t)
{
    return t->free + t->idle_count;
}

#define STACK_KEYS 512 /* keys converted on the stack; a longer chain takes a heap array */

/* The keys of items[0..n) into `keys` (buf, or a heap array the caller frees when it is not
 * buf), each one's home slot prefetched so the probes that follow overlap their cache misses.
 * Returns how many were converted: fewer than n at the first item that is not a valid key (its
 * error set, or cleared when `lenient`: then it is simply not cached), -1 out of memory. */
static Py_ssize_t
convert(const KV *t, PyObject **items, Py_ssize_t n, uint64_t *buf, uint64_t **keys, int lenient)
{
    *keys = buf;
    if (n > STACK_KEYS && (*keys = PyMem_Malloc((size_t)n * sizeof(uint64_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!key_of(items[i], &(*keys)[i])) {
            if (lenient)
                PyErr_Clear();
            return i;
        }
        __builtin_prefetch(&t->slots[khome(t, (*keys)[i])]);
    }
    return n;
}

/* --- whole operations, as the reference's methods ---------------------------------------- */

/* The two chain operations below have one signature, so that kvcache.c reads a Python
 * sequence into items for both the same way (over_hashes). */

/* Idle blocks among hashes (all cached): -1 with KeyError set otherwise. */
static Py_ssize_t
count_idle(KV *t, PyObject **items, Py_ssize_t n)
{
    Py_ssize_t idle = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Node *node = need(t, items[i]);
        if (node == NULL)
            return -1;
        idle += node->refs == 0;
    }
    return idle;
}

/* A request starts using these cached blocks: n, or -1 with KeyError set at the first one
 * not cached (the ones before it stay pinned, as in the reference). */
static Py_ssize_t
pin_all(KV *t, PyObject **items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Node *node = need(t, items[i]);
        if (node == NULL)
            return -1;
        if (node->refs == 0 && node->idle)
            unlink_idle(t, node);
        node->refs++;
    }
    return n;
}

static int
take(KV *t, Py_ssize_t n)
{
    if (n > available(t)) {
        PyErr_Format(PyExc_ValueError, "need %zd blocks, %zd available", n, available(t));
        return 0;
    }
    Py_ssize_t from_free = n < t->free ? n : t->free;
    t->free -= from_free;
    for (Py_ssize_t i = 0; i < n - from_free; i++)
        if (!evict_oldest(t))
            return 0;
    return 1;
}

/* Register one hash: 1 new, 0 already cached, -1 error. */
static int
register_one(KV *t, PyObject *obj)
{
    uint64_t key;
    if (!key_of(obj, &key))
        return -1;
    if (find(t, key) != NULL)
        return 0;
    if (!insert(t, key))
        return -1;
    if (t->record_events && PyList_Append(t->stored, obj) < 0)
        return -1;
    return 1;
}

static int
release(KV *t, PyObject **items, Py_ssize_t n)
{
    uint64_t buf[STACK_KEYS], *keys;
    Py_ssize_t m = convert(t, items, n, buf, &keys, 0), i = n - 1;
    for (; m == n && i >= 0; i--) {
        Node *node = find(t, keys[i]);
        if (node == NULL) {
            PyErr_SetObject(PyExc_KeyError, items[i]);
            break;
        }
        if (--node->refs == 0 && !node->idle)
            append_idle(t, node);
    }
    if (keys != buf)
        PyMem_Free(keys);
    return m == n && i < 0;
}

/* acquire's walk: the leading cached blocks of keys[0..m), each key replaced by its node's
 * index; returns how many. */
static Py_ssize_t
cached_run(const KV *t, uint64_t *keys, Py_ssize_t m)
{
    Py_ssize_t hit = 0;
    for (; hit < m; hit++) {
        Node *node = find(t, keys[hit]);
        if (node == NULL)
            break;
        keys[hit] = (uint64_t)(node - t->nodes);
    }
    return hit;
}

#endif
