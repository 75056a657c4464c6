/*
 * pe/learned: a learned absolute position table (GPT-2's wpe) and its interpolation to a longer
 * context (segmented-sequences paper, section 3.2; METHODS.md 1.1).
 *
 * The table E is a (rows, d_model) parameter "wpe"; the engine adds interp(E, p) to each token
 * embedding (CTX_INPUT_TABLE, linear interpolation at fractional positions). Extending Lt -> Le
 * re-declares "wpe" with Le rows and fills it, with x = i * Lt / Le, j = floor(x), f = x - j, as
 *     e'_i = (1 - f) e_j + f e_{min(j+1, Lt-1)}
 * which for integral beta = Le / Lt is the paper's
 *     e'_i = ((beta - i % beta) / beta) e_{floor(i/beta)} + ((i % beta) / beta) e_{floor(i/beta)+1},
 *     e_{Lt} := e_{Lt-1}.
 * j and f are computed from integers (j = i*Lt div Le, f = (i*Lt mod Le) / Le) so they are exact.
 *
 * Weight decay: the table is declared with weight_decay = 1, like llm.c (which decays every 2-D
 * parameter, wpe included). Some other GPT-2 training setups exclude position tables from decay.
 */
#include <ctx/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct learned {
    int64_t rows;        /* current table length */
    int32_t d_model;
    int32_t table_param; /* index of "wpe" */
    float init_std;
    int64_t pending_old, pending_new; /* set by extend(), consumed by extend_params() */
} learned;

static int32_t declare_table(const ctx_host_api* host, const learned* l, int64_t rows,
                             ctx_err* err) {
    ctx_param_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.name = "wpe";
    d.ndim = 2;
    d.shape[0] = rows;
    d.shape[1] = l->d_model;
    d.shape[2] = 1;
    d.shape[3] = 1;
    d.init = CTX_INIT_NORMAL;
    d.init_scale = l->init_std;
    d.weight_decay = 1; /* as llm.c; see the comment at the top */
    return host->register_param(host->host, &d, err);
}

static ctx_status learned_create(const ctx_host_api* host, const ctx_model_info* model,
                                 const ctx_options* options, void** instance, ctx_err* err) {
    double init_std;
    learned* l;
    int32_t idx;

    if (!host || !model || !instance)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: NULL host, model or instance");
    if (host->struct_size < CTX_OFFSET_END(ctx_host_api, rng_u64) || !host->opt_number ||
        !host->register_param)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: the host API is too old");
    if (model->struct_size < CTX_OFFSET_END(ctx_model_info, context_length))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "create: model info is too small");
    *instance = NULL;
    if (model->context_length <= 0 || model->d_model <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "context_length and d_model must be positive, got %d and %d",
                         (int)model->context_length, (int)model->d_model);

    init_std = host->opt_number(host->host, options, "init_std", 0.02);
    if (!(isfinite(init_std) && init_std >= 0.0))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "option 'init_std' must be a finite number >= 0, got %g", init_std);

    l = (learned*)calloc(1, sizeof *l);
    if (!l) return ctx_err_setf(err, CTX_ERR_OUT_OF_MEMORY, "out of memory");
    l->rows = model->context_length;
    l->d_model = model->d_model;
    l->init_std = (float)init_std;
    l->pending_old = l->pending_new = -1;
    idx = declare_table(host, l, l->rows, err);
    if (idx < 0) {
        free(l);
        return CTX_ERR_INVALID_ARGUMENT; /* the host wrote the message */
    }
    l->table_param = idx;
    *instance = l;
    return CTX_OK;
}

static void learned_destroy(void* instance) { free(instance); }

static ctx_status learned_input_spec(void* instance, ctx_input_spec* spec, ctx_err* err) {
    const learned* l = (const learned*)instance;
    if (!l || !spec)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "input_spec: NULL instance or spec");
    if (spec->struct_size < CTX_OFFSET_END(ctx_input_spec, table_param))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "input_spec: spec struct_size %u is too small", spec->struct_size);
    spec->kind = CTX_INPUT_TABLE;
    spec->table_param = l->table_param;
    return CTX_OK;
}

static ctx_status learned_extend(const ctx_host_api* host, void* instance, int64_t old_len,
                                 int64_t new_len, ctx_err* err) {
    learned* l = (learned*)instance;
    int32_t idx;
    if (!l || !host || !host->register_param)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend: NULL host or instance");
    if (old_len != l->rows)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: old length %lld does not match the position table's %lld rows",
                         (long long)old_len, (long long)l->rows);
    if (new_len < old_len)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend: cannot shrink the position table from %lld to %lld rows (the "
                         "new length must be >= the current one)",
                         (long long)old_len, (long long)new_len);
    idx = declare_table(host, l, new_len, err);
    if (idx < 0) return CTX_ERR_INVALID_ARGUMENT;
    l->table_param = idx;
    l->pending_old = old_len;
    l->pending_new = new_len;
    ctx_host_logf(host, CTX_LOG_INFO,
             "extend: interpolating the position table from %lld to %lld rows (beta = %g)",
             (long long)old_len, (long long)new_len, (double)new_len / (double)old_len);
    return CTX_OK;
}

