// Plugin loading and validation (DESIGN.md decision 5).
//
// A library is opened by absolute path with RTLD_NOW | RTLD_LOCAL, its ctx_plugin_query is called
// and the descriptor it returns is checked field by field before anything else touches it: the ABI
// version first (so a plugin from another ABI is never read past its first two fields), then the
// descriptor size, kind, name, version, vtable and options. Every message names the file. A
// rejected library is dlclosed; an accepted one stays open until the registry is destroyed.
#include "plugin/registry.h"

#include <dlfcn.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string_view>
#include <system_error>

#include "build_info.h"

namespace fs = std::filesystem;

namespace ctx {

namespace {

// What ABI 1.0 reads. When a later minor appends fields, these stay at the 1.0 values (older
// plugins remain loadable) and the host treats slots beyond a plugin's struct_size as NULL.
constexpr size_t kDescriptorMinSize = CTX_OFFSET_END(ctx_plugin_descriptor, vtable);
constexpr size_t kPeVtableMinSize = CTX_OFFSET_END(ctx_pe_vtable, load_state);
constexpr size_t kSamplerVtableMinSize = CTX_OFFSET_END(ctx_sampler_vtable, sample);
constexpr size_t kEvalVtableMinSize = CTX_OFFSET_END(ctx_eval_vtable, run);
constexpr uint32_t kKnownPeHooks = CTX_PE_HOOK_INPUT | CTX_PE_HOOK_ROTARY | CTX_PE_HOOK_BIAS;
constexpr int32_t kMaxOptions = 1024;  // a sanity bound on n_options before we walk the array

bool valid_identifier(const char* s) {
    if (!s || !*s) return false;
    for (const char* c = s; *c; ++c) {
        const bool ok = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_';
        if (!ok) return false;
    }
    return true;
}

bool known_kind(int32_t kind) {
    return kind == CTX_PLUGIN_PE || kind == CTX_PLUGIN_SAMPLER || kind == CTX_PLUGIN_EVAL;
}

bool known_option_type(int32_t t) { return t >= CTX_OPT_NUMBER && t <= CTX_OPT_NUMBER_LIST; }

// Checks a descriptor that passed the ABI check; returns an empty string if valid, otherwise the
// reason (without the file name).
std::string validate_descriptor(const ctx_plugin_descriptor* d) {
    if (d->struct_size < kDescriptorMinSize)
        return fmt::format("descriptor struct_size is {} bytes, ABI {}.{} needs at least {}",
                           d->struct_size, d->abi_major, d->abi_minor, kDescriptorMinSize);
    if (!known_kind(d->kind))
        return fmt::format("unknown plugin kind {} (known: 1 = pe, 2 = sampler, 3 = eval)",
                           d->kind);
    if (!d->name || !*d->name) return "the descriptor has no name";
    if (!valid_identifier(d->name))
        return fmt::format("invalid plugin name '{}' (use only a-z, 0-9 and _)", d->name);
    if (!d->version || !*d->version)
        return fmt::format("plugin '{}' has no version string", d->name);
    const std::string full = fmt::format("{}/{}", plugin_kind_name(d->kind), d->name);
    if (!d->vtable) return fmt::format("{}: the descriptor's vtable is NULL", full);

    // Every vtable starts with its struct_size.
    const uint32_t vsize = *static_cast<const uint32_t*>(d->vtable);
    auto too_small = [&](size_t need) {
        return fmt::format("{}: vtable struct_size is {} bytes, ABI {}.{} needs at least {}", full,
                           vsize, CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, need);
    };
    auto missing = [&](const char* slot) {
        return fmt::format("{}: required vtable slot '{}' is NULL", full, slot);
    };
    switch (d->kind) {
        case CTX_PLUGIN_PE: {
            if (vsize < kPeVtableMinSize) return too_small(kPeVtableMinSize);
            const auto* vt = static_cast<const ctx_pe_vtable*>(d->vtable);
            if (!vt->create) return missing("create");
            if (!vt->destroy) return missing("destroy");
            if ((vt->hooks & kKnownPeHooks) == 0)
                return fmt::format("{}: declares no hook (hooks must include input, rotary or bias)",
                                   full);
            if (vt->hooks & ~kKnownPeHooks)
                return fmt::format("{}: unknown hook bits 0x{:x}", full, vt->hooks & ~kKnownPeHooks);
            if ((vt->hooks & CTX_PE_HOOK_INPUT) && !vt->input_spec)
                return fmt::format("{}: uses the input hook but input_spec is NULL", full);
            if ((vt->hooks & CTX_PE_HOOK_ROTARY) && !vt->rotary_spec)
                return fmt::format("{}: uses the rotary hook but rotary_spec is NULL", full);
            if ((vt->hooks & CTX_PE_HOOK_BIAS) && !vt->bias_spec)
                return fmt::format("{}: uses the bias hook but bias_spec is NULL", full);
            break;
        }
        case CTX_PLUGIN_SAMPLER: {
            if (vsize < kSamplerVtableMinSize) return too_small(kSamplerVtableMinSize);
            const auto* vt = static_cast<const ctx_sampler_vtable*>(d->vtable);
            if (!vt->create) return missing("create");
            if (!vt->destroy) return missing("destroy");
            if (!vt->sample) return missing("sample");
            break;
        }
        case CTX_PLUGIN_EVAL: {
            if (vsize < kEvalVtableMinSize) return too_small(kEvalVtableMinSize);
            const auto* vt = static_cast<const ctx_eval_vtable*>(d->vtable);
            if (!vt->create) return missing("create");
            if (!vt->destroy) return missing("destroy");
            if (!vt->run) return missing("run");
            break;
        }
    }

    if (d->n_options < 0 || d->n_options > kMaxOptions)
        return fmt::format("{}: n_options is {} (expected 0..{})", full, d->n_options, kMaxOptions);
    if (d->n_options > 0 && !d->options)
        return fmt::format("{}: n_options is {} but options is NULL", full, d->n_options);
    std::set<std::string_view> seen;
    for (int32_t i = 0; i < d->n_options; ++i) {
        const ctx_option_desc& o = d->options[i];
        if (!o.name) return fmt::format("{}: option #{} has no name", full, i);
        if (!valid_identifier(o.name))
            return fmt::format("{}: invalid option name '{}' (use only a-z, 0-9 and _)", full,
                               o.name);
        if (!seen.insert(o.name).second)
            return fmt::format("{}: option '{}' is declared twice", full, o.name);
        if (!known_option_type(o.type))
            return fmt::format("{}: option '{}' has unknown type {} (known: 1..5)", full, o.name,
                               o.type);
    }
    return {};
}

// RAII for a dlopen handle that has not been accepted yet.
struct HandleGuard {
    void* handle = nullptr;
    ~HandleGuard() {
        if (handle) dlclose(handle);
    }
    void* release() {
        void* h = handle;
        handle = nullptr;
        return h;
    }
};

std::string file_stem_of(const std::string& path) {
    std::string name = fs::path(path).filename().string();
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) name.resize(name.size() - 3);
    return name;
}

}  // namespace

