/* The speed model's normal equations in C: add_observations, solve_feasible and the context per
 * token of core/_solve.py and core/speed_fit.py, their references.
 *
 * Why: a refit reads every observation of a replica's windows (up to 3 x 64) twice, and runs
 * every few requests of every replica. In the simulator at 16 replicas (cProfile, 10k requests)
 * those loops took 36% of the run under round_robin as first written in Python, and still 19%
 * under predicted_ttft once unrolled. The arithmetic is the reference's, operation
 * for operation and in the same order (no fused multiply-add: setup.py builds with
 * -ffp-contract=off), so the sums are the same to the bit and the simulator's recorded digests
 * do not move; tests/core/test_native_solve.py compares the two on random windows.
 *
 * When the answer could differ (a ratio that is not a number, where Python's sort and qsort may
 * order the newer half differently) it returns None having changed nothing, and the caller runs
 * the reference instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#include "hotpath.h"

typedef struct {
    double x[5]; /* tokens, decode steps, engine requests, first tokens, context work */
    double seconds;
} Obs;

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sequence `obj` of n floats into out[n]; 0 with an error set. */
static int
floats_of(PyObject *obj, double *out, Py_ssize_t n, const char *what)
{
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq == NULL)
        return 0;
    int ok = PySequence_Fast_GET_SIZE(seq) == n;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        ok = !(out[i] == -1.0 && PyErr_Occurred());
    }
    if (!ok && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: expected %zd numbers", what, n);
    Py_DECREF(seq);
    return ok;
}

/* The window's observations read into obs[n] (x and seconds as floats); 0 with an error set.
 * The attribute names are made once: PyObject_GetAttrString builds a new str per call, two per
 * observation, which was half of this function's time (two full windows: 12 us, now 6). */
static int
read_window(PyObject *seq, Obs *obs, Py_ssize_t n)
{
    static PyObject *name_x, *name_seconds;
    if (name_x == NULL && (name_x = PyUnicode_InternFromString("x")) == NULL)
        return 0;
    if (name_seconds == NULL && (name_seconds = PyUnicode_InternFromString("seconds")) == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *x = PyObject_GetAttr(o, name_x);
        if (x == NULL)
            return 0;
        int ok = floats_of(x, obs[i].x, 5, "an observation's x");
        Py_DECREF(x);
        if (!ok)
            return 0;
        PyObject *s = PyObject_GetAttr(o, name_seconds);
        if (s == NULL)
            return 0;
        obs[i].seconds = PyFloat_AsDouble(s);
        Py_DECREF(s);
        if (obs[i].seconds == -1.0 && PyErr_Occurred())
            return 0;
    }
    return 1;
}

/* One window into A and C, as the reference's loop body does; -1 when a ratio is not a number
 * (the caller falls back), else how many observations were left out. */
static Py_ssize_t
add_window(Obs *obs, Py_ssize_t n, const double t[5], double factor, double floor_s, double A[5][5],
           double C[5], double *scratch)
{
    double *p = scratch, *r = scratch + n, *recent = scratch + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const double *x = obs[i].x;
        double pred = x[0] * t[0] + x[1] * t[1] + x[2] * t[2] + x[3] * t[3] + x[4] * t[4];
        if (pred < 1e-9)
            pred = 1e-9;
        p[i] = pred;
        r[i] = obs[i].seconds / pred;
        if (isnan(r[i]))
            return -1;
    }
    Py_ssize_t half = n / 2, m = n - half;
    for (Py_ssize_t i = 0; i < m; i++)
        recent[i] = r[half + i];
    qsort(recent, (size_t)m, sizeof(double), cmp_double);
    double centre = recent[m / 2];
    double low = centre / factor, high = centre * factor;
    Py_ssize_t dropped = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!(low <= r[i] && r[i] <= high)) {
            dropped++;
            continue;
        }
        const double *ox = obs[i].x;
        double scale = p[i], ratio = r[i];
        if (floor_s != 0.0) { /* judged against prediction + floor, as the reference */
            scale += floor_s;
            ratio = obs[i].seconds / scale;
        }
        double x = ox[0] / scale, k = ox[1] / scale;
        A[0][0] += x * x;
        A[0][1] += x * k;
        A[1][1] += k * k;
        C[0] += x * ratio;
        C[1] += k * ratio;
        if (ox[2] != 0.0 || ox[3] != 0.0 || ox[4] != 0.0) {
            double row[5] = {x, k, ox[2] / scale, ox[3] / scale, ox[4] / scale};
            for (int a = 2; a < 5; a++) {
                if (ox[a] == 0.0)
                    continue;
                for (int j = 0; j < 5; j++) {
                    A[a][j] += row[a] * row[j];
                    if (j < 2)
                        A[j][a] += row[a] * row[j];
                }
                C[a] += row[a] * ratio;
            }
        }
    }
    return dropped;
}

/* Every window (a sequence of sequences of observations) into A and C, each with its floor
 * (floors: a sequence of floats, one per window); -1 to fall back, -2 with an error set, else
 * how many were left out. */
