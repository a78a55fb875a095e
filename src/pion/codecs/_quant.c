/* Optional compiled twins of the block codecs: int8 (int8.py), fp8 (fp8.py), mlx4g32
 * (mlx4.py) and turbo4/3/2 (turbo.py). Each module's numpy code is the reference and
 * its docstring the byte layout; this file computes the same bytes (and, decoding, the
 * same fp32 bits) with the same IEEE operations in the same order, one row block at a
 * time, without temporaries, with the GIL released.
 *
 * Every function takes (src, dst, dim[, tables...]) and returns True when it wrote
 * every row, or False when it declines, having written any part of dst: an encode
 * meets a value the format refuses (non-finite, an fp16 field overflow) or the thread
 * flushes subnormals (MXCSR FTZ/DAZ, which numpy's integer-based fp16 casts ignore).
 * The caller then runs the numpy reference, which raises the exact error (or, under
 * FTZ/DAZ, computes what numpy computes).
 *
 * Order matters for bit-exactness and is fixed here and in the references:
 * - no fused multiply-add: the kernels are built for the baseline and for AVX2, and
 *   neither target has FMA, so the compiler cannot contract a*b+c;
 * - rint is round-half-even (the 2**23 trick, exact for any fp32 in the default
 *   rounding mode), roundf is rint with exact halves moved away from zero;
 * - turbo's rotation sums its 16 and 8 terms in index order (what numpy's matmul does
 *   through OpenBLAS) and its norms in the halving order of turbo.halving_sum.
 * Tables that define a format (the fp8 code values, turbo's centroids, signs and
 * thresholds) are passed in from the Python modules, so there is one copy of each.
 *
 * The kernels are in _quant_simd.h (the helpers), _quant_blocks.h (int8, fp8,
 * mlx4g32) and _quant_turbo.h; this file builds each twice (baseline, AVX2), picks one
 * at import, and is the Python surface.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define FP16_MAX 65504.0f

#if defined(__GNUC__) && !defined(__clang__)
/* Lets comparisons and selects vectorise (no FP exception is ever unmasked here) and
 * sqrtf inline; neither changes any result. */
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
#if defined(__GNUC__)
/* The 32-byte vector helpers are always inlined: no vector crosses a call. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define X86 1
static int
flushes_subnormals(void)
{
    return (_mm_getcsr() & ((1u << 15) | (1u << 6))) != 0;
}
static int
have_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#define INLINE static inline __attribute__((always_inline))
#else
static int
flushes_subnormals(void)
{
    return 0;
}
#define INLINE static inline
#endif

#include "_quant_simd.h"
#include "_quant_blocks.h"
#include "_quant_turbo.h"

/* -- one baseline and one AVX2 build of every kernel, chosen at run time ---------- */

#define KERNELS(suffix)                                                                   \
    static int int8_encode_##suffix(const float *x, uint8_t *o, Py_ssize_t n, Py_ssize_t d) \
    {                                                                                     \
        return int8_encode_body(x, o, n, d);                                              \
    }                                                                                     \
    static void int8_decode_##suffix(const uint8_t *s, float *o, Py_ssize_t n, Py_ssize_t d) \
    {                                                                                     \
        int8_decode_body(s, o, n, d);                                                     \
    }                                                                                     \
    static int fp8_encode_##suffix(const float *x, uint8_t *o, Py_ssize_t n, Py_ssize_t d) \
    {                                                                                     \
        return fp8_encode_body(x, o, n, d);                                               \
    }                                                                                     \
    static void fp8_decode_##suffix(const uint8_t *s, float *o, Py_ssize_t n, Py_ssize_t d, \
                                    const float *lut)                                     \
    {                                                                                     \
        fp8_decode_body(s, o, n, d, lut);                                                 \
    }                                                                                     \
    static int mlx4_encode_##suffix(const float *x, uint8_t *o, Py_ssize_t n, Py_ssize_t d) \
    {                                                                                     \
        return mlx4_encode_body(x, o, n, d);                                              \
    }                                                                                     \
    static void mlx4_decode_##suffix(const uint8_t *s, float *o, Py_ssize_t n, Py_ssize_t d) \
    {                                                                                     \
        mlx4_decode_body(s, o, n, d);                                                     \
    }                                                                                     \
    static int turbo_encode_##suffix(const float *x, uint8_t *o, Py_ssize_t n, Py_ssize_t d, \
                                     const Turbo *T)                                      \
    {                                                                                     \
        return turbo_encode_by_bits(x, o, n, d, T);                                       \
    }                                                                                     \
    static void turbo_decode_##suffix(const uint8_t *s, float *o, Py_ssize_t n, Py_ssize_t d, \
                                      const Turbo *T)                                     \
    {                                                                                     \
        turbo_decode_by_bits(s, o, n, d, T);                                              \
    }

