// cuda_sample.cu - token selection and log-probs on the device, by the rules
// of engine/serve/sampler.c (its header comment states them).
//
// What is bit-identical to the CPU sampler: the argmax (lowest index), the
// fp32 weights w_i = exp_nonpos((x_i - m) / t) (cuda_math.h is a copy of the
// CPU's expression, without FMA contraction), the uniform u (Philox4x32-10,
// the same counter and key), the rank order (logit descending, ties to the
// lower index) and so the top-k set and the alternatives. What is equal up
// to double rounding: the sums (Z, the top-p mass) are taken in a fixed
// parallel order rather than the CPU's lanes, so a token can differ from the
// CPU's only if u*Z falls within ~1e-16 (relative) of a CDF boundary.
//
// Kept set (as the CPU): finite tokens with rank key >= K_cut, w > 0 and
// w >= min_p, where K_cut is the k-th largest key (top-k) and/or the key of
// the token whose running mass in rank order first reaches top_p * total
// (the crossing token is kept). The one-CTA form finds the keys by bitwise
// binary search over the 64-bit rank keys, each step a block-wide count or
// mass, the tiled form by a radix search over the tiles. The draw walks the
// kept tokens in ascending index order: chunks of contiguous tokens (a
// thread's), their sums scanned in order, then the crossing chunk's tokens.
//
// Two forms. The tiled one (the default) spreads a request over its row:
// a CTA per tile of SAMP_TILE tokens finds the tile's largest rank key
// (k_samp_scan), then, with the row's max from every tile's, the tile's
// sums (k_samp_tiles: exp mass, kept mass, rank count, top keys); the last
// of a request's CTAs folds them in tile order and finishes the request: the
// log-probs, the alternatives, and a greedy draw or one without a top-k/top-p
// cut. A draw with a cut finds its cut key in rounds over the tiles
// (k_samp_cut, a radix search), then draws (k_samp_draw). RD_CUDA_SAMPLE=cta:
// k_sample alone, one CTA per request over the whole row (the old form, to
// time against).
//
// Logit edits (bias, min-tokens mask, penalties; samp_sample_ex): k_edit_rows
// writes a request's edited copy of its row first (cm_edit_logit is
// samp_edit_logit's expression, so the copy is bit-identical to
// samp_apply_edits'); either form then takes the raw log-prob and the
// alternatives from the raw row and everything about the draw from the copy.
#include "kernels/cuda/cuda_internal.h"

namespace RD_NS {

#define ST RD_SAMPLE_THREADS

struct kept_rule {
    uint64_t k_cut;             // keep keys >= k_cut (0: no rank cut)
    float min_w;
    float m, t;
};

RD_DEV bool finite_logit(float x) { return x > -INFINITY; } // NaN/+inf rejected before

RD_DEV bool rule_keeps(const kept_rule &r, float x, int32_t i, float *w_out)
{
    if (!finite_logit(x))
        return false;
    const float w = cm_scaled_weight(x, r.m, r.t);
    *w_out = w;
    return w > 0.0f && w >= r.min_w && cm_rank_key(x, i) >= r.k_cut;
}

// Mass (double, fixed order) of finite tokens with key >= k and key >= floor_key.
RD_DEV double mass_ge(const float *x, int32_t vocab, uint64_t k, uint64_t floor_key, float m, float t)
{
    double s = 0.0;
    for (int32_t i = threadIdx.x; i < vocab; i += ST) {
        const float xi = x[i];
        if (!finite_logit(xi))
            continue;
        const uint64_t key = cm_rank_key(xi, i);
        if (key >= k && key >= floor_key)
            s += (double)cm_scaled_weight(xi, m, t);
    }
    return block_allreduce(s, op_add());
}

RD_DEV int32_t count_ge(const float *x, int32_t vocab, uint64_t k)
{
    int32_t c = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += ST) {
        const float xi = x[i];
        c += finite_logit(xi) && cm_rank_key(xi, i) >= k;
    }
    return block_allreduce(c, op_add());
}

// Finite tokens whose key has high half hi, and the largest such key.
RD_DEV int32_t count_hi(const float *x, int32_t vocab, uint32_t hi, uint64_t *max_key)
{
    int32_t c = 0;
    uint64_t mk = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += ST) {
        const float xi = x[i];
        if (!finite_logit(xi))
            continue;
        const uint64_t key = cm_rank_key(xi, i);
        if ((uint32_t)(key >> 32) == hi) {
            c++;
            mk = key > mk ? key : mk;
        }
    }
    *max_key = block_allreduce(mk, op_max());
    return block_allreduce(c, op_add());
}

// The largest key K with pred(K) true, pred non-increasing in K; 0 if none.
// Bitwise search over the high half (the logit order) first; the low half
// (the index) only when several tokens share the logit at the cut.
template <class Pred> RD_DEV uint64_t key_search(const float *x, int32_t vocab, Pred pred)
{
    uint64_t k = 0;
    for (int bit = 63; bit >= 32; bit--) {
        const uint64_t cand = k | ((uint64_t)1 << bit);
        if (pred(cand))
            k = cand;
    }
    uint64_t only = 0;
    const int32_t n = count_hi(x, vocab, (uint32_t)(k >> 32), &only);
    if (n <= 1)
        return n == 1 ? only : k; // one token in [k, k + 2^32): the answer is its key
    for (int bit = 31; bit >= 0; bit--) {
        const uint64_t cand = k | ((uint64_t)1 << bit);
        if (pred(cand))
            k = cand;
    }
    return k;
}

