/* Scalar and eight-lane helpers of the block codecs: exactly numpy's element-wise
 * results (rint, roundf, the fp16 casts), the vector types and the block loader.
 * Part of pion.codecs._quant, included by _quant.c only (see its top comment for the
 * rules every kernel here follows). */

#ifndef PION_QUANT_SIMD_H
#define PION_QUANT_SIMD_H

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

#endif
