/*
 * sampler/chunk: chunk-alpha of the segmented-sequences paper (METHODS.md 2.2).
 *
 * k = 1/alpha contiguous, non-overlapping segments of s = alpha*L tokens each (L = row_len) are
 * placed in the window of W = window_len tokens, uniformly over all valid placements, kept in
 * their original order and concatenated: row = x[a_0 .. a_0+s-1] x[a_1 .. a_1+s-1] ...
 * Positions are the original ones (floats).
 *
 * Uniform placement (stars and bars). Placements are start sequences with a_0 >= 0,
 * a_{i+1} >= a_i + s, a_{k-1} + s <= W. With free = W - k*s, v_i = a_i - i*s is a non-decreasing
 * sequence in [0, free] (a multiset of size k), and u_i = v_i + i is a strictly increasing one,
 * i.e. a k-subset of {0 .. free + k - 1}. That map is a bijection, so drawing a uniform k-subset
 * (Floyd's algorithm) and setting a_i = u_i + i*(s - 1) is uniform over placements. (Sorting k
 * independent uniform draws from [0, free] is NOT: it favours multisets with distinct values,
 * e.g. k = 2, free = 1 gives {0,1} probability 1/2 instead of 1/3.)
 *
 * Targets: inside a segment, the next original token x[p+1], mask 1. At the last token of a
 * segment that is not the row's last, by option `boundary`:
 *   "concat" (default, the paper's plain causal objective on the concatenation): the first token
 *            of the next segment, mask 1;
 *   "next"   (ours): x[p+1], the true next token of the document, mask 1;
 *   "mask"   (ours): x[p+1] with mask 0 (no loss on the discontinuity).
 * The row's last token always predicts x[p+1] with mask 1.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


enum { BOUNDARY_CONCAT = 0, BOUNDARY_NEXT = 1, BOUNDARY_MASK = 2 };

typedef struct chunk_sampler {
    double alpha;
    int64_t k; /* 1/alpha segments */
    int32_t boundary;
} chunk_sampler;

static ctx_status chunk_create(const ctx_host_api* host, const ctx_options* options,
                               void** instance, ctx_err* err) {
    double alpha, inv;
    const char* boundary;
    int32_t b;
    chunk_sampler* c;
    if (!host || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, opt_string) || !host->opt_number ||
        !host->opt_string)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    *instance = NULL;

    alpha = host->opt_number(host->host, options, "alpha", 0.25);
    if (!(isfinite(alpha) && alpha > 0.0 && alpha <= 1.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'alpha' must be in (0, 1], got %g", alpha);
    inv = 1.0 / alpha;
    /* 1/alpha must be an integer; the tolerance absorbs decimal inputs such as 0.1 or 1/3. */
    if (fabs(inv - floor(inv + 0.5)) > 1e-9 * inv)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'alpha' = %g: 1/alpha = %.10g must be an integer (the number "
                         "of segments)", alpha, inv);

    boundary = host->opt_string(host->host, options, "boundary", "concat");
    if (boundary && strcmp(boundary, "concat") == 0)
        b = BOUNDARY_CONCAT;
    else if (boundary && strcmp(boundary, "next") == 0)
        b = BOUNDARY_NEXT;
    else if (boundary && strcmp(boundary, "mask") == 0)
        b = BOUNDARY_MASK;
    else
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'boundary' must be \"concat\", \"next\" or \"mask\", got \"%s\"",
                         boundary ? boundary : "(null)");

    c = (chunk_sampler*)calloc(1, sizeof *c);
    if (!c) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    c->alpha = alpha;
    c->k = (int64_t)floor(inv + 0.5);
    c->boundary = b;
    *instance = c;
    return CTX_OK;
}

static void chunk_destroy(void* instance) { free(instance); }

static ctx_status chunk_sample(void* instance, const int32_t* window, int64_t window_len,
                               uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err) {
    const chunk_sampler* c = (const chunk_sampler*)instance;
    int64_t L, k, s, n_pick, i, o;
    int64_t* u; /* (k) the sorted k-subset, then the segment starts */
    if (!c || !window || !row || !rng_state)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "sample: NULL argument");
    L = row->row_len;
    k = c->k;
    if (L <= 0 || L > window_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "row_len %lld must be in [1, window_len = %lld]", (long long)L,
                         (long long)window_len);
    if (L % k != 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'alpha' = %g: alpha * row_len = %g must be an integer (segment "
                         "length) for row_len %lld", c->alpha, c->alpha * (double)L, (long long)L);
    s = L / k;
    n_pick = window_len - L + k; /* free + k */

    u = (int64_t*)malloc(sizeof(int64_t) * (size_t)k);
    if (!u) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    ctx_rng_sorted_subset(rng_state, n_pick, k, u); /* a uniform k-subset of {0 .. n_pick-1} */
    for (i = 0; i < k; ++i) u[i] += i * (s - 1);

    for (i = 0; i < k; ++i) {
        for (o = 0; o < s; ++o) {
            const int64_t r = i * s + o, p = u[i] + o;
            row->tokens[r] = window[p];
            if (row->source) row->source[r] = p;
            row->positions[r] = (float)p;
            row->targets[r] = window[p + 1];
            row->loss_mask[r] = 1.0f;
            if (o == s - 1 && i + 1 < k) { /* a segment boundary inside the row */
                if (c->boundary == BOUNDARY_CONCAT)
                    row->targets[r] = window[u[i + 1]];
                else if (c->boundary == BOUNDARY_MASK)
                    row->loss_mask[r] = 0.0f;
            }
        }
    }
    free(u);
    return CTX_OK;
}

static const ctx_option_desc chunk_options[] = {
    {"alpha", CTX_OPT_NUMBER, "0.25",
     "segment fraction: 1/alpha segments of alpha*row_len tokens; 1/alpha and alpha*row_len "
     "must be integers (paper: 0.125, 0.25, 0.5)"},
    {"boundary", CTX_OPT_STRING, "concat",
     "target at a segment's last token: \"concat\" the next segment's first token (paper), "
     "\"next\" the true next token, \"mask\" no loss"},
};

static const ctx_sampler_vtable chunk_vtable = {
    sizeof(ctx_sampler_vtable),
    chunk_create,
    chunk_destroy,
    chunk_sample,
};

static const ctx_plugin_descriptor chunk_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_SAMPLER,
    "chunk",
    "1.0.0",
    "chunk-alpha: 1/alpha uniformly placed segments, concatenated, original positions (METHODS "
    "2.2)",
    chunk_options,
    (int32_t)(sizeof chunk_options / sizeof chunk_options[0]),
    &chunk_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &chunk_descriptor; }
