/* sampler.c - token selection and log-probs from fp32 logits (see sampler.h).
 *
 * The exact rules (what the CUDA port must reproduce to match, up to float
 * rounding; "exp" is exp_nonpos below, "sum" is sum_weights' fixed order):
 *   1. Scan: reject NaN and +inf (-inf means masked); m = max logit, argmax =
 *      its lowest index. All -inf is an error.
 *   2. Raw log-probs (temperature 1): S = sum of exp(x_i - m) in double;
 *      logprob_i = (x_i - m) - (float)log(S), in fp32.
 *   3. Alternatives: the logprobs_topk highest logits, ties to the lower index,
 *      masked tokens never listed, with their raw log-probs.
 *   4. Greedy (temperature 0): the argmax; the processed distribution is a
 *      point mass, so its log-prob is 0.
 *   5. Otherwise weights w_i = exp((x_i - m) / T) in fp32, so w = 1 at the max
 *      and w_i = p_i / p_max. "Rank order" is logit descending, ties to the
 *      lower index (the logit, not w, so logits that round to equal w keep
 *      their order; exp is monotone, so the two orders never disagree).
 *      - top-k: the first k tokens in rank order.
 *      - top-p: walking the rank order (within the top-k if set), the shortest
 *        prefix whose mass reaches top_p times the total (total = the top-k
 *        set's mass in rank order, or the whole vocab's sum); the token that
 *        crosses is kept. (Without top-k, the mass above the crossing is
 *        summed by buckets of w, see nucleus_cut: the same set up to double
 *        rounding, without sorting the vocab.)
 *      - min-p: drop tokens with w < min_p (p < min_p * p_max).
 *      The kept set is always a prefix of the rank order (at least the max).
 *   6. Draw: Z = sum of kept w (lanes by index, as in sum_weights); u =
 *      samp_uniform(seed, sample_idx, pos); walk the kept tokens in ascending
 *      index order adding w in double; take the first whose running sum
 *      exceeds u * Z (the last kept token if rounding leaves it short).
 *      logprob_processed = (x_tok - m) / T - log(Z).
 * Every sum has a fixed order that depends only on the inputs (never on the
 * batch), so the result is a pure function of its arguments. */
#include "engine/serve/sampler.h"
#include "base/err.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

samp_params samp_default(void)
{
    samp_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.seed = 0;
    p.logprobs_topk = 0;
    p.processed_logprobs = 0;
    return p;
}