const char* plugin_kind_name(int32_t kind) {
    switch (kind) {
        case CTX_PLUGIN_PE: return "pe";
        case CTX_PLUGIN_SAMPLER: return "sampler";
        case CTX_PLUGIN_EVAL: return "eval";
        default: return "unknown";
    }
}

PluginRegistry::~PluginRegistry() {
    for (auto& p : plugins_)
        if (p->handle) dlclose(p->handle);
}

const LoadedPlugin& PluginRegistry::load_file(const std::string& path_in) {
    CTX_CHECK(!path_in.empty(), "plugin path is empty");
    std::error_code ec;
    fs::path abs = fs::absolute(fs::path(path_in), ec).lexically_normal();
    CTX_CHECK(!ec, "{}: cannot make the path absolute: {}", path_in, ec.message());
    CTX_CHECK(fs::exists(abs, ec), "{}: no such plugin file", abs.string());
    CTX_CHECK(!fs::is_directory(abs, ec), "{}: is a directory, not a plugin library", abs.string());
    // The canonical path (symlinks resolved) identifies the file; it is what we store and report.
    const fs::path canon = fs::canonical(abs, ec);
    const std::string path = ec ? abs.string() : canon.string();

    for (const auto& p : plugins_)
        if (p->path == path) return *p;

    dlerror();  // clear any stale error
    HandleGuard guard{dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)};
    if (!guard.handle) {
        const char* why = dlerror();
        fail("{}: cannot load the library: {}", path, why ? why : "unknown dlopen error");
    }
    dlerror();
    void* sym = dlsym(guard.handle, CTX_PLUGIN_QUERY_SYMBOL);
    CTX_CHECK(sym != nullptr,
              "{}: no '" CTX_PLUGIN_QUERY_SYMBOL
              "' symbol (not a ctxengine plugin, or the function is not exported with "
              "CTX_PLUGIN_EXPORT)",
              path);
    auto query = reinterpret_cast<ctx_plugin_query_fn>(sym);
    const ctx_plugin_descriptor* d = query();
    CTX_CHECK(d != nullptr, "{}: " CTX_PLUGIN_QUERY_SYMBOL "() returned NULL", path);

    // The same library reached through another name (hard link): dlopen hands back the handle it
    // already has, so the descriptor is the one we registered. The guard drops the extra ref.
    for (const auto& p : plugins_)
        if (p->descriptor == d) return *p;

    if (d->abi_major != CTX_PLUGIN_ABI_MAJOR || d->abi_minor > CTX_PLUGIN_ABI_MINOR)
        fail("{}: built for plugin ABI {}.{}, this ctxengine supports {}.{}", path, d->abi_major,
             d->abi_minor, CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR);

    if (std::string reason = validate_descriptor(d); !reason.empty())
        fail("{}: {}", path, reason);

    std::string full_name = fmt::format("{}/{}", plugin_kind_name(d->kind), d->name);
    for (const auto& p : plugins_)
        if (p->full_name == full_name)
            fail("{}: plugin '{}' is already registered from {}", path, full_name, p->path);

    auto entry = std::make_unique<LoadedPlugin>();
    entry->full_name = std::move(full_name);
    entry->path = path;
    entry->descriptor = d;
    entry->handle = guard.release();
    plugins_.push_back(std::move(entry));
    spdlog::debug("loaded plugin {} {} from {}", plugins_.back()->full_name, d->version, path);
    return *plugins_.back();
}

