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

/* -- scalar helpers (exactly numpy's element-wise results) -------------------------- */

INLINE uint32_t
bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

INLINE float
float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round half to even (np.rint): exact for every finite fp32 in the default mode. */
INLINE float
rint_even(float v)
{
    const float a = fabsf(v);
    float r = (a + 0x1p23f) - 0x1p23f;
    r = a < 0x1p23f ? r : a;
    return copysignf(r, v);
}

/* C roundf (int8.roundf): halves away from zero. */
INLINE float
round_away(float v)
{
    const float r = rint_even(v);
    const float t = v + copysignf(0.5f, v);
    return fabsf(v - r) == 0.5f ? t : r;
}

/* IEEE binary16 bits of a finite |f| <= 65504, nearest even: numpy's astype(float16). */
INLINE uint16_t
half_bits(float f)
{
    const uint32_t u = bits_of(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t mag = u & 0x7FFFFFFFu;
    if (mag >= 0x38800000u) { /* normal half: round at bit 13, rebias 127 -> 15 */
        const uint32_t r = mag + 0xFFFu + ((mag >> 13) & 1u);
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    /* subnormal half: a multiple of 2**-24 (the scaling is exact) */
    return (uint16_t)(sign | (uint32_t)rint_even(fabsf(f) * 0x1p24f));
}

/* fp32 value of half bits as numpy widens them (NaN payloads kept). */
INLINE float
half_value(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        const float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31)
        return float_of(sign | 0x7F800000u | (m << 13));
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

INLINE uint16_t
load_half(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

INLINE void
store_half(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Eight lanes through GCC's vector extensions: element-wise IEEE operations, the same
 * as the scalar code (the baseline build splits them into SSE halves). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

INLINE v8f
ld8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void
st8(float *p, v8f v)
{
    memcpy(p, &v, sizeof v);
}

INLINE v8f
splat(float x)
{
    return (v8f){x, x, x, x, x, x, x, x};
}

/* m ? a : b per lane (m all ones or all zeros). */
INLINE v8f
sel(v8i m, v8f a, v8f b)
{
    return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}

INLINE v8u
selu(v8i m, v8u a, v8u b)
{
    return (a & (v8u)m) | (b & ~(v8u)m);
}

/* rint_even on eight lanes. */
INLINE v8f
rint8(v8f v)
{
    const v8i sign = (v8i)v & (int32_t)0x80000000u;
    const v8f a = (v8f)((v8i)v & 0x7FFFFFFF);
    v8f r = (a + 0x1p23f) - 0x1p23f;
    r = sel(a < 0x1p23f, r, a);
    return (v8f)((v8i)r | sign);
}

/* Block j (of `block` values, a multiple of 8) of a row, zero-padded past dim. Returns
 * the largest |x| as fp32 bits: the bits of non-negative floats order as the values,
 * and every inf or NaN is above every finite value, so a result >= 0x7F800000 means a
 * value the encode must refuse. */
INLINE uint32_t
load_block(const float *row, Py_ssize_t dim, Py_ssize_t j, int block, float *out)
{
    const Py_ssize_t lo = j * block;
    const Py_ssize_t n = dim - lo < block ? dim - lo : block;
    v8u m8 = {0};
    if (n == block) { /* the common case: whole vectors */
        for (int i = 0; i < block; i += 8) {
            const v8f v = ld8(row + lo + i);
            st8(out + i, v);
            const v8u u = (v8u)v & 0x7FFFFFFFu;
            m8 = selu(u > m8, u, m8);
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = row[lo + i];
        for (Py_ssize_t i = n; i < block; i++)
            out[i] = 0.0f;
        for (int i = 0; i < block; i += 8) {
            const v8u u = (v8u)ld8(out + i) & 0x7FFFFFFFu;
            m8 = selu(u > m8, u, m8);
        }
    }
    uint32_t m = 0;
    for (int l = 0; l < 8; l++)
        m = m8[l] > m ? m8[l] : m;
    return m;
}

#define NOT_FINITE 0x7F800000u

/* -- int8 (q8_0) -------------------------------------------------------------------- */

INLINE int
int8_encode_body(const float *x, uint8_t *out, Py_ssize_t n, Py_ssize_t dim)
{
    const Py_ssize_t nb = (dim + 31) / 32;
    const float min_d = 1.0f / FLT_MAX; /* smallest d whose reciprocal is finite */
    float blk[32];
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < nb; j++) {
            const uint32_t abits = load_block(x + r * dim, dim, j, 32, blk);
            if (abits >= NOT_FINITE)
                return 0;
            const float d = float_of(abits) / 127.0f;
            if (d > FP16_MAX)
                return 0;
            const float inv = d >= min_d ? 1.0f / d : 0.0f;
            uint8_t *o = out + (r * nb + j) * 34;
            store_half(o, half_bits(d));
            int8_t q[32];
            for (int i = 0; i < 32; i++)
                q[i] = (int8_t)round_away(blk[i] * inv);
            memcpy(o + 2, q, 32);
        }
    }
    return 1;
}

INLINE void
int8_decode_body(const uint8_t *data, float *out, Py_ssize_t n, Py_ssize_t dim)
{
    const Py_ssize_t nb = (dim + 31) / 32;
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < nb; j++) {
            const uint8_t *b = data + (r * nb + j) * 34;
            const float d = half_value(load_half(b));
            const int8_t *q = (const int8_t *)(b + 2);
            float vals[32];
            for (int i = 0; i < 32; i++)
                vals[i] = (float)q[i] * d;
            const Py_ssize_t lo = j * 32, k = dim - lo < 32 ? dim - lo : 32;
            memcpy(out + r * dim + lo, vals, (size_t)k * sizeof(float));
        }
    }
}

/* -- fp8 (E4M3FN codes, fp16 scale per 32) --------------------------------------- */

/* fp8.to_e4m3fn for one value already clipped to +-448. */
INLINE uint8_t
e4m3(float v)
{
    const uint32_t u = bits_of(v);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t mag = u & 0x7FFFFFFFu;
    uint8_t code;
    if (mag < 0x3C800000u) { /* below 2**-6: a subnormal multiple of 2**-9 */
        code = (uint8_t)rint_even(float_of(mag) * 512.0f);
    } else {
        const uint32_t r = (mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20;
        code = (uint8_t)(r - ((127u - 7u) << 3));
    }
    return code | sign;
}

INLINE int
fp8_encode_body(const float *x, uint8_t *out, Py_ssize_t n, Py_ssize_t dim)
{
    const Py_ssize_t nb = (dim + 31) / 32;
    float blk[32];
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < nb; j++) {
            const uint32_t abits = load_block(x + r * dim, dim, j, 32, blk);
            if (abits >= NOT_FINITE)
                return 0;
            const float scale = float_of(abits) / 448.0f;
            if (scale > FP16_MAX)
                return 0;
            const uint16_t s16 = half_bits(scale);
            const float s = half_value(s16);
            const float inv = s > 0.0f ? 1.0f / s : 0.0f;
            uint8_t *o = out + (r * nb + j) * 34;
            store_half(o, s16);
            int32_t codes[32];
            for (int i = 0; i < 32; i += 8) {
                v8f v = ld8(blk + i) * inv;
                v = sel(v > 448.0f, splat(448.0f), v);
                v = sel(v < -448.0f, splat(-448.0f), v);
                /* e4m3() on eight lanes */
                const v8u u = (v8u)v;
                const v8u sign = (u >> 24) & 0x80u;
                const v8u mag = u & 0x7FFFFFFFu;
                const v8u r = (mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20;
                const v8u normal = r - ((127u - 7u) << 3);
                const v8u sub = (v8u)__builtin_convertvector(rint8((v8f)mag * 512.0f), v8i);
                const v8u code = selu(mag < 0x3C800000u, sub, normal) | sign;
                memcpy(codes + i, &code, sizeof code);
            }
            for (int i = 0; i < 32; i++)
                o[2 + i] = (uint8_t)codes[i];
        }
    }
    return 1;
}

INLINE void
fp8_decode_body(const uint8_t *data, float *out, Py_ssize_t n, Py_ssize_t dim, const float *lut)
{
    const Py_ssize_t nb = (dim + 31) / 32;
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < nb; j++) {
            const uint8_t *b = data + (r * nb + j) * 34;
            const float s = half_value(load_half(b));
            float vals[32];
            for (int i = 0; i < 32; i++)
                vals[i] = lut[b[2 + i]] * s;
            const Py_ssize_t lo = j * 32, k = dim - lo < 32 ? dim - lo : 32;
            memcpy(out + r * dim + lo, vals, (size_t)k * sizeof(float));
        }
    }
}

