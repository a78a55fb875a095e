/* The int8, fp8 and mlx4g32 kernels (references: int8.py, fp8.py, mlx4.py).
 * Part of pion.codecs._quant, included by _quant.c only (see its top comment for the
 * rules every kernel here follows). */

#ifndef PION_QUANT_BLOCKS_H
#define PION_QUANT_BLOCKS_H

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
                /* fp8.to_e4m3fn on eight lanes (|v| <= 448) */
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
                    /* base.round_to_fp16 on eight lanes (|v| <= 65504) */
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

#endif
