// The plugin loader (engine/plugin/registry.cpp) against deliberately broken test plugins
// (tests/plugins/*.c, built into CTX_TEST_PLUGIN_DIR) and the real plugins of the build tree.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "build_info.h"
#include "plugin/registry.h"

namespace fs = std::filesystem;
using ctx::LoadedPlugin;
using ctx::PluginRegistry;

namespace {

std::string test_plugin(const std::string& stem) {
    return fs::canonical(fs::path(CTX_TEST_PLUGIN_DIR) / (stem + ".so")).string();
}
std::string real_plugin_dir() {
    return fs::canonical(fs::path(CTX_TEST_BINARY_DIR) / "plugins").string();
}
std::string real_pe(const std::string& name) {
    return fs::canonical(fs::path(CTX_TEST_BINARY_DIR) / "plugins" / "pe" / ("pe_" + name + ".so"))
        .string();
}
std::string host_abi() {
    return std::to_string(CTX_PLUGIN_ABI_MAJOR) + "." + std::to_string(CTX_PLUGIN_ABI_MINOR);
}
bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// True if the library at path is currently mapped into this process.
bool is_resident(const std::string& path) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    dlclose(h);
    return true;
}

// The message of the ctx::Error that f throws ("" and a test failure if it does not throw one).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const ctx::Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "threw a non-ctx::Error exception: " << e.what();
        return e.what();
    }
    ADD_FAILURE() << "did not throw";
    return "";
}

// A temporary directory removed at the end of the test.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() /
               ("ctx_test_registry_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
        fs::remove_all(path);
        fs::create_directories(path);
        path = fs::canonical(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string copy(const std::string& from, const std::string& rel) const {
        const fs::path to = path / rel;
        fs::create_directories(to.parent_path());
        fs::copy_file(from, to, fs::copy_options::overwrite_existing);
        return to.string();
    }
    std::string write(const std::string& rel, const std::string& text) const {
        const fs::path to = path / rel;
        fs::create_directories(to.parent_path());
        std::ofstream(to) << text;
        return to.string();
    }
};

}  // namespace

TEST(PluginRegistry, KindNames) {
    EXPECT_STREQ(ctx::plugin_kind_name(CTX_PLUGIN_PE), "pe");
    EXPECT_STREQ(ctx::plugin_kind_name(CTX_PLUGIN_SAMPLER), "sampler");
    EXPECT_STREQ(ctx::plugin_kind_name(CTX_PLUGIN_EVAL), "eval");
    EXPECT_STREQ(ctx::plugin_kind_name(0), "unknown");
    EXPECT_STREQ(ctx::plugin_kind_name(42), "unknown");
}

TEST(PluginRegistry, LoadsAValidPlugin) {
    const std::string path = test_plugin("good_test_pe");
    {
        PluginRegistry reg;
        const LoadedPlugin& p = reg.load_file(path);
        EXPECT_EQ(p.full_name, "pe/test_pe");
        EXPECT_EQ(p.path, path);
        EXPECT_TRUE(fs::path(p.path).is_absolute());
        EXPECT_EQ(p.kind(), CTX_PLUGIN_PE);
        EXPECT_STREQ(p.name(), "test_pe");
        EXPECT_STREQ(p.version(), "1.0.0");
        ASSERT_NE(p.descriptor, nullptr);
        EXPECT_EQ(p.descriptor->n_options, 2);
        EXPECT_NE(p.handle, nullptr);
        EXPECT_EQ(reg.find("pe/test_pe"), &p);
        EXPECT_EQ(&reg.get("pe/test_pe"), &p);
        EXPECT_EQ(reg.find("pe/other"), nullptr);
        EXPECT_EQ(reg.find("sampler/test_pe"), nullptr);
        ASSERT_EQ(reg.list().size(), 1u);
        EXPECT_TRUE(reg.rejected().empty());
        EXPECT_TRUE(is_resident(path));
    }
    EXPECT_FALSE(is_resident(path)) << "the registry's destructor must dlclose its libraries";
}

TEST(PluginRegistry, LoadsSamplerKind) {
    PluginRegistry reg;
    const LoadedPlugin& p = reg.load_file(test_plugin("good_test_sampler"));
    EXPECT_EQ(p.full_name, "sampler/test_sampler");
    EXPECT_EQ(p.kind(), CTX_PLUGIN_SAMPLER);
}

