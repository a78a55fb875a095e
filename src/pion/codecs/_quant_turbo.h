/* The turbo4/3/2 kernels (reference: turbo.py).
 * Part of pion.codecs._quant, included by _quant.c only (see its top comment for the
 * rules every kernel here follows). */

#ifndef PION_QUANT_TURBO_H
#define PION_QUANT_TURBO_H

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
    v8f y[8][2], z[8][2];
    for (int half = 0; half < 2; half++) { /* eight accumulators at a time: no spills */
        for (int a = 0; a < 8; a++)
            y[a][half] = splat(0.0f);
        for (int b = 0; b < 16; b++) {
            const v8f h = ld8(H16[b] + 8 * half);
            for (int a = 0; a < 8; a++)
                y[a][half] += v[16 * a + b] * h;
        }
        for (int c = 0; c < 8; c++)
            z[c][half] = splat(0.0f);
        for (int a = 0; a < 8; a++)
            for (int c = 0; c < 8; c++)
                z[c][half] += H16[a][c] * y[a][half]; /* H8 is the top-left of H16 */
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
            /* each code's centroid, straight from the payload bytes */
            const float *value = T->value;
            if (bits == 4) {
                for (int i = 0; i < 64; i++) {
                    v[2 * i] = value[p[i] & 15];
                    v[2 * i + 1] = value[p[i] >> 4];
                }
            } else if (bits == 3) {
                for (int i = 0; i < 32; i++) {
                    const int signs = p[32 + i / 2] >> (4 * (i & 1)); /* bits of 4i.. */
                    for (int k = 0; k < 4; k++)
                        v[4 * i + k] = value[((p[i] >> (2 * k)) & 3) | (((signs >> k) & 1) << 2)];
                }
            } else {
                for (int i = 0; i < 32; i++)
                    for (int k = 0; k < 4; k++)
                        v[4 * i + k] = value[(p[i] >> (2 * k)) & 3];
            }
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

#endif
