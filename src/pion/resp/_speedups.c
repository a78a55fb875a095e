/* Optional compiled accelerators of pion.resp (the request decoder's hot path).
 *
 * Every function here has a pure-Python twin in pion/resp/scan.py with the same
 * contract, and the decoder works with either (pip install without a compiler gets
 * the Python one). The tests run the decoder's whole suite against both and compare
 * them on random and hostile input.
 *
 * scan(buf, pos, max_args, max_bulk, max_frame, max_cmds) -> (commands, pos)
 *
 *     Parses complete, well-formed multibulk commands from buf[pos:], stopping at the
 *     first thing that is anything else: an incomplete frame, an inline command, a
 *     header that is malformed, signed, has a leading zero or exceeds a bound
 *     (`*N` with N > max_args, `$L` with L > max_bulk, a frame declaring more than
 *     max_frame payload bytes), a payload not followed by CRLF, or max_cmds
 *     commands. It never raises on input: it returns the commands before the stop
 *     and the offset of the stop, a frame boundary, where the caller's exact parser
 *     takes over (and reports errors in Redis's words). So it can only ever accept a
 *     subset of what the exact parser accepts, never more.
 *
 * BulkWriter(n)
 *
 *     A bytes object of n bytes, filled in place through a writable buffer (recv_into
 *     writes a large bulk straight into the argument it becomes), then taken with
 *     take(). The bytes object is created uninitialised by the C API and is not seen
 *     by anyone before take(): the C API allows filling a fresh bytes object before
 *     it is shared. take() refuses before every byte was marked written (advance());
 *     if a writable view is still exported it returns a copy instead, and after it no
 *     buffer can be exported.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#define HUGE_PAGE (2u << 20)
#if defined(__linux__)
#include <sys/mman.h>
/* Transparent huge pages for a large bulk's buffer (BulkWriter): a fresh mapping of
 * many megabytes is otherwise faulted in 4 KiB at a time as the socket fills it, which
 * cost about a quarter of an fp16 store's CPU. Only the 2 MiB-aligned middle can be
 * huge; the system's THP mode decides (madvise or always; nothing under never). */
static void
advise_huge(void *p, Py_ssize_t n)
{
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + (uintptr_t)n) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: failure is fine */
}
#else
static void
advise_huge(void *p, Py_ssize_t n)
{
}
#endif

/* Digits of a header we parse at all: 18 keeps the value below 2**63 without an
 * overflow check, and every bound we are given is far below 10**18. */
#define MAX_DIGITS 18

/* Parse the decimal after a type byte at p (end e): canonical (no sign, no leading
 * zero unless the value is 0) and CRLF-terminated. Returns the offset just past the
 * CRLF and sets *value, or -1 when the line is incomplete or not canonical. */
static Py_ssize_t
read_len(const char *s, Py_ssize_t p, Py_ssize_t e, long long *value)
{
    Py_ssize_t start = p;
    long long v = 0;
    while (p < e && s[p] >= '0' && s[p] <= '9') {
        if (p - start >= MAX_DIGITS)
            return -1;
        v = v * 10 + (s[p] - '0');
        p++;
    }
    if (p == start || p + 1 >= e || s[p] != '\r' || s[p + 1] != '\n')
        return -1;
    if (s[start] == '0' && p - start > 1)
        return -1;
    *value = v;
    return p + 2;
}

static PyObject *
scan(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t pos, max_cmds;
    long long max_args, max_bulk, max_frame;
    if (!PyArg_ParseTuple(args, "OnLLLn", &obj, &pos, &max_args, &max_bulk, &max_frame,
                          &max_cmds))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *s = (const char *)view.buf;
    const Py_ssize_t e = view.len;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (pos < 0)
        pos = e; /* nothing to scan; the caller never does this */
    Py_ssize_t p = pos;
    while (PyList_GET_SIZE(out) < max_cmds && p < e && s[p] == '*') {
        long long n;
        Py_ssize_t q = read_len(s, p + 1, e, &n);
        if (q < 0 || n < 1 || n > max_args)
            break;
        /* First pass: check the whole frame is here and within bounds, without
         * allocating anything. */
        Py_ssize_t r = q;
        long long declared = 0;
        long long i;
        for (i = 0; i < n; i++) {
            long long len;
            if (r >= e || s[r] != '$')
                break;
            r = read_len(s, r + 1, e, &len);
            if (r < 0 || len > max_bulk)
                break;
            declared += len;
            if (declared > max_frame || (long long)(e - r) < len + 2)
                break;
            if (s[r + len] != '\r' || s[r + len + 1] != '\n')
                break;
            r += (Py_ssize_t)len + 2;
        }
        if (i < n)
            break;
        /* Second pass: build [bytes, ...]. */
        PyObject *cmd = PyList_New((Py_ssize_t)n);
        if (cmd == NULL)
            goto error;
        r = q;
        for (i = 0; i < n; i++) {
            long long len;
            r = read_len(s, r + 1, e, &len);
            PyObject *arg = PyBytes_FromStringAndSize(s + r, (Py_ssize_t)len);
            if (arg == NULL) {
                Py_DECREF(cmd);
                goto error;
            }
            PyList_SET_ITEM(cmd, (Py_ssize_t)i, arg);
            r += (Py_ssize_t)len + 2;
        }
        if (PyList_Append(out, cmd) < 0) {
            Py_DECREF(cmd);
            goto error;
        }
        Py_DECREF(cmd);
        p = r;
    }
    PyBuffer_Release(&view);
    PyObject *result = Py_BuildValue("(Nn)", out, p);
    return result;
error:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

/* -- BulkWriter -------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *data;   /* the bytes being filled; NULL once taken */
    Py_ssize_t size;
    Py_ssize_t filled;
    Py_ssize_t exports;
} BulkWriter;

