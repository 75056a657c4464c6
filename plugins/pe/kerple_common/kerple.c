/*
 * pe/kerple_log and pe/kerple_power: KERPLE (Chi et al. 2022; METHODS.md 1.5; the reference is
 * chijames/KERPLE, and gpt-neox's ParallelKerpleLog for the log kernel). One source, compiled
 * once per plugin: KERPLE_VARIANT_LOG=1 builds pe/kerple_log, KERPLE_VARIANT_POWER=1 builds
 * pe/kerple_power (see plugins/pe/kerple_log/CMakeLists.txt and kerple_power/CMakeLists.txt).
 *
 * Log kernel: the logit of query i and key j (j <= i) gets -r1[h] * log(1 + r2[h] * |p_i - p_j|),
 * with per-head learnable r1, r2 > 0 (CTX_BIAS_KERPLE_LOG).
 * Power kernel: the logit gets -r1[h] * |p_i - p_j|^r2[h] (0 at distance 0), with per-head
 * learnable r1 > 0 and 0 < r2 <= 2 (CTX_BIAS_KERPLE_POWER).
 * In both the engine evaluates the kernel inside attention on real-valued distances and
 * accumulates the gradients of r1 and r2.
 *
 * Parameters: "r1" (n_head) and "r2" (n_head), no weight decay, by default r1 ~ U(0, 2) and
 * r2 ~ U(0, 1) drawn by the host (the reference init).
 * Power only: init = "reference" (default) is that draw; init = "alibi_like": r1 = the ALiBi
 * slopes of METHODS.md 1.4 and r2 = 1, i.e. exactly ALiBi at step 0 (METHODS.md 1.5: ALiBi is the
 * special case r2 = 1 with r1 = m_h); slopes below min_value (the last heads of 8 or more) are
 * raised to min_value, with a warning, so that the clamp below never moves them later.
 * after_update clamps r1 and r2 to >= min_value (1e-2 by default, the reference's eps) after every
 * optimizer step, and for the power kernel also r2 to <= 2. The reference also clamps right before
 * the first forward; here a reference draw below min_value (probability 0.5% per head for r1, 1%
 * for r2) keeps its small positive value until the first update, which changes nothing that
 * matters (the kernel stays well defined).
 * The bias is relative (a function of p_i - p_j only): extending the context changes nothing.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KERPLE_VARIANT_LOG) && defined(KERPLE_VARIANT_POWER)
#error "define exactly one of KERPLE_VARIANT_LOG and KERPLE_VARIANT_POWER"
#elif defined(KERPLE_VARIANT_POWER)
#define KERPLE_POWER 1
#elif defined(KERPLE_VARIANT_LOG)
#define KERPLE_POWER 0
#else
#error "define KERPLE_VARIANT_LOG=1 or KERPLE_VARIANT_POWER=1"
#endif


typedef struct kerple {
    int32_t n_head;
    int32_t r1, r2; /* parameter indices */
    float min_value;
#if KERPLE_POWER
    int32_t alibi_like;
    const ctx_host_api* host; /* for the warning in init_params; lives as long as the instance */
#endif
} kerple;

#if KERPLE_POWER
#define KERPLE_POWER_MAX_R2 2.0f

/* METHODS.md 1.4, in double precision (as plugins/pe/alibi): for c = 2^floor(log2 n), the c-head
 * slopes 2^(-8h/c), h = 1..c, then entries 0, 2, 4, ... of the 2c-head list. */
static void alibi_slopes(int32_t n, float* out) {
    int32_t c = 1, h, i;
    while (c * 2 <= n) c *= 2;
    for (h = 1; h <= c; ++h) out[h - 1] = (float)pow(2.0, -8.0 * (double)h / (double)c);
    for (i = 0; i < n - c; ++i)
        out[c + i] = (float)pow(2.0, -8.0 * (double)(2 * i + 1) / (double)(2 * c));
}
#endif