TEST(PluginRegistry, RelativePathIsMadeAbsolute) {
    const std::string path = test_plugin("good_test_pe");
    const std::string rel = fs::relative(path, fs::current_path()).string();
    ASSERT_FALSE(fs::path(rel).is_absolute());
    PluginRegistry reg;
    const LoadedPlugin& p = reg.load_file(rel);
    EXPECT_EQ(p.path, path);
}

TEST(PluginRegistry, SameFileTwiceIsTheSameEntry) {
    const std::string path = test_plugin("good_test_pe");
    PluginRegistry reg;
    const LoadedPlugin& a = reg.load_file(path);
    // Another spelling of the same path.
    const std::string dotted =
        (fs::path(CTX_TEST_PLUGIN_DIR) / "." / ".." / "test_plugins" / "good_test_pe.so").string();
    EXPECT_EQ(&reg.load_file(dotted), &a);
    EXPECT_EQ(&reg.load_file(path), &a);
    // A symlink to it.
    TempDir tmp;
    const fs::path link = tmp.path / "link.so";
    fs::create_symlink(path, link);
    EXPECT_EQ(&reg.load_file(link.string()), &a);
    // A hard link (if the file system allows one here): dlopen returns the same handle.
    std::error_code ec;
    const fs::path hard = fs::path(CTX_TEST_PLUGIN_DIR).parent_path() /
                          (".ctx_test_hardlink_" + std::to_string(getpid()) + ".so");
    fs::remove(hard, ec);
    fs::create_hard_link(path, hard, ec);
    if (!ec) {
        EXPECT_EQ(&reg.load_file(hard.string()), &a);
        fs::remove(hard, ec);
    }
    EXPECT_EQ(reg.list().size(), 1u);
}

struct BadCase {
    const char* stem;
    std::vector<std::string> expect;  // substrings of the message
};

TEST(PluginRegistry, RejectsBrokenPluginsWithClearMessages) {
    const std::string host = host_abi();
    const std::vector<BadCase> cases = {
        {"bad_abi_major", {"built for plugin ABI 2.0, this ctxengine supports " + host}},
        {"bad_abi_minor", {"built for plugin ABI 1.99, this ctxengine supports " + host}},
        {"bad_no_query", {"no 'ctx_plugin_query' symbol"}},
        {"bad_null_descriptor", {"ctx_plugin_query() returned NULL"}},
        {"bad_desc_size", {"descriptor struct_size is 16 bytes"}},
        {"bad_kind", {"unknown plugin kind 42"}},
        {"bad_name", {"invalid plugin name 'Bad-Name'"}},
        {"bad_empty_name", {"has no name"}},
        {"bad_no_version", {"no_version", "has no version"}},
        {"bad_null_vtable", {"pe/null_vtable", "vtable is NULL"}},
        {"bad_vtable_size", {"vtable struct_size is 16 bytes"}},
        {"bad_missing_create", {"pe/missing_create", "'create' is NULL"}},
        {"bad_missing_destroy", {"'destroy' is NULL"}},
        {"bad_no_hooks", {"declares no hook"}},
        {"bad_unknown_hook", {"unknown hook bits 0x40"}},
        {"bad_rotary_no_spec", {"rotary hook but rotary_spec is NULL"}},
        {"bad_input_no_spec", {"input hook but input_spec is NULL"}},
        {"bad_options", {"option 'alpha' is declared twice"}},
        {"bad_option_type", {"option 'alpha' has unknown type 99"}},
        {"bad_option_name", {"invalid option name 'Alpha'"}},
        {"bad_option_null_name", {"option #0 has no name"}},
        {"bad_options_null_array", {"n_options is 3 but options is NULL"}},
        {"bad_sampler_no_sample", {"sampler/no_sample", "'sample' is NULL"}},
        {"bad_eval_no_run", {"eval/no_run", "'run' is NULL"}},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.stem);
        const std::string path = test_plugin(c.stem);
        PluginRegistry reg;
        const std::string msg = error_of([&] { reg.load_file(path); });
        EXPECT_TRUE(contains(msg, path)) << "message must name the file: " << msg;
        for (const auto& e : c.expect) EXPECT_TRUE(contains(msg, e)) << "missing '" << e << "' in: " << msg;
        EXPECT_TRUE(reg.list().empty());
        EXPECT_FALSE(is_resident(path)) << "a rejected library must be dlclosed";
    }
}

