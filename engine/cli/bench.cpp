#include "cli/bench.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>

#include "core/error.h"
#include "data/token_source.h"
#include "lua/options.h"
#include "model/trainer.h"
#include "plugin/pe_plugin.h"

namespace ctx {
namespace {

struct BenchConfig {
    const char* description;
    int n_layer, d_model, n_head, vocab, seq, batch;
    const char* pe;  // plugin name, "none" for NoPE
};

const std::map<std::string, BenchConfig> kConfigs = {
    {"cpu-ref", {"the CPU reference: GPT-2 style, learned positions, tied embeddings, AdamW", 4,
                 256, 8, 4096, 256, 8, "learned"}},
    {"cpu-ref-rope", {"cpu-ref with RoPE", 4, 256, 8, 4096, 256, 8, "rope"}},
    {"cpu-ref-alibi", {"cpu-ref with ALiBi", 4, 256, 8, 4096, 256, 8, "alibi"}},
    {"tiny", {"a seconds-long smoke config", 2, 64, 4, 256, 64, 4, "learned"}},
    {"recipe-base", {"the default recipes' base model (byte-level, RoPE)", 4, 128, 4, 259, 128, 16,
                     "rope"}},
};

void usage() {
    std::printf(
        "usage: ctxengine bench [--config NAME] [--steps N] [--warmup N] [--threads N]\n"
        "                       [--peak-gflops X]\n\n"
        "Trains the named config on random tokens and prints tokens/s, achieved GFLOP/s and\n"
        "MFU (FLOPs per token = 6N + 6*L*C*T, llm.c's convention). Configs:\n");
    for (const auto& [name, c] : kConfigs)
        std::printf("  %-14s L=%d C=%d H=%d V=%d T=%d B=%d pe=%s: %s\n", name.c_str(), c.n_layer,
                    c.d_model, c.n_head, c.vocab, c.seq, c.batch, c.pe, c.description);
}

int64_t parse_int(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used == v.size()) return x;
    } catch (...) {
    }
    fail("{} expects an integer, got '{}'", flag, v);
}

}  // namespace

double cpu_peak_flops(int threads, std::string* note) {
    double mhz = 0;
    bool avx512 = false, fma = false;
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    const std::regex mhz_re(R"(^cpu MHz\s*:\s*([0-9.]+))");
    std::smatch m;
    while (std::getline(cpuinfo, line)) {
        if (mhz <= 0 && std::regex_search(line, m, mhz_re)) mhz = std::stod(m[1]);
        if (line.rfind("flags", 0) == 0) {
            avx512 = line.find(" avx512f") != std::string::npos;
            fma = line.find(" fma") != std::string::npos;
            if (mhz > 0) break;
        }
    }
    if (mhz <= 0) mhz = 2000;
    // FP32 FLOPs per cycle per core: two FMA pipes of 16 lanes (AVX-512) or 8 lanes (AVX2).
    const double flops_per_cycle = avx512 ? 64 : (fma ? 32 : 16);
    if (note)
        *note = fmt::format("{} threads x {:.0f} MHz x {} FLOP/cycle ({})", threads, mhz,
                            flops_per_cycle, avx512 ? "AVX-512" : (fma ? "AVX2 FMA" : "SSE"));
    return threads * mhz * 1e6 * flops_per_cycle;
}

int run_bench(const std::vector<std::string>& args, PluginRegistry& registry, int threads) {
    std::string config_name = "cpu-ref";
    int64_t steps = 10, warmup = 2;
    double peak_gflops = 0;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> std::string {
            CTX_CHECK(i + 1 < args.size(), "bench: {} needs a value", a);
            return args[++i];
        };
        if (a == "--help" || a == "-h") {
            usage();
            return 0;
        } else if (a == "--config") {
            config_name = value();
        } else if (a == "--steps") {
            steps = parse_int(a, value());
        } else if (a == "--warmup") {
            warmup = parse_int(a, value());
        } else if (a == "--threads") {
            threads = static_cast<int>(parse_int(a, value()));
        } else if (a == "--peak-gflops") {
            peak_gflops = std::stod(value());
        } else {
            fail("bench: unknown argument '{}' (see ctxengine bench --help)", a);
        }
    }
    auto it = kConfigs.find(config_name);
    if (it == kConfigs.end()) {
        std::string names;
        for (const auto& [n, c] : kConfigs) names += (names.empty() ? "" : ", ") + n;
        fail("bench: unknown config '{}' (known: {})", config_name, names);
    }
    CTX_CHECK(steps > 0 && warmup >= 0, "bench: --steps must be > 0 and --warmup >= 0");
    const BenchConfig& bc = it->second;
    auto backend = make_cpu_backend(threads);
    const int used_threads = threads > 0 ? threads : omp_get_max_threads();

    ModelConfig c;
    c.n_layer = bc.n_layer;
    c.d_model = bc.d_model;
    c.n_head = bc.n_head;
    c.vocab_size = bc.vocab;
    c.context_length = bc.seq;
    std::unique_ptr<PePlugin> pe;
    if (std::string(bc.pe) != "none") {
        ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                            c.n_layer, c.vocab_size, c.context_length};
        lua::Options none;  // defaults
        pe = std::make_unique<PePlugin>(registry.get(std::string("pe/") + bc.pe), info, none, 1);
    }
    Model model(c, *backend, std::move(pe), 1);
    OptimizerConfig oc;
    oc.lr = 3e-4f;
    oc.weight_decay = 0.01f;  // the PyTorch peer's AdamW default
    oc.grad_clip = 0.0f;      // the peer does not clip
    oc.schedule = LrSchedule::Constant;
    Optimizer opt(model, oc);
    // Random tokens, like the peer benchmark (../shared/tools/torch_gpt_bench.py).
    Rng rng(0);
    std::vector<int32_t> stream(1 << 20);
    for (auto& t : stream) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(bc.vocab)));
    auto source = std::make_shared<TokenSource>(std::move(stream), bc.vocab);
    TokenStream batches(source, 1, 0);
    auto comm = make_single_comm();
    TrainOptions t;
    t.batch_size = bc.batch;
    t.seq_len = bc.seq;
    t.log_every = 0;
    if (warmup > 0) {
        t.steps = warmup;
        train(model, opt, batches, t, *comm);
    }
    std::string note;
    const double peak = peak_gflops > 0 ? peak_gflops * 1e9 : cpu_peak_flops(used_threads, &note);
    if (peak_gflops > 0) note = "given by --peak-gflops";
    t.steps = steps;
    const TrainResult r = train(model, opt, batches, t, *comm, peak);
    const double gflops = r.tokens_per_s * model.flops_per_token(bc.seq) / 1e9;
    std::printf("config=%s params=%zu threads=%d steps=%lld\n", config_name.c_str(),
                model.num_params(), used_threads, static_cast<long long>(steps));
    std::printf("step_s=%.4f\n", r.seconds / static_cast<double>(steps));
    std::printf("tokens_per_s=%.1f\n", r.tokens_per_s);
    std::printf("gflops=%.2f\n", gflops);
    std::printf("mfu=%.4f (peak %.1f GFLOP/s: %s)\n", r.mfu, peak / 1e9, note.c_str());
    std::printf("final_loss=%.4f\n", r.steps.back().loss);
    return 0;
}

}  // namespace ctx
