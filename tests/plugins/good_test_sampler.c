/* Test plugin for the loader (tests/test_plugin_registry.cpp): a minimal valid sampler plugin (sampler/test_sampler) */
#include <ctx/plugin.h>

#include <stddef.h>

static ctx_status t_create(const ctx_host_api* host, const ctx_options* options, void** instance,
                           ctx_err* err) {
    (void)host; (void)options; (void)err;
    *instance = NULL;
    return CTX_OK;
}
static void t_destroy(void* instance) { (void)instance; }
__attribute__((unused)) static ctx_status t_sample(
    void* instance, const int32_t* window, int64_t window_len, uint64_t rng_state[4],
    ctx_sample_row* row, ctx_err* err) {
    (void)instance; (void)window; (void)window_len; (void)rng_state; (void)row; (void)err;
    return CTX_OK;
}

static const ctx_sampler_vtable t_vtable = {sizeof(ctx_sampler_vtable), t_create, t_destroy, t_sample};

static const ctx_plugin_descriptor t_descriptor = {
    CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, sizeof(ctx_plugin_descriptor), CTX_PLUGIN_SAMPLER,
    "test_sampler", "0.1", NULL, NULL, 0, &t_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &t_descriptor; }