/* plugin_init: init_params fills the values (power's init = "alibi_like"); else U(0, hi). */
static int32_t declare(const ctx_host_api* host, const char* name, int32_t n_head, float hi,
                       int32_t plugin_init, ctx_err* err) {
    ctx_param_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.name = name;
    d.ndim = 1;
    d.shape[0] = n_head;
    d.shape[1] = d.shape[2] = d.shape[3] = 1;
    d.init = plugin_init ? CTX_INIT_PLUGIN : CTX_INIT_UNIFORM;
    d.init_lo = 0.0f;
    d.init_hi = plugin_init ? 0.0f : hi;
    d.weight_decay = 0;
    return host->register_param(host->host, &d, err);
}

static ctx_status kerple_create(const ctx_host_api* host, const ctx_model_info* model,
                                const ctx_options* options, void** instance, ctx_err* err) {
    kerple* k;
    double min_value;
    int32_t alibi_like = 0;
    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    *instance = NULL;
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->register_param)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: host API is too old");
    if (model->n_head <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "n_head must be positive, got %d",
                         (int)model->n_head);
    min_value = host->opt_number(host->host, options, "min_value", 1e-2);
    if (!(min_value > 0.0) || !(min_value < 1.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option min_value must be in (0, 1), got %g", min_value);
#if KERPLE_POWER
    {
        const char* init = host->opt_string
                               ? host->opt_string(host->host, options, "init", "reference")
                               : "reference";
        if (!init) init = "reference";
        if (strcmp(init, "reference") == 0) {
            alibi_like = 0;
        } else if (strcmp(init, "alibi_like") == 0) {
            alibi_like = 1;
        } else {
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "option init must be \"reference\" or \"alibi_like\", got \"%s\"",
                             init);
        }
    }
#endif
    k = (kerple*)calloc(1, sizeof *k);
    if (!k) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    k->n_head = model->n_head;
    k->min_value = (float)min_value;
#if KERPLE_POWER
    k->alibi_like = alibi_like;
    k->host = host;
#endif
    k->r1 = declare(host, "r1", k->n_head, 2.0f, alibi_like, err);
    k->r2 = k->r1 < 0 ? -1 : declare(host, "r2", k->n_head, 1.0f, alibi_like, err);
    if (k->r1 < 0 || k->r2 < 0) {
        free(k);
        return CTX_ERR_INVALID_ARGUMENT; /* register_param wrote the message */
    }
    *instance = k;
    return CTX_OK;
}

static void kerple_destroy(void* instance) { free(instance); }

#if KERPLE_POWER
static ctx_status check_param(const kerple* k, ctx_tensor* params, int32_t n_params, int32_t i,
                              const char* call, ctx_err* err) {
    if (i >= n_params || !params[i].data || params[i].ndim != 1 || params[i].shape[0] != k->n_head)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "%s: parameter %d must be a (%d) tensor (got %d parameters)", call, (int)i,
                         (int)k->n_head, (int)n_params);
    return CTX_OK;
}

/* init = "alibi_like" only: r1 = ALiBi slopes (raised to min_value), r2 = 1. */
static ctx_status kerple_init_params(void* instance, ctx_tensor* params, int32_t n_params,
                                     ctx_err* err) {
    const kerple* k = (const kerple*)instance;
    int32_t h, raised = 0;
    if (!k || !params)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "init_params: NULL instance or params");
    if (check_param(k, params, n_params, k->r1, "init_params", err) != CTX_OK ||
        check_param(k, params, n_params, k->r2, "init_params", err) != CTX_OK)
        return CTX_ERR_INVALID_ARGUMENT;
    alibi_slopes(k->n_head, params[k->r1].data);
    for (h = 0; h < k->n_head; ++h) {
        if (params[k->r1].data[h] < k->min_value) {
            params[k->r1].data[h] = k->min_value;
            ++raised;
        }
        params[k->r2].data[h] = 1.0f;
    }
    if (raised)
        ctx_host_logf(k->host, CTX_LOG_WARN,
                 "init alibi_like: %d of %d ALiBi slopes are below min_value %g and start at %g "
                 "(pass a smaller min_value to keep them)",
                 (int)raised, (int)k->n_head, (double)k->min_value, (double)k->min_value);
    return CTX_OK;
}
#endif

