/* Optional compiled twin of the fp16 codec's two casts (pion/codecs/fp16.py).
 *
 * to_f16(src, dst) -> bool
 *
 *     src: a C-contiguous buffer of n float32; dst: a writable buffer of n uint16.
 *     Writes the IEEE binary16 bits of every value, rounded to nearest even: exactly
 *     numpy's float32 -> float16 cast for finite values within +-65504 (the codec has
 *     refused everything else before calling). Returns False, writing nothing, where
 *     it cannot vouch for that: a CPU without F16C, a compiler or architecture this
 *     file does not know, or a thread whose MXCSR flushes subnormals (FTZ/DAZ), which
 *     the instruction would honour and numpy does not.
 *
 * from_f16(src, dst) -> bool
 *
 *     The other way: n uint16 to n float32, exact (every binary16 value is a float32),
 *     NaN payloads kept as numpy keeps them; False under the same conditions.
 *
 * numpy's casts between float32 and float16 are not vectorised on every build (on the
 * development machine: 2.7 GB/s of input); F16C converts 8 values per instruction.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_F16C_PATH 1

/* FTZ (bit 15) or DAZ (bit 6) set: subnormals would be flushed. */
static int
mxcsr_flushes(void)
{
    return (_mm_getcsr() & ((1u << 15) | (1u << 6))) != 0;
}

__attribute__((target("avx,f16c"))) static void
f32_to_f16(const float *src, uint16_t *dst, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    if (i < n) { /* the tail, through a zero-padded block of 8 */
        float in[8] = {0};
        uint16_t out[8];
        memcpy(in, src + i, (size_t)(n - i) * sizeof(float));
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)out, h);
        memcpy(dst + i, out, (size_t)(n - i) * sizeof(uint16_t));
    }
}

/* NaN halves widened as numpy widens them: the payload kept as it is (the instruction
 * would set the quiet bit of a signalling NaN). Stored fp16 may hold any bits (FMT F16
 * is stored verbatim), so this must match numpy bit for bit too. */
static void
nan_payloads(const uint16_t *src, float *dst, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        const uint32_t h = src[j];
        if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu)) {
            const uint32_t bits = ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x03FFu) << 13);
            memcpy(dst + j, &bits, sizeof bits);
        }
    }
}

__attribute__((target("avx,f16c"))) static void
f16_to_f32(const uint16_t *src, float *dst, Py_ssize_t n)
{
    const __m128i exponent = _mm_set1_epi16(0x7C00);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
        __m128i special = _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent);
        if (_mm_movemask_epi8(special)) /* an inf or NaN among these 8: rare */
            nan_payloads(src + i, dst + i, 8);
    }
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        memcpy(in, src + i, (size_t)(n - i) * sizeof(uint16_t));
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)in)));
        memcpy(dst + i, out, (size_t)(n - i) * sizeof(float));
        nan_payloads(src + i, dst + i, n - i);
    }
}

static int
usable(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c") && !mxcsr_flushes();
}
#endif

/* Parse (src, dst) and check their sizes: n elements of src_size and dst_size bytes. */
static int
buffers(PyObject *args, Py_buffer *src, Py_buffer *dst, Py_ssize_t src_size,
        Py_ssize_t dst_size, Py_ssize_t *n)
{
    if (!PyArg_ParseTuple(args, "y*w*", src, dst))
        return -1;
    if (src->len % src_size || dst->len != src->len / src_size * dst_size) {
        PyErr_SetString(PyExc_ValueError, "buffers of different lengths");
        PyBuffer_Release(src);
        PyBuffer_Release(dst);
        return -1;
    }
    *n = src->len / src_size;
    return 0;
}

static PyObject *
to_f16(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    Py_ssize_t n;
    if (buffers(args, &src, &dst, 4, 2, &n) < 0)
        return NULL;
    int done = 0;
#ifdef HAVE_F16C_PATH
    if (usable()) {
        Py_BEGIN_ALLOW_THREADS
        f32_to_f16((const float *)src.buf, (uint16_t *)dst.buf, n);
        Py_END_ALLOW_THREADS
        done = 1;
    }
#endif
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyBool_FromLong(done);
}

static PyObject *
from_f16(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    Py_ssize_t n;
    if (buffers(args, &src, &dst, 2, 4, &n) < 0)
        return NULL;
    int done = 0;
#ifdef HAVE_F16C_PATH
    if (usable()) {
        Py_BEGIN_ALLOW_THREADS
        f16_to_f32((const uint16_t *)src.buf, (float *)dst.buf, n);
        Py_END_ALLOW_THREADS
        done = 1;
    }
#endif
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyBool_FromLong(done);
}

static PyMethodDef module_methods[] = {
    {"to_f16", to_f16, METH_VARARGS,
     "to_f16(src_f32, dst_u16) -> bool: the float16 bits of src, or False (nothing done)"},
    {"from_f16", from_f16, METH_VARARGS,
     "from_f16(src_u16, dst_f32) -> bool: the float32 values of src, or False"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pion.codecs._speedups",
    "Compiled twin of the fp16 codec's casts (optional; see the C source).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