/* -- mlx4g32 (MLX affine int4, group 32) ------------------------------------------- */

/* base.round_to_fp16 for one value (|v| <= 65504). */
INLINE float
to_fp16_precision(float v)
{
    const uint32_t u = bits_of(v);
    const uint32_t mag = u & 0x7FFFFFFFu;
    if (mag < 0x38800000u)
        return rint_even(v * 0x1p24f) * 0x1p-24f;
    uint32_t r = mag + 0xFFFu + ((mag >> 13) & 1u);
    return float_of((r & 0xFFFFE000u) | (u & 0x80000000u));
}

INLINE int
mlx4_encode_body(const float *x, uint8_t *out, Py_ssize_t n, Py_ssize_t dim)
{
    const Py_ssize_t g = (dim + 31) / 32;
    const Py_ssize_t nc = g * 16, rb = g * 20;
    const float eps = (float)1e-7;
    float w[8][32];
    for (Py_ssize_t r = 0; r < n; r++) {
        uint8_t *o = out + r * rb;
        /* Eight groups at a time: their values rounded to fp16 precision and their
         * extremes first, then their scales and biases as eight lanes (the scalar
         * chain of divisions of one group would otherwise wait on itself). */
        for (Py_ssize_t j0 = 0; j0 < g; j0 += 8) {
            const int count = g - j0 < 8 ? (int)(g - j0) : 8;
            float gmax[8] = {0}, gmin[8] = {0};
            for (int q = 0; q < count; q++) {
                const uint32_t abits = load_block(x + r * dim, dim, j0 + q, 32, w[q]);
                if (abits >= NOT_FINITE || float_of(abits) > FP16_MAX)
                    return 0;
                v8f hi = splat(-INFINITY), lo = splat(INFINITY);
                for (int i = 0; i < 32; i += 8) {
                    /* to_fp16_precision() on eight lanes */
                    const v8f v = ld8(w[q] + i);
                    const v8u u = (v8u)v;
                    const v8u mag = u & 0x7FFFFFFFu;
                    const v8u rr = ((mag + 0xFFFu + ((mag >> 13) & 1u)) & 0xFFFFE000u) |
                                   (u & 0x80000000u);
                    const v8f sub = rint8(v * 0x1p24f) * 0x1p-24f;
                    const v8f f = sel(mag < 0x38800000u, sub, (v8f)rr);
                    st8(w[q] + i, f);
                    hi = sel(f > hi, f, hi);
                    lo = sel(f < lo, f, lo);
                }
                float w_max = hi[0], w_min = lo[0];
                for (int l = 1; l < 8; l++) {
                    w_max = hi[l] > w_max ? hi[l] : w_max;
                    w_min = lo[l] < w_min ? lo[l] : w_min;
                }
                gmax[q] = w_max;
                gmin[q] = w_min;
            }
            /* mlx4.py's scale and bias, one group per lane */
            const v8f wmax = ld8(gmax), wmin = ld8(gmin);
            const v8f amax = (v8f)((v8i)wmax & 0x7FFFFFFF);
            const v8f amin = (v8f)((v8i)wmin & 0x7FFFFFFF);
            const v8i mask = amin > amax;
            v8f scale = (wmax - wmin) / 15.0f;
            scale = sel(scale > eps, scale, splat(eps));
            scale = sel(mask, scale, -scale);
            const v8f edge = sel(mask, wmin, wmax);
            const v8f q0 = rint8(edge / scale);
            const v8i nz = q0 != 0.0f;
            scale = sel(nz, edge / q0, scale);
            const v8f bias = sel(nz, edge, splat(0.0f));
            for (int q = 0; q < count; q++) {
                const Py_ssize_t j = j0 + q;
                const float sq = scale[q], bq = bias[q];
                int32_t codes[32];
                for (int i = 0; i < 32; i += 8) {
                    v8f v = rint8((ld8(w[q] + i) - bq) / sq);
                    v = sel(v > 0.0f, v, splat(0.0f));
                    v = sel(v < 15.0f, v, splat(15.0f));
                    const v8i c = __builtin_convertvector(v, v8i);
                    memcpy(codes + i, &c, sizeof c);
                }
                for (int i = 0; i < 16; i++)
                    o[j * 16 + i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
                store_half(o + nc + 2 * j, half_bits(sq));
                store_half(o + nc + 2 * g + 2 * j, half_bits(bq));
            }
        }
    }
    return 1;
}

INLINE void
mlx4_decode_body(const uint8_t *data, float *out, Py_ssize_t n, Py_ssize_t dim)
{
    const Py_ssize_t g = (dim + 31) / 32;
    const Py_ssize_t nc = g * 16, rb = g * 20;
    for (Py_ssize_t r = 0; r < n; r++) {
        const uint8_t *b = data + r * rb;
        for (Py_ssize_t j = 0; j < g; j++) {
            const float scale = half_value(load_half(b + nc + 2 * j));
            const float bias = half_value(load_half(b + nc + 2 * g + 2 * j));
            int32_t codes[32];
            for (int i = 0; i < 16; i++) {
                codes[2 * i] = b[j * 16 + i] & 15;
                codes[2 * i + 1] = b[j * 16 + i] >> 4;
            }
            float vals[32];
            for (int i = 0; i < 32; i += 8) {
                v8i c;
                memcpy(&c, codes + i, sizeof c);
                st8(vals + i, __builtin_convertvector(c, v8f) * scale + bias);
            }
            const Py_ssize_t lo = j * 32, k = dim - lo < 32 ? dim - lo : 32;
            memcpy(out + r * dim + lo, vals, (size_t)k * sizeof(float));
        }
    }
}

/* -- turbo4/3/2 (rotated Lloyd-Max codes, groups of 128) -------------------------- */

/* The tables turbo.py defines, as passed in (see turbo_tables()). */
typedef struct {
    int bits;
    float s1[128], s2[128], s1_scaled[128];
    float thresholds[7]; /* 2**(bits-1) - 1 midpoints */
    float byte_c2[256];  /* ||C||**2 contribution of one payload byte */
    float value[16];     /* code -> its centroid, signed */
    float inv_sqrt;      /* fp32(1/sqrt(128)) */
} Turbo;

/* Sylvester's H16: H16[i][j] = (-1)**popcount(i & j), filled at import. */
static float H16[16][16];

/* H128 . v as H8 (x) H16: each output the sum of its 16, then 8, terms in index order
 * (see the top of this file). H[i][j] = (-1)**popcount(i & j). */
INLINE void
hadamard128(const float *v, float *out)
{
    /* The loops run over the term index outside and the outputs inside: every output's
     * sum still takes its terms in index order, and the 16 sums advance together
     * (independent chains, not one add's latency after another). */
    v8f y[8][2];
    for (int a = 0; a < 8; a++)
        y[a][0] = y[a][1] = splat(0.0f);
    for (int b = 0; b < 16; b++) {
        const v8f h_lo = ld8(H16[b]), h_hi = ld8(H16[b] + 8);
        for (int a = 0; a < 8; a++) {
            const float x = v[16 * a + b];
            y[a][0] += x * h_lo;
            y[a][1] += x * h_hi;
        }
    }
    v8f z[8][2];
    for (int c = 0; c < 8; c++)
        z[c][0] = z[c][1] = splat(0.0f);
    for (int a = 0; a < 8; a++) {
        for (int c = 0; c < 8; c++) {
            const float h = H16[a][c]; /* H8 is the top-left of H16 */
            z[c][0] += h * y[a][0];
            z[c][1] += h * y[a][1];
        }
    }
    for (int c = 0; c < 8; c++) {
        st8(out + 16 * c, z[c][0]);
        st8(out + 16 * c + 8, z[c][1]);
    }
}

/* turbo.halving_sum over n = 2**k values (t is overwritten). */
INLINE float
halving_sum(float *t, int n)
{
    int half = n / 2;
    for (; half >= 8; half /= 2)
        for (int i = 0; i < half; i += 8)
            st8(t + i, ld8(t + i) + ld8(t + i + half));
    for (; half >= 1; half /= 2)
        for (int i = 0; i < half; i++)
            t[i] = t[i] + t[i + half];
    return t[0];
}

/* `bits` is a constant at each call (see turbo_encode_by_bits): the loops over the
 * thresholds and the packing compile for one format each. */
INLINE int
turbo_encode_body(const float *x, uint8_t *out, Py_ssize_t n, Py_ssize_t dim, const Turbo *T,
                  const int bits)
{
    const int k = (1 << (bits - 1)) - 1;
    const int payload = 128 * bits / 8;
    const Py_ssize_t g = (dim + 127) / 128, rb = g * (2 + payload);
    float grp[128], sq[128], y[128], c2[64];
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < g; j++) {
            if (load_block(x + r * dim, dim, j, 128, grp) >= NOT_FINITE)
                return 0;
            for (int i = 0; i < 128; i += 8) {
                const v8f g8 = ld8(grp + i) * ld8(T->s1 + i);
                st8(grp + i, g8);
                st8(sq + i, g8 * g8);
            }
            const float norm = sqrtf(halving_sum(sq, 128));
            const float scale = norm > 0.0f ? T->inv_sqrt / norm : 0.0f;
            hadamard128(grp, y);
            int32_t sign[128], mag[128];
            for (int i = 0; i < 128; i += 8) {
                const v8f v = (ld8(y + i) * ld8(T->s2 + i)) * scale;
                const v8i neg = -(v < 0.0f); /* 1 where negative (NaN: 0) */
                const v8f a = (v8f)((v8i)v & 0x7FFFFFFF);
                v8i m = {0};
                for (int t = 0; t < k; t++)
                    m -= a > T->thresholds[t];
                memcpy(sign + i, &neg, sizeof neg);
                memcpy(mag + i, &m, sizeof m);
            }
            uint8_t *o = out + r * rb + j * (2 + payload);
            uint8_t *p = o + 2;
            int nbytes; /* the payload bytes the centroid norm is summed over */
            if (bits == 4) {
                for (int i = 0; i < 64; i++)
                    p[i] = (uint8_t)(((sign[2 * i] << 3) | mag[2 * i]) |
                                     (((sign[2 * i + 1] << 3) | mag[2 * i + 1]) << 4));
                nbytes = 64;
            } else if (bits == 3) {
                for (int i = 0; i < 32; i++)
                    p[i] = (uint8_t)(mag[4 * i] | (mag[4 * i + 1] << 2) | (mag[4 * i + 2] << 4) |
                                     (mag[4 * i + 3] << 6));
                for (int i = 0; i < 16; i++) {
                    uint8_t s = 0;
                    for (int b = 0; b < 8; b++)
                        s |= (uint8_t)(sign[8 * i + b] << b);
                    p[32 + i] = s;
                }
                nbytes = 32;
            } else {
                for (int i = 0; i < 32; i++) {
                    uint8_t s = 0;
                    for (int b = 0; b < 4; b++)
                        s |= (uint8_t)(((sign[4 * i + b] << 1) | mag[4 * i + b]) << (2 * b));
                    p[i] = s;
                }
                nbytes = 32;
            }
            for (int i = 0; i < nbytes; i++)
                c2[i] = T->byte_c2[p[i]];
            const float stored = norm / sqrtf(halving_sum(c2, nbytes));
            if (!(stored <= FP16_MAX))
                return 0;
            store_half(o, half_bits(stored));
        }
    }
    return 1;
}