struct mass_pred {
    const float *x;
    int32_t vocab;
    uint64_t floor_key;
    double target;
    float m, t;
    RD_DEV bool operator()(uint64_t k) const { return mass_ge(x, vocab, k, floor_key, m, t) >= target; }
};

struct count_pred {
    const float *x;
    int32_t vocab, k;
    RD_DEV bool operator()(uint64_t key) const { return count_ge(x, vocab, key) >= k; }
};

// The largest key K with mass(keys >= max(K, floor_key)) >= target; 0 if none.
RD_DEV uint64_t mass_cut(const float *x, int32_t vocab, uint64_t floor_key, double target, float m, float t)
{
    return key_search(x, vocab, mass_pred{x, vocab, floor_key, target, m, t});
}

// Step 1 on one row (block-uniform result): 0 and *amax = the lowest index
// of the max logit; 1 if a NaN or +inf is present; 2 if all are -inf.
RD_DEV int32_t scan_row(const float *x, int32_t vocab, int32_t *amax)
{
    const int32_t tid = threadIdx.x;
    const int32_t ord_pinf = cm_logit_order(INFINITY), ord_ninf = cm_logit_order(-INFINITY);
    int32_t best = INT32_MIN, bad = 0;
    for (int32_t i = tid; i < vocab; i += ST) {
        const int32_t o = cm_logit_order(x[i]);
        bad |= o >= ord_pinf || o < ord_ninf;
        best = o > best ? o : best;
    }
    best = block_allreduce(best, op_max());
    bad = block_allreduce(bad, op_max());
    if (bad || best == ord_ninf)
        return bad ? 1 : 2;
    int32_t a = INT32_MAX;
    for (int32_t i = tid; i < vocab; i += ST)
        if (cm_logit_order(x[i]) == best && i < a)
            a = i;
    *amax = block_allreduce(a, op_min());
    return 0;
}

// A request's row, from its tiles' scan results (every thread the same):
// err as scan_row's, the raw row's first, then the edited row's (1: a NaN
// or +inf, 2: all -inf).
struct samp_row {
    int32_t err, amax_raw, amax;
    float m_raw, m;
};

RD_DEV samp_row row_from_tiles(const samp_tile *tr, int32_t T, const float *xr, const float *x)
{
    uint64_t br = 0, bp = 0;
    int32_t bad_r = 0, bad_p = 0;
    for (int32_t t = threadIdx.x; t < T; t += blockDim.x) {
        const uint64_t r = __ldcg(&tr[t].best_r), p = __ldcg(&tr[t].best_p);
        br = r > br ? r : br;
        bp = p > bp ? p : bp;
        bad_r |= __ldcg(&tr[t].bad_r);
        bad_p |= __ldcg(&tr[t].bad_p);
    }
    br = block_allreduce(br, op_max());
    bp = block_allreduce(bp, op_max());
    bad_r = block_allreduce(bad_r, op_max());
    bad_p = block_allreduce(bad_p, op_max());
    samp_row w;
    w.amax_raw = cm_key_index(br);
    w.amax = cm_key_index(bp);
    w.m_raw = xr[w.amax_raw];
    w.m = x[w.amax];
    const int32_t ord_ninf = cm_logit_order(-INFINITY);
    w.err = bad_r                                     ? 1
            : cm_logit_order(w.m_raw) == ord_ninf ? 2
            : bad_p                                   ? 1
            : cm_logit_order(w.m) == ord_ninf     ? 2
                                                      : 0;
    return w;
}

// The raw row's mass from its tiles, in tile order (one thread's sum, the
// same bits wherever it is taken).
RD_DEV double s_raw_from_tiles(const samp_tile *tr, int32_t T)
{
    double s = 0.0;
    for (int32_t t = 0; t < T; t++)
        s += __ldcg(&tr[t].s_raw);
    return s;
}

// Step 3: the n_top largest of n candidate keys (key_at(c): a finite raw
// logit's rank key, or 0), one block-wide max below the last per round; the
// alternatives go to out with their raw log-probs. Returns how many.
template <class KeyAt>
RD_DEV int32_t alternatives(KeyAt key_at, int32_t n, int32_t n_top, const float *xr, float m_raw, float log_s,
                            sample_res *out)
{
    int32_t n_alt = 0;
    uint64_t prev = ~(uint64_t)0;
    for (int32_t j = 0; j < n_top && j < 20; j++) {
        uint64_t bk = 0;
        for (int32_t c = threadIdx.x; c < n; c += blockDim.x) {
            const uint64_t key = key_at(c);
            if (key < prev && key > bk)
                bk = key;
        }
        bk = block_allreduce(bk, op_max());
        if (bk == 0)
            break;
        if (threadIdx.x == 0) {
            const int32_t id = cm_key_index(bk);
            out->top_ids[j] = id;
            out->top_lp[j] = RD_FSUB(RD_FSUB(xr[id], m_raw), log_s);
        }
        prev = bk;
        n_alt++;
    }
    return n_alt;
}

