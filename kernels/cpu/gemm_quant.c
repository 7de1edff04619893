/* gemm_quant.c - packed weights in their file dtype and the GEMM that
 * decodes them on the fly (see gemm_quant.h).
 *
 * Exactness: engine/model/dequant.c computes every weight as an exact product
 * (f16 scale times a small integer, or (d * sc) * q for K-quants; at most 24
 * significant bits) followed by at most one rounded add or subtract of an
 * exact product. The decoders below compute the same products and the same
 * single add, so they give the same float per weight. Where they use a fused
 * multiply-add (q * d + m) the product is exact, so fusing it changes
 * nothing: fma rounds q*d + m once, as the separate add does. test_gemm
 * checks every type against ggml_dequant_row bit for bit. */
#include "kernels/cpu/gemm_quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <immintrin.h>

#include "base/cpu_isa.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "base/pool.h"

#define LANES GEMM_PANEL

/* ---------------------------------------------------------------------------
 * Layouts: k per block, bytes per panel-block, and where each field starts. */

typedef struct {
    int32_t blk;                /* k per block */
    uint32_t pblk;              /* bytes per panel-block */
    uint32_t raw;               /* bytes per raw (GGUF) block of one row; F types: per element */
    uint32_t d, m, sc, mn, hi, q; /* field offsets in the panel-block */
} qlayout;

static int layout_of(int32_t type, qlayout *l)
{
    memset(l, 0, sizeof *l);
    l->blk = 32;
    switch (type) {
    case GGML_F32: l->pblk = 32 * LANES * 4; l->raw = 4; return 0;
    case GGML_F16:
    case GGML_BF16: l->pblk = 32 * LANES * 2; l->raw = 2; return 0;
    case GGML_Q8_0: l->pblk = 544; l->raw = 34; l->q = 32; return 0;
    case GGML_Q4_0: l->pblk = 288; l->raw = 18; l->q = 32; return 0;
    case GGML_Q4_1: l->pblk = 320; l->raw = 20; l->m = 32; l->q = 64; return 0;
    case GGML_Q5_0: l->pblk = 352; l->raw = 22; l->hi = 32; l->q = 96; return 0;
    case GGML_Q5_1: l->pblk = 384; l->raw = 24; l->m = 32; l->hi = 64; l->q = 128; return 0;
    case GGML_Q4_K:
        l->blk = 256; l->pblk = 2368; l->raw = 144; l->m = 32; l->sc = 64; l->mn = 192; l->q = 320;
        return 0;
    case GGML_Q5_K:
        l->blk = 256; l->pblk = 2880; l->raw = 176; l->m = 32; l->sc = 64; l->mn = 192; l->hi = 320; l->q = 832;
        return 0;
    case GGML_Q6_K:
        l->blk = 256; l->pblk = 3360; l->raw = 210; l->sc = 32; l->q = 288; l->hi = 2336;
        return 0;
    }
    return RD_ENOTSUP;
}

static int is_ftype(int32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16; }

int gemm_qtype_ok(int32_t type)
{
    qlayout l;
    return layout_of(type, &l) == 0;
}

/* Panels are stored in groups of 4 (the GEMM's work item), blocks of the
 * group's panels interleaved: [group][block][panel of the group][pblk], so a
 * task reads one linear stream (the hardware prefetcher follows it; four
 * short per-panel streams it did not). The last group may hold fewer. */
static inline size_t group_bytes(const gemm_qpart *q, int32_t g)
{
    int32_t npg = q->n_panels - 4 * g < 4 ? q->n_panels - 4 * g : 4;
    return (size_t)npg * q->n_blocks * q->pblk;
}
static inline size_t pblock_at(const gemm_qpart *q, int32_t p, int32_t b)
{
    int32_t g = p / 4, npg = q->n_panels - 4 * g < 4 ? q->n_panels - 4 * g : 4;
    return ((size_t)g * 4 * q->n_blocks + (size_t)b * npg + p % 4) * q->pblk;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
/* 4-bit code of k (0..blk) for a lane: pairs of k share a byte. */
static void put_nib(uint8_t *q, int k, int lane, int v) { q[(k / 2) * LANES + lane] |= (uint8_t)(k & 1 ? v << 4 : v); }
static int get_nib(const uint8_t *q, int k, int lane)
{
    uint8_t b = q[(k / 2) * LANES + lane];
    return k & 1 ? b >> 4 : b & 15;
}
/* One bit per (k, lane): a u16 per k. */
static void put_bit(uint8_t *hi, int k, int lane) { hi[2 * k + lane / 8] |= (uint8_t)(1u << (lane % 8)); }
static int get_bit(const uint8_t *hi, int k, int lane) { return (hi[2 * k + lane / 8] >> (lane % 8)) & 1; }

/* K-quant 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* One raw block `b` of one row into lane `lane` of panel-block pb. */
static void pack_block(int32_t type, const qlayout *L, const uint8_t *b, uint8_t *pb, int lane)
{
    uint8_t *q = pb + L->q;
    switch (type) {
    case GGML_Q8_0:
        put16(pb + 2 * lane, rd16(b));
        for (int k = 0; k < 32; k++)
            q[k * LANES + lane] = b[2 + k];
        break;
    case GGML_Q4_0:
    case GGML_Q4_1: {
        const uint8_t *qs = b + (type == GGML_Q4_0 ? 2 : 4);
        put16(pb + 2 * lane, rd16(b));
        if (type == GGML_Q4_1)
            put16(pb + L->m + 2 * lane, rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            put_nib(q, j, lane, qs[j] & 15);
            put_nib(q, j + 16, lane, qs[j] >> 4);
        }
        break;
    }
    case GGML_Q5_0:
    case GGML_Q5_1: {
        int one = type == GGML_Q5_1;
        uint32_t qh = rd32(b + (one ? 4 : 2));
        const uint8_t *qs = b + (one ? 8 : 6);
        put16(pb + 2 * lane, rd16(b));
        if (one)
            put16(pb + L->m + 2 * lane, rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            put_nib(q, j, lane, qs[j] & 15);
            put_nib(q, j + 16, lane, qs[j] >> 4);
        }
        for (int k = 0; k < 32; k++)
            if ((qh >> k) & 1)
                put_bit(pb + L->hi, k, lane);
        break;
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (type == GGML_Q4_K ? 16 : 48);
        put16(pb + 2 * lane, rd16(b));
        put16(pb + L->m + 2 * lane, rd16(b + 2));
        for (int s = 0; s < 8; s++) {
            int sc, m;
            scale_min_k4(s, scales, &sc, &m);
            pb[L->sc + s * LANES + lane] = (uint8_t)sc;
            pb[L->mn + s * LANES + lane] = (uint8_t)m;
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                put_nib(q, 64 * c + l, lane, qs[32 * c + l] & 15);
                put_nib(q, 64 * c + 32 + l, lane, qs[32 * c + l] >> 4);
                if (type == GGML_Q5_K) {
                    if ((qh[l] >> (2 * c)) & 1)
                        put_bit(pb + L->hi, 64 * c + l, lane);
                    if ((qh[l] >> (2 * c + 1)) & 1)
                        put_bit(pb + L->hi, 64 * c + 32 + l, lane);
                }
            }
        break;
    }
    case GGML_Q6_K: {
        put16(pb + 2 * lane, rd16(b + 208));
        for (int s = 0; s < 16; s++)
            pb[L->sc + s * LANES + lane] = b[192 + s];
        for (int e = 0; e < 256; e++) {
            int h = e / 128, t = (e % 128) / 32, l = e % 32;
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            int nib = t & 1 ? ql[l + 32] : ql[l];
            nib = t & 2 ? nib >> 4 : nib & 15;
            int hb = (qh[l] >> (2 * t)) & 3;
            put_nib(q, e, lane, nib);
            pb[L->hi + (e / 4) * LANES + lane] |= (uint8_t)(hb << (2 * (e % 4)));
        }
        break;
    }
    }
}

/* The inverse of pack_block: lane `lane` of panel-block pb back into the raw
 * block b (whose bytes it fully writes). Every bit of a raw block is kept by
 * the pack, so a weight reads back as the very bytes it was loaded from: a
 * partial push keeps the rows it leaves out without re-quantizing them. */
static void unpack_block(int32_t type, const qlayout *L, const uint8_t *pb, uint8_t *b, int lane)
{
    const uint8_t *q = pb + L->q;
    memset(b, 0, L->raw);
    switch (type) {
    case GGML_Q8_0:
        put16(b, rd16(pb + 2 * lane));
        for (int k = 0; k < 32; k++)
            b[2 + k] = q[k * LANES + lane];
        break;
    case GGML_Q4_0:
    case GGML_Q4_1:
    case GGML_Q5_0:
    case GGML_Q5_1: {
        const int one = type == GGML_Q4_1 || type == GGML_Q5_1, five = type == GGML_Q5_0 || type == GGML_Q5_1;
        uint8_t *qs = b + 2 + 2 * one + 4 * five;
        put16(b, rd16(pb + 2 * lane));
        if (one)
            put16(b + 2, rd16(pb + L->m + 2 * lane));
        for (int j = 0; j < 16; j++)
            qs[j] = (uint8_t)(get_nib(q, j, lane) | get_nib(q, j + 16, lane) << 4);
        if (five) {
            uint32_t qh = 0;
            for (int k = 0; k < 32; k++)
                qh |= (uint32_t)get_bit(pb + L->hi, k, lane) << k;
            uint8_t *h = b + 2 + 2 * one;
            for (int i = 0; i < 4; i++)
                h[i] = (uint8_t)(qh >> (8 * i));
        }
        break;
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
        uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (type == GGML_Q4_K ? 16 : 48);
        put16(b, rd16(pb + 2 * lane));
        put16(b + 2, rd16(pb + L->m + 2 * lane));
        /* scale_min_k4's packing, inverted: low 6 bits of sub-blocks 0-3 in
         * bytes 0-7, sub-blocks 4-7 split into nibbles (bytes 8-11) and the
         * top 2 bits of bytes 0-7. */
        for (int j = 0; j < 4; j++) {
            const int sc = pb[L->sc + j * LANES + lane], m = pb[L->mn + j * LANES + lane];
            const int sc4 = pb[L->sc + (j + 4) * LANES + lane], m4 = pb[L->mn + (j + 4) * LANES + lane];
            scales[j] = (uint8_t)(sc | (sc4 >> 4) << 6);
            scales[j + 4] = (uint8_t)(m | (m4 >> 4) << 6);
            scales[j + 8] = (uint8_t)((sc4 & 15) | (m4 & 15) << 4);
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                qs[32 * c + l] = (uint8_t)(get_nib(q, 64 * c + l, lane) | get_nib(q, 64 * c + 32 + l, lane) << 4);
                if (type == GGML_Q5_K)
                    qh[l] |= (uint8_t)(get_bit(pb + L->hi, 64 * c + l, lane) << (2 * c) |
                                       get_bit(pb + L->hi, 64 * c + 32 + l, lane) << (2 * c + 1));
            }
        break;
    }
    case GGML_Q6_K: {
        put16(b + 208, rd16(pb + 2 * lane));
        for (int s = 0; s < 16; s++)
            b[192 + s] = pb[L->sc + s * LANES + lane];
        for (int e = 0; e < 256; e++) {
            int h = e / 128, t = (e % 128) / 32, l = e % 32;
            uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int nib = get_nib(q, e, lane), hb = (pb[L->hi + (e / 4) * LANES + lane] >> (2 * (e % 4))) & 3;
            ql[l + (t & 1 ? 32 : 0)] |= (uint8_t)(t & 2 ? nib << 4 : nib);
            qh[l] |= (uint8_t)(hb << (2 * t));
        }
        break;
    }
    }
}

/* One 4-panel group (64 rows) of a pack: its bytes zeroed (first touch on
 * the thread that fills them), then every row's blocks placed. */
typedef struct {
    gemm_qpart *q;
    qlayout L;
    const uint8_t *src;
    size_t row_bytes;
} pack_job;

/* An 8 x 8 transpose of 16-bit elements: row i of src (8 elements at
 * src + i * ss bytes) becomes column i of dst (rows at dst + j * ds). SSE2
 * (every x86-64 has it): three rounds of interleaves instead of 64 scalar
 * moves, for the 16-bit packs a push or a delta does over a whole model. */
static inline void t8x8_u16(const uint8_t *src, size_t ss, uint8_t *dst, size_t ds)
{
#if defined(__SSE2__)
#define LD(i) _mm_loadu_si128((const __m128i *)(src + (i) * ss))
#define ST(j, v) _mm_storeu_si128((__m128i *)(dst + (size_t)(j) * ds), (v))
    const __m128i r0 = LD(0), r1 = LD(1), r2 = LD(2), r3 = LD(3), r4 = LD(4), r5 = LD(5), r6 = LD(6), r7 = LD(7);
    /* pairs of rows interleaved: columns 0-3 (lo) and 4-7 (hi) */
    const __m128i a0 = _mm_unpacklo_epi16(r0, r1), a1 = _mm_unpacklo_epi16(r2, r3);
    const __m128i a2 = _mm_unpacklo_epi16(r4, r5), a3 = _mm_unpacklo_epi16(r6, r7);
    const __m128i a4 = _mm_unpackhi_epi16(r0, r1), a5 = _mm_unpackhi_epi16(r2, r3);
    const __m128i a6 = _mm_unpackhi_epi16(r4, r5), a7 = _mm_unpackhi_epi16(r6, r7);
    /* quads of rows: two columns each */
    const __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1);
    const __m128i b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3);
    const __m128i b4 = _mm_unpacklo_epi32(a4, a5), b5 = _mm_unpackhi_epi32(a4, a5);
    const __m128i b6 = _mm_unpacklo_epi32(a6, a7), b7 = _mm_unpackhi_epi32(a6, a7);
    ST(0, _mm_unpacklo_epi64(b0, b2));
    ST(1, _mm_unpackhi_epi64(b0, b2));
    ST(2, _mm_unpacklo_epi64(b1, b3));
    ST(3, _mm_unpackhi_epi64(b1, b3));
    ST(4, _mm_unpacklo_epi64(b4, b6));
    ST(5, _mm_unpackhi_epi64(b4, b6));
    ST(6, _mm_unpacklo_epi64(b5, b7));
    ST(7, _mm_unpackhi_epi64(b5, b7));
