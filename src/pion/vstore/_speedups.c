/* Optional compiled twin of the block-table membership test (pion/vstore/views.py).
 *
 * member_bits(sorted, probes, index, shift) -> bytes
 *
 *     sorted: a buffer of N unsigned 64-bit integers in ascending order; probes: a
 *     buffer of K unsigned 64-bit integers (both in the host's byte order: the caller
 *     uses this only on little-endian hosts, where that is the wire's '<u8'); index: a
 *     buffer of 2**(64 - shift) + 1 unsigned 32-bit offsets, index[b] being the number
 *     of elements of `sorted` below b << shift (index[last] = N). Returns ceil(K / 8)
 *     bytes, bit i (byte i >> 3, bit i & 7, least significant first) set iff probe i
 *     is in `sorted`: KV.PREFIX.MEMBERSHIP's reply, exactly what
 *     numpy.packbits(numpy.isin(probes, sorted), bitorder="little") gives.
 *
 *     The index maps a probe's top bits to the few elements that can equal it (block
 *     hashes are uniform, and the caller sizes the index to about one element per
 *     entry); those are searched by bisection, so a table whose hashes crowd into a
 *     few entries still costs O(log N) per probe, never more. Two loads per probe,
 *     independent from one probe to the next, where a plain binary search over N
 *     makes log2(N) dependent ones.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *
member_bits(PyObject *self, PyObject *args)
{
    Py_buffer table, probes, index;
    int shift;
    if (!PyArg_ParseTuple(args, "y*y*y*i", &table, &probes, &index, &shift))
        return NULL;
    PyObject *out = NULL;
    const Py_ssize_t n = table.len / 8;
    const Py_ssize_t k = probes.len / 8;
    const Py_ssize_t entries = index.len / 4;
    if (table.len % 8 || probes.len % 8 || index.len % 4) {
        PyErr_SetString(PyExc_ValueError, "member_bits: buffers must hold whole u64s / u32s");
        goto done;
    }
    if (shift < 1 || shift > 63 || entries != ((Py_ssize_t)1 << (64 - shift)) + 1) {
        PyErr_SetString(PyExc_ValueError, "member_bits: index does not match shift");
        goto done;
    }
    const uint64_t *t = (const uint64_t *)table.buf;
    const uint32_t *ix = (const uint32_t *)index.buf;
    if (ix[entries - 1] != (uint64_t)n) {
        PyErr_SetString(PyExc_ValueError, "member_bits: index does not match the table");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (k + 7) / 8);
    if (out == NULL)
        goto done;
    unsigned char *bits = (unsigned char *)PyBytes_AS_STRING(out);
    memset(bits, 0, (size_t)((k + 7) / 8));
    const unsigned char *p = (const unsigned char *)probes.buf;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint64_t x;
        memcpy(&x, p + 8 * i, 8); /* the probe blob need not be aligned */
        const uint64_t b = x >> shift;
        uint64_t lo = ix[b], hi = ix[b + 1];
        if (lo > hi || hi > (uint64_t)n)
            continue; /* an inconsistent index: never built so; answer "absent" */
        while (lo < hi) { /* lower_bound within the entry */
            const uint64_t mid = lo + (hi - lo) / 2;
            if (t[mid] < x)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < (uint64_t)n && t[lo] == x)
            bits[i >> 3] |= (unsigned char)(1u << (i & 7));
    }
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&probes);
    PyBuffer_Release(&index);
    return out;
}

static PyMethodDef module_methods[] = {
    {"member_bits", member_bits, METH_VARARGS,
     "member_bits(sorted_u64, probes_u64, index_u32, shift) -> bytes: the membership bitmap"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pion.vstore._speedups",
    "Compiled twin of the block-table membership test (optional; see the C source).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
