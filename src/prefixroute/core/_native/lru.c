/* One replica's LRU: the compiled twin of ReplicaLRU (core/_lru.py); design in table.h. */
#include "glue.h"
#include "hotpath.h"
#include "table.h"

/* Drop the stale touches (a later touch restamped their key), keeping the order: only memory
 * changes, never what is evicted. */
static void
compact(LRU *t)
{
    size_t out = 0;
    for (size_t i = t->head; i < t->tail; i++) {
        Slot q = t->queue[i];
        if (probe(t, q.key)->stamp == q.stamp)
            t->queue[out++] = q; /* still the key's latest touch: keep it, in order */
    }
    t->head = 0;
    t->tail = out;
}

static int
queue_room(LRU *t, size_t n)
{
    if (t->tail + n <= t->qcap)
        return 0;
    compact(t);
    if (t->tail + n <= t->qcap)
        return 0;
    size_t cap = t->qcap ? t->qcap : 1024;
    while (cap < t->tail + n)
        cap *= 2;
    Slot *q = PyMem_Realloc(t->queue, cap * sizeof(Slot));
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->queue = q;
    t->qcap = cap;
    return 0;
}

static Py_ssize_t
evict(LRU *t)
{
    Py_ssize_t evicted = 0;
    while ((Py_ssize_t)t->used > t->capacity && t->head < t->tail) {
        Slot q = t->queue[t->head++];
        Slot *s = probe(t, q.key);
        if (s->stamp == q.stamp) {
            delete_slot(t, s);
            evicted++;
        }
    }
    if (t->head == t->tail)
        t->head = t->tail = 0;
    return evicted;
}

/* Stamp keys[0..n) (already tail first) with this insert's tick. */
static void
stamp_all(LRU *t, const uint64_t *keys, size_t n, uint64_t stamp)
{
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(&t->slots[home(t, keys[i + PREFETCH_AHEAD])], 1);
        Slot *s = probe(t, keys[i]);
        if (s->stamp == 0) {
            s->key = keys[i];
            t->used++;
        }
        s->stamp = stamp;
    }
}

static PyObject *
LRU_touch(LRU *t, PyObject *hashes)
{
    Hashes h;
    if (!hashes_open(&h, hashes))
        return NULL;
    Py_ssize_t n = h.n;
    uint64_t *keys = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (keys == NULL) {
        hashes_close(&h);
        return PyErr_NoMemory();
    }
    /* Convert everything before changing anything: a bad hash leaves the LRU as it was. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!key_of(h.items[n - 1 - i], &keys[i])) {
            PyMem_Free(keys);
            hashes_close(&h);
            return NULL;
        }
    }
    hashes_close(&h);
    Py_ssize_t evicted = 0;
    if (n == 0)
        goto done;
    uint64_t stamp = ++t->tick; /* tick t->tick - 1, stored + 1 */
    if (reserve(t, (size_t)n) < 0 || (t->capacity >= 0 && queue_room(t, (size_t)n) < 0)) {
        PyMem_Free(keys);
        return NULL;
    }
    stamp_all(t, keys, (size_t)n, stamp);
    if (t->capacity < 0)
        goto done; /* nothing will ever be evicted: no need to remember the order */
    for (Py_ssize_t i = 0; i < n; i++) {
        t->queue[t->tail].key = keys[i];
        t->queue[t->tail++].stamp = stamp;
    }
    evicted = evict(t);
    if (t->tail - t->head > COMPACT_FACTOR * t->used + COMPACT_MIN)
        compact(t);
done:
    PyMem_Free(keys);
    return PyLong_FromSsize_t(evicted);
}

static PyObject *
LRU_discard(LRU *t, PyObject *obj)
{
    uint64_t key;
    if (!key_of(obj, &key)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Slot *s = probe(t, key);
    if (s->stamp == 0)
        Py_RETURN_FALSE;
    delete_slot(t, s);
    Py_RETURN_TRUE;
}

/* A bounded LRU takes a new capacity; entries beyond it go, least recently touched first. */
static PyObject *
LRU_resize(LRU *t, PyObject *arg)
{
    Py_ssize_t c = PyLong_AsSsize_t(arg);
    if (c == -1 && PyErr_Occurred())
        return NULL;
    if (c < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity must be at least 1 block");
        return NULL;
    }
    if (t->capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "an unbounded LRU keeps no order to resize by");
        return NULL;
    }
    t->capacity = c;
    return PyLong_FromSsize_t(evict(t));
}

/* A chain being matched: its hashes' keys, each converted on first use and kept for the next
 * LRU. A decision matches one chain against every candidate's LRU, and their binary searches
 * probe mostly the same blocks, so each block's int is read once, not once per replica. */