TEST(PluginRegistry, MissingFileOrNotALibrary) {
    PluginRegistry reg;
    TempDir tmp;
    const std::string missing = (tmp.path / "nope.so").string();
    std::string msg = error_of([&] { reg.load_file(missing); });
    EXPECT_TRUE(contains(msg, missing)) << msg;
    EXPECT_TRUE(contains(msg, "no such plugin file")) << msg;

    const std::string text = tmp.write("text.so", "this is not an ELF file\n");
    msg = error_of([&] { reg.load_file(text); });
    EXPECT_TRUE(contains(msg, text)) << msg;
    EXPECT_TRUE(contains(msg, "cannot load the library")) << msg;

    msg = error_of([&] { reg.load_file(tmp.path.string()); });
    EXPECT_TRUE(contains(msg, "is a directory")) << msg;
    msg = error_of([&] { reg.load_file(""); });
    EXPECT_TRUE(contains(msg, "empty")) << msg;
    EXPECT_TRUE(reg.list().empty());
}

TEST(PluginRegistry, DuplicateNameFromAnotherFileNamesBothFiles) {
    const std::string rope = real_pe("rope");
    const std::string dup = test_plugin("dup_name_rope");
    {
        PluginRegistry reg;
        reg.load_file(rope);
        const std::string msg = error_of([&] { reg.load_file(dup); });
        EXPECT_TRUE(contains(msg, "'pe/rope'")) << msg;
        EXPECT_TRUE(contains(msg, dup)) << msg;
        EXPECT_TRUE(contains(msg, rope)) << msg;
        EXPECT_EQ(reg.get("pe/rope").path, rope);
        EXPECT_EQ(reg.list().size(), 1u);
    }
    {
        PluginRegistry reg;
        reg.load_file(dup);
        const std::string msg = error_of([&] { reg.load_file(rope); });
        EXPECT_TRUE(contains(msg, dup)) << msg;
        EXPECT_TRUE(contains(msg, rope)) << msg;
        EXPECT_EQ(reg.get("pe/rope").path, dup);
    }
}

TEST(PluginRegistry, ScanFindsTheRealPePlugins) {
    PluginRegistry reg;
    EXPECT_GE(reg.scan_directory(real_plugin_dir()), 3);
    for (const char* name : {"pe/learned", "pe/rope", "pe/alibi"}) {
        const LoadedPlugin* p = reg.find(name);
        ASSERT_NE(p, nullptr) << name;
        EXPECT_TRUE(contains(p->path, real_plugin_dir())) << p->path;
        EXPECT_STREQ(p->version(), "1.0.0");
    }
    const auto all = reg.list();
    EXPECT_TRUE(std::is_sorted(all.begin(), all.end(), [](auto* a, auto* b) {
        return a->full_name < b->full_name;
    }));
}

TEST(PluginRegistry, ScanRecordsRejections) {
    PluginRegistry reg;
    reg.scan_directory(real_plugin_dir());
    const size_t before = reg.list().size();
    const int accepted = reg.scan_directory(CTX_TEST_PLUGIN_DIR);
    EXPECT_GE(accepted, 2);  // good_test_pe, good_test_sampler
    EXPECT_NE(reg.find("pe/test_pe"), nullptr);
    EXPECT_NE(reg.find("sampler/test_sampler"), nullptr);
    EXPECT_EQ(reg.list().size(), before + static_cast<size_t>(accepted));

    // Every bad_* library and the duplicate rope are rejected, with reasons naming them.
    std::vector<std::string> mine;
    for (const auto& e : fs::directory_iterator(CTX_TEST_PLUGIN_DIR)) {
        const std::string name = e.path().filename().string();
        if ((name.rfind("bad_", 0) == 0 || name == "dup_name_rope.so") && e.path().extension() == ".so")
            mine.push_back(fs::canonical(e.path()).string());
    }
    ASSERT_GE(mine.size(), 20u);
    std::vector<std::string> rejected_paths;
    for (const auto& r : reg.rejected()) rejected_paths.push_back(r.path);
    for (const auto& path : mine) {
        auto it = std::find(rejected_paths.begin(), rejected_paths.end(), path);
        ASSERT_NE(it, rejected_paths.end()) << path << " was not rejected";
        const auto& r = reg.rejected()[it - rejected_paths.begin()];
        EXPECT_TRUE(contains(r.reason, path)) << r.reason;
    }
    const auto dup = std::find(rejected_paths.begin(), rejected_paths.end(),
                               test_plugin("dup_name_rope"));
    EXPECT_TRUE(contains(reg.rejected()[dup - rejected_paths.begin()].reason, real_pe("rope")));
    // Scanned in sorted order.
    std::vector<std::string> from_test_dir;
    for (const auto& p : rejected_paths)
        if (contains(p, "/test_plugins/")) from_test_dir.push_back(p);
    EXPECT_TRUE(std::is_sorted(from_test_dir.begin(), from_test_dir.end()));

    // A second scan accepts the same libraries again (same entries) and records nothing new.
    const size_t n_rejected = reg.rejected().size();
    EXPECT_EQ(reg.scan_directory(CTX_TEST_PLUGIN_DIR), accepted);
    EXPECT_EQ(reg.rejected().size(), n_rejected);
    EXPECT_EQ(reg.list().size(), before + static_cast<size_t>(accepted));
}

