/* lora.c - the CPU backend's LoRA ops; lora.h says how and why. */
#include "kernels/cpu/lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/pool.h"
#include "engine/format/gguf.h"

typedef struct {
    int32_t rank, in, out;
    float scale;
    float *a;                   /* [rank][in] */
    float *b;                   /* [out][rank] */
} cpu_lora;

static int widen(const void *src, int32_t type, size_t n, float *dst)
{
    if (type == GGML_F32) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    const uint16_t *h = src;
    if (type == GGML_F16)
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_f16_to_f32(h[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_bf16_to_f32(h[i]);
    return 0;
}

static int type_ok(int32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16; }

int cpu_lora_load(const rd_lora_w *w, void **handle)
{
    *handle = NULL;
    if (!w || w->rank < 1 || w->rank > RD_LORA_MAX_RANK || w->in <= 0 || w->out <= 0 || !w->a || !w->b ||
        !type_ok(w->a_type) || !type_ok(w->b_type) || !isfinite(w->scale))
        return rd_fail(RD_EINVAL, "cpu: lora_load: rank %d (1..%d), [%d] -> [%d], A %s, B %s: not a LoRA pair",
                       w ? w->rank : 0, RD_LORA_MAX_RANK, w ? w->in : 0, w ? w->out : 0,
                       w ? ggml_type_name(w->a_type) : "?", w ? ggml_type_name(w->b_type) : "?");
    cpu_lora *L = calloc(1, sizeof *L);
    const size_t na = (size_t)w->rank * w->in, nb = (size_t)w->out * w->rank;
    if (L) {
        L->a = malloc(na * sizeof(float));
        L->b = malloc(nb * sizeof(float));
    }
    if (!L || !L->a || !L->b) {
        cpu_lora_free(L);
        return rd_fail(RD_ENOMEM, "cpu: lora_load: out of memory for a rank-%d [%d] -> [%d] pair", w->rank, w->in,
                       w->out);
    }
    L->rank = w->rank;
    L->in = w->in;
    L->out = w->out;
    L->scale = w->scale;
    widen(w->a, w->a_type, na, L->a);
    widen(w->b, w->b_type, nb, L->b);
    *handle = L;
    return 0;
}

void cpu_lora_free(void *handle)
{
    cpu_lora *L = handle;
    if (!L)
        return;
    free(L->a);
    free(L->b);
    free(L);
}

int64_t cpu_lora_bytes(const void *handle)
{
    const cpu_lora *L = handle;
    return L ? ((int64_t)L->rank * L->in + (int64_t)L->out * L->rank) * (int64_t)sizeof(float) : 0;
}

float cpu_lora_dot(const float *w, const float *x, int32_t n)
{
    float p[RD_LORA_LANES] = {0};
    const int32_t chunks = n / RD_LORA_CHUNK, tail = chunks * RD_LORA_CHUNK;
    /* Chunk c is lane c % 32's; each lane meets its chunks in ascending c. */
    for (int32_t c = 0; c < chunks; c++) {
        float *acc = &p[c % RD_LORA_LANES];
        const float *wc = w + (size_t)c * RD_LORA_CHUNK, *xc = x + (size_t)c * RD_LORA_CHUNK;
        for (int32_t t = 0; t < RD_LORA_CHUNK; t++)
            *acc = fmaf(xc[t], wc[t], *acc);
    }
    for (int32_t e = tail; e < n; e++)
        p[(e - tail) % RD_LORA_LANES] = fmaf(x[e], w[e], p[(e - tail) % RD_LORA_LANES]);
    /* The xor butterfly as lane 0 sees it (every lane ends with these bits). */
    for (int32_t o = RD_LORA_LANES / 2; o > 0; o >>= 1)
        for (int32_t l = 0; l < o; l++)
            p[l] = p[l] + p[l + o];
    return p[0];
}

/* One row: y[out_off + j] += s (B (A x))[j]. */
static void lora_row(const cpu_lora *L, const float *x, float *y)
{
    float t[RD_LORA_MAX_RANK];
    for (int32_t k = 0; k < L->rank; k++)
        t[k] = cpu_lora_dot(L->a + (size_t)k * L->in, x, L->in);
    for (int32_t j = 0; j < L->out; j++) {
        const float *bj = L->b + (size_t)j * L->rank;
        float u = 0.0f;
        for (int32_t k = 0; k < L->rank; k++)
            u = fmaf(bj[k], t[k], u);
        y[j] = y[j] + L->scale * u;
    }
}

typedef struct {
    const rd_lora_batch *lb;
    const float *x;
    const int32_t *slots, *order;   /* order NULL: rows in index order */
    int32_t n;                      /* rows in order (or m) */
    float *y;
    int32_t y_stride, out_off;
} lora_job;

#define ROWS_PER_TASK 4

static const cpu_lora *slot_lora(const rd_lora_batch *lb, int32_t a)
{
    if (a < 0 || a >= lb->n_slots)
        return NULL;
    const cpu_lora *L = lb->w[a];
    /* A handle of another shape is the caller's error; it adds nothing. */
    return L && L->in == lb->in && L->out == lb->out && L->rank <= lb->max_rank ? L : NULL;
}

static void lora_task(void *ctx, int32_t task, int32_t worker)
{
    const lora_job *j = ctx;
    const int32_t r1 = (task + 1) * ROWS_PER_TASK < j->n ? (task + 1) * ROWS_PER_TASK : j->n;
    for (int32_t p = task * ROWS_PER_TASK; p < r1; p++) {
        const int32_t i = j->order ? j->order[p] : p;
        const cpu_lora *L = slot_lora(j->lb, j->slots[i]);
        if (L)
            lora_row(L, j->x + (size_t)i * j->lb->in, j->y + (size_t)i * j->y_stride + j->out_off);
    }
}

void cpu_lora_apply(cpu_lora_scratch *s, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                    float *y, int32_t y_stride, int32_t out_off)
{
    if (m <= 0 || !lb || lb->n_slots <= 0 || lb->n_slots > RD_LORA_MAX_SLOTS || lb->out <= 0 ||
        out_off < 0 || out_off + lb->out > y_stride)
        return;
    lora_job j = {lb, x, slots, NULL, m, y, y_stride, out_off};
    /* Rows grouped by slot (a counting sort; rows without an adapter
     * dropped), so an adapter's A and B stay in cache across its rows. If
     * the scratch cannot grow, rows go in index order: the same bits. */
    if (s->order_cap < (size_t)m) {
        int32_t *o = realloc(s->order, (size_t)m * sizeof(int32_t));
        if (o) {
            s->order = o;
            s->order_cap = (size_t)m;
        }
    }
    if (s->order_cap >= (size_t)m) {
        int32_t count[RD_LORA_MAX_SLOTS + 1] = {0};
        for (int32_t i = 0; i < m; i++)
            if (slot_lora(lb, slots[i]))
                count[slots[i] + 1]++;
        for (int32_t a = 0; a < lb->n_slots; a++)
            count[a + 1] += count[a];
        j.n = count[lb->n_slots];
        for (int32_t i = 0; i < m; i++)
            if (slot_lora(lb, slots[i]))
                s->order[count[slots[i]]++] = i;
        j.order = s->order;
    }
    if (j.n > 0)
        pool_run((j.n + ROWS_PER_TASK - 1) / ROWS_PER_TASK, lora_task, &j);
}

void cpu_lora_scratch_free(cpu_lora_scratch *s)
{
    free(s->order);
    memset(s, 0, sizeof *s);
}
