/* The simulator's KV block pool: the compiled twin of KVCache (sim/kv_cache.py), which stays the
 * readable reference. tests/sim/test_kv_cache_native.py feeds both the same operations and
 * compares every answer.
 *
 * Why C: a simulated request pins, registers and releases ~130 blocks, and each is a dict probe
 * (an entry pointing at a separate int object) plus an OrderedDict link in Python: ~0.2 us per
 * block, the largest share of the simulator's time. Here a block is one probe of a table with
 * the 64-bit key inline, and the LRU of idle blocks is an intrusive list through a node pool.
 *
 * Layout: `nodes` holds one node per cached block (key, running users, idle-list links); node
 * indices never move, so the idle list links by index. `slots` maps key -> node index + 1
 * (0: empty), open addressing with linear probing and backward-shift deletion, as table.h.
 * Both grow by doubling; a replica never caches more than `capacity` blocks, so they stay small.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "glue.h"
#include "kvpool.h"

/* --- methods, in the reference's order -------------------------------------------------- */

/* What a method that only changes the pool returns: None, or NULL when it failed (error set). */
static PyObject *
none_unless_failed(int ok)
{
    return ok ? Py_NewRef(Py_None) : NULL;
}

static PyObject *
KV_lookup(KV *t, PyObject *args)
{
    Hashes h;
    Py_ssize_t limit, m = 0;
    if (!hashes_args(args, "On:lookup", &h, &limit, NULL))
        return NULL;
    limit = slice_stop(limit, h.n); /* hashes[:limit] */
    while (m < limit && kholds(t, h.items[m]))
        m++;
    hashes_close(&h);
    return PyLong_FromSsize_t(m);
}

/* op (count_idle, pin_all) over a sequence of block hashes: its count, or -1 with an error
 * set, as when hashes is not a sequence. */
static Py_ssize_t
over_hashes(KV *t, PyObject *hashes, Py_ssize_t (*op)(KV *, PyObject **, Py_ssize_t))
{
    Hashes h;
    if (!hashes_open(&h, hashes))
        return -1;
    Py_ssize_t r = op(t, h.items, h.n);
    hashes_close(&h);
    return r;
}

static PyObject *
KV_idle_among(KV *t, PyObject *hashes)
{
    Py_ssize_t idle = over_hashes(t, hashes, count_idle);
    return idle < 0 ? NULL : PyLong_FromSsize_t(idle);
}

static PyObject *
KV_available(KV *t, PyObject *unused)
{
    return PyLong_FromSsize_t(available(t));
}

static PyObject *
KV_pin(KV *t, PyObject *hashes)
{
    return none_unless_failed(over_hashes(t, hashes, pin_all) >= 0);
}

static PyObject *
KV_take(KV *t, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return none_unless_failed(take(t, n));
}

static PyObject *
KV_register(KV *t, PyObject *obj)
{
    int rc = register_one(t, obj);
    if (rc < 0)
        return NULL;
    return PyBool_FromLong(rc);
}

static PyObject *
KV_register_chain(KV *t, PyObject *args)
{
    Hashes h;
    Py_ssize_t start, stop;
    if (!hashes_args(args, "Onn:register_chain", &h, &start, &stop))
        return NULL;
    PyObject *dups = PyList_New(0);
    if (dups != NULL && start < stop && (start < 0 || stop > h.n)) {
        PyErr_SetString(PyExc_IndexError, "block range out of the chain");
        Py_CLEAR(dups);
    }
    for (Py_ssize_t i = start; dups != NULL && i < stop; i++) {
        int rc = register_one(t, h.items[i]);
        PyObject *v = rc == 0 ? PyLong_FromSsize_t(i) : NULL;
        if (rc < 0 || (rc == 0 && (v == NULL || PyList_Append(dups, v) < 0)))
            Py_CLEAR(dups);
        Py_XDECREF(v);
    }
    hashes_close(&h);
    return dups;
}

/* Drop every cached block and start new event lists; 0 with MemoryError set, and the pool as
 * it was. What __init__ and reset share: the caller sets `free` (all of the capacity). */
static int
empty_pool(KV *t)
{
    PyObject *stored = PyList_New(0), *removed = PyList_New(0);
    if (stored == NULL || removed == NULL) {
        Py_XDECREF(stored);
        Py_XDECREF(removed);
        return 0;
    }
    memset(t->slots, 0, sizeof(KSlot) << t->bits);
    t->cached = 0;
    t->nused = 0;
    t->free_node = t->head = t->tail = NONE;
    t->idle_count = 0;
    Py_XSETREF(t->stored, stored);
    Py_XSETREF(t->removed, removed);
    return 1;
}

static PyObject *
KV_reset(KV *t, PyObject *unused)
{
    if (t->capacity - t->free - t->idle_count)
        Py_RETURN_FALSE;
    if (!empty_pool(t))
        return NULL;
    t->free = t->capacity;
    Py_RETURN_TRUE;
}

static PyObject *
KV_release(KV *t, PyObject *args)
{
    Hashes h;
    Py_ssize_t anonymous;
    if (!hashes_args(args, "On:release", &h, &anonymous, NULL))
        return NULL;
    t->free += anonymous;
    int ok = release(t, h.items, h.n);
    hashes_close(&h);
    return none_unless_failed(ok);
}