KERNELS(base)
#ifdef X86
#pragma GCC push_options
#pragma GCC target("avx2")
KERNELS(avx2)
#pragma GCC pop_options
#else
#define int8_encode_avx2 int8_encode_base
#define int8_decode_avx2 int8_decode_base
#define fp8_encode_avx2 fp8_encode_base
#define fp8_decode_avx2 fp8_decode_base
#define mlx4_encode_avx2 mlx4_encode_base
#define mlx4_decode_avx2 mlx4_decode_base
#define turbo_encode_avx2 turbo_encode_base
#define turbo_decode_avx2 turbo_decode_base
#endif

static int use_avx2 = 0;

/* -- the Python surface ------------------------------------------------------------- */

/* Bytes per stored row of `dim` values, by format. */
enum { F_INT8, F_FP8, F_MLX4, F_TURBO };

static Py_ssize_t
row_bytes(int format, Py_ssize_t dim, int bits)
{
    switch (format) {
    case F_INT8:
    case F_FP8:
        return (dim + 31) / 32 * 34;
    case F_MLX4:
        return (dim + 31) / 32 * 20;
    default:
        return (dim + 127) / 128 * (2 + 16 * bits);
    }
}

/* Check (src, dst, dim): n whole rows in src of `src_row` bytes and in dst of
 * `dst_row`; on failure a ValueError is set and both buffers are released. */
static int
check(Py_buffer *src, Py_buffer *dst, Py_ssize_t src_row, Py_ssize_t dst_row, Py_ssize_t *n)
{
    if (src_row <= 0 || dst_row <= 0 || src->len % src_row || dst->len % dst_row ||
        src->len / src_row != dst->len / dst_row) {
        PyErr_SetString(PyExc_ValueError, "buffers of different row counts");
        PyBuffer_Release(src);
        PyBuffer_Release(dst);
        return -1;
    }
    *n = src->len / src_row;
    return 0;
}

static int
dim_ok(Py_ssize_t dim)
{
    if (dim < 1 || dim > 8192) {
        PyErr_SetString(PyExc_ValueError, "dim out of range 1..8192");
        return 0;
    }
    return 1;
}

/* encode(src_f32, dst_u8, dim) / decode(src_u8, dst_f32, dim) for int8, fp8, mlx4. */
static PyObject *
block_codec(PyObject *args, int format, int encode)
{
    Py_buffer src, dst, lut = {0};
    Py_ssize_t dim, n;
    int ok;
    if (format == F_FP8 && !encode)
        ok = PyArg_ParseTuple(args, "y*w*ny*", &src, &dst, &dim, &lut);
    else
        ok = PyArg_ParseTuple(args, "y*w*n", &src, &dst, &dim);
    if (!ok)
        return NULL;
    if (lut.obj != NULL && lut.len != 256 * sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "the code table must hold 256 float32");
        ok = 0;
    }
    ok = ok && dim_ok(dim);
    if (!ok) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        if (lut.obj != NULL)
            PyBuffer_Release(&lut);
        return NULL;
    }
    const Py_ssize_t rb = row_bytes(format, dim, 0), fb = dim * (Py_ssize_t)sizeof(float);
    if (check(&src, &dst, encode ? fb : rb, encode ? rb : fb, &n) < 0) {
        if (lut.obj != NULL)
            PyBuffer_Release(&lut);
        return NULL;
    }
    int done = 0;
    if (!flushes_subnormals()) {
        const int v = use_avx2;
        Py_BEGIN_ALLOW_THREADS
        if (encode) {
            const float *x = src.buf;
            uint8_t *o = dst.buf;
            if (format == F_INT8)
                done = v ? int8_encode_avx2(x, o, n, dim) : int8_encode_base(x, o, n, dim);
            else if (format == F_FP8)
                done = v ? fp8_encode_avx2(x, o, n, dim) : fp8_encode_base(x, o, n, dim);
            else
                done = v ? mlx4_encode_avx2(x, o, n, dim) : mlx4_encode_base(x, o, n, dim);
        } else {
            const uint8_t *s = src.buf;
            float *o = dst.buf;
            if (format == F_INT8)
                v ? int8_decode_avx2(s, o, n, dim) : int8_decode_base(s, o, n, dim);
            else if (format == F_FP8)
                v ? fp8_decode_avx2(s, o, n, dim, lut.buf) : fp8_decode_base(s, o, n, dim, lut.buf);
            else
                v ? mlx4_decode_avx2(s, o, n, dim) : mlx4_decode_base(s, o, n, dim);
            done = 1;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (lut.obj != NULL)
        PyBuffer_Release(&lut);
    return PyBool_FromLong(done);
}


static PyObject *
int8_encode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_INT8, 1);
}
static PyObject *
int8_decode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_INT8, 0);
}
static PyObject *
fp8_encode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_FP8, 1);
}
static PyObject *
fp8_decode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_FP8, 0);
}
static PyObject *
mlx4_encode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_MLX4, 1);
}
static PyObject *
mlx4_decode(PyObject *self, PyObject *args)
{
    return block_codec(args, F_MLX4, 0);
}