INLINE void
turbo_decode_body(const uint8_t *data, float *out, Py_ssize_t n, Py_ssize_t dim, const Turbo *T,
                  const int bits)
{
    const int payload = 128 * bits / 8;
    const Py_ssize_t g = (dim + 127) / 128, rb = g * (2 + payload);
    float v[128], h[128];
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t j = 0; j < g; j++) {
            const uint8_t *b = data + r * rb + j * (2 + payload);
            const uint8_t *p = b + 2;
            const float norm = half_value(load_half(b));
            uint8_t code[128];
            if (bits == 4) {
                for (int i = 0; i < 64; i++) {
                    code[2 * i] = p[i] & 15;
                    code[2 * i + 1] = p[i] >> 4;
                }
            } else {
                for (int i = 0; i < 32; i++)
                    for (int k = 0; k < 4; k++)
                        code[4 * i + k] = (p[i] >> (2 * k)) & 3;
                if (bits == 3)
                    for (int i = 0; i < 16; i++)
                        for (int k = 0; k < 8; k++)
                            code[8 * i + k] |= (uint8_t)(((p[32 + i] >> k) & 1) << 2);
            }
            for (int i = 0; i < 128; i++)
                v[i] = T->value[code[i]];
            for (int i = 0; i < 128; i += 8)
                st8(v + i, (ld8(v + i) * ld8(T->s2 + i)) * norm);
            hadamard128(v, h);
            for (int i = 0; i < 128; i += 8) /* + 0 makes every zero +0.0 */
                st8(h + i, ld8(h + i) * ld8(T->s1_scaled + i) + 0.0f);
            const Py_ssize_t lo = j * 128, k = dim - lo < 128 ? dim - lo : 128;
            memcpy(out + r * dim + lo, h, (size_t)k * sizeof(float));
        }
    }
}

INLINE int
turbo_encode_by_bits(const float *x, uint8_t *out, Py_ssize_t n, Py_ssize_t dim, const Turbo *T)
{
    if (T->bits == 4)
        return turbo_encode_body(x, out, n, dim, T, 4);
    if (T->bits == 3)
        return turbo_encode_body(x, out, n, dim, T, 3);
    return turbo_encode_body(x, out, n, dim, T, 2);
}

INLINE void
turbo_decode_by_bits(const uint8_t *data, float *out, Py_ssize_t n, Py_ssize_t dim,
                     const Turbo *T)
{
    if (T->bits == 4)
        turbo_decode_body(data, out, n, dim, T, 4);
    else if (T->bits == 3)
        turbo_decode_body(data, out, n, dim, T, 3);
    else
        turbo_decode_body(data, out, n, dim, T, 2);
}

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