#undef LD
#undef ST
#else
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++)
            memcpy(dst + (size_t)j * ds + 2 * (size_t)i, src + (size_t)i * ss + 2 * (size_t)j, 2);
#endif
}

/* F32/F16/BF16: panel-block [32 k][16 lanes] of es-byte elements; a 16 x 32
 * transpose per block, rows read in order. */
static void pack_ftype_panel(const pack_job *j, int32_t p)
{
    const gemm_qpart *q = j->q;
    const size_t es = j->L.raw;
    const int32_t c0 = p * LANES, nc = q->out - c0 < LANES ? q->out - c0 : LANES;
    for (int32_t b = 0; b < q->n_blocks; b++) {
        uint8_t *pb = q->data + pblock_at(q, p, b);
        const int32_t k0 = b * 32, nk = q->in - k0 < 32 ? q->in - k0 : 32;
        if (es == 2 && nc == LANES && nk == 32) {   /* a whole block: 2 x 4 transposes of 8 x 8 */
            for (int32_t lg = 0; lg < LANES; lg += 8)
                for (int32_t kg = 0; kg < 32; kg += 8)
                    t8x8_u16(j->src + (size_t)(c0 + lg) * j->row_bytes + (size_t)(k0 + kg) * 2, j->row_bytes,
                             pb + ((size_t)kg * LANES + lg) * 2, LANES * 2);
            continue;
        }
        for (int32_t lane = 0; lane < nc; lane++) {
            const uint8_t *row = j->src + (size_t)(c0 + lane) * j->row_bytes + (size_t)k0 * es;
            if (es == 2) {
                uint16_t *d = (uint16_t *)pb + lane;
                for (int32_t k = 0; k < nk; k++)
                    memcpy(d + (size_t)k * LANES, row + 2 * (size_t)k, 2);
            } else {
                uint32_t *d = (uint32_t *)pb + lane;
                for (int32_t k = 0; k < nk; k++)
                    memcpy(d + (size_t)k * LANES, row + 4 * (size_t)k, 4);
            }
        }
    }
}

static void pack_task(void *ctx, int32_t g, int32_t worker)
{
    const pack_job *j = ctx;
    gemm_qpart *q = j->q;
    const int32_t p1 = 4 * g + 4 < q->n_panels ? 4 * g + 4 : q->n_panels;
    /* A 16/32-bit group with no padding lane or k is written whole below;
     * every other group starts from zeros (quantized fields are or-ed in). */
    if (!is_ftype(q->type) || q->in % 32 || p1 * LANES > q->out)
        memset(q->data + (size_t)g * 4 * q->n_blocks * q->pblk, 0, group_bytes(q, g));
    for (int32_t p = 4 * g; p < p1; p++) {
        if (is_ftype(q->type)) {
            pack_ftype_panel(j, p);
            continue;
        }
        const int32_t c1 = (p + 1) * LANES < q->out ? (p + 1) * LANES : q->out;
        for (int32_t c = p * LANES; c < c1; c++) {
            const uint8_t *row = j->src + (size_t)c * j->row_bytes;
            for (int32_t b = 0; b < q->n_blocks; b++)
                pack_block(q->type, &j->L, row + (size_t)b * j->L.raw, q->data + pblock_at(q, p, b), c % LANES);
        }
    }
}

/* The packed bytes. A weight push packs a model's worth of fresh memory
 * (~270 MB for bf16 SmolLM2) and frees the replaced weights after the swap;
 * on a VM whose freed pages go back to the host, the kernel's zeroing of the
 * fresh ones cost more than the packing itself (0.25-2 GB/s measured here).
 * So freed weights of 64 KiB or more wait in a cache, bounded by
 * RD_CPU_WEIGHT_CACHE_MB (default 1024; 0 turns it off), and the next pack
 * of the same size takes one: after the first push, every push reuses the
 * previous version's memory. A weight of 2 MiB or more sits on transparent
 * huge pages (THP's "madvise" mode, Debian's default, needs the advice). */
#define QHUGE ((size_t)2 << 20)
#define QCACHE_MIN ((size_t)64 << 10)
#define QCACHE_MAX 8192

static size_t qround(size_t bytes)
{
    return bytes < QHUGE ? (bytes + 63) & ~(size_t)63 : (bytes + QHUGE - 1) & ~(QHUGE - 1);
}

static struct {
    pthread_mutex_t mu;
    int32_t n;
    size_t bytes, cap;
    int cap_set;
    void *p[QCACHE_MAX];
    size_t size[QCACHE_MAX];
} qcache = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *qcache_take(size_t n)
{
    void *p = NULL;
    pthread_mutex_lock(&qcache.mu);
    for (int32_t i = qcache.n - 1; i >= 0; i--)
        if (qcache.size[i] == n) {
            p = qcache.p[i];
            qcache.bytes -= n;
            qcache.n--;
            qcache.p[i] = qcache.p[qcache.n];
            qcache.size[i] = qcache.size[qcache.n];
            break;
        }
    pthread_mutex_unlock(&qcache.mu);
    return p;
}

static int qcache_put(void *p, size_t n)
{
    int kept = 0;
    pthread_mutex_lock(&qcache.mu);
    if (!qcache.cap_set) {
        const char *v = getenv("RD_CPU_WEIGHT_CACHE_MB");
        qcache.cap = (size_t)(v && *v ? strtoull(v, NULL, 10) : 1024) << 20;
        qcache.cap_set = 1;
    }
    if (n >= QCACHE_MIN && qcache.n < QCACHE_MAX && qcache.bytes + n <= qcache.cap) {
        qcache.p[qcache.n] = p;
        qcache.size[qcache.n++] = n;
        qcache.bytes += n;
        kept = 1;
    }
    pthread_mutex_unlock(&qcache.mu);
    return kept;
}

