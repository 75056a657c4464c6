// Finding, loading and validating plugins (DESIGN.md decision 5). Libraries are opened by
// absolute path with RTLD_NOW | RTLD_LOCAL and never unloaded while the registry lives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ctx/plugin.h"
#include "core/error.h"

namespace ctx {

const char* plugin_kind_name(int32_t kind);  // "pe", "sampler", "eval", or "unknown"

struct LoadedPlugin {
    std::string full_name;  // "<kind>/<name>", e.g. "pe/rope"
    std::string path;       // absolute path of the shared library
    const ctx_plugin_descriptor* descriptor = nullptr;
    void* handle = nullptr;  // dlopen handle
    int32_t kind() const { return descriptor->kind; }
    const char* name() const { return descriptor->name; }
    const char* version() const { return descriptor->version; }
};

// A library that was found but not accepted, and why.
struct RejectedPlugin {
    std::string path;
    std::string reason;
};

class PluginRegistry {
public:
    PluginRegistry() = default;
    ~PluginRegistry();  // dlcloses every handle
    PluginRegistry(const PluginRegistry&) = delete;
    PluginRegistry& operator=(const PluginRegistry&) = delete;

    // Loads and validates one library (the path is made absolute). Throws ctx::Error naming the
    // file and the reason: not loadable (dlerror), no ctx_plugin_query symbol, query returned
    // NULL, ABI major differs or minor is newer ("built for plugin ABI 2.0, this ctxengine
    // supports 1.0"), struct_size too small, unknown kind, missing name/version/vtable, vtable
    // struct_size too small or required slots (create, destroy, and the kind's main entry)
    // NULL, invalid option declarations (NULL/duplicate names, unknown types), or a
    // "<kind>/<name>" already registered from another file. Loading the same file twice returns
    // the existing entry.
    const LoadedPlugin& load_file(const std::string& path);

    // Loads every *.so below dir (recursively, sorted for determinism). Libraries that fail
    // validation are recorded in rejected() and logged as warnings; a missing dir is ignored.
    // Returns the number accepted.
    int scan_directory(const std::string& dir);

    // nullptr if absent. `full_name` is "<kind>/<name>".
    const LoadedPlugin* find(const std::string& full_name) const;
    // Like find() but throws ctx::Error listing the plugins of that kind that do exist, and the
    // rejection reason if a library of that name was rejected.
    const LoadedPlugin& get(const std::string& full_name) const;

    std::vector<const LoadedPlugin*> list() const;  // sorted by full_name
    const std::vector<RejectedPlugin>& rejected() const { return rejected_; }

private:
    std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
    std::vector<RejectedPlugin> rejected_;
};

// Plugin directories in search order: $CTX_PLUGIN_PATH (colon-separated), the build tree's
// plugins/ next to the executable, and <prefix>/lib/ctxengine/plugins for an installed binary.
// Only directories that exist are returned.
std::vector<std::string> default_plugin_dirs();

}  // namespace ctx