int PluginRegistry::scan_directory(const std::string& dir) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) return 0;

    std::vector<std::string> files;
    fs::recursive_directory_iterator it(
        dir, fs::directory_options::follow_directory_symlink |
                 fs::directory_options::skip_permission_denied,
        ec);
    if (ec) {
        spdlog::warn("cannot scan plugin directory {}: {}", dir, ec.message());
        return 0;
    }
    // Directory symlinks are followed; each real directory is entered once, so a symlink cycle
    // cannot make the walk endless.
    std::error_code cec;
    std::set<std::string> visited_dirs{fs::canonical(dir, cec).string()};
    for (const auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
        if (ec) {
            spdlog::warn("error while scanning plugin directory {}: {}", dir, ec.message());
            break;
        }
        const fs::directory_entry& e = *it;
        std::error_code fec;
        if (e.is_directory(fec)) {
            const fs::path real = fs::canonical(e.path(), fec);
            if (fec || !visited_dirs.insert(real.string()).second) it.disable_recursion_pending();
            continue;
        }
        if (!e.is_regular_file(fec) || fec) continue;
        const std::string name = e.path().filename().string();
        if (name.size() <= 3 || name.compare(name.size() - 3, 3, ".so") != 0) continue;
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());

    int accepted = 0;
    for (const auto& f : files) {
        try {
            load_file(f);
            ++accepted;
        } catch (const std::exception& ex) {
            std::error_code cec;
            const fs::path canon = fs::canonical(f, cec);
            RejectedPlugin r{cec ? f : canon.string(), ex.what()};
            const bool known = std::any_of(rejected_.begin(), rejected_.end(), [&](const auto& x) {
                return x.path == r.path && x.reason == r.reason;
            });
            if (!known) {
                spdlog::warn("plugin rejected: {}", r.reason);
                rejected_.push_back(std::move(r));
            }
        }
    }
    return accepted;
}