static void *qalloc(size_t bytes)
{
    size_t n = qround(bytes);
    void *p = n >= QCACHE_MIN ? qcache_take(n) : NULL;
    if (p)
        return p;
    if (n < QHUGE)
        return aligned_alloc(64, n);
    if (posix_memalign(&p, QHUGE, n))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

int gemm_qpack(int32_t type, const void *raw, int32_t out, int32_t in, gemm_qpart *q)
{
    memset(q, 0, sizeof *q);
    qlayout L;
    if (layout_of(type, &L))
        return rd_fail(RD_ENOTSUP, "gemm_qpack: tensor type %s (%d) is not supported", ggml_type_name(type), type);
    if (out <= 0 || in <= 0)
        return rd_fail(RD_EINVAL, "gemm_qpack: shape [%d][%d] must be positive", out, in);
    if (!is_ftype(type) && in % L.blk)
        return rd_fail(RD_EINVAL, "gemm_qpack: %s rows of %d elements are not a multiple of its block %d",
                       ggml_type_name(type), in, L.blk);
    q->type = type;
    q->out = out;
    q->in = in;
    q->n_panels = (out + LANES - 1) / LANES;
    q->blk = L.blk;
    q->n_blocks = (in + L.blk - 1) / L.blk;
    q->pblk = L.pblk;
    size_t bytes = (size_t)q->n_panels * q->n_blocks * L.pblk;
    q->data = qalloc(bytes);
    if (!q->data)
        return rd_fail(RD_ENOMEM, "gemm_qpack: cannot allocate %zu bytes", bytes);
    /* On the pool: a weight push repacks ~270 MB (bf16 SmolLM2) at COMMIT,
     * and the load does the same for the file; groups are independent. */
    pack_job j = {.q = q, .L = L, .src = raw,
                  .row_bytes = is_ftype(type) ? (size_t)in * L.raw : (size_t)(in / L.blk) * L.raw};
    pool_run((q->n_panels + 3) / 4, pack_task, &j);
    return 0;
}

void gemm_qrelease(gemm_qpart *q)
{
    if (q->data && !qcache_put(q->data, qround(gemm_qbytes(q))))
        free(q->data);
    q->data = NULL;
}

size_t gemm_qbytes(const gemm_qpart *q) { return (size_t)q->n_panels * q->n_blocks * q->pblk; }

/* ---------------------------------------------------------------------------
 * Plain C decode: lanes [l0, l1) of panel p, k in [k0, k0 + nk), into
 * dst[kk * ld + lane - l0]. The operations are dequant.c's, in its order. */

static void decode_lanes(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, int l0, int l1, float *dst,
                         int ld)
{
    qlayout L;
    layout_of(q->type, &L);
    const int32_t b = k0 / q->blk, kb0 = k0 % q->blk;
    const uint8_t *pb = q->data + pblock_at(q, p, b);
    const uint8_t *qq = pb + L.q;
    for (int lane = l0; lane < l1; lane++) {
        float d = rd_f16_to_f32(rd16(pb + 2 * lane));
        float m = rd_f16_to_f32(rd16(pb + L.m + 2 * lane));
        for (int32_t kk = 0; kk < nk; kk++) {
            const int k = kb0 + kk;
            float w = 0.0f;
            switch (q->type) {
            case GGML_F32: memcpy(&w, pb + ((size_t)k * LANES + lane) * 4, 4); break;
            case GGML_F16: w = rd_f16_to_f32(rd16(pb + ((size_t)k * LANES + lane) * 2)); break;
            case GGML_BF16: w = rd_bf16_to_f32(rd16(pb + ((size_t)k * LANES + lane) * 2)); break;
            case GGML_Q8_0: w = (float)(int8_t)qq[k * LANES + lane] * d; break;
            case GGML_Q4_0: w = (float)(get_nib(qq, k, lane) - 8) * d; break;
            case GGML_Q4_1: w = (float)get_nib(qq, k, lane) * d + m; break;
            case GGML_Q5_0:
                w = (float)((get_nib(qq, k, lane) | get_bit(pb + L.hi, k, lane) << 4) - 16) * d;
                break;
            case GGML_Q5_1: w = (float)(get_nib(qq, k, lane) | get_bit(pb + L.hi, k, lane) << 4) * d + m; break;
            case GGML_Q4_K:
            case GGML_Q5_K: {
                int s = k / 32, v = get_nib(qq, k, lane);
                if (q->type == GGML_Q5_K)
                    v |= get_bit(pb + L.hi, k, lane) << 4;
                float d0 = d * (float)pb[L.sc + s * LANES + lane], mn0 = m * (float)pb[L.mn + s * LANES + lane];
                w = d0 * (float)v - mn0;
                break;
            }
            case GGML_Q6_K: {
                int v = get_nib(qq, k, lane) | ((pb[L.hi + (k / 4) * LANES + lane] >> (2 * (k % 4))) & 3) << 4;
                w = d * (float)(int8_t)pb[L.sc + (k / 16) * LANES + lane] * (float)(v - 32);
                break;
            }
            }
            dst[(size_t)kk * ld + lane - l0] = w;
        }
    }
}

void gemm_qdecode_scalar(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst)
{
    decode_lanes(q, p, k0, nk, 0, LANES, dst, LANES);
}

void gemm_qrow(const gemm_qpart *q, int32_t r, float *dst)
{
    for (int32_t k0 = 0; k0 < q->in; k0 += GEMMQ_CHUNK) {
        int32_t nk = q->in - k0 < GEMMQ_CHUNK ? q->in - k0 : GEMMQ_CHUNK;
        decode_lanes(q, r / LANES, k0, nk, r % LANES, r % LANES + 1, dst + k0, 1);
    }
}

void gemm_qlinear_row(const gemm_qlinear *L, int32_t r, float *dst)
{
    int i = L->n_parts - 1;
    while (i > 0 && L->row0[i] > r)
        i--;
    gemm_qrow(&L->parts[i], r - L->row0[i], dst);
}

/* ---------------------------------------------------------------------------
 * Reading a 16/32-bit part back as its own bytes: the inverse of
 * pack_ftype_panel, one panel at a time on the pool. */

typedef struct {
    const gemm_qpart *q;
    int32_t r0, nr;             /* rows [r0, r0 + nr) of the part */
    uint8_t *dst;               /* nr x in elements, row-major */
} raw_job;

static void raw_task(void *ctx, int32_t i, int32_t worker)
{
    const raw_job *j = ctx;
    const gemm_qpart *q = j->q;
    const size_t es = q->type == GGML_F32 ? 4 : 2;
    const int32_t p = j->r0 / LANES + i;
    const int32_t c0 = p * LANES > j->r0 ? p * LANES : j->r0;
    const int32_t c1 = (p + 1) * LANES < j->r0 + j->nr ? (p + 1) * LANES : j->r0 + j->nr;
    for (int32_t b = 0; b < q->n_blocks; b++) {
        const uint8_t *pb = q->data + pblock_at(q, p, b);
        const int32_t k0 = b * 32, nk = q->in - k0 < 32 ? q->in - k0 : 32;
        if (es == 2 && c1 - c0 == LANES && nk == 32) {  /* a whole block: pack_ftype_panel's transposes, back */
            for (int32_t lg = 0; lg < LANES; lg += 8)
                for (int32_t kg = 0; kg < 32; kg += 8)
                    t8x8_u16(pb + ((size_t)kg * LANES + lg) * 2, LANES * 2,
                             j->dst + ((size_t)(c0 + lg - j->r0) * q->in + k0 + kg) * 2, (size_t)q->in * 2);
            continue;
        }
        for (int32_t c = c0; c < c1; c++) {
            uint8_t *row = j->dst + ((size_t)(c - j->r0) * q->in + k0) * es;
            const int32_t lane = c % LANES;
            if (es == 2) {
                for (int32_t k = 0; k < nk; k++)
                    memcpy(row + 2 * (size_t)k, pb + ((size_t)k * LANES + lane) * 2, 2);
            } else {
                for (int32_t k = 0; k < nk; k++)
                    memcpy(row + 4 * (size_t)k, pb + ((size_t)k * LANES + lane) * 4, 4);
            }
        }
    }
}

/* A block-quantized part's rows: every raw block unpacked from its lane. */
static void raw_task_q(void *ctx, int32_t i, int32_t worker)
{
    const raw_job *j = ctx;
    const gemm_qpart *q = j->q;
    qlayout L;
    layout_of(q->type, &L);
    const int32_t p = j->r0 / LANES + i;
    const int32_t c0 = p * LANES > j->r0 ? p * LANES : j->r0;
    const int32_t c1 = (p + 1) * LANES < j->r0 + j->nr ? (p + 1) * LANES : j->r0 + j->nr;
    const size_t row_bytes = (size_t)q->n_blocks * L.raw;
    for (int32_t c = c0; c < c1; c++)
        for (int32_t b = 0; b < q->n_blocks; b++)
            unpack_block(q->type, &L, q->data + pblock_at(q, p, b), j->dst + (size_t)(c - j->r0) * row_bytes + (size_t)b * L.raw,
                         c % LANES);
}

int gemm_qraw(const gemm_qpart *q, int32_t r0, int32_t nr, void *dst)
{
    if (r0 < 0 || nr <= 0 || r0 + nr > q->out)
        return rd_fail(RD_EINVAL, "gemm_qraw: rows [%d, %d) of a %d-row weight", r0, r0 + nr, q->out);
    raw_job j = {.q = q, .r0 = r0, .nr = nr, .dst = dst};
    pool_run((r0 + nr - 1) / LANES - r0 / LANES + 1, is_ftype(q->type) ? raw_task : raw_task_q, &j);
    return 0;
}

void gemm_qlinear_index(gemm_qlinear *L)
{
    int32_t row = 0, t = 0;
    for (int i = 0; i < L->n_parts; i++) {
        L->row0[i] = row;
        L->task0[i] = t;
        row += L->parts[i].out;
        t += (L->parts[i].n_panels + 3) / 4;
    }
    L->task0[L->n_parts] = t;
}

/* ---------------------------------------------------------------------------
 * AVX-512 decode of one chunk of GEMMQ_CHUNK k (k0 a multiple of it),
 * compiled for AVX-512 whatever the build's flags; taken where
 * cpu_isa_active() says the host has it (base/cpu_isa.h). */

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
static inline __m512 cvt_u8(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512 ld_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __mmask16 ld_mask(const uint8_t *p) { return (__mmask16)rd16(p); }

/* The 32 codes of a chunk as 32 vectors of int32: nibble pairs at q (16
 * rows), plus 16 where the hi bit mask is set (hi NULL: none), minus sub. */
#define NIB_LOOP(q, hi, BODY)                                                                        \
    for (int i = 0; i < 16; i++) {                                                                   \
        __m512i bb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((q) + i * LANES)));      \
        __m512i c0 = _mm512_and_si512(bb, _mm512_set1_epi32(15)), c1 = _mm512_srli_epi32(bb, 4);     \
        if (hi) {                                                                                    \
            c0 = _mm512_mask_or_epi32(c0, ld_mask((hi) + 4 * i), c0, _mm512_set1_epi32(16));         \
            c1 = _mm512_mask_or_epi32(c1, ld_mask((hi) + 4 * i + 2), c1, _mm512_set1_epi32(16));     \
        }                                                                                            \
        float *o0 = dst + (2 * i) * LANES, *o1 = o0 + LANES;                                         \
        BODY                                                                                         \
    }