static ctx_status kerple_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                                   ctx_err* err) {
    const kerple* k = (const kerple*)instance;
    (void)seq_len;
    if (!k || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_bias_spec, param_b))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = KERPLE_POWER ? CTX_BIAS_KERPLE_POWER : CTX_BIAS_KERPLE_LOG;
    spec->slopes = NULL;
    spec->param_a = k->r1;
    spec->param_b = k->r2;
    return CTX_OK;
}

static ctx_status kerple_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                                int64_t new_len, ctx_err* err) {
    if (!instance) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend %lld -> %lld: KERPLE is a function of p_i - p_j, nothing to change",
             (long long)old_len, (long long)new_len);
    return CTX_OK;
}

/* Clamps r1, r2 to >= min_value (NaN becomes min_value too); power also clamps r2 to <= 2. */
static ctx_status kerple_after_update(void* instance, ctx_tensor* params, int32_t n_params,
                                      ctx_err* err) {
    const kerple* k = (const kerple*)instance;
    int32_t which[2], w;
    int64_t h;
    if (!k || !params)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "after_update: NULL instance or params");
    if (n_params <= k->r1 || n_params <= k->r2)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "after_update: expected at least %d parameters, got %d",
                         (int)(k->r2 > k->r1 ? k->r2 : k->r1) + 1, (int)n_params);
    which[0] = k->r1;
    which[1] = k->r2;
    for (w = 0; w < 2; ++w) {
        ctx_tensor* t = &params[which[w]];
        if (t->ndim != 1 || t->shape[0] != k->n_head || !t->data)
            return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                             "after_update: parameter %d must be (%d), got ndim %d shape[0] %lld",
                             (int)which[w], (int)k->n_head, (int)t->ndim, (long long)t->shape[0]);
        for (h = 0; h < k->n_head; ++h) {
            if (!(t->data[h] >= k->min_value)) t->data[h] = k->min_value;
#if KERPLE_POWER
            if (w == 1 && t->data[h] > KERPLE_POWER_MAX_R2) t->data[h] = KERPLE_POWER_MAX_R2;
#endif
        }
    }
    return CTX_OK;
}

static const ctx_pe_vtable kerple_vtable = {
    sizeof(ctx_pe_vtable),
    CTX_PE_HOOK_BIAS,
    kerple_create,
    kerple_destroy,
#if KERPLE_POWER
    kerple_init_params, /* init = "alibi_like" only; "reference" draws on the host */
#else
    NULL, /* init_params: the host draws U(0, 2), U(0, 1) */
#endif
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
#if KERPLE_POWER
    {"init", CTX_OPT_STRING, "reference",
     "\"reference\": r1 ~ U(0, 2), r2 ~ U(0, 1); \"alibi_like\": r1 = ALiBi slopes, r2 = 1"},
    {"min_value", CTX_OPT_NUMBER, "0.01",
     "after every update r1 and r2 are clamped to >= min_value (the reference's eps); r2 <= 2"},
#else
    {"min_value", CTX_OPT_NUMBER, "0.01",
     "after every update r1 and r2 are clamped to >= min_value (the reference's eps)"},
#endif
};

static const ctx_plugin_descriptor kerple_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
#if KERPLE_POWER
    "kerple_power",
    "1.0.0",
    "KERPLE power kernel (Chi et al.): learnable per-head bias -r1 |p_i - p_j|^r2, "
    "r1 ~ U(0,2), r2 ~ U(0,1) (or ALiBi-like), clamped to r1 >= min_value, min_value <= r2 <= 2",
#else
    "kerple_log",
    "1.0.0",
    "KERPLE log kernel (Chi et al.): learnable per-head bias -r1 log(1 + r2 |p_i - p_j|), "
    "r1 ~ U(0,2), r2 ~ U(0,1), clamped to >= min_value after each update",
#endif
    kerple_options,
    (int32_t)(sizeof kerple_options / sizeof kerple_options[0]),
    &kerple_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &kerple_descriptor;
}
