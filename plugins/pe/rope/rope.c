/*
 * pe/rope: standard rotary position embedding (METHODS.md 1.3, first paragraph).
 *
 *   rotary dims  dr = floor(rotary_pct * head_dim), rounded down to even (GPT-NeoX: int(dh * pct))
 *   frequencies  theta_k = base^(-2k/dr), k = 0 .. dr/2 - 1, computed in double and cast to float
 *   layout       "half" (NeoX/LLaMA: dim k pairs with k + dr/2) or "interleaved" (GPT-J: 2k, 2k+1)
 *
 * The engine rotates q and k with angle p * theta_k for the (float) position p of each token.
 * Scaling variants (linear, NTK, dynamic NTK, YaRN, Giraffe bases, xPos) are separate plugins; plain
 * RoPE has nothing to change when the context is extended.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OFFSET_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

typedef struct rope {
    int32_t rotary_dims;
    int32_t layout;
    float* inv_freq; /* (rotary_dims / 2) */
} rope;

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

static ctx_status rope_create(const ctx_host_api* host, const ctx_model_info* model,
                              const ctx_options* options, void** instance, ctx_err* err) {
    double base, pct;
    const char* layout_name;
    int32_t layout, dims, k;
    rope* r;

    if (!host || !model || !instance)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (host->struct_size < OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->opt_string)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    if (model->struct_size < OFFSET_END(ctx_model_info, context_length))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;

    base = host->opt_number(host->host, options, "base", 10000.0);
    if (!(isfinite(base) && base > 0.0))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'base' must be a finite number > 0, got %g", base);

    pct = host->opt_number(host->host, options, "rotary_pct", 1.0);
    if (!(pct > 0.0 && pct <= 1.0))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'rotary_pct' must be in (0, 1], got %g", pct);
    if (model->head_dim <= 0)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "head_dim must be positive, got %d",
                         (int)model->head_dim);
    dims = (int32_t)floor(pct * (double)model->head_dim);
    dims -= dims % 2;
    if (dims <= 0)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'rotary_pct' = %g gives %d rotary dims for head_dim %d "
                         "(need at least 2)",
                         pct, (int)dims, (int)model->head_dim);

    layout_name = host->opt_string(host->host, options, "layout", "half");
    if (layout_name && strcmp(layout_name, "half") == 0)
        layout = CTX_ROTARY_HALF;
    else if (layout_name && strcmp(layout_name, "interleaved") == 0)
        layout = CTX_ROTARY_INTERLEAVED;
    else
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'layout' must be \"half\" or \"interleaved\", got \"%s\"",
                         layout_name ? layout_name : "(null)");

    r = (rope*)calloc(1, sizeof *r);
    if (!r) return set_error(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    r->inv_freq = (float*)malloc(sizeof(float) * (size_t)(dims / 2));
    if (!r->inv_freq) {
        free(r);
        return set_error(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    }
    r->rotary_dims = dims;
    r->layout = layout;
    for (k = 0; k < dims / 2; ++k)
        r->inv_freq[k] = (float)pow(base, -2.0 * (double)k / (double)dims);
    *instance = r;
    return CTX_OK;
}

static void rope_destroy(void* instance) {
    rope* r = (rope*)instance;
    if (!r) return;
    free(r->inv_freq);
    free(r);
}

static ctx_status rope_rotary_spec(void* instance, int64_t seq_len, ctx_rotary_spec* spec,
                                   ctx_err* err) {
    const rope* r = (const rope*)instance;
    (void)seq_len; /* standard RoPE does not depend on the row length */
    if (!r || !spec)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "rotary_spec: NULL instance or spec");
    if (spec->struct_size < OFFSET_END(ctx_rotary_spec, amp_scale_base))
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "rotary_spec: spec struct_size %u is too small", spec->struct_size);
    spec->rotary_dims = r->rotary_dims;
    spec->layout = r->layout;
    spec->inv_freq = r->inv_freq;
    spec->position_scale = 1.0f;
    spec->attention_factor = 1.0f;
    spec->amp_base = NULL;
    spec->amp_scale_base = 512.0f; /* unused without amp_base */
    return CTX_OK;
}

static ctx_status rope_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                              int64_t new_len, ctx_err* err) {
    if (!instance)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL instance");
    if (old_len <= 0 || new_len <= 0)
        return set_error(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: lengths must be positive, got %lld -> %lld", (long long)old_len,
                         (long long)new_len);
    host_log(host, CTX_LOG_INFO,
             "extend %lld -> %lld: plain RoPE is unchanged (same frequencies at every position; "
             "use a scaling variant to adapt them)",
             (long long)old_len, (long long)new_len);
    return CTX_OK;
}

static const ctx_option_desc rope_options[] = {
    {"base", CTX_OPT_NUMBER, "10000", "frequency base: theta_k = base^(-2k/dr); > 0"},
    {"rotary_pct", CTX_OPT_NUMBER, "1.0",
     "fraction of each head's dims that rotate, in (0, 1]; dr = floor(pct * head_dim) rounded "
     "down to even (GPT-NeoX/Pythia 0.25, LLaMA 1.0)"},
    {"layout", CTX_OPT_STRING, "half",
     "pairing of rotated dims: \"half\" (NeoX/LLaMA: k with k + dr/2) or \"interleaved\" (GPT-J: "
     "2k with 2k+1)"},
};

static const ctx_pe_vtable rope_vtable = {
    sizeof(ctx_pe_vtable),
    CTX_PE_HOOK_ROTARY,
    rope_create,
    rope_destroy,
    NULL, /* init_params: no parameters */
    NULL, /* input_spec */
    NULL, /* input_forward */
    NULL, /* input_backward */
    rope_rotary_spec,
    NULL, /* bias_spec */
    rope_extend,
    NULL, /* extend_params: no parameters */
    NULL, /* after_update */
    NULL, /* save_state: stateless */
    NULL, /* load_state */
};

static const ctx_plugin_descriptor rope_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "rope",
    "1.0.0",
    "Rotary position embedding (Su et al.): theta_k = base^(-2k/dr) on the first rotary_pct of "
    "each head, half or interleaved pairs",
    rope_options,
    (int32_t)(sizeof rope_options / sizeof rope_options[0]),
    &rope_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &rope_descriptor; }