/* Q6_K's four k of one hi byte as int8 codes minus 32, per lane: the
 * 6-bit code is assembled on 16 bytes (low nibble from the pair byte, 2
 * high bits from the hi byte; 16-bit shifts with byte masks, the masks drop
 * what crosses a byte) and widened once. The same integers as unpacking in
 * 32-bit lanes, so the weights are the same floats. */
static inline __attribute__((always_inline)) void q6k_codes(const uint8_t *ql, const uint8_t *qh, __m512i c[4])
{
    const __m128i h = _mm_loadu_si128((const __m128i *)qh), n0 = _mm_loadu_si128((const __m128i *)ql),
                  n1 = _mm_loadu_si128((const __m128i *)(ql + LANES));
    const __m128i f = _mm_set1_epi8(15), hm = _mm_set1_epi8(0x30), z = _mm_set1_epi8(32);
    __m128i b0 = _mm_or_si128(_mm_and_si128(n0, f), _mm_and_si128(_mm_slli_epi16(h, 4), hm));
    __m128i b1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n0, 4), f), _mm_and_si128(_mm_slli_epi16(h, 2), hm));
    __m128i b2 = _mm_or_si128(_mm_and_si128(n1, f), _mm_and_si128(h, hm));
    __m128i b3 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n1, 4), f), _mm_and_si128(_mm_srli_epi16(h, 2), hm));
    c[0] = _mm512_cvtepi8_epi32(_mm_sub_epi8(b0, z));
    c[1] = _mm512_cvtepi8_epi32(_mm_sub_epi8(b1, z));
    c[2] = _mm512_cvtepi8_epi32(_mm_sub_epi8(b2, z));
    c[3] = _mm512_cvtepi8_epi32(_mm_sub_epi8(b3, z));
}

static void decode_avx512(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst)
{
    const int32_t b = k0 / q->blk, kb0 = k0 % q->blk;
    const uint8_t *pb = q->data + pblock_at(q, p, b);
    switch (q->type) {
    case GGML_F32:
        memcpy(dst, pb + (size_t)kb0 * LANES * 4, (size_t)nk * LANES * 4);
        return;
    case GGML_F16:
        for (int32_t kk = 0; kk < nk; kk++)
            _mm512_storeu_ps(dst + kk * LANES, ld_f16(pb + (size_t)(kb0 + kk) * LANES * 2));
        return;
    case GGML_BF16:
        for (int32_t kk = 0; kk < nk; kk++) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(pb + (size_t)(kb0 + kk) * LANES * 2));
            _mm512_storeu_ps(dst + kk * LANES, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        }
        return;
    case GGML_Q8_0: {
        const __m512 d = ld_f16(pb);
        for (int kk = 0; kk < 32; kk++) {
            __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb + 32 + kk * LANES)));
            _mm512_storeu_ps(dst + kk * LANES, _mm512_mul_ps(_mm512_cvtepi32_ps(v), d));
        }
        return;
    }
    case GGML_Q4_0: {
        const __m512 d = ld_f16(pb);
        const __m512i eight = _mm512_set1_epi32(8);
        const uint8_t *hi = NULL;
        NIB_LOOP(pb + 32, hi, {
            _mm512_storeu_ps(o0, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0, eight)), d));
            _mm512_storeu_ps(o1, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1, eight)), d));
        })
        return;
    }
    case GGML_Q4_1: {
        const __m512 d = ld_f16(pb), m = ld_f16(pb + 32);
        const uint8_t *hi = NULL;
        NIB_LOOP(pb + 64, hi, {
            _mm512_storeu_ps(o0, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), d, m));
            _mm512_storeu_ps(o1, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), d, m));
        })
        return;
    }
    case GGML_Q5_0: {
        const __m512 d = ld_f16(pb);
        const __m512i sixteen = _mm512_set1_epi32(16);
        const uint8_t *hi = pb + 32;
        NIB_LOOP(pb + 96, hi, {
            _mm512_storeu_ps(o0, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0, sixteen)), d));
            _mm512_storeu_ps(o1, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1, sixteen)), d));
        })
        return;
    }
    case GGML_Q5_1: {
        const __m512 d = ld_f16(pb), m = ld_f16(pb + 32);
        const uint8_t *hi = pb + 64;
        NIB_LOOP(pb + 128, hi, {
            _mm512_storeu_ps(o0, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), d, m));
            _mm512_storeu_ps(o1, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), d, m));
        })
        return;
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const int s = kb0 / 32;
        const int off_q = q->type == GGML_Q4_K ? 320 : 832;
        const __m512 d0 = _mm512_mul_ps(ld_f16(pb), cvt_u8(pb + 64 + s * LANES));
        const __m512 mn0 = _mm512_mul_ps(ld_f16(pb + 32), cvt_u8(pb + 192 + s * LANES));
        const uint8_t *hi = q->type == GGML_Q5_K ? pb + 320 + 2 * kb0 : NULL;
        NIB_LOOP(pb + off_q + (kb0 / 2) * LANES, hi, {
            _mm512_storeu_ps(o0, _mm512_fmsub_ps(d0, _mm512_cvtepi32_ps(c0), mn0));
            _mm512_storeu_ps(o1, _mm512_fmsub_ps(d0, _mm512_cvtepi32_ps(c1), mn0));
        })
        return;
    }
    case GGML_Q6_K: {
        const __m512 d = ld_f16(pb);
        const int s = kb0 / 16;
        const __m512 dsc[2] = {
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb + 32 + s * LANES))))),
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb + 32 + (s + 1) * LANES))))),
        };
        const uint8_t *ql = pb + 288 + (kb0 / 2) * LANES, *qh = pb + 2336 + (kb0 / 4) * LANES;
        for (int i = 0; i < 8; i++) {       /* 4 k per hi byte, 2 per nibble byte */
            __m512i c[4];
            q6k_codes(ql + (2 * i) * LANES, qh + i * LANES, c);
            for (int j = 0; j < 4; j++) {
                int kk = 4 * i + j;
                _mm512_storeu_ps(dst + kk * LANES, _mm512_mul_ps(dsc[kk / 16], _mm512_cvtepi32_ps(c[j])));
            }
        }
        return;
    }
    }
}
#pragma GCC pop_options

/* ---------------------------------------------------------------------------
 * AVX2 decode: decode_avx512's operations on the 16 lanes as two halves of
 * 8, for hosts without AVX-512 (the plain C decode is a switch per weight,
 * ~20x slower). Every product here is exact in fp32 (an f16 scale times a
 * code of at most 8 bits, or an f16 times a 6-bit sub-scale times a 5-bit
 * code), so FMA and a multiply then an add give the same floats as
 * decode_lanes. */

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
static inline __m256 a2_u8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline __m256 a2_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* The 8 bits of hb as 8 int32 lanes of 16 (set) or 0. */
static inline __m256i a2_bits16(uint8_t hb)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(hb), sel), sel);
    return _mm256_and_si256(on, _mm256_set1_epi32(16));
}

/* NIB_LOOP's codes for lanes 8h .. 8h + 7 (h = 0, 1): c0 (k = 2i) and c1
 * (k = 2i + 1), plus 16 where the hi bit is set (hi NULL: none). */
#define NIB_LOOP2(q, hi, BODY)                                                                           \
    for (int i = 0; i < 16; i++)                                                                         \
        for (int h = 0; h < 2; h++) {                                                                    \
            __m256i bb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((q) + i * LANES + 8 * h))); \
            __m256i c0 = _mm256_and_si256(bb, _mm256_set1_epi32(15)), c1 = _mm256_srli_epi32(bb, 4);     \
            if (hi) {                                                                                    \
                c0 = _mm256_or_si256(c0, a2_bits16((hi)[4 * i + h]));                                    \
                c1 = _mm256_or_si256(c1, a2_bits16((hi)[4 * i + 2 + h]));                                \
            }                                                                                            \
            float *o0 = dst + (2 * i) * LANES + 8 * h, *o1 = o0 + LANES;                                 \
            BODY                                                                                         \
        }

/* 16 bf16 lanes as floats in a permuted order: lo holds lanes 0-3 and 8-11,
 * hi lanes 4-7 and 12-15 (unpacking with zero puts each bf16 in a float's
 * high half, exactly its value). */
static inline void bf16_lanes2(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    const __m256i w = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w));
}

