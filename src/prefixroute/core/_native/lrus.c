/* Many replicas' LRUs at once (PrefixIndex over compiled LRUs): a decision's matches in one
 * call, and how many distinct keys they hold together. The reference is PrefixIndex's own loops
 * over ReplicaLRU (core/index.py). */
#include "glue.h"
#include "hotpath.h"
#include "match.h"

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
    ChainBuf buf;
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
        if (chain_open(&c, h.items, h.n, &buf)) {
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