int samp_validate(const samp_params *p)
{
    if (!p)
        return rd_fail(RD_EINVAL, "sampling params: got a NULL pointer");
    /* The comparisons are written so that NaN fails them. */
    if (!isfinite(p->temperature) || !(p->temperature >= 0.0f))
        return rd_fail(RD_EINVAL, "temperature must be a finite number >= 0 (0 = greedy), got %g",
                       p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return rd_fail(RD_EINVAL, "top_p must be in (0, 1] (1 = off), got %g", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return rd_fail(RD_EINVAL, "min_p must be in [0, 1] (0 = off), got %g", p->min_p);
    if (p->top_k < 0)
        return rd_fail(RD_EINVAL, "top_k must be >= 0 (0 = off), got %d", (int)p->top_k);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f))
        return rd_fail(RD_EINVAL, "repetition_penalty must be a finite number > 0 (1 = off), got %g",
                       p->repetition_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return rd_fail(RD_EINVAL, "frequency_penalty must be in [-2, 2] (0 = off), got %g", p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return rd_fail(RD_EINVAL, "presence_penalty must be in [-2, 2] (0 = off), got %g", p->presence_penalty);
    if (p->logprobs_topk < 0 || p->logprobs_topk > 20)
        return rd_fail(RD_EINVAL, "logprobs_topk must be in 0..20, got %d", (int)p->logprobs_topk);
    if (p->n_want < 0 || p->n_want > SAMP_MAX_WANT || (p->n_want > 0 && !p->want_ids))
        return rd_fail(RD_EINVAL, "n_want must be in 0..%d with want_ids given, got %d", SAMP_MAX_WANT,
                       (int)p->n_want);
    return 0;
}

/* ---- Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11; Random123) ----
 *
 * Exact construction, for the CUDA side to match bit for bit:
 *   key  = { (uint32)seed, (uint32)(seed >> 32) }
 *   ctr  = { sample_idx, pos, 0, 0 }
 *   10 rounds; round r (r = 0..9) uses key_r = key + r * (W0, W1) mod 2^32,
 *   W0 = 0x9E3779B9, W1 = 0xBB67AE85, and maps (c0, c1, c2, c3) to
 *     hi0:lo0 = 0xD2511F53 * c0   (full 64-bit product)
 *     hi1:lo1 = 0xCD9E8D57 * c2
 *     (hi1 ^ c1 ^ key_r[0], lo1, hi0 ^ c3 ^ key_r[1], lo0)
 *   out = the counter after round 9 (this is Random123's philox4x32_R(10,...)).
 *   u = ((uint64)out[1] << 32 | out[0]) >> 11, times 2^-53: a double in [0,1)
 *   with 53 random bits (out[2], out[3] unused; exact in double, no rounding).
 * Words 2 and 3 of the counter are free for other streams later. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void samp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

double samp_uniform(uint64_t seed, uint32_t sample_idx, uint32_t pos)
{
    const uint32_t ctr[4] = {sample_idx, pos, 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    samp_philox4x32_10(ctr, key, out);
    uint64_t bits = ((uint64_t)out[1] << 32 | out[0]) >> 11;
    return (double)bits * 0x1.0p-53;
}

/* ---- Ordering ----
 * logit_order maps a logit to an int32 whose signed order is the float order;
 * -0 becomes +0 first, so equal logits get equal values. +inf and +NaN land
 * at or above logit_order(INFINITY), -NaN below logit_order(-INFINITY), which
 * is how the first scan rejects them without a float compare per token. A
 * rank key is one uint64 per token, larger = earlier in rank order: the
 * logit order in the high half, UINT32_MAX - index in the low half. With a
 * zero high half the same key sorts plain indices ascending. */
static inline int32_t logit_order(float x)
{
    x += 0.0f;
    int32_t b;
    memcpy(&b, &x, sizeof b);
    return b < 0 ? b ^ INT32_MAX : b;
}

static inline uint64_t rank_key(float x, int32_t i)
{
    uint32_t hi = (uint32_t)logit_order(x) ^ 0x80000000u;
    return (uint64_t)hi << 32 | (uint32_t)(UINT32_MAX - (uint32_t)i);
}

static inline int32_t key_order(uint64_t k) { return (int32_t)((uint32_t)(k >> 32) ^ 0x80000000u); }

static inline uint64_t index_key(int32_t i) { return (uint32_t)(UINT32_MAX - (uint32_t)i); }

static inline int32_t key_index(uint64_t k) { return (int32_t)(UINT32_MAX - (uint32_t)k); }

static inline void swap_u64(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Min-heap on a[0..n): the root is the smallest key. */
static void heap_sift_down(uint64_t *a, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, s = i;
        if (l < n && a[l] < a[s])
            s = l;
        if (l + 1 < n && a[l + 1] < a[s])
            s = l + 1;
        if (s == i)
            return;
        swap_u64(&a[i], &a[s]);
        i = s;
    }
}

static void heap_push(uint64_t *a, size_t n_before, uint64_t key)
{
    size_t i = n_before;
    a[i] = key;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (a[up] <= a[i])
            break;
        swap_u64(&a[up], &a[i]);
        i = up;
    }
}

static void heapsort_desc(uint64_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        heap_sift_down(a, n, i);
    for (size_t end = n; end > 1; end--) {
        swap_u64(&a[0], &a[end - 1]); /* smallest left goes to the back */
        heap_sift_down(a, end - 1, 0);
    }
}

/* Introsort, descending: quicksort with a median-of-three pivot, insertion
 * sort for short runs, heapsort if the recursion gets deep, so the worst case
 * stays O(n log n) whatever logits arrive. Keys are distinct (they hold the
 * index), so the result does not depend on the algorithm. No allocation. */
static void sort_desc_depth(uint64_t *a, size_t n, int depth)
{
    while (n > 16) {
        if (depth-- == 0) {
            heapsort_desc(a, n);
            return;
        }
        size_t mid = n / 2;
        if (a[0] < a[mid])
            swap_u64(&a[0], &a[mid]);
        if (a[mid] < a[n - 1])
            swap_u64(&a[mid], &a[n - 1]);
        if (a[0] < a[mid])
            swap_u64(&a[0], &a[mid]);
        uint64_t pivot = a[mid];
        /* Hoare partition: afterwards a[0..j] >= pivot >= a[j+1..n), and
         * a[0] >= pivot >= a[n-1] keep both scans in bounds. */
        size_t i = 0, j = n - 1;
        for (;;) {
            while (a[i] > pivot)
                i++;
            while (a[j] < pivot)
                j--;
            if (i >= j)
                break;
            swap_u64(&a[i], &a[j]);
            i++;
            j--;
        }
        size_t left = j + 1;
        if (left < n - left) {
            sort_desc_depth(a, left, depth);
            a += left;
            n -= left;
        } else {
            sort_desc_depth(a + left, n - left, depth);
            n = left;
        }
    }
    for (size_t i = 1; i < n; i++) {
        uint64_t k = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] < k) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = k;
    }
}