static PyObject *
KV_acquire(KV *t, PyObject *args)
{
    Hashes h;
    Py_ssize_t limit, blocks, hit, idle = 0;
    if (!hashes_args(args, "Onn:acquire", &h, &limit, &blocks))
        return NULL;
    uint64_t buf[STACK_KEYS], *keys;
    /* hashes[:limit] */
    Py_ssize_t m = convert(t, h.items, slice_stop(limit, h.n), buf, &keys, 1);
    hashes_close(&h);
    if (m < 0)
        return NULL;
    hit = cached_run(t, keys, m);
    for (Py_ssize_t i = 0; i < hit; i++) /* pinning these takes them out of the evictable */
        idle += t->nodes[keys[i]].refs == 0;
    PyObject *out = NULL;
    if (blocks - hit > available(t) - idle) {
        out = PyLong_FromLong(-1);
    } else {
        for (Py_ssize_t i = 0; i < hit; i++) {
            Node *node = &t->nodes[keys[i]];
            if (node->refs++ == 0 && node->idle)
                unlink_idle(t, node);
        }
        if (take(t, blocks - hit))
            out = PyLong_FromSsize_t(hit);
    }
    if (keys != buf)
        PyMem_Free(keys);
    return out;
}

/* --- the type --------------------------------------------------------------------------- */

static int
KV_init(KV *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"capacity", "record_events", NULL};
    Py_ssize_t capacity;
    int record = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|p:KVCache", names, &capacity, &record))
        return -1;
    if (!empty_pool(t)) /* __init__ again empties it, as a fresh one */
        return -1;
    t->capacity = t->free = capacity;
    t->evictions = 0;
    t->record_events = (char)record;
    return 0;
}

static PyObject *
KV_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    KV *t = knew_table(type, 4);
    if (t != NULL)
        t->free_node = t->head = t->tail = NONE;
    return (PyObject *)t;
}

static void
KV_dealloc(KV *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->nodes);
    Py_XDECREF(t->stored);
    Py_XDECREF(t->removed);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *
KV_get_used(KV *t, void *unused)
{
    return PyLong_FromSsize_t(t->capacity - t->free - t->idle_count);
}

static PyObject *
KV_get_cached_blocks(KV *t, void *unused)
{
    return PyLong_FromSsize_t(t->cached);
}

static PyObject *
KV_get_list(KV *t, void *which)
{
    PyObject *v = which ? t->removed : t->stored;
    return Py_NewRef(v);
}

static int
KV_set_list(KV *t, PyObject *value, void *which)
{
    if (value == NULL || !PyList_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "stored and removed must be lists");
        return -1;
    }
    Py_SETREF(*(which ? &t->removed : &t->stored), Py_NewRef(value));
    return 0;
}

static PyMethodDef KV_methods[] = {
    {"lookup", (PyCFunction)KV_lookup, METH_VARARGS, "Leading cached blocks (at most limit)."},
    {"idle_among", (PyCFunction)KV_idle_among, METH_O, "How many of these cached are idle."},
    {"available", (PyCFunction)KV_available, METH_NOARGS, "Free plus evictable blocks."},
    {"pin", (PyCFunction)KV_pin, METH_O, "A request starts using these cached blocks."},
    {"take", (PyCFunction)KV_take, METH_O, "Take n blocks, evicting idle ones if needed."},
    {"register", (PyCFunction)KV_register, METH_O, "Cache one hash; False if already cached."},
    {"register_chain", (PyCFunction)KV_register_chain, METH_VARARGS,
     "Register hashes[start:stop]; returns the indices that were already cached."},
    {"reset", (PyCFunction)KV_reset, METH_NOARGS, "Drop every cached block unless one is used."},
    {"release", (PyCFunction)KV_release, METH_VARARGS, "A request ends: unpin, free the rest."},
    {"acquire", (PyCFunction)KV_acquire, METH_VARARGS,
     "Pin the cached prefix and take the rest; the hit in blocks, or -1 if it does not fit."},
    {NULL},
};

#define MEMBER(name, type, field, flags, doc) {name, type, offsetof(KV, field), flags, doc}
static PyMemberDef KV_members[] = {
    MEMBER("capacity", T_PYSSIZET, capacity, READONLY, "total blocks"),
    MEMBER("free", T_PYSSIZET, free, READONLY, "blocks holding nothing reusable"),
    MEMBER("evictions", T_PYSSIZET, evictions, READONLY, "cached blocks dropped, since creation"),
    MEMBER("record_events", T_BOOL, record_events, READONLY, "keep stored/removed lists"),
    {NULL},
};

static PyGetSetDef KV_getset[] = {
    {"used", (getter)KV_get_used, NULL, "blocks pinned by running requests", NULL},
    {"cached_blocks", (getter)KV_get_cached_blocks, NULL, "blocks holding a hash", NULL},
    {"stored", (getter)KV_get_list, (setter)KV_set_list, "new cached blocks", NULL},
    {"removed", (getter)KV_get_list, (setter)KV_set_list, "evicted blocks", (void *)1},
    {NULL},
};

static PyTypeObject KV_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prefixroute.core._native._kvcache.KVCache",
    .tp_doc = "A replica's KV block pool (the compiled twin of sim.kv_cache.KVCache).",
    .tp_basicsize = sizeof(KV),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = KV_new,
    .tp_init = (initproc)KV_init,
    .tp_dealloc = (destructor)KV_dealloc,
    .tp_methods = KV_methods,
    .tp_members = KV_members,
    .tp_getset = KV_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "prefixroute.core._native._kvcache",
    .m_doc = "The simulator's KV block pool in C (sim/kv_cache.py is the reference).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__kvcache(void)
{
    return module_of_type(&module, "KVCache", &KV_type);
}