// xr: the raw row (raw log-probs, alternatives); x: the edited row the
// token is drawn from (the same pointer when the request has no edits).
// (RD_CUDA_SAMPLE=cta: one CTA per request over its whole row.)
__global__ void __launch_bounds__(ST) k_sample(const float *logits, const float *proc, int32_t vocab,
                                               const sample_req *reqs, sample_res *res)
{
    RD_PDL_ENTRY();
    const sample_req &q = reqs[blockIdx.x];
    sample_res *out = res + blockIdx.x;
    const float *xr = logits + (int64_t)q.row * vocab;
    const float *x = q.proc_row < 0 ? xr : proc + (int64_t)q.proc_row * vocab;
    const int32_t tid = threadIdx.x;
    __shared__ double chunk_sum[ST];

    // 1. scan: max logit order, bad logits; the edited row too, as the CPU
    // rejects an edit that makes a logit +inf or masks every token.
    int32_t amax_raw = 0;
    int32_t err = scan_row(xr, vocab, &amax_raw);
    int32_t amax = amax_raw;
    if (!err && x != xr)
        err = scan_row(x, vocab, &amax);
    if (err) {
        if (tid == 0) {
            out->token = -1;
            out->err = err;
            out->n_top = 0;
        }
        return;
    }
    const float m_raw = xr[amax_raw], m = x[amax];

    // 2. raw log-probs: S = sum exp(x - m) in double, over the raw row.
    double s_raw = 0.0;
    for (int32_t i = tid; i < vocab; i += ST)
        s_raw += (double)cm_exp_nonpos(RD_FSUB(xr[i], m_raw));
    s_raw = block_allreduce(s_raw, op_add());
    const float log_s = (float)log(s_raw);
    for (int32_t j = tid; j < q.n_want && j < 32; j += ST)
        out->want_lp[j] = RD_FSUB(RD_FSUB(xr[q.want_ids[j]], m_raw), log_s);

    // 3. alternatives: the n_top largest rank keys among finite raw logits.
    const int32_t n_alt =
        alternatives([&](int32_t i) { return finite_logit(xr[i]) ? cm_rank_key(xr[i], i) : (uint64_t)0; }, vocab,
                     q.n_top, xr, m_raw, log_s, out);

    // 4./5. the token, from the edited row.
    int32_t tok;
    float lp_proc;
    const float t = q.temperature;
    const bool score = q.score_token >= 0;
    int32_t rank = 0;
    if (score) {
        // Scoring a given token (samp_score): its raw log-prob below, as a draw of it would have it, its rank,
        // and with score_proc its processed log-prob from the kept set a draw would have (scores have no edits).
        const float xt = xr[q.score_token];
        for (int32_t i = tid; i < vocab; i += ST)
            rank += xr[i] >= xt;
        rank = block_allreduce(rank, op_add());
    }
    if (score && !q.score_proc) {
        tok = q.score_token;
        lp_proc = NAN;
    } else if (t == 0.0f) {
        tok = score ? q.score_token : amax;
        lp_proc = tok == amax ? 0.0f : -INFINITY;
    } else {
        const double u = cm_uniform((uint64_t)q.seed_hi << 32 | q.seed_lo, q.sample_idx, q.pos);
        kept_rule rule = {0, q.min_p, m, t};
        if (q.top_k > 0 && q.top_k < vocab) {
            // The k-th largest key among finite tokens (all of them if fewer).
            uint64_t kk = 0;
            if (count_ge(x, vocab, 1) > q.top_k)
                kk = key_search(x, vocab, count_pred{x, vocab, q.top_k});
            rule.k_cut = kk;
            if (q.top_p < 1.0f) {
                const double z = mass_ge(x, vocab, 0, kk, m, t);
                const uint64_t kc = mass_cut(x, vocab, kk, (double)q.top_p * z, m, t);
                if (kc > kk)
                    rule.k_cut = kc;
            }
        } else if (q.top_p < 1.0f) {
            const double z = mass_ge(x, vocab, 0, 0, m, t);
            rule.k_cut = mass_cut(x, vocab, 0, (double)q.top_p * z, m, t);
        }

        // Kept mass in ascending index chunks (thread t owns one chunk).
        const int32_t chunk = (vocab + ST - 1) / ST;
        const int32_t c0 = tid * chunk, c1 = c0 + chunk < vocab ? c0 + chunk : vocab;
        double cs = 0.0;
        int32_t last = -1;
        for (int32_t i = c0; i < c1; i++) {
            float w;
            if (rule_keeps(rule, x[i], i, &w)) {
                cs += (double)w;
                last = i;
            }
        }
        chunk_sum[tid] = cs;
        last = block_allreduce(last, op_max()); // also orders chunk_sum's writes
        double z_kept = 0.0;
        for (int32_t c = 0; c < ST; c++)
            z_kept += chunk_sum[c];
        // Thread 0 walks: whole chunks while they stay at or under the
        // target, then token by token.
        __shared__ int32_t tok_s;
        if (score) {
            tok = q.score_token;
            float w;
            const bool kept = rule_keeps(rule, x[tok], tok, &w);
            lp_proc = kept ? (float)(((double)x[tok] - (double)m) / (double)t - log(z_kept)) : -INFINITY;
        } else {
        if (tid == 0) {
            const double target = u * z_kept;
            double cum = 0.0;
            int32_t c = 0;
            while (c < ST - 1 && !(cum + chunk_sum[c] > target))
                cum += chunk_sum[c++];
            int32_t found = -1;
            for (int32_t i = c * chunk; i < vocab && found < 0; i++) {
                float w;
                if (rule_keeps(rule, x[i], i, &w)) {
                    cum += (double)w;
                    if (cum > target)
                        found = i;
                }
            }
            tok_s = found >= 0 ? found : last;
        }
        __syncthreads();
        tok = tok_s;
        // In double, as the CPU takes it: (x - m) / t rounded to fp32 alone is ~1 ulp of the result off.
        lp_proc = (float)(((double)x[tok] - (double)m) / (double)t - log(z_kept));
        }
    }
    if (tid == 0) {
        out->token = tok;
        out->err = 0;
        out->logprob = RD_FSUB(RD_FSUB(xr[tok], m_raw), log_s);
        out->logprob_proc = lp_proc;
        out->n_top = n_alt;
        out->rank = rank;
    }
}

