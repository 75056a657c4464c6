/*
 * pe/sinusoidal: the fixed sinusoidal encoding of Vaswani et al. (METHODS.md 1.2), added to the
 * token embeddings through the input hook (CTX_INPUT_GENERIC):
 *
 *     PE(p, 2k)   = sin(p / base^(2k/d))
 *     PE(p, 2k+1) = cos(p / base^(2k/d)),     d = d_model, base = 10000 by default
 *
 * for the (float, possibly fractional or non-contiguous) position p of every token. The inverse
 * frequencies base^(-2k/d) are computed once in double, the angles and their sin/cos in double per
 * token, and the sum is rounded to float. With an odd d_model the last dimension (2k = d - 1) gets
 * its sine only, since its cosine partner would be dimension d.
 *
 * There are no parameters, so input_backward is NULL (nothing to differentiate) and extending the
 * context changes nothing. input_forward only reads the instance, so concurrent calls are safe.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>


typedef struct sinusoidal {
    int32_t d_model;
    double base;
    double* inv_freq; /* ((d_model + 1) / 2): base^(-2k/d) */
} sinusoidal;

static ctx_status sinusoidal_create(const ctx_host_api* host, const ctx_model_info* model,
                                    const ctx_options* options, void** instance, ctx_err* err) {
    double base;
    int32_t k, pairs;
    sinusoidal* s;

    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;
    if (model->d_model <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "d_model must be positive, got %d",
                         (int)model->d_model);

    base = host->opt_number(host->host, options, "base", 10000.0);
    if (!(isfinite(base) && base > 0.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'base' must be a finite number > 0, got %g", base);

    s = (sinusoidal*)calloc(1, sizeof *s);
    if (!s) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    pairs = (model->d_model + 1) / 2;
    s->inv_freq = (double*)malloc(sizeof(double) * (size_t)pairs);
    if (!s->inv_freq) {
        free(s);
        return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    s->d_model = model->d_model;
    s->base = base;
    for (k = 0; k < pairs; ++k)
        s->inv_freq[k] = pow(base, -2.0 * (double)k / (double)model->d_model);
    if (model->d_model % 2)
        ctx_host_logf(host, CTX_LOG_INFO,
                 "d_model %d is odd: its last dimension gets the sine term only",
                 (int)model->d_model);
    *instance = s;
    return CTX_OK;
}

static void sinusoidal_destroy(void* instance) {
    sinusoidal* s = (sinusoidal*)instance;
    if (!s) return;
    free(s->inv_freq);
    free(s);
}

static ctx_status sinusoidal_input_spec(void* instance, ctx_input_spec* spec, ctx_err* err) {
    if (!instance || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "input_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_input_spec, table_param))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "input_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_INPUT_GENERIC;
    spec->table_param = -1;
    return CTX_OK;
}

static ctx_status sinusoidal_input_forward(void* instance, const ctx_tensor* params,
                                           int32_t n_params, const float* positions,
                                           int64_t n_tokens, float* x, ctx_err* err) {
    const sinusoidal* s = (const sinusoidal*)instance;
    int64_t n;
    int32_t k;
    (void)params;
    (void)n_params; /* no parameters */
    if (!s) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "input_forward: NULL instance");
    if (n_tokens < 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "input_forward: n_tokens %lld < 0",
                         (long long)n_tokens);
    if (n_tokens > 0 && (!positions || !x))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "input_forward: NULL positions or x");
    for (n = 0; n < n_tokens; ++n) {
        const double p = (double)positions[n];
        float* row = x + n * (int64_t)s->d_model;
        if (!isfinite(p))
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "input_forward: position %g of token %lld is not finite", p,
                             (long long)n);
        for (k = 0; 2 * k < s->d_model; ++k) {
            const double a = p * s->inv_freq[k];
            row[2 * k] = (float)((double)row[2 * k] + sin(a));
            if (2 * k + 1 < s->d_model) row[2 * k + 1] = (float)((double)row[2 * k + 1] + cos(a));
        }
    }
    return CTX_OK;
}

static ctx_status sinusoidal_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                                    int64_t new_len, ctx_err* err) {
    if (!instance) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend %lld -> %lld: the sinusoidal encoding is unchanged (defined at every "
             "position)",
             (long long)old_len, (long long)new_len);
    return CTX_OK;
}

static const ctx_option_desc sinusoidal_options[] = {
    {"base", CTX_OPT_NUMBER, "10000",
     "wavelength base: PE(p, 2k) = sin(p / base^(2k/d)), PE(p, 2k+1) = cos(...); > 0"},
};

/* Designated initializers: slots not named here (and slots appended in later ABI minors) are
 * NULL. */
static const ctx_pe_vtable sinusoidal_vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_INPUT,
    .create = sinusoidal_create,
    .destroy = sinusoidal_destroy,
    .input_spec = sinusoidal_input_spec,
    .input_forward = sinusoidal_input_forward,
    .extend = sinusoidal_extend,
};

static const ctx_plugin_descriptor sinusoidal_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "sinusoidal",
    "1.0.0",
    "Fixed sinusoidal position encoding (Vaswani et al.) added to the token embeddings at float "
    "positions",
    sinusoidal_options,
    (int32_t)(sizeof sinusoidal_options / sizeof sinusoidal_options[0]),
    &sinusoidal_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &sinusoidal_descriptor;
}