static void sort_desc(uint64_t *a, size_t n)
{
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1)
        depth += 2;
    sort_desc_depth(a, n, depth);
}

/* ---- Pass 1: max, argmax, bad logits ----
 * Tokens go in chunks; each chunk's max logit order is kept so that the
 * top-n selections can skip whole chunks. The loops over a chunk are plain
 * integer min/max, which the compiler vectorises at -O2. */
#define SAMP_CHUNK 64

static inline void chunk_range(const float *restrict x, int32_t len, int32_t *hi, int32_t *lo)
{
    int32_t h = INT32_MIN, l = INT32_MAX;
    for (int32_t j = 0; j < len; j++) {
        int32_t k = logit_order(x[j]);
        h = k > h ? k : h;
        l = k < l ? k : l;
    }
    *hi = h;
    *lo = l;
}

static int scan_logits(const float *restrict logits, int32_t vocab, int32_t *restrict chunk_max,
                       int32_t *argmax)
{
    int32_t best = INT32_MIN, lowest = INT32_MAX, best_chunk = 0;
    for (int32_t c = 0; c * SAMP_CHUNK < vocab; c++) {
        int32_t len = vocab - c * SAMP_CHUNK, hi, lo;
        if (len >= SAMP_CHUNK)
            chunk_range(logits + (size_t)c * SAMP_CHUNK, SAMP_CHUNK, &hi, &lo);
        else
            chunk_range(logits + (size_t)c * SAMP_CHUNK, len, &hi, &lo);
        chunk_max[c] = hi;
        if (hi > best) {
            best = hi;
            best_chunk = c;
        }
        lowest = lo < lowest ? lo : lowest;
    }
    if (best >= logit_order(INFINITY) || lowest < logit_order(-INFINITY)) {
        for (int32_t i = 0; i < vocab; i++)
            if (!(logits[i] < INFINITY))
                return rd_fail(RD_EINVAL,
                               "logits[%d] is %g; logits must be finite or -inf (masked)",
                               (int)i, logits[i]);
    }
    if (best == logit_order(-INFINITY))
        return rd_fail(RD_EINVAL, "all %d logits are -inf; at least one token must be allowed",
                       (int)vocab);
    /* The first chunk reaching the max holds the first token with it. */
    int32_t i = best_chunk * SAMP_CHUNK;
    while (logit_order(logits[i]) != best)
        i++;
    *argmax = i;
    return 0;
}

/* Writes the rank keys of the n earliest tokens in rank order into out[],
 * sorted (fewer if fewer logits are finite; -inf tokens are never chosen).
 * A min-heap holds the best n so far. The scan goes in index order, so a
 * later token whose logit equals the heap's worst ranks after it: only a
 * strictly larger logit can enter, and a chunk whose max is not larger is
 * skipped whole. Returns the count. */
