/*
 * sampler/prefix: prefix-alpha of the segmented-sequences paper (METHODS.md 2.3).
 *
 * With Lt = row_len, Le = window_len, s = alpha*Lt (suffix length) and m = (1-alpha)*Lt = Lt - s
 * (prefix length):
 *   i       uniform over the integers with m < i < Le - s, i.e. {m+1 .. Le-s-1}: Le - Lt - 1
 *           values, so Le >= Lt + 2 is required (otherwise an error naming the lengths);
 *   suffix  the s contiguous tokens x[i .. i+s-1];
 *   prefix  m positions drawn uniformly WITHOUT replacement from [0, i), in increasing order;
 *   row     prefix then suffix, every token with its original (float) position.
 *
 * Loss only on the suffix: a suffix token at position p predicts x[p+1] (the true next token,
 * the window holds Le + 1 tokens) with mask 1. A prefix token at position p gets target x[p+1]
 * (a valid token) with mask 0: it is never trained, so no discontinuity is ever a target.
 *
 * The prefix subset: Floyd's algorithm (exactly m draws, each subset of size m equally likely)
 * marking a byte map of [0, i), then a scan of the map emits the positions in increasing order.
 *
 * Random numbers: one draw for i, then m draws for the prefix, all from the host-owned
 * rng_state (xoshiro256**), uniform integers by rejection (no modulo bias). Nothing else.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct prefix_sampler {
    double alpha;
} prefix_sampler;

static ctx_status prefix_create(const ctx_host_api* host, const ctx_options* options,
                                void** instance, ctx_err* err) {
    double alpha;
    prefix_sampler* p;
    if (!host || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, opt_number) || !host->opt_number)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    *instance = NULL;

    alpha = host->opt_number(host->host, options, "alpha", 0.25);
    if (!(isfinite(alpha) && alpha > 0.0 && alpha <= 1.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'alpha' must be in (0, 1], got %g", alpha);

    p = (prefix_sampler*)calloc(1, sizeof *p);
    if (!p) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    p->alpha = alpha;
    *instance = p;
    return CTX_OK;
}

static void prefix_destroy(void* instance) { free(instance); }

static ctx_status prefix_sample(void* instance, const int32_t* window, int64_t window_len,
                                uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err) {
    const prefix_sampler* ps = (const prefix_sampler*)instance;
    int64_t L, s, m, i, j, p, r;
    double sd;
    unsigned char* mark; /* (i) 1 where a prefix position was drawn */
    if (!ps || !window || !row || !rng_state)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "sample: NULL argument");
    L = row->row_len;
    if (L <= 0 || L > window_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "row_len %lld must be in [1, window_len = %lld]", (long long)L,
                         (long long)window_len);
    sd = ps->alpha * (double)L;
    /* alpha*Lt must be an integer (then (1-alpha)*Lt = Lt - alpha*Lt is one too); the tolerance
     * absorbs decimal inputs such as 0.1. */
    if (fabs(sd - floor(sd + 0.5)) > 1e-9 * (sd > 1.0 ? sd : 1.0) || floor(sd + 0.5) < 1.0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'alpha' = %g: alpha * row_len = %g must be a positive integer "
                         "(suffix length) for row_len %lld", ps->alpha, sd, (long long)L);
    s = (int64_t)floor(sd + 0.5);
    m = L - s;
    /* i in {m+1 .. window_len-s-1}: window_len - L - 1 values. */
    if (window_len - L - 1 < 1)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "no valid suffix start: need (1-alpha)*Lt = %lld < i < Le - alpha*Lt = "
                         "%lld for Lt = row_len = %lld, Le = window_len = %lld (Le >= Lt + 2 "
                         "required)", (long long)m, (long long)(window_len - s), (long long)L,
                         (long long)window_len);
    i = m + 1 + (int64_t)ctx_rng_below(rng_state, (uint64_t)(window_len - L - 1));

    r = 0;
    if (m > 0) {
        mark = (unsigned char*)calloc((size_t)i, 1);
        if (!mark) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
        /* Floyd: a uniform m-subset of {0 .. i-1} with exactly m draws. */
        for (j = i - m; j < i; ++j) {
            const int64_t t = (int64_t)ctx_rng_below(rng_state, (uint64_t)(j + 1));
            if (mark[t]) mark[j] = 1; /* j is new: every earlier pick is < j */
            else mark[t] = 1;
        }
        for (p = 0; p < i; ++p) {
            if (!mark[p]) continue;
            row->tokens[r] = window[p];
            if (row->source) row->source[r] = p;
            row->positions[r] = (float)p;
            row->targets[r] = window[p + 1]; /* a valid token, never trained */
            row->loss_mask[r] = 0.0f;
            ++r;
        }
        free(mark);
    }
    for (j = 0; j < s; ++j, ++r) {
        p = i + j;
        row->tokens[r] = window[p];
        if (row->source) row->source[r] = p;
        row->positions[r] = (float)p;
        row->targets[r] = window[p + 1]; /* the true next token; p + 1 < window_len */
        row->loss_mask[r] = 1.0f;
    }
    return CTX_OK;
}

static const ctx_option_desc prefix_options[] = {
    {"alpha", CTX_OPT_NUMBER, "0.25",
     "suffix fraction: the last alpha*row_len tokens are contiguous and trained, the first "
     "(1-alpha)*row_len are sampled from before them and untrained; alpha*row_len must be an "
     "integer (paper: 0.25, 0.5)"},
};

static const ctx_sampler_vtable prefix_vtable = {
    .struct_size = sizeof(ctx_sampler_vtable),
    .create = prefix_create,
    .destroy = prefix_destroy,
    .sample = prefix_sample,
};

static const ctx_plugin_descriptor prefix_descriptor = {
    .abi_major = CTX_PLUGIN_ABI_MAJOR,
    .abi_minor = CTX_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ctx_plugin_descriptor),
    .kind = CTX_PLUGIN_SAMPLER,
    .name = "prefix",
    .version = "1.0.0",
    .description = "prefix-alpha: a contiguous trained suffix after a sorted uniform subset of "
                   "earlier tokens, original positions, loss on the suffix only (METHODS 2.3)",
    .options = prefix_options,
    .n_options = (int32_t)(sizeof prefix_options / sizeof prefix_options[0]),
    .vtable = &prefix_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &prefix_descriptor;
}
