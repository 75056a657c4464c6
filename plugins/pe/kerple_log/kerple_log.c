/*
 * pe/kerple_log: KERPLE with the logarithmic kernel (Chi et al. 2022; METHODS.md 1.5; the
 * reference is chijames/KERPLE and gpt-neox's ParallelKerpleLog).
 *
 * The logit of query i and key j (j <= i) gets -r1[h] * log(1 + r2[h] * |p_i - p_j|), with
 * per-head learnable r1, r2 > 0 (CTX_BIAS_KERPLE_LOG: the engine evaluates the kernel inside
 * attention on real-valued distances and accumulates the gradients of r1 and r2).
 *
 * Parameters: "r1" (n_head) ~ U(0, 2) and "r2" (n_head) ~ U(0, 1), the reference init, no weight
 * decay. after_update clamps both to >= min_value (1e-2 by default, the reference's eps) after
 * every optimizer step. The reference also clamps right before the first forward; here a draw
 * below min_value (probability 0.5% per head for r1, 1% for r2) keeps its small positive value
 * until the first update, which changes nothing that matters (the kernel stays well defined).
 * The bias is relative (a function of p_i - p_j only): extending the context changes nothing.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OFFSET_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

typedef struct kerple {
    int32_t n_head;
    int32_t r1, r2; /* parameter indices */
    float min_value;
} kerple;

static ctx_status set_error(ctx_err* err, ctx_status status, const char* fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, CTX_ERR_MESSAGE_CAP, fmt, ap);
        va_end(ap);
    }
    return status;
}

static void host_log(const ctx_host_api* host, int32_t level, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    if (!host || !host->log) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    host->log(host->host, level, buf);
}

static int32_t declare(const ctx_host_api* host, const char* name, int32_t n_head, float hi,
                       ctx_err* err) {
    ctx_param_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.name = name;
    d.ndim = 1;
    d.shape[0] = n_head;
    d.shape[1] = d.shape[2] = d.shape[3] = 1;
    d.init = CTX_INIT_UNIFORM;
    d.init_lo = 0.0f;
    d.init_hi = hi;
    d.weight_decay = 0;
    return host->register_param(host->host, &d, err);
}

static ctx_status kerple_create(const ctx_host_api* host, const ctx_model_info* model,
                                const ctx_options* options, void** instance, ctx_err* err) {
    kerple* k;
    double min_value;
    if (!host || !model || !instance)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    *instance = NULL;
    if (model->struct_size < OFFSET_END(ctx_model_info, context_length))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    if (host->struct_size < OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->register_param)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: host API is too old");
    if (model->n_head <= 0)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "n_head must be positive, got %d",
                         (int)model->n_head);
    min_value = host->opt_number(host->host, options, "min_value", 1e-2);
    if (!(min_value > 0.0) || !(min_value < 1.0))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "option min_value must be in (0, 1), got %g", min_value);
    k = (kerple*)calloc(1, sizeof *k);
    if (!k) return set_error(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    k->n_head = model->n_head;
    k->min_value = (float)min_value;
    k->r1 = declare(host, "r1", k->n_head, 2.0f, err);
    k->r2 = k->r1 < 0 ? -1 : declare(host, "r2", k->n_head, 1.0f, err);
    if (k->r1 < 0 || k->r2 < 0) {
        free(k);
        return CTX_ERR_INVALID_ARGUMENT; /* register_param wrote the message */
    }
    *instance = k;
    return CTX_OK;
}

static void kerple_destroy(void* instance) { free(instance); }

static ctx_status kerple_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                                   ctx_err* err) {
    const kerple* k = (const kerple*)instance;
    (void)seq_len;
    if (!k || !spec)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < OFFSET_END(ctx_bias_spec, param_b))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_BIAS_KERPLE_LOG;
    spec->slopes = NULL;
    spec->param_a = k->r1;
    spec->param_b = k->r2;
    return CTX_OK;
}

static ctx_status kerple_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                                int64_t new_len, ctx_err* err) {
    if (!instance) return set_error(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    host_log(host, CTX_LOG_INFO,
             "extend %lld -> %lld: KERPLE is a function of p_i - p_j, nothing to change",
             (long long)old_len, (long long)new_len);
    return CTX_OK;
}

/* Clamps r1, r2 to >= min_value (NaN becomes min_value too). */
static ctx_status kerple_after_update(void* instance, ctx_tensor* params, int32_t n_params,
                                      ctx_err* err) {
    const kerple* k = (const kerple*)instance;
    int32_t which[2], w;
    int64_t h;
    if (!k || !params)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "after_update: NULL instance or params");
    if (n_params <= k->r1 || n_params <= k->r2)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "after_update: expected at least %d parameters, got %d",
                         (int)(k->r2 > k->r1 ? k->r2 : k->r1) + 1, (int)n_params);
    which[0] = k->r1;
    which[1] = k->r2;
    for (w = 0; w < 2; ++w) {
        ctx_tensor* t = &params[which[w]];
        if (t->ndim != 1 || t->shape[0] != k->n_head || !t->data)
            return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                             "after_update: parameter %d must be (%d), got ndim %d shape[0] %lld",
                             (int)which[w], (int)k->n_head, (int)t->ndim, (long long)t->shape[0]);
        for (h = 0; h < k->n_head; ++h)
            if (!(t->data[h] >= k->min_value)) t->data[h] = k->min_value;
    }
    return CTX_OK;
}

static const ctx_pe_vtable kerple_vtable = {
    sizeof(ctx_pe_vtable),
    CTX_PE_HOOK_BIAS,
    kerple_create,
    kerple_destroy,
    NULL, /* init_params: the host draws U(0, 2), U(0, 1) */
    NULL, /* input_spec */
    NULL, /* input_forward */
    NULL, /* input_backward */
    NULL, /* rotary_spec */
    kerple_bias_spec,
    kerple_extend,
    NULL, /* extend_params: shapes never change */
    kerple_after_update,
    NULL, /* save_state: stateless */
    NULL, /* load_state */
    NULL, /* bias_forward: the engine evaluates the family in-kernel */
    NULL, /* bias_backward */
};

static const ctx_option_desc kerple_options[] = {
    {"min_value", CTX_OPT_NUMBER, "0.01",
     "after every update r1 and r2 are clamped to >= min_value (the reference's eps)"},
};

static const ctx_plugin_descriptor kerple_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "kerple_log",
    "1.0.0",
    "KERPLE log kernel (Chi et al.): learnable per-head bias -r1 log(1 + r2 |p_i - p_j|), "
    "r1 ~ U(0,2), r2 ~ U(0,1), clamped to >= min_value after each update",
    kerple_options,
    (int32_t)(sizeof kerple_options / sizeof kerple_options[0]),
    &kerple_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &kerple_descriptor;
}
