// ctxengine: run a Lua recipe (under mpirun or alone), list plugins, benchmark.
//
// Exit codes: 0 success; 1 the recipe failed while running (or a subcommand failed);
// 2 bad command line; 3 the recipe could not be loaded (missing file, syntax error).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "build_info.h"
#include "cli/bench.h"
#include "cli/convert_cmd.h"
#include "cli/data_cmd.h"
#include "cli/tokenize_cmd.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "lua/ctx_module.h"
#include "lua/runtime.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "plugin/registry.h"

namespace {

constexpr int kExitRunError = 1, kExitUsage = 2, kExitLoadError = 3;

void print_help() {
    std::printf(
        "ctxengine %s: extend the context window of pretrained language models.\n\n"
        "usage:\n"
        "  ctxengine [options] RECIPE.lua [ARGS...]   run a recipe (also under mpirun -np N)\n"
        "  ctxengine bench [--config NAME] ...        training throughput (bench --help)\n"
        "  ctxengine bench attention ...              attention fwd+bwd TFLOP/s per PE\n"
        "  ctxengine data generate --out DIR ...      the default long-document corpus as shards\n"
        "  ctxengine data info FILE.shard             a shard's documents and lengths\n"
        "  ctxengine data qa --out F.jsonl --context N  retrieval questions (docs/EVAL.md)\n"
        "  ctxengine tokenize --input DIR --out DIR   text/jsonl documents -> train/val/test "
        "shards\n"
        "  ctxengine convert HF_DIR OUT.h5            HF model (safetensors) <-> checkpoint;\n"
        "  ctxengine convert --to-hf IN.h5 OUT_DIR    see convert --help and docs/HF.md\n"
        "  ctxengine --list-plugins                   plugins found: name, kind, version, file\n"
        "  ctxengine --version | --help\n\n"
        "options:\n"
        "  --threads N            CPU threads for the CPU backend (default: all cores)\n"
        "  --tp N                 tensor-parallel ranks per model (default 1); the world is\n"
        "                         dp x cp x tp, data parallel over the rest (docs/PARALLEL.md)\n"
        "  --cp N                 context-parallel ranks per row (default 1; ring attention,\n"
        "                         CPU and CUDA; rows split in 2 cp chunks, zigzag)\n"
        "  --backend-memory-limit BYTES  cap on the CPU backend's memory per rank (e.g. 2e9;\n"
        "                         an allocation beyond it fails, as on a device)\n"
        "  --sequence-parallel    with --tp: norms and residuals on N/tp rows per rank\n"
        "                         (all-gather / reduce-scatter instead of all-reduce)\n"
        "  --device D             auto (default: the GPU of this rank's local rank when one\n"
        "                         is visible, else the CPU), cpu or cuda; recipes may name\n"
        "                         their own (ctx.model{device = ...})\n"
        "  --precision P          fp32 (default) or bf16 (CUDA: bf16 matrix products, fp32\n"
        "                         master weights and optimizer state)\n"
        "  --plugin PATH          load one more plugin library (repeatable)\n"
        "  --plugin-dir DIR       search one more plugin directory (repeatable)\n"
        "  --log-level LEVEL      trace, debug, info (default), warn, error, off\n"
        "  --unsafe               run the recipe without the sandbox (allows os.execute,\n"
        "                         io.popen, package.loadlib, binary chunks, ...)\n"
        "  --max-instructions N   stop a recipe after N Lua VM instructions (default 1e10;\n"
        "                         0 = no limit; time inside training does not count)\n"
        "  --max-lua-memory BYTES Lua heap limit (default 1 GiB; 0 = no limit; model\n"
        "                         tensors are not on the Lua heap)\n"
        "  --stop-signals LIST    signals that stop training after the current step, save\n"
        "                         ctx.train's checkpoint_dir and exit 75 (default TERM,USR1;\n"
        "                         none: the default actions)\n\n"
        "Plugin directories: $CTX_PLUGIN_PATH (colon-separated), then the build tree or the\n"
        "installed lib/ctxengine/plugins. Recipes: see recipes/ and docs/ARCHITECTURE.md.\n"
        "Exit codes: 0 ok, 1 run error, 2 usage error, 3 recipe load error, 75 stopped by a\n"
        "signal (rerun to continue).\n",
        CTX_VERSION_STRING);
}

struct CliOptions {
    int threads = 0;
    ctx::GridShape grid;            // --tp, --cp
    bool grid_from_cli = false;
    bool sequence_parallel = false;
    std::string device, precision;  // empty: not given
    std::vector<std::string> plugins, plugin_dirs;
    std::string log_level = "info";
    std::string stop_signals = "TERM,USR1";
    ctx::lua::SandboxOptions sandbox;
    bool list_plugins = false, help = false, version = false;
    std::string command;  // "bench" or a recipe path
    std::vector<std::string> args;
};

int64_t parse_count(const std::string& flag, const std::string& v) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);  // accepts 1e10
    if (end == v.c_str() || *end != '\0' || x < 0 || x != static_cast<double>(static_cast<int64_t>(x)))
        ctx::fail("{} expects a non-negative integer, got '{}'", flag, v);
    return static_cast<int64_t>(x);
}