static size_t select_top(const float *logits, int32_t vocab, const int32_t *chunk_max, size_t n,
                         uint64_t *out)
{
    size_t h = 0;
    int32_t bar = logit_order(-INFINITY);
    if (n == 0)
        return 0;
    for (int32_t c0 = 0; c0 < vocab; c0 += SAMP_CHUNK) {
        if (chunk_max[c0 / SAMP_CHUNK] <= bar)
            continue;
        int32_t end = vocab - c0 < SAMP_CHUNK ? vocab : c0 + SAMP_CHUNK;
        for (int32_t i = c0; i < end; i++) {
            if (logit_order(logits[i]) <= bar)
                continue;
            if (h < n) {
                heap_push(out, h++, rank_key(logits[i], i));
                if (h < n)
                    continue; /* until the heap is full, any finite logit enters */
            } else {
                out[0] = rank_key(logits[i], i);
                heap_sift_down(out, n, 0);
            }
            bar = key_order(out[0]);
        }
    }
    sort_desc(out, h);
    return h;
}

/* ---- Weights ----
 * exp for x <= 0 (and -inf), written so the compiler vectorises it and the
 * result is the same on every x86-64 build (libm's expf picks FMA or not at
 * run time; this uses plain IEEE ops, and -std=c11 keeps the compiler from
 * contracting them): Cephes' expf. n = round(x log2 e) by the 1.5 * 2^23
 * trick, r = x - n ln2 in two parts (Cody-Waite), a degree-7 polynomial for
 * e^r, times 2^n built in the exponent bits. x < -87 (the smallest normal is
 * e^-87.3) and -inf give exactly 0; exp(0) = 1 exactly. Checked over every
 * float in [-87.5, 0]: error < 1 ulp, and non-increasing as x decreases,
 * which the rank-order reasoning below relies on. */
static inline float exp_nonpos(float x)
{
    uint32_t ux;
    memcpy(&ux, &x, sizeof ux);
    /* As unsigned bits, a negative float is below -87 iff its bits are above -87's. */
    uint32_t under = -(uint32_t)(ux > 0xC2AE0000u);
    ux = (ux & ~under) | (0xC2AE0000u & under);
    float xc;
    memcpy(&xc, &ux, sizeof xc);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = (y * (r * r) + r) + 1.0f;
    uint32_t scale_bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    float res = y * scale;
    uint32_t ur;
    memcpy(&ur, &res, sizeof ur);
    ur &= ~under;
    memcpy(&res, &ur, sizeof res);
    return res;
}

/* The scaled weight p_i / p_max = exp((x_i - m) / t). Division, not a
 * multiply by 1/t, so a tiny t gives -inf (weight 0) rather than 0 * inf =
 * NaN at the max; and t = 1 gives exactly exp(x_i - m). */
static inline float scaled_weight(float x, float m, float t) { return exp_nonpos((x - m) / t); }

static inline void weights_run(const float *restrict x, int32_t len, float m, float t,
                               float *restrict w)
{
    for (int32_t j = 0; j < len; j++)
        w[j] = scaled_weight(x[j], m, t);
}

static void fill_weights(const float *restrict x, int32_t vocab, float m, float t,
                         float *restrict w)
{
    int32_t i = 0;
    for (; i + SAMP_CHUNK <= vocab; i += SAMP_CHUNK)
        weights_run(x + i, SAMP_CHUNK, m, t, w + i); /* fixed trip count: vectorised */
    weights_run(x + i, vocab - i, m, t, w + i);
}

/* Sums in double in a fixed order that depends only on n: 8 interleaved
 * lanes (lane j adds items j, j+8, j+16, ... in index order), combined as
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Eight independent chains run at load
 * speed instead of one add latency per token (49152 tokens: ~6x faster). */
static inline double combine_lanes(const double l[8])
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static double sum_weights(const float *w, int32_t n)
{
    double l[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] += w[i + j];
    for (int j = 0; i + j < n; j++)
        l[j] += w[i + j];
    return combine_lanes(l);
}

/* ---- Kept set as a rule ----
 * Every kept set is a prefix of the rank order cut by min-p, so it can be
 * tested per token without a list: keep i iff w_i > 0, w_i >= min_w, and i
 * ranks at or before the cut token. */
typedef struct {
    float x_cut;   /* logit of the last kept token in rank order (-inf: no cut) */
    int32_t i_cut; /* its index */
    float min_w;   /* min_p: p_i >= min_p * p_max  <=>  w_i >= min_p */
} kept_rule;

