/* Test plugin for the loader (tests/test_plugin_registry.cpp): eval plugin without a run slot */
#include <ctx/plugin.h>

#include <stddef.h>

static ctx_status t_create(const ctx_host_api* host, const ctx_options* options, void** instance,
                           ctx_err* err) {
    (void)host; (void)options; (void)err;
    *instance = NULL;
    return CTX_OK;
}
static void t_destroy(void* instance) { (void)instance; }

static const ctx_eval_vtable t_vtable = {sizeof(ctx_eval_vtable), t_create, t_destroy, NULL};

static const ctx_plugin_descriptor t_descriptor = {
    CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, sizeof(ctx_plugin_descriptor), CTX_PLUGIN_EVAL,
    "no_run", "0.1", NULL, NULL, 0, &t_vtable,
};

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return &t_descriptor; }