static void decode_avx2(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst)
{
    const int32_t b = k0 / q->blk, kb0 = k0 % q->blk;
    const uint8_t *pb = q->data + pblock_at(q, p, b);
    switch (q->type) {
    case GGML_F32:
        memcpy(dst, pb + (size_t)kb0 * LANES * 4, (size_t)nk * LANES * 4);
        return;
    case GGML_F16:
        for (int32_t kk = 0; kk < nk; kk++)
            for (int h = 0; h < 2; h++)
                _mm256_storeu_ps(dst + kk * LANES + 8 * h, a2_f16(pb + ((size_t)(kb0 + kk) * LANES + 8 * h) * 2));
        return;
    case GGML_BF16:
        /* Zen 1 widens with one 256-bit vpmovzxwd in ~2.4 cycles; two in-lane
         * unpacks with zero give the same floats (lanes 0-3 and 8-11, then
         * 4-7 and 12-15), stored as four quarters. */
        for (int32_t kk = 0; kk < nk; kk++) {
            __m256 lo, hi;
            bf16_lanes2(pb + (size_t)(kb0 + kk) * LANES * 2, &lo, &hi);
            float *o = dst + kk * LANES;
            _mm_storeu_ps(o, _mm256_castps256_ps128(lo));
            _mm_storeu_ps(o + 4, _mm256_castps256_ps128(hi));
            _mm_storeu_ps(o + 8, _mm256_extractf128_ps(lo, 1));
            _mm_storeu_ps(o + 12, _mm256_extractf128_ps(hi, 1));
        }
        return;
    case GGML_Q8_0: {
        const __m256 d[2] = {a2_f16(pb), a2_f16(pb + 16)};
        for (int kk = 0; kk < 32; kk++)
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(pb + 32 + kk * LANES + 8 * h)));
                _mm256_storeu_ps(dst + kk * LANES + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d[h]));
            }
        return;
    }
    case GGML_Q4_0: {
        const __m256 d[2] = {a2_f16(pb), a2_f16(pb + 16)};
        const __m256i eight = _mm256_set1_epi32(8);
        const uint8_t *hi = NULL;
        NIB_LOOP2(pb + 32, hi, {
            _mm256_storeu_ps(o0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c0, eight)), d[h]));
            _mm256_storeu_ps(o1, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c1, eight)), d[h]));
        })
        return;
    }
    case GGML_Q4_1: {
        const __m256 d[2] = {a2_f16(pb), a2_f16(pb + 16)}, m[2] = {a2_f16(pb + 32), a2_f16(pb + 48)};
        const uint8_t *hi = NULL;
        NIB_LOOP2(pb + 64, hi, {
            _mm256_storeu_ps(o0, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), d[h], m[h]));
            _mm256_storeu_ps(o1, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), d[h], m[h]));
        })
        return;
    }
    case GGML_Q5_0: {
        const __m256 d[2] = {a2_f16(pb), a2_f16(pb + 16)};
        const __m256i sixteen = _mm256_set1_epi32(16);
        const uint8_t *hi = pb + 32;
        NIB_LOOP2(pb + 96, hi, {
            _mm256_storeu_ps(o0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c0, sixteen)), d[h]));
            _mm256_storeu_ps(o1, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c1, sixteen)), d[h]));
        })
        return;
    }
    case GGML_Q5_1: {
        const __m256 d[2] = {a2_f16(pb), a2_f16(pb + 16)}, m[2] = {a2_f16(pb + 32), a2_f16(pb + 48)};
        const uint8_t *hi = pb + 64;
        NIB_LOOP2(pb + 128, hi, {
            _mm256_storeu_ps(o0, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), d[h], m[h]));
            _mm256_storeu_ps(o1, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), d[h], m[h]));
        })
        return;
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const int s = kb0 / 32;
        const int off_q = q->type == GGML_Q4_K ? 320 : 832;
        __m256 d0[2], mn0[2];
        for (int h = 0; h < 2; h++) {
            d0[h] = _mm256_mul_ps(a2_f16(pb + 16 * h), a2_u8(pb + 64 + s * LANES + 8 * h));
            mn0[h] = _mm256_mul_ps(a2_f16(pb + 32 + 16 * h), a2_u8(pb + 192 + s * LANES + 8 * h));
        }
        const uint8_t *hi = q->type == GGML_Q5_K ? pb + 320 + 2 * kb0 : NULL;
        NIB_LOOP2(pb + off_q + (kb0 / 2) * LANES, hi, {
            _mm256_storeu_ps(o0, _mm256_fmsub_ps(d0[h], _mm256_cvtepi32_ps(c0), mn0[h]));
            _mm256_storeu_ps(o1, _mm256_fmsub_ps(d0[h], _mm256_cvtepi32_ps(c1), mn0[h]));
        })
        return;
    }
    case GGML_Q6_K: {
        const int s = kb0 / 16;
        __m256 dsc[2][2];
        for (int j = 0; j < 2; j++)
            for (int h = 0; h < 2; h++)
                dsc[j][h] = _mm256_mul_ps(a2_f16(pb + 16 * h),
                                          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                              _mm_loadl_epi64((const __m128i *)(pb + 32 + (s + j) * LANES + 8 * h)))));
        const uint8_t *ql = pb + 288 + (kb0 / 2) * LANES, *qh = pb + 2336 + (kb0 / 4) * LANES;
        const __m128i f = _mm_set1_epi8(15), hm = _mm_set1_epi8(0x30), z = _mm_set1_epi8(32);
        for (int i = 0; i < 8; i++) { /* 4 k per hi byte, 2 per nibble byte: q6k_codes' bytes */
            const __m128i hv = _mm_loadu_si128((const __m128i *)(qh + i * LANES));
            const __m128i n0 = _mm_loadu_si128((const __m128i *)(ql + (2 * i) * LANES));
            const __m128i n1 = _mm_loadu_si128((const __m128i *)(ql + (2 * i + 1) * LANES));
            __m128i c[4];
            c[0] = _mm_or_si128(_mm_and_si128(n0, f), _mm_and_si128(_mm_slli_epi16(hv, 4), hm));
            c[1] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n0, 4), f), _mm_and_si128(_mm_slli_epi16(hv, 2), hm));
            c[2] = _mm_or_si128(_mm_and_si128(n1, f), _mm_and_si128(hv, hm));
            c[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n1, 4), f), _mm_and_si128(_mm_srli_epi16(hv, 2), hm));
            for (int j = 0; j < 4; j++) {
                const int kk = 4 * i + j;
                const __m128i v = _mm_sub_epi8(c[j], z);
                _mm256_storeu_ps(dst + kk * LANES, _mm256_mul_ps(dsc[kk / 16][0], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
                _mm256_storeu_ps(dst + kk * LANES + 8,
                                 _mm256_mul_ps(dsc[kk / 16][1], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
            }
        }
        return;
    }
    }
}
#pragma GCC pop_options

void gemm_qdecode(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst)
{
    switch (cpu_isa_active()) {
    case CPU_ISA_AVX512: decode_avx512(q, p, k0, nk, dst); return;
    case CPU_ISA_AVX2: decode_avx2(q, p, k0, nk, dst); return;
    default: decode_lanes(q, p, k0, nk, 0, LANES, dst, LANES); return;
    }
}

/* ---------------------------------------------------------------------------
 * The GEMM. Work items are groups of 4 panels of one part, as gemm.c's. */

#define ROW_CHUNK 64            /* as gemm.c: rows per pass over the weights */
#define PREFETCH_BYTES 4096     /* how far ahead of the small-batch decoder its stream is fetched */
#define SMALL_ROWS 8            /* up to this many rows decode into L1 per chunk of k */
#define SMALL_WIDE_ROWS 3       /* up to this many run a group's 4 panels at once; more, 2 at a time (registers) */

/* Per-worker decode buffers for the larger batches: 4 panels of the widest
 * in loaded so far, fp32 (4 * in * 64 bytes per thread, 393 KB at in =
 * 1536), kept for the life of the process. */
static float *scratch[POOL_MAX_THREADS];
static size_t scratch_n[POOL_MAX_THREADS];

typedef struct {
    int32_t in;
    int rc;
} reserve_job;

static void reserve_serial(void *ctx)
{
    reserve_job *j = ctx;
    const size_t n = (size_t)4 * j->in * LANES;
    for (int i = 0; i < pool_size() && i < POOL_MAX_THREADS; i++) {
        if (scratch_n[i] >= n)
            continue;
        float *p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
        if (!p) {
            j->rc = rd_fail(RD_ENOMEM, "gemm_qreserve: cannot allocate %zu bytes of decode buffer", n * sizeof(float));
            return;
        }
        free(scratch[i]);
        scratch[i] = p;
        scratch_n[i] = n;
    }
}

/* While no job runs: a weight update's build (another thread) may grow the
 * buffers that the engine's GEMM tasks read. */
int gemm_qreserve(int32_t in)
{
    reserve_job j = {in, 0};
    pool_serial(reserve_serial, &j);
    return j.rc;
}

typedef struct {
    const gemm_qlinear *L;
    const float *x;
    float *y;
    int32_t r0, r1;
    int accumulate;
} qjob;

/* Writes rows x cols of t (stride tld) into y (stride ldy), or adds them to y. */
static void put_rows(const float *t, int32_t tld, int32_t rows, int32_t cols, float *y, int32_t ldy, int accumulate)
{
    for (int32_t r = 0; r < rows; r++) {
        const float *tr = t + (size_t)r * tld;
        float *yr = y + (size_t)r * ldy;
        if (accumulate)
            for (int32_t c = 0; c < cols; c++)
                yr[c] = yr[c] + tr[c];
        else
            memcpy(yr, tr, (size_t)cols * sizeof(float));
    }
}

/* A type's row in the one-row tables of both vector paths (their rows are in
 * this order); -1 if none. Baseline code, as the stream helpers below. */
static int qrow1_slot(int32_t type)
{
    static const int32_t order[11] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                      GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    for (int i = 0; i < 11; i++)
        if (order[i] == type)
            return i;
    return -1;
}

/* Plain SSE (the x86-64 baseline), so both vector paths below inline it.
 * Batch 1-3 streams the weights once per step and is bound by how fast
 * they arrive: a task's group is one linear stream (pblock_at), which is
 * fetched PREFETCH_BYTES ahead of the decoder, a chunk's worth per step
 * (the first PREFETCH_BYTES at the start). */
typedef struct {
    const char *base, *end;     /* the group's bytes */
    const char *next;           /* first byte not yet prefetched */
    size_t step;                /* bytes the decoder consumes per chunk of k */
} stream_prefetch;

static inline void prefetch_to(stream_prefetch *s, const char *to)
{
    if (to > s->end)
        to = s->end;
    for (; s->next < to; s->next += 64)
        _mm_prefetch(s->next, _MM_HINT_T0);
}

static inline void stream_start(stream_prefetch *s, const gemm_qpart *q, int32_t g)
{
    s->base = s->next = (const char *)q->data + pblock_at(q, 4 * g, 0);
    s->end = s->base + group_bytes(q, g);
    s->step = group_bytes(q, g) / ((size_t)(q->in + GEMMQ_CHUNK - 1) / GEMMQ_CHUNK);
    prefetch_to(s, s->base + PREFETCH_BYTES);
}

