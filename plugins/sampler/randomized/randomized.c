/*
 * sampler/randomized: randomized positions of Giraffe (METHODS.md 2.4).
 *
 *   row     L = row_len contiguous tokens x[o .. o+L-1] of the window
 *   pos     p_0 = 0, p_{t+1} = p_t + g_t with g_t ~ U[eps, 2] (option eps, default 1/16, in
 *           (0, 2)); E[g] = (eps + 2) / 2, so the last position is ~ L on average
 *   target  x[o+t+1], the true next token, loss mask 1 everywhere
 *
 * The offset o, by option `span` (as in sampler/full): "start" (default) o = 0, the window's first
 * row_len tokens, no random number drawn for it; "random" o uniform in [0, window_len - row_len].
 * The positions do not depend on o (they always start at 0).
 *
 * Positions are accumulated in double and stored as floats. They are strictly increasing: if a
 * float rounding would make two neighbours equal (only for gaps far below the float spacing at
 * that position, i.e. a tiny eps at huge positions) the later one is moved to the next float up.
 *
 * Random numbers: (span "random" only) one draw for o, then L - 1 draws for the gaps, each a
 * 53-bit uniform u in [0, 1) from the host-owned rng_state (xoshiro256**), g = eps + (2-eps)*u.
 *
 * This plugin is the training side only. Evaluation-time position policies (Giraffe: fixed gap 1,
 * or gaps U[eps, 1]) belong to the evaluation plugins, which choose their own positions.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct randomized_sampler {
    double eps;
    int32_t random_span; /* 0: "start", 1: "random" */
} randomized_sampler;

static ctx_status randomized_create(const ctx_host_api* host, const ctx_options* options,
                                    void** instance, ctx_err* err) {
    double eps;
    const char* span;
    randomized_sampler* r;
    if (!host || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, opt_string) || !host->opt_number ||
        !host->opt_string)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    *instance = NULL;

    eps = host->opt_number(host->host, options, "eps", 1.0 / 16.0);
    if (!(isfinite(eps) && eps > 0.0 && eps < 2.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'eps' must be in (0, 2), got %g", eps);
    span = host->opt_string(host->host, options, "span", "start");
    if (!span || (strcmp(span, "start") != 0 && strcmp(span, "random") != 0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'span' must be \"start\" or \"random\", got \"%s\"",
                         span ? span : "(null)");

    r = (randomized_sampler*)calloc(1, sizeof *r);
    if (!r) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    r->eps = eps;
    r->random_span = strcmp(span, "random") == 0;
    *instance = r;
    return CTX_OK;
}

static void randomized_destroy(void* instance) { free(instance); }

static ctx_status randomized_sample(void* instance, const int32_t* window, int64_t window_len,
                                    uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err) {
    const randomized_sampler* rs = (const randomized_sampler*)instance;
    int64_t L, o = 0, t;
    double pos = 0.0;
    float prev = 0.0f;
    if (!rs || !window || !row || !rng_state)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "sample: NULL argument");
    L = row->row_len;
    if (L <= 0 || L > window_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "row_len %lld must be in [1, window_len = %lld]", (long long)L,
                         (long long)window_len);
    if (rs->random_span && L < window_len)
        o = (int64_t)ctx_rng_below(rng_state, (uint64_t)(window_len - L + 1));
    for (t = 0; t < L; ++t) {
        const int64_t p = o + t;
        float f;
        if (t > 0) pos += rs->eps + (2.0 - rs->eps) * ctx_rng_unit(rng_state);
        f = (float)pos;
        if (t > 0 && !(f > prev)) f = nextafterf(prev, INFINITY);
        prev = f;
        row->tokens[t] = window[p];
        if (row->source) row->source[t] = p;
        row->positions[t] = f;
        row->targets[t] = window[p + 1]; /* p + 1 <= window_len: the window has one more token */
        row->loss_mask[t] = 1.0f;
    }
    return CTX_OK;
}

static const ctx_option_desc randomized_options[] = {
    {"eps", CTX_OPT_NUMBER, "0.0625",
     "smallest gap: positions are p_0 = 0, p_{t+1} = p_t + U[eps, 2]; must be in (0, 2)"},
    {"span", CTX_OPT_STRING, "start",
     "which tokens when row_len < window_len: \"start\" the first row_len, \"random\" a "
     "uniformly placed contiguous span (positions start at 0 either way)"},
};

static const ctx_sampler_vtable randomized_vtable = {
    .struct_size = sizeof(ctx_sampler_vtable),
    .create = randomized_create,
    .destroy = randomized_destroy,
    .sample = randomized_sample,
};

static const ctx_plugin_descriptor randomized_descriptor = {
    .abi_major = CTX_PLUGIN_ABI_MAJOR,
    .abi_minor = CTX_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ctx_plugin_descriptor),
    .kind = CTX_PLUGIN_SAMPLER,
    .name = "randomized",
    .version = "1.0.0",
    .description = "randomized positions (Giraffe): contiguous tokens, positions with gaps "
                   "U[eps, 2] from 0, every target trained (METHODS 2.4)",
    .options = randomized_options,
    .n_options = (int32_t)(sizeof randomized_options / sizeof randomized_options[0]),
    .vtable = &randomized_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &randomized_descriptor;
}