static Py_ssize_t
add_windows(PyObject *windows, PyObject *floors, const double t[5], double factor, double A[5][5],
            double C[5])
{
    PyObject *all = PySequence_Fast(windows, "windows must be a sequence");
    if (all == NULL)
        return -2;
    double floor_of[8];
    Py_ssize_t nw = PySequence_Fast_GET_SIZE(all);
    if (nw > 8 || !floats_of(floors, floor_of, nw, "floors")) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "at most 8 windows");
        Py_DECREF(all);
        return -2;
    }
    Py_ssize_t dropped = 0;
    for (Py_ssize_t w = 0; w < PySequence_Fast_GET_SIZE(all) && dropped >= 0; w++) {
        PyObject *seq = PySequence_Fast(PySequence_Fast_GET_ITEM(all, w), "a window");
        if (seq == NULL) {
            dropped = -2;
            break;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        Obs *obs = n ? PyMem_Malloc((size_t)n * sizeof(Obs)) : NULL;
        double *scratch = n ? PyMem_Malloc((size_t)n * 3 * sizeof(double)) : NULL;
        if (n && (obs == NULL || scratch == NULL)) {
            PyErr_NoMemory();
            dropped = -2;
        }
        else if (n && !read_window(seq, obs, n))
            dropped = -2;
        else if (n) {
            Py_ssize_t d = add_window(obs, n, t, factor, floor_of[w], A, C, scratch);
            dropped = d < 0 ? -1 : dropped + d;
        }
        PyMem_Free(obs);
        PyMem_Free(scratch);
        Py_DECREF(seq);
    }
    Py_DECREF(all);
    return dropped;
}

/* a (5 lists of 5) and c (5) into A and C, or back; 0 with an error set. */
static int
matrix_io(PyObject *a, PyObject *c, double A[5][5], double C[5], int write)
{
    if (!PyList_Check(a) || PyList_GET_SIZE(a) != 5 || !PyList_Check(c) || PyList_GET_SIZE(c) != 5) {
        PyErr_SetString(PyExc_TypeError, "a must be 5 lists of 5 floats, c a list of 5");
        return 0;
    }
    for (Py_ssize_t i = 0; i < 5; i++) {
        PyObject *row = PyList_GET_ITEM(a, i);
        if (!PyList_Check(row) || PyList_GET_SIZE(row) != 5) {
            PyErr_SetString(PyExc_TypeError, "a must be 5 lists of 5 floats");
            return 0;
        }
        if (!write) {
            if (!floats_of(row, A[i], 5, "a row of a"))
                return 0;
            continue;
        }
        for (Py_ssize_t j = 0; j < 5; j++) {
            PyObject *v = PyFloat_FromDouble(A[i][j]);
            if (v == NULL)
                return 0;
            PyList_SetItem(row, j, v); /* steals v */
        }
        PyObject *v = PyFloat_FromDouble(C[i]);
        if (v == NULL)
            return 0;
        PyList_SetItem(c, i, v);
    }
    return write || floats_of(c, C, 5, "c");
}

/* add_observations(a, c, windows, theta, factor, floors) -> int | None (core/_solve.py). */
static PyObject *
solve_add_observations(PyObject *self, PyObject *args)
{
    PyObject *a, *c, *windows, *theta, *floors;
    double factor, t[5], A[5][5], C[5];
    if (!PyArg_ParseTuple(args, "OOOOdO:add_observations", &a, &c, &windows, &theta, &factor,
                          &floors))
        return NULL;
    if (!floats_of(theta, t, 5, "theta") || !matrix_io(a, c, A, C, 0))
        return NULL;
    Py_ssize_t dropped = add_windows(windows, floors, t, factor, A, C);
    if (dropped == -2)
        return NULL;
    if (dropped == -1)
        Py_RETURN_NONE; /* a and c untouched: the reference decides */
    if (!matrix_io(a, c, A, C, 1))
        return NULL;
    return PyLong_FromSsize_t(dropped);
}

/* _gauss of core/_solve.py on the n x n system m (each row n coefficients, then the right-hand
 * side), in place, operation for operation: Cramer's rule at n = 2, else elimination with the
 * first largest pivot. 0 where the reference returns None (singular). */
static int
gauss(int n, double m[5][6], double x[5])
{
    if (n == 2) {
        double det = m[0][0] * m[1][1] - m[0][1] * m[0][1];
        if (det <= 0)
            return 0;
        x[0] = (m[0][2] * m[1][1] - m[1][2] * m[0][1]) / det;
        x[1] = (m[0][0] * m[1][2] - m[0][1] * m[0][2]) / det;
        return 1;
    }
    for (int k = 0; k < n; k++) {
        int p = k; /* Python's max(): the first of the largest */
        for (int i = k + 1; i < n; i++)
            if (fabs(m[i][k]) > fabs(m[p][k]))
                p = i;
        if (fabs(m[p][k]) < 1e-300)
            return 0;
        for (int j = 0; j <= n; j++) {
            double tmp = m[k][j];
            m[k][j] = m[p][j];
            m[p][j] = tmp;
        }
        for (int i = k + 1; i < n; i++) {
            double f = m[i][k] / m[k][k];
            for (int j = k; j <= n; j++)
                m[i][j] -= f * m[k][j];
        }
    }
    for (int k = n - 1; k >= 0; k--) {
        double sum = 0.0; /* Python's sum() starts at 0: 0 + -0.0 is 0.0 there and here */
        for (int j = k + 1; j < n; j++)
            sum += m[k][j] * x[j];
        x[k] = (m[k][n] - sum) / m[k][k];
    }
    return 1;
}

