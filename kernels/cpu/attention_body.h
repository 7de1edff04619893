/* attention_body.h - the attention kernel's per-ISA part, included by
 * attention.c once per vector path inside a target region (AVX-512, AVX2 +
 * FMA + F16C, plain C), with ISA_NAME(x) giving each copy its own names.
 * Inside a region the compiler defines __AVX512F__ / __AVX2__ / __F16C__ as a
 * build with those flags would, so the #ifs below pick each copy's code. The
 * plain C copy keeps the vector copies' 8 lanes in an array: the same FMA
 * chains, summed in the same order, so all three give the same bits. */

#if defined(__AVX2__)
/* 8 (16) cache elements of type T at element index i of p, as floats. */
static inline __attribute__((always_inline)) __m256 ISA_NAME(ld8)(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == CPU_KV_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 ISA_NAME(ld16)(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (T == CPU_KV_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif
#endif
static inline __attribute__((always_inline)) float ISA_NAME(ld1)(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (T == CPU_KV_F16)
#if defined(__F16C__)
        return _cvtsh_ss(h);
#else
        return rd_f16_to_f32(h);
#endif
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Dot product of two head vectors, in a fixed order: 8 lanes over strided
 * elements, then the lanes summed left to right, then the tail. */
static inline __attribute__((always_inline)) float ISA_NAME(dot_hd)(const float *a, const void *b, int32_t hd, int T)
{
    float lanes[8];
    int32_t j = 0;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= hd; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), ISA_NAME(ld8)(b, (size_t)j, T), acc);
    _mm256_storeu_ps(lanes, acc);
#else
    for (int i = 0; i < 8; i++)
        lanes[i] = 0.0f;
    for (; j + 8 <= hd; j += 8)
        for (int i = 0; i < 8; i++)
            lanes[i] = fmaf(a[j + i], ISA_NAME(ld1)(b, (size_t)(j + i), T), lanes[i]);
#endif
    float s = 0.0f;
    for (int i = 0; i < 8; i++)
        s += lanes[i];
    for (; j < hd; j++)
        s += a[j] * ISA_NAME(ld1)(b, (size_t)j, T);
    return s;
}

/* ISA_NAME(dot_hd) of one query against 4 keys at once: the same operations per key,
 * as 4 independent chains so the FMA latency is hidden. */
static inline __attribute__((always_inline)) void ISA_NAME(dot_hd4)(const float *a, const void *const b[4], int32_t hd,
                                                         float out[4], int T)
{
    float lanes4[4][8];
    int32_t j = 0;
#if defined(__AVX2__)
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; j + 8 <= hd; j += 8) {
        __m256 q = _mm256_loadu_ps(a + j);
        for (int t = 0; t < 4; t++)
            acc[t] = _mm256_fmadd_ps(q, ISA_NAME(ld8)(b[t], (size_t)j, T), acc[t]);
    }
    for (int t = 0; t < 4; t++)
        _mm256_storeu_ps(lanes4[t], acc[t]);
#else
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 8; i++)
            lanes4[t][i] = 0.0f;
    for (; j + 8 <= hd; j += 8)
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 8; i++)
                lanes4[t][i] = fmaf(a[j + i], ISA_NAME(ld1)(b[t], (size_t)(j + i), T), lanes4[t][i]);
#endif
    for (int t = 0; t < 4; t++) {
        const float *lanes = lanes4[t];
        float s = 0.0f;
        for (int i = 0; i < 8; i++)
            s += lanes[i];
        for (int32_t e = j; e < hd; e++)
            s += a[e] * ISA_NAME(ld1)(b[t], (size_t)e, T);
        out[t] = s;
    }
}

/* acc[d] = fma(p, v[d], acc[d]) for d < hd: independent per d, so the vector
 * width changes nothing in the result. */
static inline __attribute__((always_inline)) void ISA_NAME(axpy_hd)(float p, const void *v, float *acc, int32_t hd, int T)
{
    int32_t d = 0;
#if defined(__AVX512F__)
    __m512 p16 = _mm512_set1_ps(p);
    for (; d + 16 <= hd; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(p16, ISA_NAME(ld16)(v, (size_t)d, T), _mm512_loadu_ps(acc + d)));
#endif
#if defined(__AVX2__)
    __m256 p8 = _mm256_set1_ps(p);
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(p8, ISA_NAME(ld8)(v, (size_t)d, T), _mm256_loadu_ps(acc + d)));
#endif
    for (; d < hd; d++)
        acc[d] = fmaf(p, ISA_NAME(ld1)(v, (size_t)d, T), acc[d]);
}