static int
BulkWriter_init(BulkWriter *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t n;
    static char *kwlist[] = {"size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &n))
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "size must not be negative");
        return -1;
    }
    if (self->data != NULL || self->exports) {
        PyErr_SetString(PyExc_RuntimeError, "BulkWriter cannot be re-initialised");
        return -1;
    }
    self->data = PyBytes_FromStringAndSize(NULL, n);
    if (self->data == NULL)
        return -1;
    if (n >= (Py_ssize_t)(4 * HUGE_PAGE))
        advise_huge(PyBytes_AS_STRING(self->data), n);
    self->size = n;
    self->filled = 0;
    return 0;
}

static void
BulkWriter_dealloc(BulkWriter *self)
{
    Py_XDECREF(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
BulkWriter_getbuffer(BulkWriter *self, Py_buffer *view, int flags)
{
    if (self->data == NULL) {
        PyErr_SetString(PyExc_BufferError, "BulkWriter: already taken");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->data), self->size,
                          0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void
BulkWriter_releasebuffer(BulkWriter *self, Py_buffer *view)
{
    self->exports--;
}

static PyBufferProcs BulkWriter_as_buffer = {
    (getbufferproc)BulkWriter_getbuffer,
    (releasebufferproc)BulkWriter_releasebuffer,
};

static PyObject *
BulkWriter_advance(BulkWriter *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > self->size - self->filled) {
        PyErr_SetString(PyExc_ValueError, "BulkWriter: advance past the end");
        return NULL;
    }
    self->filled += n;
    Py_RETURN_NONE;
}

static PyObject *
BulkWriter_take(BulkWriter *self, PyObject *unused)
{
    if (self->data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BulkWriter: already taken");
        return NULL;
    }
    if (self->filled != self->size) {
        PyErr_SetString(PyExc_RuntimeError, "BulkWriter: not filled yet");
        return NULL;
    }
    if (self->exports) {
        /* Someone still holds a writable view: hand out a copy, so the bytes the
         * caller gets can never change. The decoder arranges for this not to happen
         * (its last bytes arrive through a scratch buffer); this is the safety net. */
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->data), self->size);
    }
    PyObject *data = self->data;
    self->data = NULL;
    return data;
}

static PyObject *
BulkWriter_view(BulkWriter *self, PyObject *unused)
{
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyObject *
BulkWriter_get_filled(BulkWriter *self, void *closure)
{
    return PyLong_FromSsize_t(self->filled);
}

static Py_ssize_t
BulkWriter_len(BulkWriter *self)
{
    return self->size;
}

static PyMethodDef BulkWriter_methods[] = {
    {"advance", (PyCFunction)BulkWriter_advance, METH_O,
     "advance(n): the next n bytes of the buffer were written."},
    {"view", (PyCFunction)BulkWriter_view, METH_NOARGS,
     "view() -> memoryview: a writable view of the whole buffer."},
    {"take", (PyCFunction)BulkWriter_take, METH_NOARGS,
     "take() -> bytes: the filled bytes; the writer is spent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef BulkWriter_getset[] = {
    {"filled", (getter)BulkWriter_get_filled, NULL, "bytes written so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods BulkWriter_as_sequence = {
    .sq_length = (lenfunc)BulkWriter_len,
};

static PyTypeObject BulkWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pion.resp._speedups.BulkWriter",
    .tp_basicsize = sizeof(BulkWriter),
    .tp_dealloc = (destructor)BulkWriter_dealloc,
    .tp_as_sequence = &BulkWriter_as_sequence,
    .tp_as_buffer = &BulkWriter_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bytes object of a given size, filled in place, then taken.",
    .tp_methods = BulkWriter_methods,
    .tp_getset = BulkWriter_getset,
    .tp_init = (initproc)BulkWriter_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, pos, max_args, max_bulk, max_frame, max_cmds) -> (commands, pos)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pion.resp._speedups",
    "Compiled twins of pion.resp.scan (optional; see the C source).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&BulkWriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&BulkWriterType);
    if (PyModule_AddObject(m, "BulkWriter", (PyObject *)&BulkWriterType) < 0) {
        Py_DECREF(&BulkWriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