static inline int rule_keeps(const kept_rule *r, float x, float w, int32_t i)
{
    return w > 0.0f && w >= r->min_w && (x > r->x_cut || (x == r->x_cut && i <= r->i_cut));
}

/* Inverse CDF in ascending index order: the first kept token whose running
 * mass exceeds u * z. A zero-weight token never raises the running mass, so it
 * is never chosen; if rounding leaves the target unreached, the last kept
 * token is taken. */
static int32_t draw_rule(const kept_rule *r, const float *x, const float *w, int32_t vocab,
                         double z, double u)
{
    double target = u * z, cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < vocab; i++) {
        if (rule_keeps(r, x[i], w[i], i)) {
            cum += w[i];
            last = i;
            if (cum > target)
                return i;
        }
    }
    return last;
}

/* The kept mass, in sum_weights' lane order: a dropped token adds 0 to its
 * lane. The test is branch-free (w * 0 or w * 1, both exact) because which
 * tokens are kept is close to random in index order. */
static double mass_rule(const kept_rule *r, const float *x, const float *w, int32_t vocab)
{
    const float x_cut = r->x_cut, min_w = r->min_w;
    const int32_t i_cut = r->i_cut;
    double l[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= vocab; i += 8) {
        for (int32_t j = 0; j < 8; j++) {
            float xv = x[i + j], wv = w[i + j];
            int keep = (wv > 0.0f) & (wv >= min_w) &
                       ((xv > x_cut) | ((xv == x_cut) & (i + j <= i_cut)));
            l[j] += wv * (float)keep;
        }
    }
    for (int32_t j = 0; i + j < vocab; j++)
        l[j] += rule_keeps(r, x[i + j], w[i + j], i + j) ? w[i + j] : 0.0f;
    return combine_lanes(l);
}

/* The same draw over an explicit list of index keys (ascending index). */
static int32_t draw_list(const uint64_t *kept, size_t n, const float *w, double z, double u)
{
    double target = u * z, cum = 0.0;
    int32_t last = -1;
    for (size_t j = 0; j < n; j++) {
        int32_t i = key_index(kept[j]);
        if (w[i] > 0.0f) {
            cum += w[i];
            last = i;
            if (cum > target)
                return i;
        }
    }
    return last;
}

/* ---- Top-p over the whole vocab without sorting it ----
 * Buckets of w in [0, 1] by float bits, 8 per octave from w = 1 down to
 * 2^-40, then one tail bucket for everything smaller (zeros included). Bits
 * of non-negative floats are monotone in value and w is monotone in the
 * logit, so each bucket is a run of the rank order. The mass before the
 * crossing bucket is taken bucket by bucket; only the crossing bucket is
 * sorted and walked in rank order. That is the rank-order rule up to double
 * rounding at a boundary; if the walk falls short by rounding, the whole
 * crossing bucket is kept. */
#define SAMP_BUCKETS 321

static inline uint32_t weight_bucket(float w)
{
    uint32_t b;
    memcpy(&b, &w, sizeof b);
    uint32_t k = 0x3f8u - (b >> 20); /* 0x3f8 = 1.0f >> 20; w <= 1 */
    return k < SAMP_BUCKETS - 1 ? k : SAMP_BUCKETS - 1;
}

static void nucleus_cut(const float *x, const float *w, int32_t vocab, double target,
                        uint64_t *keys, kept_rule *r)
{
    double mass[SAMP_BUCKETS]; /* each bucket's sum in index order */
    memset(mass, 0, sizeof mass);
    for (int32_t i = 0; i < vocab; i++)
        mass[weight_bucket(w[i])] += w[i];
    double cum = 0.0;
    uint32_t b = 0;
    while (b < SAMP_BUCKETS && !(cum + mass[b] >= target))
        cum += mass[b++];
    if (b == SAMP_BUCKETS)
        return; /* all the mass falls short by rounding: no cut */
    size_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (weight_bucket(w[i]) == b)
            keys[n++] = rank_key(x[i], i);
    sort_desc(keys, n);
    size_t cut = n - 1;
    for (size_t j = 0; j < n; j++) {
        cum += w[key_index(keys[j])];
        if (cum >= target) {
            cut = j;
            break;
        }
    }
    r->i_cut = key_index(keys[cut]);
    r->x_cut = x[r->i_cut];
}