/* solve_feasible of core/_solve.py into theta; the fixed unknowns kept in the order the
 * reference's dict holds them (its sums run in that order). */
static void
feasible(const double A[5][5], const double C[5], const double current[5], const int is_free[5],
         double theta[5])
{
    int order[5], nfixed = 0, fixed[5] = {0};
    double value[5] = {0};
    for (int i = 0; i < 5; i++) {
        theta[i] = current[i];
        if (!is_free[i]) {
            fixed[i] = 1;
            value[i] = current[i];
            order[nfixed++] = i;
        }
    }
    for (int round = 0; round < 5; round++) {
        int free[5], n = 0;
        for (int i = 0; i < 5; i++)
            if (!fixed[i])
                free[n++] = i;
        if (n == 0) {
            for (int i = 0; i < 5; i++)
                theta[i] = value[i];
            return;
        }
        double m[5][6], sol[5];
        for (int r = 0; r < n; r++) {
            int i = free[r];
            double sum = 0.0;
            for (int q = 0; q < nfixed; q++) {
                double v = value[order[q]];
                if (v != 0.0) /* `if v`: NaN counts, 0.0 and -0.0 do not */
                    sum += A[i][order[q]] * v;
            }
            for (int col = 0; col < n; col++)
                m[r][col] = A[i][free[col]];
            m[r][n] = C[i] - sum;
        }
        if (!gauss(n, m, sol)) {
            for (int i = 0; i < 5; i++)
                theta[i] = current[i];
            return;
        }
        for (int i = 0; i < 5; i++)
            theta[i] = fixed[i] ? value[i] : 0.0;
        for (int r = 0; r < n; r++)
            theta[free[r]] = sol[r];
        int bad = 0;
        for (int r = 0; r < n; r++) {
            int i = free[r];
            if (i == 0 ? theta[i] <= 0 : theta[i] < 0) {
                fixed[i] = 1;
                value[i] = i == 0 ? current[0] : 0.0;
                order[nfixed++] = i;
                bad = 1;
            }
        }
        if (!bad)
            return;
    }
}

/* solve_feasible(a, c, current, free) -> list of 5 floats (core/_solve.py). */
static PyObject *
solve_solve_feasible(PyObject *self, PyObject *args)
{
    PyObject *a, *c, *current, *free;
    double A[5][5], C[5], cur[5], theta[5];
    int is_free[5] = {0};
    if (!PyArg_ParseTuple(args, "OOOO:solve_feasible", &a, &c, &current, &free))
        return NULL;
    if (!matrix_io(a, c, A, C, 0) || !floats_of(current, cur, 5, "current"))
        return NULL;
    PyObject *seq = PySequence_Fast(free, "free must be a sequence of unknowns");
    if (seq == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        long i = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, k));
        if (i == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (0 <= i && i < 5)
            is_free[i] = 1;
    }
    Py_DECREF(seq);
    feasible((const double(*)[5])A, C, cur, is_free, theta);
    return Py_BuildValue("[ddddd]", theta[0], theta[1], theta[2], theta[3], theta[4]);
}

/* context_per_token(window) -> float: speed_fit._context_per_token's sums, in its order. */
static PyObject *
solve_context_per_token(PyObject *self, PyObject *window)
{
    PyObject *seq = PySequence_Fast(window, "a window");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Obs *obs = n ? PyMem_Malloc((size_t)n * sizeof(Obs)) : NULL;
    if (n && obs == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int ok = !n || read_window(seq, obs, n);
    double tokens = 0.0, context = 0.0;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        tokens += obs[i].x[0];
        context += obs[i].x[4];
    }
    PyMem_Free(obs);
    Py_DECREF(seq);
    if (!ok)
        return NULL;
    return PyFloat_FromDouble(tokens > 0 ? context / tokens : 0.0);
}

PyMethodDef solve_methods[] = {
    {"add_observations", solve_add_observations, METH_VARARGS,
     "add_observations(a, c, windows, theta, factor) -> int | None: core/_solve.py's, in C "
     "(None: a ratio is not a number; nothing changed)."},
    {"solve_feasible", solve_solve_feasible, METH_VARARGS,
     "solve_feasible(a, c, current, free) -> list[float]: core/_solve.py's, in C, to the bit."},
    {"context_per_token", solve_context_per_token, METH_O,
     "context_per_token(window) -> float: core/speed_fit.py's _context_per_token, in C."},
    {NULL, NULL, 0, NULL},
};