/* One task: one (row, kv head) pair, all query heads of its group; T is
 * the cache's element type (a constant in each of the three callers). */
static inline __attribute__((always_inline)) void ISA_NAME(attn_item)(const attn_job *J, int32_t item, int32_t worker, int T)
{
    const size_t es = T == CPU_KV_F32 ? 4 : 2;
    const rd_attn_shape *a = J->a;
    const rd_step_dev *s = J->s;
    const int32_t hd = a->head_dim, bs = a->block_size, nkv = a->n_kv_heads;
    const int32_t group = a->n_heads / nkv;
    float *scores = J->scratch + (size_t)worker * ((size_t)J->max_ctx * group + (size_t)hd * group);
    float *acc = scores + (size_t)J->max_ctx * group;

    int32_t row = item / nkv, kvh = item % nkv;
    int32_t seq = row_seq(s, row);
    /* Keys j0 .. positions[row]: all of them, or the last `window` (the
     * scores and values below are indexed from j0). */
    int32_t end = s->positions[row] + 1;
    int32_t j0 = a->window > 0 && end > a->window ? end - a->window : 0;
    int32_t n = end - j0;
    const int32_t *table = s->block_tables + (size_t)seq * s->max_blocks;
    const float *qrow = J->q + (size_t)row * J->stride;

    /* scores[g][j] = q_g . k_j * scale, 4 keys at a time */
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const void *kj[4];
        for (int t = 0; t < 4; t++)
            kj[t] = J->k_cache + (((size_t)table[(j0 + j + t) / bs] * nkv + kvh) * bs + (j0 + j + t) % bs) * hd * es;
        for (int32_t g = 0; g < group; g++) {
            float d4[4];
            ISA_NAME(dot_hd4)(qrow + (size_t)(kvh * group + g) * hd, kj, hd, d4, T);
            for (int t = 0; t < 4; t++)
                scores[(size_t)g * n + j + t] = d4[t] * a->scale;
        }
    }
    for (; j < n; j++) {
        size_t off = (((size_t)table[(j0 + j) / bs] * nkv + kvh) * bs + (j0 + j) % bs) * hd;
        const void *kj = J->k_cache + off * es;
        for (int32_t g = 0; g < group; g++)
            scores[(size_t)g * n + j] = ISA_NAME(dot_hd)(qrow + (size_t)(kvh * group + g) * hd, kj, hd, T) * a->scale;
    }
    /* softmax per query head, summed in key order */
    for (int32_t g = 0; g < group; g++) {
        float *sc = scores + (size_t)g * n;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n; j++)
            mx = sc[j] > mx ? sc[j] : mx;
        float sum = 0.0f;
        for (int32_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = 1.0f / sum;
        for (int32_t j = 0; j < n; j++)
            sc[j] *= inv;
        for (int32_t d = 0; d < hd; d++)
            acc[(size_t)g * hd + d] = 0.0f;
    }
    /* out_g = sum_j p_gj v_j, in key order */
    for (int32_t j = 0; j < n; j++) {
        size_t off = (((size_t)table[(j0 + j) / bs] * nkv + kvh) * bs + (j0 + j) % bs) * hd;
        const void *vj = J->v_cache + off * es;
        for (int32_t g = 0; g < group; g++) {
            ISA_NAME(axpy_hd)(scores[(size_t)g * n + j], vj, acc + (size_t)g * hd, hd, T);
        }
    }
    for (int32_t g = 0; g < group; g++) {
        float *o = J->out + (size_t)row * a->n_heads * hd + (size_t)(kvh * group + g) * hd;
        memcpy(o, acc + (size_t)g * hd, sizeof(float) * hd);
    }
}

static void ISA_NAME(attn_task_f32)(void *ctx, int32_t item, int32_t worker) { ISA_NAME(attn_item)(ctx, item, worker, CPU_KV_F32); }
static void ISA_NAME(attn_task_bf16)(void *ctx, int32_t item, int32_t worker) { ISA_NAME(attn_item)(ctx, item, worker, CPU_KV_BF16); }
static void ISA_NAME(attn_task_f16)(void *ctx, int32_t item, int32_t worker) { ISA_NAME(attn_item)(ctx, item, worker, CPU_KV_F16); }