/* Kept lists longer than this are drawn through the rule (a scan of the
 * vocab) rather than sorted by index; both give the same token. */
#define SAMP_LIST_MAX 4096

/* Token indices, chunk offsets and rank keys stay far from int32 overflow. */
#define SAMP_MAX_VOCAB (1 << 30)

size_t samp_scratch_bytes(int32_t vocab)
{
    if (vocab <= 0 || vocab > SAMP_MAX_VOCAB)
        return 0;
    size_t chunks = ((size_t)vocab + SAMP_CHUNK - 1) / SAMP_CHUNK;
    return (size_t)vocab * (sizeof(uint64_t) + sizeof(float)) + 2 * chunks * sizeof(int32_t);
}

void samp_apply_edits(const samp_params *p, const float *logits, int32_t vocab, const samp_edit *edits,
                      int32_t n_edits, float *proc)
{
    if (proc != logits)
        memcpy(proc, logits, sizeof(float) * (size_t)vocab);
    for (int32_t j = 0; j < n_edits; j++)
        if (edits[j].token >= 0 && edits[j].token < vocab)
            proc[edits[j].token] = samp_edit_logit(logits[edits[j].token], &edits[j], p);
}

/* Steps 1-3 on the raw row: the max (its lowest index in *argmax), S = the
 * sum of w = exp(x - m) in sum_weights' order (w is left holding them), log S
 * in fp32, and the alternatives into out (cleared first). samp_sample_ex and
 * samp_score share it, so a scored token's log-prob has the sampled one's bits. */
static int raw_part(const samp_params *p, const float *raw, int32_t vocab, int32_t *chunk_max, float *w,
                    samp_result *out, int32_t *argmax, float *m_raw, float *log_s, double *s_raw)
{
    int rc = scan_logits(raw, vocab, chunk_max, argmax);
    if (rc)
        return rc;
    *m_raw = raw[*argmax];
    fill_weights(raw, vocab, *m_raw, 1.0f, w);
    *s_raw = sum_weights(w, vocab);
    *log_s = (float)log(*s_raw);
    memset(out, 0, sizeof *out);
    uint64_t alt[20];
    size_t n_alt = select_top(raw, vocab, chunk_max, (size_t)p->logprobs_topk, alt);
    for (size_t j = 0; j < n_alt; j++) {
        int32_t i = key_index(alt[j]);
        out->top_ids[j] = i;
        out->top_logprobs[j] = (raw[i] - *m_raw) - *log_s;
    }
    out->n_top = (int32_t)n_alt;
    for (int32_t j = 0; j < p->n_want; j++) {
        const int32_t i = p->want_ids[j];
        if (i < 0 || i >= vocab)
            return rd_fail(RD_EINVAL, "want_ids[%d] = %d is outside the vocabulary of %d", (int)j, (int)i, (int)vocab);
        out->want_lps[j] = (raw[i] - *m_raw) - *log_s;
    }
    return 0;
}

/* The kept set of a draw at temperature t > 0 from logits (argmax's logit m,
 * z1 the row's mass at t = 1 with w holding its weights): either a list
 * keys[0..*n_list) of index keys in ascending index order (*n_list > 0) or
 * the rule (*n_list 0), and its mass *z_kept; w holds the weights at t of
 * every token the set can keep. */
