/*
 * pe/none: no positional encoding (NoPE; Kazemnejad et al., Haviv et al.; METHODS.md 1.7).
 *
 * The causal mask is the only source of order information: token embeddings get nothing added,
 * q and k are not rotated and attention logits get no bias, so the model's outputs do not depend
 * on the position ids at all (shifting or reordering them changes nothing).
 *
 * The registry rejects a PE plugin that declares no hook, so this plugin declares the bias hook
 * and its bias_spec answers CTX_BIAS_NONE: the engine then adds no bias (and evaluates nothing
 * per logit). It has no options, no parameters and no state; extend() changes nothing.
 *
 * The same model results from a recipe's ctx.pe("none"), which the engine treats as "no PE
 * plugin at all"; this plugin makes NoPE available as a regular plugin ("pe/none") as well.
 */
#include <ctx/plugin.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>


typedef struct nope {
    int32_t n_head; /* kept only so the instance is a real allocation */
} nope;

static ctx_status none_create(const ctx_host_api* host, const ctx_model_info* model,
                              const ctx_options* options, void** instance, ctx_err* err) {
    nope* n;
    (void)options; /* no options */
    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;
    n = (nope*)calloc(1, sizeof *n);
    if (!n) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    n->n_head = model->n_head;
    *instance = n;
    return CTX_OK;
}

static void none_destroy(void* instance) { free(instance); }

/* The bias hook is declared only to satisfy the registry: the answer is always "no bias". */
static ctx_status none_bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec,
                                 ctx_err* err) {
    (void)seq_len;
    if (!instance || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "bias_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_bias_spec, max_distance))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "bias_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_BIAS_NONE;
    spec->slopes = NULL;
    spec->param_a = -1;
    spec->param_b = -1;
    return CTX_OK;
}

static ctx_status none_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                              int64_t new_len, ctx_err* err) {
    char buf[160];
    if (!instance) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    if (host && host->log) {
        snprintf(buf, sizeof buf, "extend %lld -> %lld: NoPE has nothing positional to change",
                 (long long)old_len, (long long)new_len);
        host->log(host->host, CTX_LOG_INFO, buf);
    }
    return CTX_OK;
}

/* Designated initializers: slots not named here (and slots appended in later ABI minors) are
 * NULL. */
static const ctx_pe_vtable none_vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_BIAS,
    .create = none_create,
    .destroy = none_destroy,
    .bias_spec = none_bias_spec,
    .extend = none_extend,
};

static const ctx_plugin_descriptor none_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "none",
    "1.0.0",
    "No positional encoding (NoPE): order comes from the causal mask alone",
    NULL, /* no options */
    0,
    &none_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &none_descriptor; }