CliOptions parse_args(int argc, char** argv) {
    CliOptions o;
    o.sandbox.sandboxed = true;
    o.sandbox.max_instructions = 10'000'000'000ull;
    o.sandbox.max_memory_bytes = size_t{1} << 30;
    int i = 1;
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) ctx::fail("{} needs a value", a);
            return argv[++i];
        };
        if (a == "--help" || a == "-h") o.help = true;
        else if (a == "--version") o.version = true;
        else if (a == "--list-plugins") o.list_plugins = true;
        else if (a == "--threads") o.threads = static_cast<int>(parse_count(a, value()));
        else if (a == "--tp") o.grid.tp = static_cast<int>(parse_count(a, value())), o.grid_from_cli = true;
        else if (a == "--cp") o.grid.cp = static_cast<int>(parse_count(a, value())), o.grid_from_cli = true;
        else if (a == "--sequence-parallel") o.sequence_parallel = true;
        else if (a == "--backend-memory-limit") ctx::set_cpu_memory_limit(static_cast<size_t>(parse_count(a, value())));
        else if (a == "--device") o.device = value(), ctx::device_choice_from_name(o.device);
        else if (a == "--precision") o.precision = value(), ctx::precision_from_name(o.precision);
        else if (a == "--plugin") o.plugins.push_back(value());
        else if (a == "--plugin-dir") o.plugin_dirs.push_back(value());
        else if (a == "--log-level") o.log_level = value();
        else if (a == "--unsafe") o.sandbox.sandboxed = false;
        else if (a == "--stop-signals")
            o.stop_signals = value(), ctx::stop_signals_from_names(o.stop_signals);
        else if (a == "--max-instructions") o.sandbox.max_instructions = parse_count(a, value());
        else if (a == "--max-lua-memory") o.sandbox.max_memory_bytes = parse_count(a, value());
        else if (a.size() > 1 && a[0] == '-') ctx::fail("unknown option '{}' (see --help)", a);
        else break;
    }
    if (i < argc) {
        o.command = argv[i++];
        for (; i < argc; ++i) o.args.emplace_back(argv[i]);
    }
    return o;
}

void list_plugins(const ctx::PluginRegistry& reg) {
    const auto list = reg.list();
    std::printf("%-20s %-8s %-9s %s\n", "NAME", "KIND", "VERSION", "FILE");
    for (const ctx::LoadedPlugin* p : list)
        std::printf("%-20s %-8s %-9s %s\n", p->full_name.c_str(), ctx::plugin_kind_name(p->kind()),
                    p->version(), p->path.c_str());
    if (list.empty()) std::printf("(no plugins found; searched: see --help)\n");
    for (const auto& r : reg.rejected())
        std::printf("rejected: %s: %s\n", r.path.c_str(), r.reason.c_str());
}

// Threads per rank when --threads is not given: the node's cores shared by the ranks on it, so
// `mpirun -np 2` on 2 cores runs 1 thread per rank instead of 4 threads fighting for 2 cores.
int default_threads() {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local = 1;
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
        if (const char* v = std::getenv(var)) {
            local = std::max(1, std::atoi(v));
            break;
        }
    }
    return static_cast<int>(std::max(1L, cores / local));
}

