/*
 * sampler/full: a contiguous span of the window (METHODS.md 2.1).
 *
 *   row    tokens x[o .. o + L - 1] of the window x, L = row_len
 *   pos    the original positions o .. o + L - 1 (floats)
 *   target x[p + 1] for every token (the true next token), loss mask 1 everywhere
 *
 * With row_len == window_len (domain adaptation at Lt, or the "full" baseline at Le) the span is
 * the whole window, o = 0. When row_len < window_len the option `span` decides (ours):
 *   "start"  (default) o = 0: the first row_len tokens, positions 0 .. L-1 exactly as METHODS 2.1
 *            states; consumes no random numbers.
 *   "random" o uniform in [0, window_len - row_len]: uses the whole window over epochs, but the
 *            positions then reach window_len - 1, i.e. it also trains positions beyond row_len.
 */
#include <ctx/plugin.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct full_sampler {
    int32_t random_span; /* 0: "start", 1: "random" */
} full_sampler;

static ctx_status full_create(const ctx_host_api* host, const ctx_options* options,
                              void** instance, ctx_err* err) {
    const char* span;
    full_sampler* f;
    if (!host || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, opt_string) || !host->opt_string)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    *instance = NULL;
    span = host->opt_string(host->host, options, "span", "start");
    if (!span || (strcmp(span, "start") != 0 && strcmp(span, "random") != 0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'span' must be \"start\" or \"random\", got \"%s\"",
                         span ? span : "(null)");
    f = (full_sampler*)calloc(1, sizeof *f);
    if (!f) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    f->random_span = strcmp(span, "random") == 0;
    *instance = f;
    return CTX_OK;
}

static void full_destroy(void* instance) { free(instance); }

static ctx_status full_sample(void* instance, const int32_t* window, int64_t window_len,
                              uint64_t rng_state[4], ctx_sample_row* row, ctx_err* err) {
    const full_sampler* f = (const full_sampler*)instance;
    int64_t L, o = 0, r;
    if (!f || !window || !row || !rng_state)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "sample: NULL argument");
    L = row->row_len;
    if (L <= 0 || L > window_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "row_len %lld must be in [1, window_len = %lld]", (long long)L,
                         (long long)window_len);
    if (f->random_span && L < window_len)
        o = (int64_t)ctx_rng_below(rng_state, (uint64_t)(window_len - L + 1));
    for (r = 0; r < L; ++r) {
        const int64_t p = o + r;
        row->tokens[r] = window[p];
        if (row->source) row->source[r] = p;
        row->positions[r] = (float)p;
        row->targets[r] = window[p + 1]; /* p + 1 <= window_len: the window has one more token */
        row->loss_mask[r] = 1.0f;
    }
    return CTX_OK;
}

static const ctx_option_desc full_options[] = {
    {"span", CTX_OPT_STRING, "start",
     "when row_len < window_len: \"start\" takes the first row_len tokens (positions 0..L-1), "
     "\"random\" a uniformly placed contiguous span with its original positions"},
};

static const ctx_sampler_vtable full_vtable = {
    sizeof(ctx_sampler_vtable),
    full_create,
    full_destroy,
    full_sample,
};

static const ctx_plugin_descriptor full_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_SAMPLER,
    "full",
    "1.0.0",
    "contiguous window, original positions, every target the next token (METHODS 2.1)",
    full_options,
    (int32_t)(sizeof full_options / sizeof full_options[0]),
    &full_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &full_descriptor; }