typedef struct {
    PyObject **items;
    uint64_t *keys;
    unsigned char *state; /* per block: 0 not read yet, 1 a key, 2 not a key (never held) */
} Chain;

/* 0 with MemoryError set. */
static int
chain_open(Chain *c, PyObject **items, Py_ssize_t n)
{
    size_t m = (size_t)(n ? n : 1);
    c->items = items;
    c->keys = PyMem_Malloc(m * (sizeof(uint64_t) + 1));
    if (c->keys == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    c->state = (unsigned char *)(c->keys + m);
    memset(c->state, 0, m);
    return 1;
}

static void
chain_close(Chain *c)
{
    PyMem_Free(c->keys);
}

/* Whether t holds block i of the chain; anything that is not a valid key is simply not held,
 * as `x in dict` is False for it (holds() in oatable.h). */
static inline int chain_key(Chain *c, Py_ssize_t i, uint64_t *key);

static inline int
chain_holds(const LRU *t, Chain *c, Py_ssize_t i)
{
    uint64_t key;
    return chain_key(c, i, &key) && probe(t, key)->stamp != 0;
}

/* Blocks of the chain held, counted from the first, given the first `known` (>= 1) are held:
 * a linear walk when gapped, else binary search (the held blocks are a prefix). */
static Py_ssize_t
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
static Py_ssize_t
chain_match(const LRU *t, Chain *c, Py_ssize_t n, Py_ssize_t known)
{
    if (known > n)
        known = n;
    if (n == 0 || (known < 1 && !chain_holds(t, c, 0)))
        return 0;
    return held_run(t, c, n, known >= 1 ? known : 1);
}

static PyObject *
LRU_match(LRU *t, PyObject *args)
{
    Hashes h;
    Chain c;
    Py_ssize_t known = 0;
    if (!hashes_args(args, "O|n:match", &h, &known, NULL))
        return NULL;
    if (!chain_open(&c, h.items, h.n)) {
        hashes_close(&h);
        return NULL;
    }
    Py_ssize_t m = chain_match(t, &c, h.n, known);
    chain_close(&c);
    hashes_close(&h);
    return PyLong_FromSsize_t(m);
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

/* One LRU's match in progress, for match_all: the block it probes next (`at`), the bounds of
 * its binary search, and where it is in chain_match's steps. */
typedef struct {
    const LRU *t;
    Py_ssize_t at, lo, hi;
    Py_ssize_t place; /* its LRU's place in match_all's answers */
    int step;         /* FIRST, LAST, SEARCH, then DONE with the answer in lo */
} Search;

enum { FIRST, LAST, SEARCH, DONE };

/* Search s's next probe: set `at`, or DONE. */
static inline void
search_next(Search *s, Py_ssize_t n)
{
    if (s->step == SEARCH) {
        if (s->lo < s->hi)
            s->at = (s->lo + s->hi) >> 1;
        else
            s->step = DONE;
    }
    else if (s->step == LAST)
        s->at = n - 1;
}

/* Search s's probe answered: held or not. */
static inline void
search_answer(Search *s, Py_ssize_t n, int held)
{
    switch (s->step) {
    case FIRST:
        s->step = held ? LAST : DONE;
        s->lo = 0;
        break;
    case LAST:
        if (held) {
            s->step = DONE;
            s->lo = n;
        }
        else {
            s->step = SEARCH;
            s->lo = 1;
            s->hi = n - 1;
        }
        break;
    default: /* SEARCH */
        if (held)
            s->lo = s->at + 1;
        else
            s->hi = s->at;
    }
}

/* chain_match(t, c, n, 0) of every LRU in ts[k] into out[k], the binary searches run side by
 * side: each round prefetches every search's next slot, then probes them all. The tables are
 * megabytes each and every probe is a cache miss; run one after another, a decision at 16
 * replicas waits for a hundred of them in a row, side by side for about one per round. */
static void
match_all(LRU **ts, Py_ssize_t k, Chain *c, Py_ssize_t n, Py_ssize_t *out)
{
    Search one[64];
    Search *ss = k <= 64 ? one : PyMem_Malloc((size_t)k * sizeof(Search));
    if (ss == NULL) { /* no room to run them side by side: one after another */
        for (Py_ssize_t i = 0; i < k; i++)
            out[i] = ts[i] == NULL ? 0 : chain_match(ts[i], c, n, 0);
        return;
    }
    Py_ssize_t live = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        out[i] = 0;
        if (ts[i] == NULL || n == 0)
            continue;
        if (ts[i]->gapped) { /* a linear walk: no search to interleave */
            out[i] = chain_match(ts[i], c, n, 0);
            continue;
        }
        ss[live++] = (Search){.t = ts[i], .at = 0, .place = i, .step = FIRST};
    }
    while (live > 0) {
        for (Py_ssize_t j = 0; j < live; j++) {
            uint64_t key;
            if (chain_key(c, ss[j].at, &key))
                __builtin_prefetch(&ss[j].t->slots[home(ss[j].t, key)]);
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t j = 0; j < live; j++) {
            Search s = ss[j];
            search_answer(&s, n, chain_holds(s.t, c, s.at));
            search_next(&s, n);
            if (s.step == DONE)
                out[s.place] = s.lo;
            else
                ss[kept++] = s;
        }
        live = kept;
    }
    if (ss != one)
        PyMem_Free(ss);
}

/* match_each(lrus, block_hashes): [lru.match(block_hashes) for lru in lrus], 0 for None, in one
 * call: one C loop instead of a method call per replica, each block's int read once, and the
 * replicas' searches side by side (match_all). */
static PyObject *
match_each(PyObject *module, PyObject *args)
{
    PyObject *lrus_obj, *hashes_obj;
    if (!PyArg_ParseTuple(args, "OO:match_each", &lrus_obj, &hashes_obj))
        return NULL;
    PyObject *lrus = PySequence_Fast(lrus_obj, "LRUs must be a sequence");
    if (lrus == NULL)
        return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(lrus);
    PyObject **each = PySequence_Fast_ITEMS(lrus);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (each[i] != Py_None && !PyObject_TypeCheck(each[i], &LRU_type)) {
            PyErr_SetString(PyExc_TypeError, "match_each takes compiled LRUs or None");
            Py_DECREF(lrus);
            return NULL;
        }
    }
    Hashes h;
    Chain c;
    PyObject *out = NULL;
    LRU **ts = PyMem_Malloc((size_t)(k ? k : 1) * (sizeof(LRU *) + sizeof(Py_ssize_t)));
    if (ts == NULL) {
        Py_DECREF(lrus);
        return PyErr_NoMemory();
    }
    Py_ssize_t *found = (Py_ssize_t *)(ts + k);
    for (Py_ssize_t i = 0; i < k; i++)
        ts[i] = each[i] == Py_None ? NULL : (LRU *)each[i];
    if (hashes_open(&h, hashes_obj)) {
        if (chain_open(&c, h.items, h.n)) {
            match_all(ts, k, &c, h.n, found);
            chain_close(&c);
            out = PyList_New(k);
            for (Py_ssize_t i = 0; out != NULL && i < k; i++) {
                PyObject *v = PyLong_FromSsize_t(found[i]);
                if (v == NULL)
                    Py_CLEAR(out);
                else
                    PyList_SET_ITEM(out, i, v);
            }
        }
        hashes_close(&h);
    }
    PyMem_Free(ts);
    Py_DECREF(lrus);
    return out;
}