TEST(PluginRegistry, ScanIsRecursiveSortedAndOnlyTakesSoFiles) {
    TempDir tmp;
    tmp.copy(test_plugin("good_test_pe"), "b/sub/deeper/good.so");
    const std::string x = tmp.copy(test_plugin("bad_kind"), "a/x.so");
    const std::string c = tmp.copy(test_plugin("bad_name"), "c.so");
    tmp.copy(test_plugin("good_test_sampler"), "z.so.bak");
    tmp.copy(test_plugin("good_test_sampler"), "sampler.so.1");
    tmp.write("readme.txt", "not a plugin");
    fs::create_directories(tmp.path / "dir.so");
    PluginRegistry reg;
    EXPECT_EQ(reg.scan_directory(tmp.path.string()), 1);
    EXPECT_NE(reg.find("pe/test_pe"), nullptr);
    EXPECT_EQ(reg.find("sampler/test_sampler"), nullptr);
    ASSERT_EQ(reg.rejected().size(), 2u);
    EXPECT_EQ(reg.rejected()[0].path, x);
    EXPECT_EQ(reg.rejected()[1].path, c);
    EXPECT_TRUE(contains(reg.rejected()[0].reason, "unknown plugin kind 42"));

    EXPECT_EQ(reg.scan_directory((tmp.path / "does_not_exist").string()), 0);
    EXPECT_EQ(reg.scan_directory(tmp.write("file_not_dir", "x")), 0);
    EXPECT_EQ(reg.scan_directory(""), 0);
}

TEST(PluginRegistry, ScanFollowsDirectorySymlinksWithoutLooping) {
    TempDir tmp, other;
    other.copy(test_plugin("good_test_pe"), "good.so");
    const std::string x = tmp.copy(test_plugin("bad_kind"), "a/x.so");
    fs::create_directory_symlink(tmp.path, tmp.path / "a" / "loop");  // a cycle
    fs::create_directory_symlink(other.path, tmp.path / "other");
    PluginRegistry reg;
    EXPECT_EQ(reg.scan_directory(tmp.path.string()), 1);
    EXPECT_NE(reg.find("pe/test_pe"), nullptr);
    ASSERT_EQ(reg.rejected().size(), 1u);
    EXPECT_EQ(reg.rejected()[0].path, x);
}

TEST(PluginRegistry, ScanLogsRejectionsAsWarnings) {
    auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
    auto logger = std::make_shared<spdlog::logger>("test_registry", sink);
    logger->set_level(spdlog::level::debug);
    auto previous = spdlog::default_logger();
    spdlog::set_default_logger(logger);

    TempDir tmp;
    const std::string bad = tmp.copy(test_plugin("bad_abi_major"), "bad.so");
    {
        PluginRegistry reg;
        reg.scan_directory(tmp.path.string());
    }
    spdlog::set_default_logger(previous);

    bool found = false;
    for (const auto& line : sink->last_formatted()) {
        if (contains(line, "warning") && contains(line, bad) && contains(line, "ABI 2.0"))
            found = true;
    }
    EXPECT_TRUE(found) << "no warning naming " << bad;
}