static inline void stream_step(stream_prefetch *s) { prefetch_to(s, s->next + s->step); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

/* R rows x NP panels (R <= 3 with NP <= 4, or R <= 8 with NP <= 2: R * NP
 * chains and NP weight vectors in 32 registers): decode GEMMQ_CHUNK k of
 * each panel into an L1 buffer, run the chains over it, next chunk; chains
 * stay in registers from k = 0 to in - 1, exactly gemm.c's tile_z. Each
 * weight is decoded once for all R rows, and nothing larger than 8 KB is
 * written (the larger batches decode whole panels to memory first). */
static inline __attribute__((always_inline)) void qtile_small(const gemm_qpart *q, const float *x, int32_t p0,
                                                              float *y, int32_t ldy, int32_t ncol, int accumulate,
                                                              const int R, const int NP)
{
    const int32_t in = q->in;
    float buf[4][GEMMQ_CHUNK * LANES] __attribute__((aligned(64)));
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            acc[r][j] = _mm512_setzero_ps();
    stream_prefetch st;
    stream_start(&st, q, p0 / 4);
    for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK) {
        const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
        stream_step(&st);
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            decode_avx512(q, p0 + j, k0, nk, buf[j]);
        for (int32_t kk = 0; kk < nk; kk++) {
            __m512 wv[4];
#pragma GCC unroll 4
            for (int j = 0; j < NP; j++)
                wv[j] = _mm512_load_ps(buf[j] + kk * LANES);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 v = _mm512_set1_ps(x[(size_t)r * in + k0 + kk]);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++)
                    acc[r][j] = _mm512_fmadd_ps(v, wv[j], acc[r][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) {
            int32_t n = ncol - j * LANES < LANES ? ncol - j * LANES : LANES;
            __mmask16 mk = (__mmask16)((1u << n) - 1);
            float *yr = y + (size_t)r * ldy + j * LANES;
            __m512 a = acc[r][j];
            if (accumulate)
                a = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yr), a);
            _mm512_mask_storeu_ps(yr, mk, a);
        }
}

/* One row: the weights are decoded straight into registers, a chunk of 32 k
 * at a time, and fed to the same chains as qtile_small's (batch-1 decode is
 * the decoder's throughput, and this saves the store and reload of every
 * weight vector). The arithmetic per weight is decode_avx512's. TYPE is a
 * constant. */
static inline __attribute__((always_inline)) void qrow1(const gemm_qpart *q, const float *x, int32_t p0, float *y,
                                                        int32_t ncol, int accumulate, const int NP, const int TYPE)
{
    const int32_t in = q->in, blk = q->blk;
    const int kq = TYPE == GGML_Q4_K || TYPE == GGML_Q5_K;
    /* Field offsets (gemm_quant.h's layouts). */
    const int off_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1 || kq ? 32 : 0;
    const int off_hi = TYPE == GGML_Q5_0 ? 32 : TYPE == GGML_Q5_1 ? 64 : TYPE == GGML_Q5_K ? 320 : 0;
    const int off_q = TYPE == GGML_Q8_0 || TYPE == GGML_Q4_0 ? 32 : TYPE == GGML_Q4_1 ? 64 : TYPE == GGML_Q5_0 ? 96
                      : TYPE == GGML_Q5_1 ? 128 : TYPE == GGML_Q4_K ? 320 : TYPE == GGML_Q5_K ? 832 : 288;
    stream_prefetch st;
    stream_start(&st, q, p0 / 4);
    __m512 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++)
        acc[j] = _mm512_setzero_ps();
    for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK) {
        const int32_t b = k0 / blk, kb0 = k0 % blk;
        const float *xb = x + k0;
        __m512 d[4], m[4], d2[4];
        const uint8_t *pb[4];
        stream_step(&st);
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) {
            pb[j] = q->data + pblock_at(q, p0 + j, b);
            if (TYPE == GGML_F32 || TYPE == GGML_F16 || TYPE == GGML_BF16)
                continue;
            d[j] = ld_f16(pb[j]);
            m[j] = off_m ? ld_f16(pb[j] + off_m) : _mm512_setzero_ps();
            if (kq) {               /* sub-block kb0 / 32: d * sc and dmin * mn, exact */
                d[j] = _mm512_mul_ps(d[j], cvt_u8(pb[j] + 64 + (kb0 / 32) * LANES));
                m[j] = _mm512_mul_ps(m[j], cvt_u8(pb[j] + 192 + (kb0 / 32) * LANES));
            }
            if (TYPE == GGML_Q6_K) {    /* two sub-blocks of 16: d * sc */
                const uint8_t *sc = pb[j] + 32 + (kb0 / 16) * LANES;
                d2[j] = _mm512_mul_ps(d[j], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + LANES)))));
                d[j] = _mm512_mul_ps(d[j], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc))));
            }
        }
        if (TYPE == GGML_F32 || TYPE == GGML_F16 || TYPE == GGML_BF16) {
            const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
            for (int32_t kk = 0; kk < nk; kk++) {
                __m512 v = _mm512_set1_ps(xb[kk]);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++) {
                    const uint8_t *e = pb[j] + (size_t)(kb0 + kk) * LANES * (TYPE == GGML_F32 ? 4 : 2);
                    __m512 w = TYPE == GGML_F32 ? _mm512_loadu_ps((const float *)e)
                               : TYPE == GGML_F16
                                   ? ld_f16(e)
                                   : _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)e)), 16));
                    acc[j] = _mm512_fmadd_ps(v, w, acc[j]);
                }
            }
            continue;
        }
        if (TYPE == GGML_Q8_0) {
            for (int kk = 0; kk < 32; kk++) {
                __m512 v = _mm512_set1_ps(xb[kk]);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++) {
                    __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb[j] + 32 + kk * LANES)));
                    acc[j] = _mm512_fmadd_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(c), d[j]), acc[j]);
                }
            }
            continue;
        }
        if (TYPE == GGML_Q6_K) {
            for (int i = 0; i < 8; i++) {       /* 4 k per hi byte, 2 per nibble byte */
                __m512 v[4];
                for (int t = 0; t < 4; t++)
                    v[t] = _mm512_set1_ps(xb[4 * i + t]);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++) {
                    const uint8_t *ql = pb[j] + 288 + (kb0 / 2) * LANES, *qh = pb[j] + 2336 + (kb0 / 4) * LANES;
                    __m512i c[4];
                    q6k_codes(ql + (2 * i) * LANES, qh + i * LANES, c);
                    for (int t = 0; t < 4; t++) {
                        __m512 w = _mm512_mul_ps(i < 4 ? d[j] : d2[j], _mm512_cvtepi32_ps(c[t]));
                        acc[j] = _mm512_fmadd_ps(v[t], w, acc[j]);
                    }
                }
            }
            continue;
        }
        for (int i = 0; i < 16; i++) {
            __m512 v0 = _mm512_set1_ps(xb[2 * i]), v1 = _mm512_set1_ps(xb[2 * i + 1]);
#pragma GCC unroll 4
            for (int j = 0; j < NP; j++) {
                const uint8_t *qp = pb[j] + off_q + (kb0 / 2) * LANES, *hp = pb[j] + off_hi + 2 * kb0;
                __m512i bb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qp + i * LANES)));
                __m512i c0 = _mm512_and_si512(bb, _mm512_set1_epi32(15)), c1 = _mm512_srli_epi32(bb, 4);
                if (off_hi) {
                    c0 = _mm512_mask_or_epi32(c0, ld_mask(hp + 4 * i), c0, _mm512_set1_epi32(16));
                    c1 = _mm512_mask_or_epi32(c1, ld_mask(hp + 4 * i + 2), c1, _mm512_set1_epi32(16));
                }
                __m512 w0, w1;
                if (TYPE == GGML_Q4_0 || TYPE == GGML_Q5_0) {
                    const __m512i z = _mm512_set1_epi32(TYPE == GGML_Q4_0 ? 8 : 16);
                    w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0, z)), d[j]);
                    w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1, z)), d[j]);
                } else if (kq) {
                    w0 = _mm512_fmsub_ps(d[j], _mm512_cvtepi32_ps(c0), m[j]);
                    w1 = _mm512_fmsub_ps(d[j], _mm512_cvtepi32_ps(c1), m[j]);
                } else {
                    w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), d[j], m[j]);
                    w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), d[j], m[j]);
                }
                acc[j] = _mm512_fmadd_ps(v0, w0, acc[j]);
                acc[j] = _mm512_fmadd_ps(v1, w1, acc[j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++) {
        int32_t n = ncol - j * LANES < LANES ? ncol - j * LANES : LANES;
        __mmask16 mk = (__mmask16)((1u << n) - 1);
        __m512 a = acc[j];
        if (accumulate)
            a = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, y + j * LANES), a);
        _mm512_mask_storeu_ps(y + j * LANES, mk, a);
    }
}

typedef void (*qrow1_fn)(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ncol, int accumulate);
#define QR(T, NP) \
    static void qr_##T##_##NP(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ncol, int accumulate) \
    { \
        qrow1(q, x, p0, y, ncol, accumulate, NP, T); \
    }
#define QR4(T) QR(T, 1) QR(T, 2) QR(T, 3) QR(T, 4)
QR4(GGML_F32) QR4(GGML_F16) QR4(GGML_BF16) QR4(GGML_Q8_0) QR4(GGML_Q4_0) QR4(GGML_Q4_1) QR4(GGML_Q5_0)
QR4(GGML_Q5_1) QR4(GGML_Q4_K) QR4(GGML_Q5_K) QR4(GGML_Q6_K)
#undef QR4
#undef QR
#define QR_ROW(T) {qr_##T##_1, qr_##T##_2, qr_##T##_3, qr_##T##_4}
static qrow1_fn qrow1_for(int32_t type, int32_t np)
{
    static const qrow1_fn t[11][4] = {QR_ROW(GGML_F32),  QR_ROW(GGML_F16),  QR_ROW(GGML_BF16), QR_ROW(GGML_Q8_0),
                                      QR_ROW(GGML_Q4_0), QR_ROW(GGML_Q4_1), QR_ROW(GGML_Q5_0), QR_ROW(GGML_Q5_1),
                                      QR_ROW(GGML_Q4_K), QR_ROW(GGML_Q5_K), QR_ROW(GGML_Q6_K)};
    const int i = qrow1_slot(type);
    return i < 0 ? NULL : t[i][np - 1];
}
#undef QR_ROW

