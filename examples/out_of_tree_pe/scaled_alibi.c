/* pe/scaled_alibi: ALiBi with every slope multiplied by `scale` (a one-knob ablation).
 * Written only against the public header <ctx/plugin.h>; no engine code knows about it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <ctx/plugin.h>

typedef struct scaled_alibi {
    float* slopes; /* (n_head) */
} scaled_alibi;

static const ctx_option_desc options[] = {
    {"scale", CTX_OPT_NUMBER, "1.0", "multiplies every ALiBi slope"},
};

/* METHODS.md 1.4: slopes for n heads (powers of two, else interleaved from 2n). */
static double slope(int n, int h) { return pow(2.0, -8.0 * (h + 1) / n); }

static ctx_status create(const ctx_host_api* host, const ctx_model_info* model,
                         const ctx_options* opts, void** instance, ctx_err* err) {
    const double scale = host->opt_number(host->host, opts, "scale", 1.0);
    if (!(scale > 0)) {
        char msg[128];
        snprintf(msg, sizeof msg, "option 'scale' must be positive, got %g", scale);
        ctx_err_set(err, msg);
        return CTX_ERR_INVALID_ARGUMENT;
    }
    scaled_alibi* p = calloc(1, sizeof *p);
    if (p) p->slopes = calloc((size_t)model->n_head, sizeof(float));
    if (!p || !p->slopes) {
        free(p);
        return CTX_ERR_OUT_OF_MEMORY;
    }
    const int n = model->n_head;
    int c = 1;
    while (c * 2 <= n) c *= 2;
    for (int h = 0; h < n; ++h) {
        const double s = h < c ? slope(c, h) : slope(2 * c, 2 * (h - c));
        p->slopes[h] = (float)(s * scale);
    }
    *instance = p;
    return CTX_OK;
}

static void destroy(void* instance) {
    scaled_alibi* p = instance;
    if (p) free(p->slopes);
    free(p);
}

static ctx_status bias_spec(void* instance, int64_t seq_len, ctx_bias_spec* spec, ctx_err* err) {
    (void)seq_len;
    (void)err;
    spec->kind = CTX_BIAS_LINEAR;
    spec->slopes = ((scaled_alibi*)instance)->slopes;
    spec->param_a = -1;
    return CTX_OK;
}

static const ctx_pe_vtable vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_BIAS,
    .create = create,
    .destroy = destroy,
    .bias_spec = bias_spec,
};

static const ctx_plugin_descriptor descriptor = {
    .abi_major = CTX_PLUGIN_ABI_MAJOR,
    .abi_minor = CTX_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(ctx_plugin_descriptor),
    .kind = CTX_PLUGIN_PE,
    .name = "scaled_alibi",
    .version = "0.1.0",
    .description = "ALiBi with scaled slopes (out-of-tree example)",
    .options = options,
    .n_options = 1,
    .vtable = &vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &descriptor; }