TEST(PluginRegistry, GetExplainsWhatIsMissing) {
    PluginRegistry reg;
    reg.scan_directory(real_plugin_dir());
    reg.scan_directory(CTX_TEST_PLUGIN_DIR);
    EXPECT_EQ(reg.get("pe/rope").path, real_pe("rope"));

    std::string msg = error_of([&] { reg.get("pe/nonexistent"); });
    EXPECT_TRUE(contains(msg, "'pe/nonexistent'")) << msg;
    for (const char* name : {"pe/alibi", "pe/learned", "pe/rope", "pe/test_pe"})
        EXPECT_TRUE(contains(msg, name)) << msg;
    EXPECT_FALSE(contains(msg, "sampler/test_sampler")) << "only plugins of the same kind: " << msg;

    msg = error_of([&] { reg.get("sampler/zzz"); });
    EXPECT_TRUE(contains(msg, "sampler/test_sampler")) << msg;
    EXPECT_FALSE(contains(msg, "pe/rope")) << msg;

    msg = error_of([&] { reg.get("eval/zzz"); });
    EXPECT_TRUE(contains(msg, "eval/perplexity")) << msg;
    PluginRegistry only_test_plugins;  // holds no valid eval plugin
    only_test_plugins.scan_directory(CTX_TEST_PLUGIN_DIR);
    msg = error_of([&] { only_test_plugins.get("eval/zzz"); });
    EXPECT_TRUE(contains(msg, "no eval plugins")) << msg;

    // A rejected library whose file name matches says why it was rejected.
    msg = error_of([&] { reg.get("pe/bad_abi_major"); });
    EXPECT_TRUE(contains(msg, test_plugin("bad_abi_major"))) << msg;
    EXPECT_TRUE(contains(msg, "built for plugin ABI 2.0")) << msg;

    msg = error_of([&] { reg.get("rope"); });
    EXPECT_TRUE(contains(msg, "<kind>/<name>")) << msg;
    msg = error_of([&] { reg.get("foo/rope"); });
    EXPECT_TRUE(contains(msg, "<kind>/<name>")) << msg;
}

TEST(PluginRegistry, GetNamesARejectedLibraryByKindPrefixedFileName) {
    TempDir tmp;
    const std::string lib = tmp.copy(test_plugin("bad_abi_minor"), "pe/pe_future.so");
    PluginRegistry reg;
    EXPECT_EQ(reg.scan_directory(tmp.path.string()), 0);
    const std::string msg = error_of([&] { reg.get("pe/future"); });
    EXPECT_TRUE(contains(msg, lib)) << msg;
    EXPECT_TRUE(contains(msg, "built for plugin ABI 1.99")) << msg;
    EXPECT_TRUE(contains(msg, "no pe plugins")) << msg;
}

TEST(PluginRegistry, DefaultPluginDirs) {
    const std::string build_dir = fs::canonical(CTX_PLUGIN_BUILD_DIR).string();
    EXPECT_EQ(build_dir, real_plugin_dir());
    const char* old = getenv("CTX_PLUGIN_PATH");
    const std::string saved = old ? old : "";

    TempDir t1, t2;
    const std::string env = t1.path.string() + ":/nonexistent/ctx_plugins::" + t2.path.string() +
                            "/./:" + t1.path.string() + ":" + build_dir;
    setenv("CTX_PLUGIN_PATH", env.c_str(), 1);
    auto dirs = ctx::default_plugin_dirs();
    ASSERT_GE(dirs.size(), 3u);
    EXPECT_EQ(dirs[0], t1.path.string());
    EXPECT_EQ(dirs[1], t2.path.string());
    EXPECT_EQ(dirs[2], build_dir);  // from the environment, so before the exe-relative dirs
    for (const auto& d : dirs) {
        EXPECT_TRUE(fs::path(d).is_absolute()) << d;
        EXPECT_TRUE(fs::is_directory(d)) << d;
        EXPECT_EQ(std::count(dirs.begin(), dirs.end(), d), 1) << "duplicate " << d;
        EXPECT_FALSE(contains(d, "nonexistent"));
    }

    unsetenv("CTX_PLUGIN_PATH");
    dirs = ctx::default_plugin_dirs();
    ASSERT_FALSE(dirs.empty());
    EXPECT_EQ(dirs.back(), build_dir);  // the compile-time build dir comes last
    const fs::path exe_dir = fs::read_symlink("/proc/self/exe").parent_path();
    if (fs::is_directory(exe_dir / "plugins") &&
        fs::canonical(exe_dir / "plugins").string() != build_dir) {
        EXPECT_EQ(dirs[0], fs::canonical(exe_dir / "plugins").string());
    }
    if (old) setenv("CTX_PLUGIN_PATH", saved.c_str(), 1);
}