typedef void (*qsmall_fn)(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ldy, int32_t ncol,
                          int accumulate);
#define QS(R, NP) \
    static void qs_##R##x##NP(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ldy, int32_t ncol, \
                              int accumulate) \
    { \
        qtile_small(q, x, p0, y, ldy, ncol, accumulate, R, NP); \
    }
QS(1, 1) QS(1, 2) QS(1, 3) QS(1, 4) QS(2, 1) QS(2, 2) QS(2, 3) QS(2, 4) QS(3, 1) QS(3, 2) QS(3, 3) QS(3, 4)
QS(4, 1) QS(4, 2) QS(5, 1) QS(5, 2) QS(6, 1) QS(6, 2) QS(7, 1) QS(7, 2) QS(8, 1) QS(8, 2)
#undef QS
static const qsmall_fn qsmall[SMALL_ROWS][4] = {
    {qs_1x1, qs_1x2, qs_1x3, qs_1x4}, {qs_2x1, qs_2x2, qs_2x3, qs_2x4}, {qs_3x1, qs_3x2, qs_3x3, qs_3x4},
    {qs_4x1, qs_4x2}, {qs_5x1, qs_5x2}, {qs_6x1, qs_6x2}, {qs_7x1, qs_7x2}, {qs_8x1, qs_8x2}};
#pragma GCC pop_options

/* ---------------------------------------------------------------------------
 * The 1-8-row paths for AVX2 hosts: qtile_small's and qrow1's operations on
 * the 16 lanes of a panel as two halves of 8 (ymm registers), so each
 * output is the same fused multiply-add chain over k = 0 .. in - 1 with the
 * same decoded weights (decode_avx2's arithmetic) and the bits are the
 * AVX-512 paths'. Sixteen registers instead of 32 set the shapes: R rows x
 * NP panels keep 2 * R * NP chains, at most 16 (qtask2 picks NP from R). */

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* Chains of one panel (two halves) into y[0 .. n), n <= 16 lanes. */
static inline void put_panel2(float *y, int32_t n, __m256 lo, __m256 hi, int accumulate)
{
    if (n >= LANES) {
        if (accumulate) {
            lo = _mm256_add_ps(_mm256_loadu_ps(y), lo);
            hi = _mm256_add_ps(_mm256_loadu_ps(y + 8), hi);
        }
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    float t[LANES];
    _mm256_storeu_ps(t, lo);
    _mm256_storeu_ps(t + 8, hi);
    for (int32_t l = 0; l < n; l++)
        y[l] = accumulate ? y[l] + t[l] : t[l];
}

static inline __attribute__((always_inline)) void qtile_small2(const gemm_qpart *q, const float *x, int32_t p0,
                                                               float *y, int32_t ldy, int32_t ncol, int accumulate,
                                                               const int R, const int NP)
{
    const int32_t in = q->in;
    float buf[4][GEMMQ_CHUNK * LANES] __attribute__((aligned(32)));
    __m256 acc[8][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int h = 0; h < 2 * NP; h++)
            acc[r][h] = _mm256_setzero_ps();
    stream_prefetch st;
    stream_start(&st, q, p0 / 4);
    for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK) {
        const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
        stream_step(&st);
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            decode_avx2(q, p0 + j, k0, nk, buf[j]);
        for (int32_t kk = 0; kk < nk; kk++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m256 v = _mm256_broadcast_ss(x + (size_t)r * in + k0 + kk);
#pragma GCC unroll 8
                for (int h = 0; h < 2 * NP; h++)
                    acc[r][h] = _mm256_fmadd_ps(v, _mm256_load_ps(buf[h / 2] + kk * LANES + 8 * (h % 2)), acc[r][h]);
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            put_panel2(y + (size_t)r * ldy + j * LANES, ncol - j * LANES, acc[r][2 * j], acc[r][2 * j + 1], accumulate);
}

/* qrow1 on halves: the weights decoded straight into registers. */
static inline __attribute__((always_inline)) void qrow1_2(const gemm_qpart *q, const float *x, int32_t p0, float *y,
                                                          int32_t ncol, int accumulate, const int NP, const int TYPE)
{
    const int32_t in = q->in, blk = q->blk;
    const int kq = TYPE == GGML_Q4_K || TYPE == GGML_Q5_K;
    const int ft = TYPE == GGML_F32 || TYPE == GGML_F16 || TYPE == GGML_BF16;
    const int off_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1 || kq ? 32 : 0;
    const int off_hi = TYPE == GGML_Q5_0 ? 32 : TYPE == GGML_Q5_1 ? 64 : TYPE == GGML_Q5_K ? 320 : 0;
    const int off_q = TYPE == GGML_Q8_0 || TYPE == GGML_Q4_0 ? 32 : TYPE == GGML_Q4_1 ? 64 : TYPE == GGML_Q5_0 ? 96
                      : TYPE == GGML_Q5_1 ? 128 : TYPE == GGML_Q4_K ? 320 : TYPE == GGML_Q5_K ? 832 : 288;
    stream_prefetch st;
    stream_start(&st, q, p0 / 4);
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK) {
        const int32_t b = k0 / blk, kb0 = k0 % blk;
        const float *xb = x + k0;
        __m256 d[4][2], m[4][2], d2[4][2];
        const uint8_t *pb[4];
        stream_step(&st);
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) {
            pb[j] = q->data + pblock_at(q, p0 + j, b);
            if (ft)
                continue;
            for (int h = 0; h < 2; h++) {
                d[j][h] = a2_f16(pb[j] + 16 * h);
                m[j][h] = off_m ? a2_f16(pb[j] + off_m + 16 * h) : _mm256_setzero_ps();
                if (kq) {
                    d[j][h] = _mm256_mul_ps(d[j][h], a2_u8(pb[j] + 64 + (kb0 / 32) * LANES + 8 * h));
                    m[j][h] = _mm256_mul_ps(m[j][h], a2_u8(pb[j] + 192 + (kb0 / 32) * LANES + 8 * h));
                }
                if (TYPE == GGML_Q6_K) {
                    const uint8_t *sc = pb[j] + 32 + (kb0 / 16) * LANES + 8 * h;
                    d2[j][h] = _mm256_mul_ps(d[j][h], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                          _mm_loadl_epi64((const __m128i *)(sc + LANES)))));
                    d[j][h] = _mm256_mul_ps(d[j][h], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                         _mm_loadl_epi64((const __m128i *)sc))));
                }
            }
        }
        if (TYPE == GGML_BF16) {
            /* bf16_lanes2's order: acc[j][0] chains lanes 0-3 and 8-11,
             * acc[j][1] lanes 4-7 and 12-15, put back in order at the end. */
            const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
            for (int32_t kk = 0; kk < nk; kk++) {
                const __m256 v = _mm256_broadcast_ss(xb + kk);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++) {
                    __m256 lo, hi;
                    bf16_lanes2(pb[j] + (size_t)(kb0 + kk) * LANES * 2, &lo, &hi);
                    acc[j][0] = _mm256_fmadd_ps(v, lo, acc[j][0]);
                    acc[j][1] = _mm256_fmadd_ps(v, hi, acc[j][1]);
                }
            }
            continue;
        }
        if (ft) {
            const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
            for (int32_t kk = 0; kk < nk; kk++) {
                const __m256 v = _mm256_broadcast_ss(xb + kk);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++)
                    for (int h = 0; h < 2; h++) {
                        const uint8_t *e = pb[j] + ((size_t)(kb0 + kk) * LANES + 8 * h) * (TYPE == GGML_F32 ? 4 : 2);
                        __m256 w = TYPE == GGML_F32 ? _mm256_loadu_ps((const float *)e)
                                   : TYPE == GGML_F16
                                       ? a2_f16(e)
                                       : _mm256_castsi256_ps(_mm256_slli_epi32(
                                             _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)e)), 16));
                        acc[j][h] = _mm256_fmadd_ps(v, w, acc[j][h]);
                    }
            }
            continue;
        }
        if (TYPE == GGML_Q8_0) {
            for (int kk = 0; kk < 32; kk++) {
                const __m256 v = _mm256_broadcast_ss(xb + kk);
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++)
                    for (int h = 0; h < 2; h++) {
                        __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(pb[j] + 32 + kk * LANES + 8 * h)));
                        acc[j][h] = _mm256_fmadd_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(c), d[j][h]), acc[j][h]);
                    }
            }
            continue;
        }
        if (TYPE == GGML_Q6_K) {
            const __m128i f = _mm_set1_epi8(15), hm = _mm_set1_epi8(0x30), z = _mm_set1_epi8(32);
            for (int i = 0; i < 8; i++) {       /* 4 k per hi byte, 2 per nibble byte */
#pragma GCC unroll 4
                for (int j = 0; j < NP; j++) {
                    const uint8_t *ql = pb[j] + 288 + (kb0 / 2) * LANES, *qh = pb[j] + 2336 + (kb0 / 4) * LANES;
                    const __m128i hv = _mm_loadu_si128((const __m128i *)(qh + i * LANES));
                    const __m128i n0 = _mm_loadu_si128((const __m128i *)(ql + (2 * i) * LANES));
                    const __m128i n1 = _mm_loadu_si128((const __m128i *)(ql + (2 * i + 1) * LANES));
                    __m128i c[4];
                    c[0] = _mm_or_si128(_mm_and_si128(n0, f), _mm_and_si128(_mm_slli_epi16(hv, 4), hm));
                    c[1] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n0, 4), f), _mm_and_si128(_mm_slli_epi16(hv, 2), hm));
                    c[2] = _mm_or_si128(_mm_and_si128(n1, f), _mm_and_si128(hv, hm));
                    c[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(n1, 4), f), _mm_and_si128(_mm_srli_epi16(hv, 2), hm));
                    for (int t = 0; t < 4; t++) {
                        const __m256 v = _mm256_broadcast_ss(xb + 4 * i + t);
                        const __m128i cb = _mm_sub_epi8(c[t], z);
                        const __m256 s0 = i < 4 ? d[j][0] : d2[j][0], s1 = i < 4 ? d[j][1] : d2[j][1];
                        __m256 w0 = _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(cb)));
                        __m256 w1 = _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(cb, 8))));
                        acc[j][0] = _mm256_fmadd_ps(v, w0, acc[j][0]);
                        acc[j][1] = _mm256_fmadd_ps(v, w1, acc[j][1]);
                    }
                }
            }
            continue;
        }
        for (int i = 0; i < 16; i++) {
            const __m256 v0 = _mm256_broadcast_ss(xb + 2 * i), v1 = _mm256_broadcast_ss(xb + 2 * i + 1);
#pragma GCC unroll 4
            for (int j = 0; j < NP; j++) {
                const uint8_t *qp = pb[j] + off_q + (kb0 / 2) * LANES, *hp = pb[j] + off_hi + 2 * kb0;
                for (int h = 0; h < 2; h++) {
                    __m256i bb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qp + i * LANES + 8 * h)));
                    __m256i c0 = _mm256_and_si256(bb, _mm256_set1_epi32(15)), c1 = _mm256_srli_epi32(bb, 4);
                    if (off_hi) {
                        c0 = _mm256_or_si256(c0, a2_bits16(hp[4 * i + h]));
                        c1 = _mm256_or_si256(c1, a2_bits16(hp[4 * i + 2 + h]));
                    }
                    __m256 w0, w1;
                    if (TYPE == GGML_Q4_0 || TYPE == GGML_Q5_0) {
                        const __m256i z = _mm256_set1_epi32(TYPE == GGML_Q4_0 ? 8 : 16);
                        w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c0, z)), d[j][h]);
                        w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c1, z)), d[j][h]);
                    } else if (kq) {
                        w0 = _mm256_fmsub_ps(d[j][h], _mm256_cvtepi32_ps(c0), m[j][h]);
                        w1 = _mm256_fmsub_ps(d[j][h], _mm256_cvtepi32_ps(c1), m[j][h]);
                    } else {
                        w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), d[j][h], m[j][h]);
                        w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), d[j][h], m[j][h]);
                    }
                    acc[j][h] = _mm256_fmadd_ps(v0, w0, acc[j][h]);
                    acc[j][h] = _mm256_fmadd_ps(v1, w1, acc[j][h]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++) {
        if (TYPE == GGML_BF16) {
            const __m256 a = acc[j][0], c = acc[j][1];
            acc[j][0] = _mm256_permute2f128_ps(a, c, 0x20);
            acc[j][1] = _mm256_permute2f128_ps(a, c, 0x31);
        }
        put_panel2(y + j * LANES, ncol - j * LANES, acc[j][0], acc[j][1], accumulate);
    }
}

