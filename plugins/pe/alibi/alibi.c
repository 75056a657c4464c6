/*
 * pe/alibi: attention with linear biases (Press et al.; METHODS.md 1.4).
 *
 * The logit of query i and key j (j <= i) gets -m_h * (p_i - p_j). Slopes for n heads: if n is a
 * power of two, m_h = 2^(-8h/n), h = 1..n (start = 2^(-8/n), m_h = start^h); otherwise, with
 * c = 2^floor(log2 n), the c-head slopes followed by the 2c-head slopes at even indices 0, 2, 4, ...
 * (the first n - c of them): the slopes of the ALiBi reference code and BLOOM. Slopes are fixed
 * (no parameters); extending the context changes nothing.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>


typedef struct alibi {
    int32_t n_head;
    float* slopes; /* (n_head) */
} alibi;

/* METHODS.md 1.4, in double precision. Slope h (1-based) of a power-of-two count c is
 * 2^(-8h/c); entry 2i (0-based) of the 2c-head list is h = 2i + 1, i.e. 2^(-8(2i+1)/(2c)). */
static void alibi_slopes(int32_t n, float* out) {
    int32_t c = 1, h, i;
    while (c * 2 <= n) c *= 2;
    for (h = 1; h <= c; ++h) out[h - 1] = (float)pow(2.0, -8.0 * (double)h / (double)c);
    for (i = 0; i < n - c; ++i)
        out[c + i] = (float)pow(2.0, -8.0 * (double)(2 * i + 1) / (double)(2 * c));
}

static ctx_status alibi_create(const ctx_host_api* host, const ctx_model_info* model,
                               const ctx_options* options, void** instance, ctx_err* err) {
    alibi* a;
    (void)options; /* no options */
    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;
    if (model->n_head <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "n_head must be positive, got %d",
                         (int)model->n_head);
    a = (alibi*)calloc(1, sizeof *a);
    if (!a) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    a->slopes = (float*)malloc(sizeof(float) * (size_t)model->n_head);
    if (!a->slopes) {
        free(a);
        return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    a->n_head = model->n_head;
    alibi_slopes(a->n_head, a->slopes);
    *instance = a;
    return CTX_OK;
}

static void alibi_destroy(void* instance) {
    alibi* a = (alibi*)instance;
    if (!a) return;
    free(a->slopes);
    free(a);
}

static ctx_status alibi_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                                  ctx_err* err) {
    const alibi* a = (const alibi*)instance;
    (void)seq_len;
    if (!a || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_bias_spec, param_b))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_BIAS_LINEAR;
    spec->slopes = a->slopes;
    spec->param_a = -1; /* fixed slopes, not a parameter */
    spec->param_b = -1;
    return CTX_OK;
}

static ctx_status alibi_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                               int64_t new_len, ctx_err* err) {
    (void)host;
    if (!instance) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    return CTX_OK; /* ALiBi extrapolates as is */
}

/* Designated initializers: slots appended in later ABI minors stay NULL without warnings. */
static const ctx_pe_vtable alibi_vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_BIAS,
    .create = alibi_create,
    .destroy = alibi_destroy,
    .bias_spec = alibi_bias_spec,
    .extend = alibi_extend, /* stateless and parameter-free: nothing to save or interpolate */
};

static const ctx_plugin_descriptor alibi_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "alibi",
    "1.0.0",
    "ALiBi (Press et al.): fixed per-head linear bias -m_h * (p_i - p_j), BLOOM slopes for any "
    "head count",
    NULL,
    0,
    &alibi_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &alibi_descriptor; }
