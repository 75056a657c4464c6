/* Test plugin for the loader (tests/test_plugin_registry.cpp): NULL vtable */
#include <ctx/plugin.h>

#include <stddef.h>

__attribute__((unused)) static ctx_status t_create(
    const ctx_host_api* host, const ctx_model_info* model,
    const ctx_options* options, void** instance, ctx_err* err) {
    (void)host; (void)model; (void)options; (void)err;
    *instance = NULL;
    return CTX_OK;
}
__attribute__((unused)) static void t_destroy(void* instance) { (void)instance; }
__attribute__((unused)) static ctx_status t_rotary_spec(
    void* instance, int64_t seq_len, ctx_rotary_spec* spec, ctx_err* err) {
    (void)instance; (void)seq_len; (void)spec; (void)err;
    return CTX_OK;
}

__attribute__((unused)) static const ctx_pe_vtable t_vtable = {
    sizeof(ctx_pe_vtable), CTX_PE_HOOK_ROTARY, t_create, t_destroy,
    NULL, NULL, NULL, NULL, /* init_params, input_spec, input_forward, input_backward */
    t_rotary_spec, /* rotary_spec */
    NULL, NULL, NULL, NULL, NULL, NULL, /* bias_spec, extend, extend_params, after_update, save/load */
};

static const ctx_plugin_descriptor t_descriptor = {
    CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, sizeof(ctx_plugin_descriptor), CTX_PLUGIN_PE, "null_vtable", "1.0.0",
    "NULL vtable",
    NULL, 0, NULL,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &t_descriptor; }