// ------------------------------------------------------------ the tiled form

// Tile `tile` of a row: thread j's SAMP_PER contiguous tokens (valid: inside the vocab).
RD_DEV int32_t tile_first(int32_t tile) { return tile * SAMP_TILE + (int32_t)threadIdx.x * SAMP_PER; }

__global__ void __launch_bounds__(SAMP_TT) k_samp_scan(const float *logits, const float *proc, int32_t vocab,
                                                       const sample_req *reqs, samp_tile *tiles)
{
    RD_PDL_ENTRY();
    const sample_req &q = reqs[blockIdx.x];
    const float *xr = logits + (int64_t)q.row * vocab;
    const float *x = q.proc_row < 0 ? xr : proc + (int64_t)q.proc_row * vocab;
    const int32_t ord_pinf = cm_logit_order(INFINITY), ord_ninf = cm_logit_order(-INFINITY);
    const int32_t i0 = tile_first(blockIdx.y);
    uint64_t br = 0, bp = 0;
    int32_t bad_r = 0, bad_p = 0;
    for (int32_t k = 0; k < SAMP_PER; k++) {
        const int32_t i = i0 + k;
        if (i >= vocab)
            break;
        const float vr = xr[i], vp = x[i];
        const int32_t orr = cm_logit_order(vr), op = cm_logit_order(vp);
        bad_r |= orr >= ord_pinf || orr < ord_ninf;
        bad_p |= op >= ord_pinf || op < ord_ninf;
        const uint64_t kr = cm_rank_key(vr, i), kp = cm_rank_key(vp, i);
        br = kr > br ? kr : br;
        bp = kp > bp ? kp : bp;
    }
    br = block_allreduce(br, op_max());
    bp = block_allreduce(bp, op_max());
    bad_r = block_allreduce(bad_r, op_max());
    bad_p = block_allreduce(bad_p, op_max());
    if (threadIdx.x == 0) {
        samp_tile *t = tiles + (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
        t->best_r = br;
        t->best_p = bp;
        t->bad_r = bad_r;
        t->bad_p = bad_p;
    }
}

// Kept mass of a tile in ascending index order: thread j's tokens in order
// (chunk[j]), each warp's 32 chunks in order (lane 0: warp[w]), the warps in
// order (the return value, every thread). *last: the tile's last kept token.
// The tile CTA and the finishing walk call it alike, so they see the same sums.
RD_DEV double tile_kept(const float *x, int32_t vocab, int32_t tile, const kept_rule &rule, double *chunk,
                        double *warp, int32_t *last)
{
    const int32_t tid = threadIdx.x, i0 = tile_first(tile);
    double cs = 0.0;
    int32_t lk = -1;
    for (int32_t k = 0; k < SAMP_PER && i0 + k < vocab; k++) {
        float w;
        if (rule_keeps(rule, x[i0 + k], i0 + k, &w)) {
            cs += (double)w;
            lk = i0 + k;
        }
    }
    chunk[tid] = cs;
    *last = block_allreduce(lk, op_max()); // its barriers also publish chunk[]
    if (tid % 32 == 0) {
        double ws = 0.0;
        for (int32_t l = 0; l < 32; l++)
            ws += chunk[tid + l];
        warp[tid / 32] = ws;
    }
    __syncthreads();
    double t = 0.0;
    for (int32_t w = 0; w < SAMP_TT / 32; w++)
        t += warp[w];
    __syncthreads(); // chunk[] and warp[] stay as they are until every thread has read them
    return t;
}

// The draw without a cut, by thread 0 of the finishing CTA: the tile where
// the running kept mass first passes target (the last one if rounding leaves
// every tile short), then its warps, chunks and tokens the same way (tile_kept's
// sums, computed again by the whole CTA). -1 when rounding leaves the tile short.
RD_DEV int32_t walk_tiles(const float *x, int32_t vocab, const samp_tile *tr, int32_t T, const kept_rule &rule,
                          double target, double *chunk, double *warp)
{
    __shared__ int32_t tile_s;
    __shared__ double cum_s;
    if (threadIdx.x == 0) {
        double cum = 0.0;
        int32_t c = 0;
        while (c < T - 1 && !(cum + __ldcg(&tr[c].kept) > target))
            cum += __ldcg(&tr[c++].kept);
        tile_s = c;
        cum_s = cum;
    }
    __syncthreads();
    const int32_t c = tile_s;
    int32_t last;
    tile_kept(x, vocab, c, rule, chunk, warp, &last);
    int32_t found = -1;
    if (threadIdx.x == 0) {
        double cum = cum_s;
        int32_t w = 0;
        while (w < SAMP_TT / 32 - 1 && !(cum + warp[w] > target))
            cum += warp[w++];
        int32_t j = w * 32;
        while (j < w * 32 + 31 && !(cum + chunk[j] > target))
            cum += chunk[j++];
        const int32_t end = (c + 1) * SAMP_TILE < vocab ? (c + 1) * SAMP_TILE : vocab;
        for (int32_t i = c * SAMP_TILE + j * SAMP_PER; i < end && found < 0; i++) {
            float wt;
            if (rule_keeps(rule, x[i], i, &wt)) {
                cum += (double)wt;
                if (cum > target)
                    found = i;
            }
        }
    }
    return found;
}

RD_DEV void write_draw(sample_res *out, int32_t tok, float lp_proc, const float *xr, float m_raw, float log_s)
{
    out->token = tok;
    out->err = 0;
    out->logprob = RD_FSUB(RD_FSUB(xr[tok], m_raw), log_s);
    out->logprob_proc = lp_proc;
}

// A draw at temperature > 0 (or a processed score) from rule's kept set, its
// mass from the tiles' kept masses in tile order; the whole CTA calls it.
RD_DEV void finish_kept(const sample_req &q, int32_t vocab, const float *xr, const float *x, const samp_tile *tr,
                        int32_t T, const kept_rule &rule, float m_raw, float log_s, double *chunk, double *warp,
                        sample_res *out)
{
    double z_kept = 0.0;
    int32_t last = -1;
    for (int32_t c = 0; c < T; c++) {
        z_kept += __ldcg(&tr[c].kept);
        const int32_t lk = __ldcg(&tr[c].last_kept);
        last = lk > last ? lk : last;
    }
    const double t = (double)rule.t;
    if (q.score_token >= 0) {
        const int32_t tok = q.score_token;
        float wt;
        const float lp = rule_keeps(rule, x[tok], tok, &wt)
                             ? (float)(((double)x[tok] - (double)rule.m) / t - log(z_kept))
                             : -INFINITY;
        if (threadIdx.x == 0)
            write_draw(out, tok, lp, xr, m_raw, log_s);
        return;
    }
    const double u = cm_uniform((uint64_t)q.seed_hi << 32 | q.seed_lo, q.sample_idx, q.pos);
    const int32_t found = walk_tiles(x, vocab, tr, T, rule, u * z_kept, chunk, warp);
    if (threadIdx.x == 0) {
        const int32_t tok = found >= 0 ? found : last;
        // In double, as the CPU takes it: (x - m) / t rounded to fp32 alone is ~1 ulp of the result off.
        write_draw(out, tok, (float)(((double)x[tok] - (double)rule.m) / t - log(z_kept)), xr, m_raw, log_s);
    }
}

// A tile's sums, then (the request's last CTA) the request's results. tops:
// each tile's max_top largest finite raw keys, descending, 0 past the end.
__global__ void __launch_bounds__(SAMP_TT) k_samp_tiles(const float *logits, const float *proc, int32_t vocab,
                                                        const sample_req *reqs, samp_tile *tiles, uint64_t *tops,
                                                        int32_t max_top, unsigned *counts, samp_cut *cuts,
                                                        sample_res *res)
{
    RD_PDL_ENTRY();
    const sample_req &q = reqs[blockIdx.x];
    const int32_t T = gridDim.y, tile = blockIdx.y, tid = threadIdx.x;
    samp_tile *tr = tiles + (int64_t)blockIdx.x * T;
    const float *xr = logits + (int64_t)q.row * vocab;
    const float *x = q.proc_row < 0 ? xr : proc + (int64_t)q.proc_row * vocab;
    const samp_row w = row_from_tiles(tr, T, xr, x);
    const float t = q.temperature;
    const bool score = q.score_token >= 0;
    // A draw (or a processed score) over the whole kept set: no cut.
    const bool kept_mass = !w.err && t != 0.0f && (!score || q.score_proc) && !sample_has_cut(q, vocab);
    const kept_rule rule = {0, q.min_p, w.m, t};
    __shared__ double chunk[SAMP_TT], warp[SAMP_TT / 32];
    if (!w.err) {
        const int32_t i0 = tile_first(tile);
        double s = 0.0;
        int32_t rank = 0;
        const float xt = score ? xr[q.score_token] : 0.0f;
        for (int32_t k = 0; k < SAMP_PER && i0 + k < vocab; k++) {
            const float v = xr[i0 + k];
            s += (double)cm_exp_nonpos(RD_FSUB(v, w.m_raw));
            rank += score && v >= xt;
        }
        s = block_allreduce(s, op_add());
        rank = block_allreduce(rank, op_add());
        uint64_t *top = tops + ((int64_t)blockIdx.x * T + tile) * max_top;
        uint64_t prev = ~(uint64_t)0;
        for (int32_t j = 0; j < q.n_top && j < max_top; j++) {
            uint64_t bk = 0;
            for (int32_t k = 0; k < SAMP_PER && i0 + k < vocab; k++) {
                const float v = xr[i0 + k];
                const uint64_t key = cm_rank_key(v, i0 + k);
                if (finite_logit(v) && key < prev && key > bk)
                    bk = key;
            }
            bk = block_allreduce(bk, op_max());
            if (tid == 0)
                top[j] = bk;
            prev = bk;
        }
        double kept = 0.0;
        int32_t last = -1;
        if (kept_mass)
            kept = tile_kept(x, vocab, tile, rule, chunk, warp, &last);
        if (tid == 0) {
            tr[tile].s_raw = s;
            tr[tile].rank = rank;
            tr[tile].kept = kept;
            tr[tile].last_kept = last;
        }
    }
    if (!last_to_arrive(&counts[blockIdx.x], (unsigned)T))
        return;

    // The request's results, from the tiles in tile order.
    sample_res *out = res + blockIdx.x;
    if (w.err) {
        if (tid == 0) {
            out->token = -1;
            out->err = w.err;
            out->n_top = 0;
            if (q.cut_slot >= 0)
                cuts[blockIdx.x].phase = 3; // no search, no draw
        }
        return;
    }
    const float log_s = (float)log(s_raw_from_tiles(tr, T));
    for (int32_t j = tid; j < q.n_want && j < 32; j += SAMP_TT)
        out->want_lp[j] = RD_FSUB(RD_FSUB(xr[q.want_ids[j]], w.m_raw), log_s);
    // alternatives: the largest keys among the tiles' lists (each tile's n_top of max_top slots)
    const uint64_t *row_tops = tops + (int64_t)blockIdx.x * T * max_top;
    const int32_t n_top = q.n_top < max_top ? q.n_top : max_top;
    const int32_t n_alt =
        n_top > 0 ? alternatives([&](int32_t c) { return __ldcg(&row_tops[(c / n_top) * max_top + c % n_top]); },
                                 T * n_top, n_top, xr, w.m_raw, log_s, out)
                  : 0;
    int32_t rank = 0;
    for (int32_t c = 0; score && c < T; c++)
        rank += __ldcg(&tr[c].rank);
    if (tid == 0) {
        out->n_top = n_alt;
        out->rank = rank;
    }
    if (sample_has_cut(q, vocab)) {
        // the key search starts (k_samp_cut), the draw after it (k_samp_draw)
        if (tid == 0) {
            samp_cut c = {};
            c.phase = q.top_k > 0 && q.top_k < vocab ? 0 : 1;
            c.shift = 56;
            c.target = -1.0;
            c.m = w.m, c.m_raw = w.m_raw, c.log_s = log_s;
            cuts[blockIdx.x] = c;
        }
        return;
    }
    if (score && !q.score_proc) {
        if (tid == 0)
            write_draw(out, q.score_token, NAN, xr, w.m_raw, log_s);
    } else if (t == 0.0f) {
        const int32_t tok = score ? q.score_token : w.amax;
        if (tid == 0)
            write_draw(out, tok, tok == w.amax ? 0.0f : -INFINITY, xr, w.m_raw, log_s);
    } else {
        finish_kept(q, vocab, xr, x, tr, T, rule, w.m_raw, log_s, chunk, warp, out);
    }
}

// ------------------------------------------------------- draws with a cut

// One round of the key search of every draw with a cut (sample_has_cut):
// each tile's histogram of the keys still in range by this round's digit
// (count, largest key, and the weights' mass in index order: each lane sums
// its bins over its warp's tokens in order, then the warps in order), then
// the request's last CTA folds the tiles in tile order and walks the bins
// from the top: the digit whose bin holds the k-th largest key (top-k) or the
// key where the running mass reaches the target (top-p). A bin holding one
// key ends the search early; a later round finds the request done.
__global__ void __launch_bounds__(SAMP_TT) k_samp_cut(const float *logits, const float *proc, int32_t vocab,
                                                      const sample_req *reqs, samp_cut *cuts, samp_bin *bins,
                                                      unsigned *counts)
{
    RD_PDL_ENTRY();
    const sample_req &q = reqs[blockIdx.x];
    if (q.cut_slot < 0)
        return;
    samp_cut c = cuts[blockIdx.x];
    if (c.phase >= 2)
        return;
    const int32_t T = gridDim.y, tile = blockIdx.y, tid = threadIdx.x, lane = tid % 32, wp = tid / 32;
    const float *xr = logits + (int64_t)q.row * vocab;
    const float *x = q.proc_row < 0 ? xr : proc + (int64_t)q.proc_row * vocab;
    const uint64_t hi_mask = c.shift >= 56 ? 0 : ~(uint64_t)0 << (c.shift + 8); // the bits found so far
    __shared__ int32_t wbin[SAMP_TT / 32][32 * SAMP_PER];
    __shared__ float wgt[SAMP_TT / 32][32 * SAMP_PER];
    __shared__ double wmass[SAMP_TT / 32][256];
    __shared__ int32_t cnt[256];
    __shared__ unsigned long long maxk[256];
    cnt[tid] = 0;
    maxk[tid] = 0;
    for (int32_t w = 0; w < SAMP_TT / 32; w++)
        wmass[w][tid] = 0.0;
    __syncthreads();
    const int32_t i0 = tile_first(tile);
    for (int32_t k = 0; k < SAMP_PER; k++) {
        const int32_t i = i0 + k;
        int32_t b = -1;
        float wt = 0.0f;
        if (i < vocab && finite_logit(x[i])) {
            const uint64_t key = cm_rank_key(x[i], i);
            if (key >= c.floor && (key & hi_mask) == (c.prefix & hi_mask)) {
                b = (int32_t)(key >> c.shift) & 255;
                wt = cm_scaled_weight(x[i], c.m, q.temperature);
                atomicAdd(&cnt[b], 1);
                atomicMax(&maxk[b], (unsigned long long)key);
            }
        }
        wbin[wp][lane * SAMP_PER + k] = b; // the warp's tokens in index order
        wgt[wp][lane * SAMP_PER + k] = wt;
    }
    __syncwarp();
    for (int32_t j = 0; j < 32 * SAMP_PER; j++) { // lane l owns bins l, l + 32, ...
        const int32_t b = wbin[wp][j];
        if (b >= 0 && (b & 31) == lane)
            wmass[wp][b] += (double)wgt[wp][j];
    }
    __syncthreads();
    samp_bin tb;
    tb.mass = 0.0;
    for (int32_t w = 0; w < SAMP_TT / 32; w++)
        tb.mass += wmass[w][tid];
    tb.cnt = cnt[tid];
    tb.pad = 0;
    tb.max_key = maxk[tid];
    samp_bin *rb = bins + (int64_t)q.cut_slot * T * 256;
    rb[(int64_t)tile * 256 + tid] = tb;
    if (!last_to_arrive(&counts[blockIdx.x], (unsigned)T))
        return;

    // The row's bins, then the walk (thread 0).
    __shared__ double mass_s[256];
    double m = 0.0;
    int32_t n = 0;
    uint64_t mk = 0;
    for (int32_t t = 0; t < T; t++) {
        const samp_bin *p = &rb[(int64_t)t * 256 + tid];
        m += __ldcg(&p->mass);
        n += __ldcg(&p->cnt);
        const uint64_t k = __ldcg(&p->max_key);
        mk = k > mk ? k : mk;
    }
    mass_s[tid] = m;
    cnt[tid] = n;
    maxk[tid] = mk;
    __syncthreads();
    if (tid != 0)
        return;
    const bool first = c.shift == 56;
    int32_t digit = -1;
    bool no_cut = false; // decided at a first round: the search keeps every key (prefix 0)
    if (c.phase == 0) {
        int64_t total = 0;
        for (int32_t b = 0; b < 256; b++)
            total += cnt[b];
        if (first && total <= q.top_k) {
            no_cut = true; // k or fewer finite tokens
        } else {
            for (int32_t b = 255; b >= 0 && digit < 0; b--) {
                if (c.above_cnt + cnt[b] >= q.top_k)
                    digit = b;
                else
                    c.above_cnt += cnt[b];
            }
        }
    } else {
        if (c.target < 0.0) {
            double z = 0.0;
            for (int32_t b = 0; b < 256; b++)
                z += mass_s[b];
            c.target = (double)q.top_p * z;
        }
        const double base = c.above_mass;
        for (int32_t b = 255; b >= 0 && digit < 0; b--) {
            if (c.above_mass + mass_s[b] >= c.target)
                digit = b;
            else
                c.above_mass += mass_s[b];
        }
        if (digit < 0 && first) {
            no_cut = true; // rounding leaves every key short
        } else if (digit < 0) {
            // The range falls short by rounding: its smallest keys, the mass above them as the walk had it.
            for (int32_t b = 0; digit < 0 && b < 256; b++)
                digit = cnt[b] > 0 ? b : -1;
            c.above_mass = base;
            for (int32_t b = 255; b > digit; b--)
                c.above_mass += mass_s[b];
        }
    }
    bool found = no_cut; // prefix 0
    if (digit >= 0) {
        c.prefix |= (uint64_t)digit << c.shift;
        if (cnt[digit] == 1) {
            c.prefix = maxk[digit];
            found = true;
        } else {
            found = c.shift == 0;
        }
        c.shift -= 8;
    }
    if (found) {
        if (c.phase == 0) {
            c.k_cut = c.prefix;
            c.floor = c.prefix;
            c.phase = q.top_p < 1.0f ? 1 : 2;
        } else {
            c.k_cut = c.prefix > c.k_cut ? c.prefix : c.k_cut;
            c.phase = 2;
        }
        c.prefix = 0;
        c.shift = 56;
        c.above_cnt = 0;
        c.above_mass = 0.0;
    }
    cuts[blockIdx.x] = c;
}

// The draw of every request with a cut, from its kept set (rule: keys >=
// k_cut, w >= min_p): the tiles' kept masses, then the last CTA's walk.
__global__ void __launch_bounds__(SAMP_TT) k_samp_draw(const float *logits, const float *proc, int32_t vocab,
                                                       const sample_req *reqs, samp_tile *tiles,
                                                       const samp_cut *cuts, unsigned *counts, sample_res *res)
{
    RD_PDL_ENTRY();
    const sample_req &q = reqs[blockIdx.x];
    if (q.cut_slot < 0)
        return;
    const samp_cut c = cuts[blockIdx.x];
    if (c.phase != 2)
        return; // a rejected row: k_samp_tiles wrote it
    const int32_t T = gridDim.y, tile = blockIdx.y;
    samp_tile *tr = tiles + (int64_t)blockIdx.x * T;
    const float *xr = logits + (int64_t)q.row * vocab;
    const float *x = q.proc_row < 0 ? xr : proc + (int64_t)q.proc_row * vocab;
    const kept_rule rule = {c.k_cut, q.min_p, c.m, q.temperature};
    __shared__ double chunk[SAMP_TT], warp[SAMP_TT / 32];
    int32_t last;
    const double kept = tile_kept(x, vocab, tile, rule, chunk, warp, &last);
    if (threadIdx.x == 0) {
        tr[tile].kept = kept;
        tr[tile].last_kept = last;
    }
    if (!last_to_arrive(&counts[blockIdx.x], (unsigned)T))
        return;
    finish_kept(q, vocab, xr, x, tr, T, rule, c.m_raw, c.log_s, chunk, warp, res + blockIdx.x);
}

// Edited rows: a CTA per (request, span of the vocab). Each copies its span
// of the raw row, then applies the request's edits that fall in the span;
// the barrier between keeps the copy from overwriting an edit. Every CTA
// reads the whole edit list: lists are short next to the vocab.
#define EDIT_SPAN 8192
#define EDIT_THREADS 256

__global__ void __launch_bounds__(EDIT_THREADS) k_edit_rows(const float *logits, int32_t vocab,
                                                            const sample_req *reqs, const sample_edit *edits,
                                                            float *proc)
{
    RD_PDL_ENTRY();
    const sample_req q = reqs[blockIdx.x];
    if (q.proc_row < 0)
        return; // the whole CTA: no barrier is left waiting
    const float *xr = logits + (int64_t)q.row * vocab;
    float *xp = proc + (int64_t)q.proc_row * vocab;
    const int32_t i0 = (int32_t)blockIdx.y * EDIT_SPAN;
    const int32_t i1 = vocab - i0 < EDIT_SPAN ? vocab : i0 + EDIT_SPAN;
    for (int32_t i = i0 + threadIdx.x; i < i1; i += EDIT_THREADS)
        xp[i] = xr[i];
    __syncthreads();
    for (int32_t j = threadIdx.x; j < q.n_edits; j += EDIT_THREADS) {
        const sample_edit e = edits[q.edit_off + j];
        if (e.token >= i0 && e.token < i1)
            xp[e.token] = cm_edit_logit(xr[e.token], e.bias, e.mask, e.seen, e.n_out, q.rep, q.freq, q.pres);
    }
}

void launch_edit_rows(cudaStream_t s, const float *logits, int32_t vocab, const sample_req *reqs, int32_t n,
                      const sample_edit *edits, float *proc)
{
    if (n > 0 && vocab > 0)
        RD_LAUNCH(k_edit_rows, dim3(n, (vocab + EDIT_SPAN - 1) / EDIT_SPAN), dim3(EDIT_THREADS), 0, s, logits, vocab,
                  reqs, edits, proc);
}

void launch_sample(cudaStream_t s, const float *logits, const float *proc, int32_t vocab, const sample_req *reqs,
                   int32_t n, sample_res *res)
{
    if (n > 0)
        RD_LAUNCH(k_sample, dim3(n), dim3(ST), 0, s, logits, proc, vocab, reqs, res);
}

void launch_sample_tiled(cudaStream_t s, const float *logits, const float *proc, int32_t vocab,
                         const sample_req *reqs, int32_t n, samp_tile *tiles, uint64_t *tops, int32_t max_top,
                         unsigned *counts, int32_t n_cut, int32_t cut_rounds, samp_cut *cuts, samp_bin *bins,
                         sample_res *res)
{
    if (n <= 0)
        return;
    const dim3 grid(n, samp_tiles(vocab));
    RD_LAUNCH(k_samp_scan, grid, dim3(SAMP_TT), 0, s, logits, proc, vocab, reqs, tiles);
    RD_LAUNCH(k_samp_tiles, grid, dim3(SAMP_TT), 0, s, logits, proc, vocab, reqs, tiles, tops, max_top, counts, cuts,
              res);
    if (n_cut <= 0)
        return;
    for (int32_t r = 0; r < cut_rounds; r++)
        RD_LAUNCH(k_samp_cut, grid, dim3(SAMP_TT), 0, s, logits, proc, vocab, reqs, cuts, bins, counts);
    RD_LAUNCH(k_samp_draw, grid, dim3(SAMP_TT), 0, s, logits, proc, vocab, reqs, tiles, (const samp_cut *)cuts,
              counts, res);
}

}  // namespace RD_NS
