/*
 * pe/t5_bias: the T5 relative attention bias (Raffel et al.) in its causal form (METHODS.md 1.6).
 *
 * The logit of query i and key j (j <= i) gets table[h][bucket(p_i - p_j)], with
 * n = max(0, floor(p_i - p_j)), max_exact = num_buckets / 2 and
 *     bucket = n                                                       if n < max_exact,
 *            = min(num_buckets - 1, max_exact + floor(log(n / max_exact)
 *                  / log(max_distance / max_exact) * (num_buckets - max_exact)))   otherwise.
 * The engine evaluates the buckets inside attention (CTX_BIAS_T5) on real-valued distances and
 * accumulates the table's gradient.
 *
 * Parameter: "table" (n_head, num_buckets), no weight decay, initialised N(0, init_std^2) with
 * init_std = d_model^-0.5 by default: what Hugging Face's T5 does for relative_attention_bias
 * (std = initializer_factor * d_model^-0.5, factor 1). init_std = 0 starts from zeros.
 * Options: num_buckets (32; 2 .. 512, the attention op's limit), max_distance (128; must exceed
 * num_buckets / 2). Distances past max_distance share the last bucket, so the bias is relative
 * and extending the context changes nothing.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define T5_MAX_BUCKETS 512 /* the CPU attention op's per-(b, h) gradient slots */

typedef struct t5_bias {
    int32_t n_head;
    int32_t num_buckets, max_distance;
    int32_t table; /* parameter index */
} t5_bias;

static ctx_status t5_create(const ctx_host_api* host, const ctx_model_info* model,
                            const ctx_options* options, void** instance, ctx_err* err) {
    t5_bias* t;
    int64_t num_buckets, max_distance;
    double init_std;
    ctx_param_desc d;
    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    *instance = NULL;
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->opt_integer || !host->register_param)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: host API is too old");
    if (model->n_head <= 0 || model->d_model <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "n_head and d_model must be positive, got %d and %d",
                         (int)model->n_head, (int)model->d_model);
    num_buckets = host->opt_integer(host->host, options, "num_buckets", 32);
    max_distance = host->opt_integer(host->host, options, "max_distance", 128);
    init_std = host->opt_number(host->host, options, "init_std",
                                1.0 / sqrt((double)model->d_model));
    if (num_buckets < 2 || num_buckets > T5_MAX_BUCKETS)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option num_buckets must be in [2, %d], got %lld", T5_MAX_BUCKETS,
                         (long long)num_buckets);
    if (max_distance <= num_buckets / 2 || max_distance > (int64_t)1 << 30)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option max_distance must exceed num_buckets / 2 = %lld (and be at most "
                         "2^30), got %lld",
                         (long long)(num_buckets / 2), (long long)max_distance);
    if (!(init_std >= 0.0) || !isfinite(init_std))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option init_std must be a finite number >= 0, got %g", init_std);
    t = (t5_bias*)calloc(1, sizeof *t);
    if (!t) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    t->n_head = model->n_head;
    t->num_buckets = (int32_t)num_buckets;
    t->max_distance = (int32_t)max_distance;

    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.name = "table";
    d.ndim = 2;
    d.shape[0] = t->n_head;
    d.shape[1] = t->num_buckets;
    d.shape[2] = d.shape[3] = 1;
    d.init = init_std > 0.0 ? CTX_INIT_NORMAL : CTX_INIT_ZEROS;
    d.init_scale = (float)init_std;
    d.weight_decay = 0;
    t->table = host->register_param(host->host, &d, err);
    if (t->table < 0) {
        free(t);
        return CTX_ERR_INVALID_ARGUMENT; /* register_param wrote the message */
    }
    *instance = t;
    return CTX_OK;
}

static void t5_destroy(void* instance) { free(instance); }

static ctx_status t5_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                               ctx_err* err) {
    const t5_bias* t = (const t5_bias*)instance;
    (void)seq_len;
    if (!t || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_bias_spec, max_distance))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_BIAS_T5;
    spec->slopes = NULL;
    spec->param_a = t->table;
    spec->param_b = -1;
    spec->num_buckets = t->num_buckets;
    spec->max_distance = t->max_distance;
    return CTX_OK;
}

static ctx_status t5_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                            int64_t new_len, ctx_err* err) {
    const t5_bias* t = (const t5_bias*)instance;
    if (!t) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend %lld -> %lld: T5 buckets are a function of p_i - p_j (distances >= %d share "
             "the last bucket), nothing to change",
             (long long)old_len, (long long)new_len, (int)t->max_distance);
    return CTX_OK;
}

static const ctx_pe_vtable t5_vtable = {
    sizeof(ctx_pe_vtable),
    CTX_PE_HOOK_BIAS,
    t5_create,
    t5_destroy,
    NULL, /* init_params: the host draws N(0, init_std^2) */
    NULL, /* input_spec */
    NULL, /* input_forward */
    NULL, /* input_backward */
    NULL, /* rotary_spec */
    t5_bias_spec,
    t5_extend,
    NULL, /* extend_params: the table's shape never changes */
    NULL, /* after_update */
    NULL, /* save_state: stateless */
    NULL, /* load_state */
    NULL, /* bias_forward: the engine evaluates the buckets in-kernel */
    NULL, /* bias_backward */
};

static const ctx_option_desc t5_options[] = {
    {"num_buckets", CTX_OPT_INTEGER, "32", "buckets per head: exact below num_buckets / 2, log-spaced above"},
    {"max_distance", CTX_OPT_INTEGER, "128", "distances >= max_distance share the last bucket"},
    {"init_std", CTX_OPT_NUMBER, "d_model^-0.5",
     "the table starts N(0, init_std^2) (Hugging Face T5's init); 0 starts from zeros"},
};

static const ctx_plugin_descriptor t5_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "t5_bias",
    "1.0.0",
    "T5 relative attention bias, causal buckets of floor(p_i - p_j): a learnable "
    "(n_head, num_buckets) table",
    t5_options,
    (int32_t)(sizeof t5_options / sizeof t5_options[0]),
    &t5_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &t5_descriptor; }
