/* Optional compiled twins of pion.commands.plain.py_run and py_queue: a run of plain
 * GET and SET, served or queued inside MULTI.
 *
 * The contract (arguments, what a run takes and leaves to the lane, the result) is
 * written once, in pion/commands/plain.py; the tests hold both twins to it, command by
 * command, on the same keyspaces. This file only says how it is kept in C:
 *
 * - An entry (pion.keyspace.entries.Entry, a class with __slots__) is read and written
 *   through its attributes (interned names), as the Python twin does; no offsets.
 * - For each command everything that can fail (the reply bytes, the new size's int,
 *   the slow log's tuple, the append to `out`) happens before anything changes, so a
 *   MemoryError leaves the command it was on untouched and still in `ready`.
 * - Time is CLOCK_MONOTONIC, the clock of Python's perf_counter_ns on Linux, so a
 *   command's microseconds are the ones the boundary would have counted.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>
#include <time.h>

/* pion.keyspace.entries.KEY_OVERHEAD and pion.resp.encoder.SMALL_BULK (the module
 * exports both; a test compares them with the Python constants). */
#define KEY_OVERHEAD 184
#define SMALL_BULK 4096

static PyObject *s_value, *s_deadline, *s_size, *s_touched, *ok_reply;

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* 0: GET key, 1: SET key value, -1: anything else (left to the lane). */
static int
kind_of(PyObject *argv)
{
    if (!PyList_CheckExact(argv))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(argv);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_CheckExact(PyList_GET_ITEM(argv, i)))
            return -1;
    if (n < 2 || PyBytes_GET_SIZE(PyList_GET_ITEM(argv, 0)) != 3)
        return -1;
    const char *name = PyBytes_AS_STRING(PyList_GET_ITEM(argv, 0));
    if (n == 2 && (memcmp(name, "GET", 3) == 0 || memcmp(name, "get", 3) == 0))
        return 0;
    if (n == 3 && (memcmp(name, "SET", 3) == 0 || memcmp(name, "set", 3) == 0))
        return 1;
    return -1;
}

/* The next command of `ready` (its last item, borrowed) when it is a plain GET, or a
 * plain SET while may_set, its kind in *kind; NULL otherwise. */
static PyObject *
next_plain(PyObject *ready, int may_set, int *kind)
{
    Py_ssize_t n = PyList_GET_SIZE(ready);
    if (n == 0)
        return NULL;
    PyObject *argv = PyList_GET_ITEM(ready, n - 1);
    *kind = kind_of(argv);
    if (*kind < 0 || (*kind == 1 && !may_set))
        return NULL;
    return argv;
}

/* Whether the entry has no deadline: 1 yes, 0 no, -1 error. */
static int
timeless(PyObject *e)
{
    PyObject *d = PyObject_GetAttr(e, s_deadline);
    if (d == NULL)
        return -1;
    int set = PyObject_IsTrue(d);
    Py_DECREF(d);
    return set < 0 ? -1 : !set;
}

/* The entry's value if it is a string (a new reference), NULL with no error when it
 * is not, NULL with an error on failure. */
static PyObject *
string_of(PyObject *e)
{
    PyObject *v = PyObject_GetAttr(e, s_value);
    if (v != NULL && !PyBytes_CheckExact(v))
        Py_CLEAR(v);
    return v;
}