static PyObject *
LRU_blocks(LRU *t, PyObject *unused)
{
    PyObject *out = PyList_New((Py_ssize_t)t->used);
    if (out == NULL)
        return NULL;
    size_t n = (size_t)1 << t->bits, k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->slots[i].stamp == 0)
            continue;
        PyObject *v = PyLong_FromUnsignedLongLong(t->slots[i].key);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k++, v);
    }
    return out;
}

static int
LRU_init(LRU *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"capacity", NULL};
    PyObject *cap;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:LRU", names, &cap))
        return -1;
    Py_ssize_t c = -1;
    if (cap != Py_None) {
        c = PyLong_AsSsize_t(cap);
        if (c == -1 && PyErr_Occurred())
            return -1;
        if (c < 0) {
            PyErr_SetString(PyExc_ValueError, "capacity must be None or >= 0");
            return -1;
        }
    }
    /* __init__ again empties the LRU, as a fresh one */
    memset(t->slots, 0, sizeof(Slot) << t->bits);
    t->used = t->head = t->tail = 0;
    t->tick = 0;
    t->gapped = 0;
    t->capacity = c;
    return 0;
}

/* A table from the start, so an LRU made without __init__ is empty, not broken. */
static PyObject *
LRU_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    LRU *t = new_table(type, MIN_BITS);
    if (t != NULL)
        t->capacity = -1;
    return (PyObject *)t;
}

static void
LRU_dealloc(LRU *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->queue);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
LRU_len(LRU *t)
{
    return (Py_ssize_t)t->used;
}

static int
LRU_contains(LRU *t, PyObject *obj)
{
    return holds(t, obj);
}

