/* One replica's LRU: the compiled twin of ReplicaLRU (core/_lru.py); design in table.h. */
#include "glue.h"
#include "hotpath.h"
#include "match.h"

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

static PyObject *
LRU_match(LRU *t, PyObject *args)
{
    Hashes h;
    Chain c;
    ChainBuf buf;
    Py_ssize_t known = 0;
    if (!hashes_args(args, "O|n:match", &h, &known, NULL))
        return NULL;
    if (!chain_open(&c, h.items, h.n, &buf)) {
        hashes_close(&h);
        return NULL;
    }
    Py_ssize_t m = chain_match(t, &c, h.n, known);
    chain_close(&c);
    hashes_close(&h);
    return PyLong_FromSsize_t(m);
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