#define QR2_NP 2                /* panels per qrow1_2 call (registers) */
#define QR(T, NP) \
    static void qr2_##T##_##NP(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ncol, int accumulate) \
    { \
        qrow1_2(q, x, p0, y, ncol, accumulate, NP, T); \
    }
#define QR2(T) QR(T, 1) QR(T, 2)
QR2(GGML_F32) QR2(GGML_F16) QR2(GGML_BF16) QR2(GGML_Q8_0) QR2(GGML_Q4_0) QR2(GGML_Q4_1) QR2(GGML_Q5_0)
QR2(GGML_Q5_1) QR2(GGML_Q4_K) QR2(GGML_Q5_K) QR2(GGML_Q6_K)
#undef QR2
#undef QR
#define QR_ROW(T) {qr2_##T##_1, qr2_##T##_2}
static qrow1_fn qrow1_2_for(int32_t type, int32_t np)
{
    static const qrow1_fn t[11][2] = {QR_ROW(GGML_F32),  QR_ROW(GGML_F16),  QR_ROW(GGML_BF16), QR_ROW(GGML_Q8_0),
                                      QR_ROW(GGML_Q4_0), QR_ROW(GGML_Q4_1), QR_ROW(GGML_Q5_0), QR_ROW(GGML_Q5_1),
                                      QR_ROW(GGML_Q4_K), QR_ROW(GGML_Q5_K), QR_ROW(GGML_Q6_K)};
    const int i = qrow1_slot(type);
    return i < 0 ? NULL : t[i][np - 1];
}
#undef QR_ROW

#define QS(R, NP) \
    static void qs2_##R##x##NP(const gemm_qpart *q, const float *x, int32_t p0, float *y, int32_t ldy, int32_t ncol, \
                               int accumulate) \
    { \
        qtile_small2(q, x, p0, y, ldy, ncol, accumulate, R, NP); \
    }
QS(2, 1) QS(2, 2) QS(3, 1) QS(3, 2) QS(4, 1) QS(5, 1) QS(6, 1) QS(7, 1) QS(8, 1)
#undef QS
/* Row counts 2 .. 8: 2 panels a call up to 3 rows (12 chains), 1 above. */
static const qsmall_fn qsmall2[SMALL_ROWS - 1][2] = {{qs2_2x1, qs2_2x2}, {qs2_3x1, qs2_3x2}, {qs2_4x1}, {qs2_5x1},
                                                     {qs2_6x1}, {qs2_7x1}, {qs2_8x1}};
#pragma GCC pop_options

/* One task's 1-8 rows over its group's np panels on an AVX2 host. */
static void qtask2(const gemm_qpart *q, const float *x, int32_t p0, int32_t np, float *y, int32_t ldy,
                   int32_t ncol, int32_t rows, int accumulate)
{
    const int32_t per = rows == 1 ? QR2_NP : rows <= 3 ? 2 : 1;
    for (int32_t jj = 0; jj < np; jj += per) {
        const int32_t n = np - jj < per ? np - jj : per;
        if (rows == 1)
            qrow1_2_for(q->type, n)(q, x, p0 + jj, y + jj * LANES, ncol - jj * LANES, accumulate);
        else
            qsmall2[rows - 2][n - 1](q, x, p0 + jj, y + jj * LANES, ldy, ncol - jj * LANES, accumulate);
    }
}

static void qtask(void *ctx, int32_t t, int32_t worker)
{
    const qjob *j = ctx;
    const gemm_qlinear *L = j->L;
    int i = 0;
    while (t >= L->task0[i + 1])
        i++;
    const gemm_qpart *q = &L->parts[i];
    const int32_t p0 = (t - L->task0[i]) * 4;
    const int32_t np = q->n_panels - p0 < 4 ? q->n_panels - p0 : 4;
    const int32_t col0 = L->row0[i] + p0 * LANES;
    const int32_t ncol = q->out - p0 * LANES < np * LANES ? q->out - p0 * LANES : np * LANES;
    const int32_t rows = j->r1 - j->r0, in = q->in;
    const float *x = j->x + (size_t)j->r0 * in;
    float *y = j->y + (size_t)j->r0 * L->out + col0;
    if (rows <= SMALL_ROWS && cpu_isa_active() >= CPU_ISA_AVX512) {
        qrow1_fn f = rows == 1 ? qrow1_for(q->type, np) : NULL;
        if (f)
            f(q, x, p0, y, ncol, j->accumulate);
        else if (rows <= SMALL_WIDE_ROWS)
            qsmall[rows - 1][np - 1](q, x, p0, y, L->out, ncol, j->accumulate);
        else
            for (int32_t jj = 0; jj < np; jj += 2)
                qsmall[rows - 1][(np - jj < 2 ? np - jj : 2) - 1](q, x, p0 + jj, y + jj * LANES, L->out,
                                                                  ncol - jj * LANES, j->accumulate);
        return;
    }
    if (rows <= SMALL_ROWS && cpu_isa_active() == CPU_ISA_AVX2) {
        qtask2(q, x, p0, np, y, L->out, ncol, rows, j->accumulate);
        return;
    }
    float tmp[ROW_CHUNK * 4 * LANES] __attribute__((aligned(64)));
    float *w = scratch[worker];
    if (scratch_n[worker] < (size_t)np * in * LANES) {
        /* No buffer this wide (gemm_qreserve was not called for this in):
         * the same chains in plain C, a chunk of k at a time. */
        float buf[GEMMQ_CHUNK * LANES];
        const int32_t ld = np * LANES;
        memset(tmp, 0, sizeof(float) * (size_t)rows * ld);
        for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK) {
            const int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
            for (int32_t jj = 0; jj < np; jj++) {
                gemm_qdecode(q, p0 + jj, k0, nk, buf);
                for (int32_t r = 0; r < rows; r++)
                    for (int32_t kk = 0; kk < nk; kk++) {
                        const float xv = x[(size_t)r * in + k0 + kk];
                        float *a = tmp + (size_t)r * ld + jj * LANES;
                        for (int l = 0; l < LANES; l++)
                            a[l] = fmaf(xv, buf[kk * LANES + l], a[l]);
                    }
            }
        }
        put_rows(tmp, ld, rows, ncol, y, L->out, j->accumulate);
        return;
    }
    /* Decode the group's panels once as gemm.c's fp32 panels, run its tiles
     * over them into a row-chunk buffer, then place the columns. */
    for (int32_t jj = 0; jj < np; jj++)
        for (int32_t k0 = 0; k0 < in; k0 += GEMMQ_CHUNK)
            gemm_qdecode(q, p0 + jj, k0, in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK,
                         w + ((size_t)jj * in + k0) * LANES);
    gemm_weight view = {.out = np * LANES, .in = in, .n_panels = np, .packed = w};
    gemm_rows(&view, x, tmp, 0, rows, 0, np, 0);
    put_rows(tmp, np * LANES, rows, ncol, y, L->out, j->accumulate);
}

void gemm_qforward(const gemm_qlinear *L, const float *x, int32_t m, float *y, int accumulate)
{
    const int32_t n_tasks = L->task0[L->n_parts];
    for (int32_t r0 = 0; r0 < m; r0 += ROW_CHUNK) {
        qjob j = {L, x, y, r0, r0 + ROW_CHUNK < m ? r0 + ROW_CHUNK : m, accumulate};
        pool_run(n_tasks, qtask, &j);
    }
}