static void kept_set(const samp_params *p, const float *logits, int32_t vocab, int32_t *chunk_max, float m,
                     double z1, uint64_t *keys, float *w, kept_rule *rule, size_t *n_list, double *z_kept)
{
    const float t = p->temperature;
    *rule = (kept_rule){-INFINITY, -1, p->min_p};
    *n_list = 0;
    if (p->top_k > 0 && p->top_k < vocab) {
        size_t n = select_top(logits, vocab, chunk_max, (size_t)p->top_k, keys);
        double z = 0.0; /* mass of the top-k set, in rank order */
        for (size_t j = 0; j < n; j++) {
            int32_t i = key_index(keys[j]);
            w[i] = scaled_weight(logits[i], m, t);
            z += w[i];
        }
        size_t n_keep = n;
        if (p->top_p < 1.0f) {
            double target = (double)p->top_p * z, cum = 0.0;
            for (size_t j = 0; j < n; j++) {
                cum += w[key_index(keys[j])];
                if (cum >= target) {
                    n_keep = j + 1;
                    break;
                }
            }
        }
        /* min-p trims the tail: w does not increase along the rank
         * order, and the first token has w = 1 >= min_p. */
        while (n_keep > 1 && !(w[key_index(keys[n_keep - 1])] >= rule->min_w))
            n_keep--;
        if (n_keep <= SAMP_LIST_MAX) {
            for (size_t j = 0; j < n_keep; j++)
                keys[j] = index_key(key_index(keys[j]));
            sort_desc(keys, n_keep); /* ascending token index */
            double l[8] = {0}; /* mass_rule's lanes: token i in lane i % 8 */
            for (size_t j = 0; j < n_keep; j++) {
                int32_t i = key_index(keys[j]);
                l[i % 8] += w[i];
            }
            *z_kept = combine_lanes(l);
            *n_list = n_keep;
        } else {
            rule->i_cut = key_index(keys[n_keep - 1]);
            rule->x_cut = logits[rule->i_cut];
            if (t != 1.0f)
                fill_weights(logits, vocab, m, t, w); /* the rule reads every w */
            *z_kept = mass_rule(rule, logits, w, vocab);
        }
    } else {
        double z = z1; /* w holds exp(x - m) = the weights at t = 1 */
        if (t != 1.0f) {
            fill_weights(logits, vocab, m, t, w);
            z = sum_weights(w, vocab);
        }
        if (p->top_p < 1.0f)
            nucleus_cut(logits, w, vocab, (double)p->top_p * z, keys, rule);
        if (p->top_p < 1.0f || rule->min_w > 0.0f)
            *z_kept = mass_rule(rule, logits, w, vocab);
        else
            *z_kept = z; /* everything kept: the same sum in the same order */
    }
}

/* Whether the kept set of kept_set holds token i. */
static int kept_has(const kept_rule *rule, const uint64_t *keys, size_t n_list, const float *logits, const float *w,
                    int32_t i)
{
    if (n_list == 0)
        return rule_keeps(rule, logits[i], w[i], i);
    for (size_t j = 0; j < n_list; j++)
        if (key_index(keys[j]) == i)
            return w[i] > 0.0f;
    return 0;
}

/* The processed log-prob of a kept token; in double: (x - m) / t rounded to fp32 would alone be ~1 ulp of the
 * result off. */
static float kept_logprob(const float *logits, int32_t tok, float m, float t, double z_kept)
{
    return (float)(((double)logits[tok] - (double)m) / (double)t - log(z_kept));
}

int samp_score(const samp_params *p, const float *logits, int32_t vocab, int32_t token, void *scratch,
               samp_result *out)
{
    if (!logits || !scratch || !out)
        return rd_fail(RD_EINVAL, "samp_score: logits, scratch and out must not be NULL");
    if (vocab <= 0 || vocab > SAMP_MAX_VOCAB || token < 0 || token >= vocab)
        return rd_fail(RD_EINVAL, "samp_score: token %d outside a vocabulary of %d", (int)token, (int)vocab);
    if ((uintptr_t)scratch % sizeof(uint64_t) != 0)
        return rd_fail(RD_EINVAL, "samp_score: scratch must be 8-byte aligned (as malloc returns)");
    int rc = samp_validate(p);
    if (rc)
        return rc;
    uint64_t *keys = scratch;
    float *w = (float *)(keys + vocab);
    int32_t *chunk_max = (int32_t *)(w + vocab);
    int32_t argmax;
    float m_raw, log_s;
    double s_raw;
    if ((rc = raw_part(p, logits, vocab, chunk_max, w, out, &argmax, &m_raw, &log_s, &s_raw)))
        return rc;
    out->token = token;
    out->logprob = (logits[token] - m_raw) - log_s;
    /* vLLM's rank: the tokens at least as likely, the token itself included */
    const float x = logits[token];
    int32_t rank = 0;
    for (int32_t i = 0; i < vocab; i++)
        rank += logits[i] >= x;
    out->rank = rank;
    out->logprob_processed = NAN;
    if (!p->processed_logprobs)
        return 0;
    const float t = p->temperature;
    if (t == 0.0f) {
        out->logprob_processed = token == argmax ? 0.0f : -INFINITY;
    } else {
        kept_rule rule;
        size_t n_list;
        double z_kept;
        kept_set(p, logits, vocab, chunk_max, m_raw, s_raw, keys, w, &rule, &n_list, &z_kept);
        out->logprob_processed = kept_has(&rule, keys, n_list, logits, w, token)
                                     ? kept_logprob(logits, token, m_raw, t, z_kept)
                                     : -INFINITY;
    }
    return 0;
}