static PyObject *
LRU_get_capacity(LRU *t, void *unused)
{
    if (t->capacity < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(t->capacity);
}

static PyObject *
LRU_get_tick(LRU *t, void *unused)
{
    return PyLong_FromUnsignedLongLong(t->tick);
}

static PyObject *
LRU_get_gapped(LRU *t, void *unused)
{
    return PyBool_FromLong(t->gapped);
}

static int
LRU_set_gapped(LRU *t, PyObject *value, void *unused)
{
    int v = value == NULL ? 0 : PyObject_IsTrue(value);
    if (v < 0)
        return -1;
    t->gapped = v;
    return 0;
}

static PyMethodDef LRU_methods[] = {
    {"touch", (PyCFunction)LRU_touch, METH_O,
     "Insert a chain: stamp its blocks with a new tick; returns the entries evicted."},
    {"discard", (PyCFunction)LRU_discard, METH_O, "Drop one key; True if it was held."},
    {"resize", (PyCFunction)LRU_resize, METH_O,
     "Set a bounded LRU's capacity; returns the entries evicted to fit it."},
    {"match", (PyCFunction)LRU_match, METH_VARARGS,
     "Blocks of a chain held, from the first, given the first `known` are held."},
    {"blocks", (PyCFunction)LRU_blocks, METH_NOARGS, "The held keys, in no particular order."},
    {NULL},
};

static PyGetSetDef LRU_getset[] = {
    {"capacity", (getter)LRU_get_capacity, NULL, "blocks; None = unbounded", NULL},
    {"tick", (getter)LRU_get_tick, NULL, "chains inserted so far (the next insert's tick)", NULL},
    {"gapped", (getter)LRU_get_gapped, (setter)LRU_set_gapped,
     "blocks were removed individually: prefix closure not guaranteed", NULL},
    {NULL},
};

static PySequenceMethods LRU_as_sequence = {
    .sq_length = (lenfunc)LRU_len,
    .sq_contains = (objobjproc)LRU_contains,
};

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* distinct_blocks(lrus): how many distinct keys the LRUs hold together (PrefixIndex.__len__).
 * The reference builds a Python set of every replica's blocks: an int object and a set entry
 * per key, which at a thousand replicas was the simulator's peak memory at the end of a run.
 * Here the keys are copied into one array, 8 bytes each, sorted, and the runs counted. */
static PyObject *
distinct_blocks(PyObject *module, PyObject *arg)
{
    PyObject *lrus = PySequence_Fast(arg, "LRUs must be a sequence");
    if (lrus == NULL)
        return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(lrus);
    PyObject **each = PySequence_Fast_ITEMS(lrus);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!PyObject_TypeCheck(each[i], &LRU_type)) {
            PyErr_SetString(PyExc_TypeError, "distinct_blocks takes compiled LRUs");
            Py_DECREF(lrus);
            return NULL;
        }
        total += ((LRU *)each[i])->used;
    }
    uint64_t *keys = PyMem_RawMalloc((total ? total : 1) * sizeof(uint64_t));
    if (keys == NULL) {
        Py_DECREF(lrus);
        return PyErr_NoMemory();
    }
    size_t n = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        const LRU *t = (const LRU *)each[i];
        size_t slots = t->slots == NULL ? 0 : (size_t)1 << t->bits;
        for (size_t j = 0; j < slots; j++)
            if (t->slots[j].stamp != 0)
                keys[n++] = t->slots[j].key;
    }
    Py_DECREF(lrus);
    size_t distinct = 0;
    Py_BEGIN_ALLOW_THREADS
    qsort(keys, n, sizeof(uint64_t), cmp_u64);
    for (size_t j = 0; j < n; j++)
        distinct += j == 0 || keys[j] != keys[j - 1];
    Py_END_ALLOW_THREADS
    PyMem_RawFree(keys);
    return PyLong_FromSize_t(distinct);
}

PyMethodDef lru_methods[] = {
    {"match_each", (PyCFunction)match_each, METH_VARARGS,
     "match_each(lrus, block_hashes): each LRU's match of the chain (0 for None), in one call."},
    {"distinct_blocks", (PyCFunction)distinct_blocks, METH_O,
     "distinct_blocks(lrus): how many distinct keys the LRUs hold together."},
    {NULL},
};

PyTypeObject LRU_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prefixroute.core._native._hotpath.LRU",
    .tp_doc = "One replica's block-hash LRU (the compiled twin of _lru.ReplicaLRU).",
    .tp_basicsize = sizeof(LRU),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = LRU_new,
    .tp_init = (initproc)LRU_init,
    .tp_dealloc = (destructor)LRU_dealloc,
    .tp_methods = LRU_methods,
    .tp_getset = LRU_getset,
    .tp_as_sequence = &LRU_as_sequence,
};