static int table_has_shape(const ctx_tensor* t, int64_t rows, int64_t cols) {
    return t && t->data && t->dtype == CTX_F32 && t->ndim == 2 && t->shape[0] == rows &&
           t->shape[1] == cols;
}

static ctx_status learned_extend_params(void* instance, const ctx_tensor* old_params,
                                        ctx_tensor* new_params, int32_t n_params, ctx_err* err) {
    learned* l = (learned*)instance;
    const ctx_tensor *src, *dst_t;
    int64_t lt, le, d, i, c;
    if (!l || !old_params || !new_params)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "extend_params: NULL argument");
    if (l->pending_new < 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend_params called without a preceding extend()");
    if (l->table_param < 0 || l->table_param >= n_params)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend_params: got %d parameters, the table is parameter %d",
                         (int)n_params, (int)l->table_param);
    lt = l->pending_old;
    le = l->pending_new;
    d = l->d_model;
    src = &old_params[l->table_param];
    dst_t = &new_params[l->table_param];
    if (!table_has_shape(src, lt, d))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend_params: old 'wpe' must be a (%lld, %lld) f32 table",
                         (long long)lt, (long long)d);
    if (!table_has_shape(dst_t, le, d))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "extend_params: new 'wpe' must be a (%lld, %lld) f32 table",
                         (long long)le, (long long)d);
    {
        const float* e = src->data;
        float* out = dst_t->data;
        for (i = 0; i < le; ++i) {
            const int64_t num = i * lt; /* x = i / beta = i * Lt / Le */
            const int64_t j = num / le;
            const double f = (double)(num % le) / (double)le;
            const int64_t j1 = j + 1 < lt ? j + 1 : lt - 1;
            const float* a = e + j * d;
            const float* b = e + j1 * d;
            float* o = out + i * d;
            for (c = 0; c < d; ++c) o[c] = (float)((1.0 - f) * (double)a[c] + f * (double)b[c]);
        }
    }
    l->rows = le;
    l->pending_old = l->pending_new = -1;
    return CTX_OK;
}

static ctx_status learned_save_state(void* instance, void* buffer, size_t cap, size_t* size,
                                     ctx_err* err) {
    const learned* l = (const learned*)instance;
    if (!l || !size) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "save_state: NULL argument");
    *size = sizeof(int64_t);
    if (buffer && cap >= sizeof(int64_t)) memcpy(buffer, &l->rows, sizeof(int64_t));
    return CTX_OK;
}

static ctx_status learned_load_state(void* instance, const void* buffer, size_t size,
                                     ctx_err* err) {
    learned* l = (learned*)instance;
    int64_t rows;
    if (!l) return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT, "load_state: NULL instance");
    if (!buffer || size != sizeof(int64_t))
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: expected %u bytes (the table length), got %llu",
                         (unsigned)sizeof(int64_t), (unsigned long long)size);
    memcpy(&rows, buffer, sizeof rows);
    if (rows <= 0)
        return ctx_err_setf(err, CTX_ERR_INVALID_ARGUMENT,
                         "load_state: table length must be positive, got %lld", (long long)rows);
    l->rows = rows;
    l->pending_old = l->pending_new = -1;
    return CTX_OK;
}

static const ctx_option_desc learned_options[] = {
    {"init_std", CTX_OPT_NUMBER, "0.02", "standard deviation of the table's N(0, std^2) init"},
};

/* Designated initializers: slots appended in later ABI minors stay NULL without warnings.
 * init_params is NULL (the host draws the normal init); input_forward/backward are NULL (the
 * engine looks the table up and scatters its gradient). */
static const ctx_pe_vtable learned_vtable = {
    .struct_size = sizeof(ctx_pe_vtable),
    .hooks = CTX_PE_HOOK_INPUT,
    .create = learned_create,
    .destroy = learned_destroy,
    .input_spec = learned_input_spec,
    .extend = learned_extend,
    .extend_params = learned_extend_params,
    .save_state = learned_save_state,
    .load_state = learned_load_state,
};

static const ctx_plugin_descriptor learned_descriptor = {
    CTX_PLUGIN_ABI_MAJOR,
    CTX_PLUGIN_ABI_MINOR,
    sizeof(ctx_plugin_descriptor),
    CTX_PLUGIN_PE,
    "learned",
    "1.0.0",
    "Learned absolute position table (GPT-2 wpe), linearly interpolated at fractional positions "
    "and when the context is extended",
    learned_options,
    (int32_t)(sizeof learned_options / sizeof learned_options[0]),
    &learned_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) {
    return &learned_descriptor;
}