const LoadedPlugin* PluginRegistry::find(const std::string& full_name) const {
    for (const auto& p : plugins_)
        if (p->full_name == full_name) return p.get();
    return nullptr;
}

const LoadedPlugin& PluginRegistry::get(const std::string& full_name) const {
    if (const LoadedPlugin* p = find(full_name)) return *p;

    const auto slash = full_name.find('/');
    std::string kind, name;
    if (slash != std::string::npos) {
        kind = full_name.substr(0, slash);
        name = full_name.substr(slash + 1);
    }
    const bool kind_ok = kind == "pe" || kind == "sampler" || kind == "eval";

    std::string msg;
    if (!kind_ok) {
        msg = fmt::format("unknown plugin '{}': plugin names are '<kind>/<name>' with kind pe, "
                          "sampler or eval",
                          full_name);
        std::vector<std::string> all;
        for (const auto* p : list()) all.push_back(p->full_name);
        msg += all.empty() ? "; no plugins are loaded"
                           : fmt::format("; available: {}", fmt::join(all, ", "));
    } else {
        std::vector<std::string> same_kind;
        for (const auto* p : list())
            if (plugin_kind_name(p->kind()) == kind) same_kind.push_back(p->full_name);
        msg = fmt::format("unknown plugin '{}'", full_name);
        msg += same_kind.empty()
                   ? fmt::format("; no {} plugins are loaded (check CTX_PLUGIN_PATH)", kind)
                   : fmt::format("; available {} plugins: {}", kind, fmt::join(same_kind, ", "));
    }
    // A rejected library whose file name looks like the plugin (pe_rope.so or rope.so for
    // "pe/rope") probably was meant to provide it: say why it was rejected.
    if (!name.empty()) {
        const std::string want1 = kind + "_" + name, want2 = name;
        for (const auto& r : rejected_) {
            const std::string stem = file_stem_of(r.path);
            if (stem == want1 || stem == want2)
                msg += fmt::format("; the library {} was rejected: {}", r.path, r.reason);
        }
    }
    throw Error(msg);
}

std::vector<const LoadedPlugin*> PluginRegistry::list() const {
    std::vector<const LoadedPlugin*> out;
    out.reserve(plugins_.size());
    for (const auto& p : plugins_) out.push_back(p.get());
    std::sort(out.begin(), out.end(),
              [](const LoadedPlugin* a, const LoadedPlugin* b) { return a->full_name < b->full_name; });
    return out;
}

std::vector<std::string> default_plugin_dirs() {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("CTX_PLUGIN_PATH")) {
        std::string_view s(env);
        while (true) {
            const auto colon = s.find(':');
            const std::string_view part = s.substr(0, colon);
            if (!part.empty()) candidates.emplace_back(part);
            if (colon == std::string_view::npos) break;
            s.remove_prefix(colon + 1);
        }
    }
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    // The build tree's plugins only as a fallback (test executables live in build/tests/): an
    // installed ctxengine must not also load the plugins of the tree it was built from.
    bool found_next_to_exe = false;
    if (!ec && !exe.empty()) {
        const fs::path exe_dir = exe.parent_path();
        for (const fs::path& d : {exe_dir / "plugins", exe_dir / ".." / CTX_PLUGIN_INSTALL_SUBDIR}) {
            std::error_code dec;
            found_next_to_exe = found_next_to_exe || fs::is_directory(d, dec);
            candidates.push_back(d.string());
        }
    }
    if (!found_next_to_exe) candidates.emplace_back(CTX_PLUGIN_BUILD_DIR);

    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto& c : candidates) {
        std::error_code cec;
        if (!fs::is_directory(c, cec)) continue;
        const fs::path canon = fs::canonical(c, cec);
        if (cec) continue;
        if (seen.insert(canon.string()).second) out.push_back(canon.string());
    }
    return out;
}

}  // namespace ctx