static PyObject *
bulk(PyObject *value)
{
    char head[32];
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    int h = snprintf(head, sizeof head, "$%zd\r\n", n);
    PyObject *r = PyBytes_FromStringAndSize(NULL, h + n + 2);
    if (r == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(r);
    memcpy(p, head, h);
    memcpy(p + h, PyBytes_AS_STRING(value), n);
    p[h + n] = '\r';
    p[h + n + 1] = '\n';
    return r;
}

typedef struct {
    Py_ssize_t ran, nbytes, gets, hits, sets, grow;
    long long get_usec, set_usec;
    int last;
} Totals;

/* One command of the run; 1 served, 0 left to the lane, -1 error. */
static int
serve_one(PyObject *argv, int kind, PyObject *data, PyObject *out, PyObject *null,
          PyObject *lru_clock, long long slow_us, PyObject *slow, Totals *t)
{
    long long started = now_ns();
    PyObject *key = PyList_GET_ITEM(argv, 1);
    PyObject *e = PyDict_GetItemWithError(data, key);
    if (e == NULL && PyErr_Occurred())
        return -1;
    if (e == NULL && kind == 1)
        return 0; /* a new key takes a SCAN slot: the lane's */
    Py_XINCREF(e);
    PyObject *reply = NULL, *value = NULL, *size = NULL, *entry = NULL;
    Py_ssize_t grow = 0;
    int rc = -1;
    if (e != NULL) {
        int ok = timeless(e);
        if (ok <= 0) {
            rc = ok;
            goto done;
        }
        value = string_of(e);
        if (value == NULL) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
    }
    if (kind == 0) {
        if (e == NULL) {
            reply = Py_NewRef(null);
        } else if (PyBytes_GET_SIZE(value) > SMALL_BULK) {
            rc = 0; /* sent without a copy, by the lane */
            goto done;
        } else if ((reply = bulk(value)) == NULL) {
            goto done;
        }
    } else {
        PyObject *old_size = PyObject_GetAttr(e, s_size);
        if (old_size == NULL)
            goto done;
        Py_ssize_t was = PyLong_AsSsize_t(old_size);
        Py_DECREF(old_size);
        if (was == -1 && PyErr_Occurred())
            goto done;
        PyObject *new_value = PyList_GET_ITEM(argv, 2);
        Py_ssize_t now = PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(new_value) + KEY_OVERHEAD;
        if ((size = PyLong_FromSsize_t(now)) == NULL)
            goto done;
        grow = now - was;
        reply = Py_NewRef(ok_reply);
    }
    long long usec = (now_ns() - started) / 1000;
    if (slow_us >= 0 && usec >= slow_us) {
        if ((entry = Py_BuildValue("(OL)", argv, usec)) == NULL)
            goto done;
    }
    /* Everything that can fail, before anything changes. */
    if (PyList_Append(out, reply) < 0)
        goto done;
    if (entry != NULL && PyList_Append(slow, entry) < 0) {
        Py_ssize_t n = PyList_GET_SIZE(out);
        (void)PyList_SetSlice(out, n - 1, n, NULL);
        goto done;
    }
    if (kind == 0) {
        if (e != NULL) {
            if (PyObject_SetAttr(e, s_touched, lru_clock) < 0)
                goto done;
            t->hits++;
        }
        t->gets++;
        t->get_usec += usec;
        t->last = 1;
    } else {
        if (PyObject_SetAttr(e, s_value, PyList_GET_ITEM(argv, 2)) < 0 ||
            PyObject_SetAttr(e, s_size, size) < 0)
            goto done;
        t->sets++;
        t->grow += grow;
        t->set_usec += usec;
        t->last = 2;
    }
    t->nbytes += PyBytes_GET_SIZE(reply);
    t->ran++;
    rc = 1;
done:
    Py_XDECREF(e);
    Py_XDECREF(value);
    Py_XDECREF(reply);
    Py_XDECREF(size);
    Py_XDECREF(entry);
    return rc;
}

static PyObject *
run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "run() takes 10 arguments");
        return NULL;
    }
    PyObject *ready = args[0], *data = args[1], *out = args[2], *null = args[3];
    PyObject *lru_clock = args[4], *slow = args[9];
    if (!PyList_Check(ready) || !PyDict_Check(data) || !PyList_Check(out) ||
        !PyBytes_Check(null) || !PyList_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "run(): list, dict, list, bytes, ..., list expected");
        return NULL;
    }
    int may_set = PyObject_IsTrue(args[5]);
    Py_ssize_t max_cmds = PyLong_AsSsize_t(args[6]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[7]);
    long long slow_us = PyLong_AsLongLong(args[8]);
    if (may_set < 0 || PyErr_Occurred())
        return NULL;
    Totals t = {0};
    int kind;
    PyObject *argv;
    while (t.ran < max_cmds && t.nbytes <= max_bytes &&
           (argv = next_plain(ready, may_set, &kind)) != NULL) {
        Py_ssize_t n = PyList_GET_SIZE(ready);
        Py_INCREF(argv);
        int served = serve_one(argv, kind, data, out, null, lru_clock, slow_us, slow, &t);
        if (served > 0)
            (void)PyList_SetSlice(ready, n - 1, n, NULL); /* shrinking: cannot fail */
        Py_DECREF(argv);
        if (served < 0)
            return NULL;
        if (served == 0)
            break;
    }
    return Py_BuildValue("(nnnnnnLLi)", t.ran, t.nbytes, t.gets, t.hits, t.sets, t.grow,
                         t.get_usec, t.set_usec, t.last);
}

