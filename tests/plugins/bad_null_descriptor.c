/* Test plugin for the loader (tests/test_plugin_registry.cpp): ctx_plugin_query returns NULL */
#include <ctx/plugin.h>

#include <stddef.h>

CTX_PLUGIN_EXPORT const ctx_plugin_descriptor* ctx_plugin_query(void) { return NULL; }