int samp_sample(const samp_params *p, const float *logits, int32_t vocab,
                uint32_t sample_idx, uint32_t pos, void *scratch, samp_result *out)
{
    return samp_sample_ex(p, logits, NULL, vocab, sample_idx, pos, scratch, out);
}

int samp_sample_ex(const samp_params *p, const float *raw, const float *proc, int32_t vocab,
                   uint32_t sample_idx, uint32_t pos, void *scratch, samp_result *out)
{
    if (!raw || !scratch || !out)
        return rd_fail(RD_EINVAL, "samp_sample: logits, scratch and out must not be NULL");
    if (vocab <= 0 || vocab > SAMP_MAX_VOCAB)
        return rd_fail(RD_EINVAL, "samp_sample: vocab must be in 1..%d, got %d", SAMP_MAX_VOCAB,
                       (int)vocab);
    if ((uintptr_t)scratch % sizeof(uint64_t) != 0)
        return rd_fail(RD_EINVAL,
                       "samp_sample: scratch must be 8-byte aligned (as malloc returns)");
    int rc = samp_validate(p);
    if (rc)
        return rc;

    uint64_t *keys = scratch;                  /* [vocab] rank or index keys */
    float *w = (float *)(keys + vocab);        /* [vocab] weights, by token id */
    int32_t *chunk_max = (int32_t *)(w + vocab); /* [vocab / SAMP_CHUNK, rounded up] */

    /* Raw log-probs and the alternatives come from the raw row. */
    int32_t argmax = 0;
    float m_raw, log_s;
    double s_raw;
    if ((rc = raw_part(p, raw, vocab, chunk_max, w, out, &argmax, &m_raw, &log_s, &s_raw)))
        return rc;
    double z1 = s_raw; /* the drawing row's mass at t = 1; w holds its weights */

    /* The draw comes from the processed row: scanned again, and its weights
     * at t = 1 taken anew, so what follows sees it exactly as it would see
     * logits given to samp_sample. */
    const float *logits = raw;
    if (proc && proc != raw) {
        int32_t *proc_chunk_max = chunk_max + (vocab + SAMP_CHUNK - 1) / SAMP_CHUNK;
        if ((rc = scan_logits(proc, vocab, proc_chunk_max, &argmax)))
            return rd_fail(rc, "processed logits: %s", rd_errmsg());
        chunk_max = proc_chunk_max;
        logits = proc;
        fill_weights(proc, vocab, proc[argmax], 1.0f, w);
        z1 = sum_weights(w, vocab);
    }
    const float m = logits[argmax];

    int32_t tok;
    float lp_processed;
    const float t = p->temperature;
    if (t == 0.0f) {
        /* The processed distribution is a point mass on the argmax. */
        tok = argmax;
        lp_processed = 0.0f;
    } else {
        const double u = samp_uniform(p->seed, sample_idx, pos);
        kept_rule rule;
        size_t n_list;
        double z_kept;
        kept_set(p, logits, vocab, chunk_max, m, z1, keys, w, &rule, &n_list, &z_kept);
        tok = n_list ? draw_list(keys, n_list, w, z_kept, u) : draw_rule(&rule, logits, w, vocab, z_kept, u);
        lp_processed = kept_logprob(logits, tok, m, t, z_kept);
    }

    out->token = tok;
    out->logprob = (raw[tok] - m_raw) - log_s;
    out->logprob_processed = p->processed_logprobs ? lp_processed : NAN;
    return 0;
}