int run(int argc, char** argv, std::unique_ptr<ctx::Comm>& comm) {
    CliOptions o;
    try {
        o = parse_args(argc, argv);
    } catch (const ctx::Error& e) {
        std::fprintf(stderr, "ctxengine: %s\n", e.what());
        return kExitUsage;
    }
    if (o.help) {
        print_help();
        return 0;
    }
    if (o.version) {
        std::printf("ctxengine %s (plugin ABI %d.%d)\n", CTX_VERSION_STRING, CTX_PLUGIN_ABI_MAJOR,
                    CTX_PLUGIN_ABI_MINOR);
        return 0;
    }
    if (!o.list_plugins && o.command.empty()) {
        print_help();
        return kExitUsage;
    }

    if (o.threads == 0 && !std::getenv("OMP_NUM_THREADS")) o.threads = default_threads();
    ctx::mpi_init(&argc, &argv);
    comm = ctx::make_mpi_comm();
    try {
        ctx::log::init(comm->rank(), comm->size(), o.log_level);
    } catch (const ctx::Error& e) {
        std::fprintf(stderr, "ctxengine: %s\n", e.what());
        return kExitUsage;
    }

    ctx::PluginRegistry registry;
    try {
        for (const auto& d : o.plugin_dirs) registry.scan_directory(d);
        for (const auto& d : ctx::default_plugin_dirs()) registry.scan_directory(d);
        for (const auto& p : o.plugins) registry.load_file(p);
    } catch (const ctx::Error& e) {
        spdlog::error("{}", e.what());
        return kExitRunError;
    }
    if (o.list_plugins) {
        if (comm->rank() == 0) list_plugins(registry);
        return 0;
    }
    if (o.command == "data") return ctx::run_data_command(o.args);
    if (o.command == "convert") return ctx::run_convert_command(o.args, registry, *comm, o.threads);
    if (o.command == "tokenize") {
        // The global --threads applies unless the subcommand names its own.
        std::vector<std::string> args = o.args;
        if (o.threads > 0 && std::find(args.begin(), args.end(), "--threads") == args.end())
            args.insert(args.end(), {"--threads", std::to_string(o.threads)});
        return ctx::run_tokenize_command(args);
    }
    if (o.command == "bench") {
        try {
            // The global --device / --precision apply unless bench names its own.
            std::vector<std::string> args = o.args;
            for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--device", o.device},
                                              {"--precision", o.precision},
                                              {"--tp", o.grid.tp > 1 ? std::to_string(o.grid.tp) : ""},
                                              {"--cp", o.grid.cp > 1 ? std::to_string(o.grid.cp) : ""}})
                if (!value.empty() && std::find(args.begin(), args.end(), flag) == args.end())
                    args.insert(args.end(), {flag, value});
            return ctx::run_bench(args, registry, o.threads, *comm);
        } catch (const ctx::Error& e) {
            spdlog::error("{}", e.what());
            return kExitRunError;
        }
    }

    ctx::EngineContext engine;
    engine.registry = &registry;
    engine.comm = comm.get();
    engine.threads = o.threads;
    engine.grid_shape = o.grid;
    engine.grid_from_cli = o.grid_from_cli;
    engine.sequence_parallel = o.sequence_parallel;
    if (!o.device.empty()) {
        engine.default_device = ctx::device_choice_from_name(o.device);
        engine.device_from_cli = true;
    }
    if (!o.precision.empty()) {
        engine.default_precision = ctx::precision_from_name(o.precision);
        engine.precision_from_cli = true;
    }
    {
        std::ifstream recipe(o.command, std::ios::binary);  // a missing file fails in run_file
        engine.recipe_text.assign(std::istreambuf_iterator<char>(recipe), {});
    }
    ctx::install_stop_signals(ctx::stop_signals_from_names(o.stop_signals));
    try {
        ctx::lua::Runtime runtime(o.sandbox);
        runtime.set_args(o.command, o.args);
        ctx::open_ctx_module(runtime.state(), &engine);
        runtime.add_module_dir(std::filesystem::path(o.command).parent_path().string());
        runtime.run_file(o.command);
    } catch (const ctx::lua::LoadError& e) {
        spdlog::error("cannot load recipe: {}", e.what());
        return kExitLoadError;
    } catch (const ctx::lua::RunError& e) {
        if (ctx::exit_status_override() != 0) {  // a stop that saved its checkpoint
            spdlog::warn("{}", e.what());
            return ctx::exit_status_override();
        }
        spdlog::error("recipe failed: {}", e.what());
        return kExitRunError;
    } catch (const ctx::Error& e) {
        spdlog::error("{}", e.what());
        return kExitRunError;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    // Idle OpenMP threads sleep instead of spinning unless the user chose otherwise: spinning
    // threads steal the cores of other ranks and processes (measured: 5x slower on a busy
    // 2-core machine) for a small gain on an idle one.
    setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
    std::unique_ptr<ctx::Comm> comm;
    int rc = 0;
    try {
        rc = run(argc, argv, comm);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ctxengine: internal error: %s\n", e.what());
        rc = kExitRunError;
    }
    // A failing rank must not leave the others waiting in a collective forever. (A stop by
    // signal happens on every rank after the same step: they all end normally.)
    if (rc != 0 && rc != ctx::kExitStopped && comm && comm->size() > 1) {
        std::fflush(nullptr);
        ctx::mpi_abort(rc);
    }
    ctx::mpi_finalize();
    return rc;
}