static PyObject *
queue(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "queue() takes 7 arguments");
        return NULL;
    }
    PyObject *ready = args[0], *queued = args[1], *get = args[2], *set = args[3];
    if (!PyList_Check(ready) || !PyList_Check(queued)) {
        PyErr_SetString(PyExc_TypeError, "queue(): ready and queued must be lists");
        return NULL;
    }
    int may_set = PyObject_IsTrue(args[4]);
    Py_ssize_t max_cmds = PyLong_AsSsize_t(args[5]);
    Py_ssize_t room = PyLong_AsSsize_t(args[6]);
    if (may_set < 0 || PyErr_Occurred())
        return NULL;
    Py_ssize_t done = 0, nbytes = 0;
    int last = 0;
    int kind;
    PyObject *argv;
    while (done < max_cmds && (argv = next_plain(ready, may_set, &kind)) != NULL) {
        Py_ssize_t n = PyList_GET_SIZE(ready);
        Py_ssize_t size = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(argv); i++)
            size += PyBytes_GET_SIZE(PyList_GET_ITEM(argv, i));
        if (nbytes + size > room)
            break;
        PyObject *item = PyTuple_Pack(2, kind == 0 ? get : set, argv);
        if (item == NULL)
            return NULL;
        int failed = PyList_Append(queued, item);
        Py_DECREF(item);
        if (failed < 0)
            return NULL;
        (void)PyList_SetSlice(ready, n - 1, n, NULL); /* shrinking: cannot fail */
        nbytes += size;
        done++;
        last = kind + 1;
    }
    return Py_BuildValue("(nni)", done, nbytes, last);
}

static PyMethodDef module_methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(ready, data, out, null, lru_clock, may_set, max_cmds, max_bytes, slow_us, slow)"
     " -> (ran, nbytes, gets, hits, sets, grow, get_usec, set_usec, last)"},
    {"queue", (PyCFunction)(void (*)(void))queue, METH_FASTCALL,
     "queue(ready, queued, get, set, may_set, max_cmds, room) -> (queued, nbytes, last)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pion.commands._plain",
    "Compiled twin of pion.commands.plain.py_run (optional; see the C source).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__plain(void)
{
    s_value = PyUnicode_InternFromString("value");
    s_deadline = PyUnicode_InternFromString("deadline");
    s_size = PyUnicode_InternFromString("size");
    s_touched = PyUnicode_InternFromString("touched");
    ok_reply = PyBytes_FromString("+OK\r\n");
    if (!s_value || !s_deadline || !s_size || !s_touched || !ok_reply)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "KEY_OVERHEAD", KEY_OVERHEAD) < 0 ||
        PyModule_AddIntConstant(m, "SMALL_BULK", SMALL_BULK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