/* turbo_encode/turbo_decode(src, dst, dim, tables): `tables` is the bytes that
 * turbo.py's _compiled_tables() builds, laid out as the Turbo struct. */
static PyObject *
turbo_codec(PyObject *args, int encode)
{
    Py_buffer src, dst, tab;
    Py_ssize_t dim, n;
    if (!PyArg_ParseTuple(args, "y*w*ny*", &src, &dst, &dim, &tab))
        return NULL;
    Turbo T;
    int ok = dim_ok(dim);
    if (ok && tab.len != (Py_ssize_t)sizeof T) {
        PyErr_SetString(PyExc_ValueError, "turbo tables of the wrong size");
        ok = 0;
    }
    if (ok) {
        memcpy(&T, tab.buf, sizeof T);
        if (T.bits < 2 || T.bits > 4) {
            PyErr_SetString(PyExc_ValueError, "turbo bits must be 2, 3 or 4");
            ok = 0;
        }
    }
    PyBuffer_Release(&tab);
    if (!ok) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    const Py_ssize_t rb = row_bytes(F_TURBO, dim, T.bits), fb = dim * (Py_ssize_t)sizeof(float);
    if (check(&src, &dst, encode ? fb : rb, encode ? rb : fb, &n) < 0)
        return NULL;
    int done = 0;
    if (!flushes_subnormals()) {
        const int v = use_avx2;
        Py_BEGIN_ALLOW_THREADS
        if (encode) {
            done = v ? turbo_encode_avx2(src.buf, dst.buf, n, dim, &T)
                     : turbo_encode_base(src.buf, dst.buf, n, dim, &T);
        } else {
            v ? turbo_decode_avx2(src.buf, dst.buf, n, dim, &T)
              : turbo_decode_base(src.buf, dst.buf, n, dim, &T);
            done = 1;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyBool_FromLong(done);
}

static PyObject *
turbo_encode(PyObject *self, PyObject *args)
{
    return turbo_codec(args, 1);
}
static PyObject *
turbo_decode(PyObject *self, PyObject *args)
{
    return turbo_codec(args, 0);
}

static PyMethodDef module_methods[] = {
    {"int8_encode", int8_encode, METH_VARARGS, "int8_encode(src_f32, dst_u8, dim) -> bool"},
    {"int8_decode", int8_decode, METH_VARARGS, "int8_decode(src_u8, dst_f32, dim) -> bool"},
    {"fp8_encode", fp8_encode, METH_VARARGS, "fp8_encode(src_f32, dst_u8, dim) -> bool"},
    {"fp8_decode", fp8_decode, METH_VARARGS, "fp8_decode(src_u8, dst_f32, dim, lut) -> bool"},
    {"mlx4_encode", mlx4_encode, METH_VARARGS, "mlx4_encode(src_f32, dst_u8, dim) -> bool"},
    {"mlx4_decode", mlx4_decode, METH_VARARGS, "mlx4_decode(src_u8, dst_f32, dim) -> bool"},
    {"turbo_encode", turbo_encode, METH_VARARGS,
     "turbo_encode(src_f32, dst_u8, dim, tables) -> bool"},
    {"turbo_decode", turbo_decode, METH_VARARGS,
     "turbo_decode(src_u8, dst_f32, dim, tables) -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pion.codecs._quant",
    "Compiled twins of the block codecs (optional; see the C source).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__quant(void)
{
#ifdef X86
    use_avx2 = have_avx2();
#endif
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            H16[i][j] = (__builtin_popcount(i & j) & 1) ? -1.0f : 1.0f;
    return PyModule_Create(&module);
}
