#include "cli/bench.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>

#include "backend/cpu/cpu_peak.h"
#include "backend/profiling_backend.h"
#include "parallel/grid.h"
#include "parallel/profiling_comm.h"
#include "core/error.h"
#include "core/options.h"
#include "data/token_source.h"
#include "model/trainer.h"
#include "plugin/pe_plugin.h"

namespace ctx {
namespace {

constexpr int kExitUsage = 2;

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
    {"recipe-base", {"the main job's base model (recipes/common.lua: BPE 1024, RoPE)", 4, 64, 2,
                     1024, 128, 16, "rope"}},
    // Issue 8's GPU targets: GPT-2 small and medium at their original context and vocabulary.
    {"gpt2-124m", {"GPT-2 small (GPU: the MFU target of issue 8)", 12, 768, 12, 50257, 1024, 8,
                   "learned"}},
    {"gpt2-350m", {"GPT-2 medium (GPU)", 24, 1024, 16, 50257, 1024, 8, "learned"}},
};

void usage() {
    std::printf(
        "usage: ctxengine bench [--config NAME] [--device auto|cpu|cuda] [--precision fp32|bf16]\n"
        "                       [--attention auto|flash|materialised] [--pe NAME] [--batch B]\n"
        "                       [--seq T] [--steps N] [--warmup N] [--threads N]\n"
        "                       [--peak-tflops X | --peak-gflops X] [--profile] [--tp N]\n"
        "                       [--sequence-parallel] [--cp N]\n"
        "       ctxengine bench attention ...   the attention ops alone (bench attention --help)\n"
        "       ctxengine bench peak ...        the peak table MFU uses (bench peak --help)\n\n"
        "Trains the named config on random tokens and prints tokens/s, achieved TFLOP/s and MFU\n"
        "(FLOPs per token = 6N + 6*L*C*T, llm.c's convention) against the device's peak: on the\n"
        "CPU the FMA throughput measured on the threads used, on a GPU its dense bf16 tensor-core peak (--precision\n"
        "bf16) or its fp32 peak (fp32, the default: no tensor cores, no TF32). --pe replaces the\n"
        "config's positional encoding (any PE plugin, or none); --attention picks the attention\n"
        "implementation (auto: flash on CUDA, materialised on the CPU). --profile adds a table of\n"
        "the timed steps' milliseconds by op and shape. Under mpirun -np N the ranks train data\n"
        "parallel (tokens/s and the peak are the world's; the profile adds the collectives); --tp N\n"
        "splits each model over N of them (tensor parallelism, data parallel over the rest) and\n"
        "the memory lines are per rank; --cp N splits each row over N ranks (ring attention).\n"
        "docs/BENCHMARKS.md.\n"
        "Configs:\n");
    for (const auto& [name, c] : kConfigs)
        std::printf("  %-14s L=%d C=%d H=%d V=%d T=%d B=%d pe=%s: %s\n", name.c_str(), c.n_layer,
                    c.d_model, c.n_head, c.vocab, c.seq, c.batch, c.pe, c.description);
}

void peak_usage() {
    std::printf(
        "usage: ctxengine bench peak [--gpu NAME] [--cc MAJOR.MINOR --sm N --clock-mhz MHZ]\n\n"
        "Prints the dense peak throughput MFU is measured against: the datasheet table (with\n"
        "--gpu, the entry that GPU name selects), or with --cc/--sm/--clock-mhz the estimate\n"
        "SMs x clock x per-SM FLOP/clock of that architecture.\n");
}

struct TrainArgs {
    std::string config = "cpu-ref";
    DeviceChoice device = DeviceChoice::Auto;
    Precision precision = Precision::Fp32;
    bool precision_given = false;
    AttentionChoice attention = AttentionChoice::Auto;
    std::string pe;  // empty: the config's
    int batch = 0, seq = 0;  // 0: the config's
    int64_t steps = 10, warmup = 2;
    int threads = 0;
    int tp = 1;             // tensor-parallel ranks per model
    int cp = 1;             // context-parallel ranks per row
    bool sequence_parallel = false;
    double peak_flops = 0;  // 0: the device's
    bool profile = false;   // time every backend op of the timed steps
    bool help = false;
};

TrainArgs parse_train_args(const std::vector<std::string>& args, int threads) {
    TrainArgs o;
    o.threads = threads;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> std::string {
            CTX_CHECK(i + 1 < args.size(), "bench: {} needs a value", a);
            return args[++i];
        };
        if (a == "--help" || a == "-h") o.help = true;
        else if (a == "--config") o.config = value();
        else if (a == "--device") o.device = device_choice_from_name(value());
        else if (a == "--precision") o.precision = precision_from_name(value()), o.precision_given = true;
        else if (a == "--attention") o.attention = attention_choice_from_name(value());
        else if (a == "--pe") o.pe = value();
        else if (a == "--batch") o.batch = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--seq") o.seq = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--steps") o.steps = bench_parse_int(a, value());
        else if (a == "--warmup") o.warmup = bench_parse_int(a, value());
        else if (a == "--threads") o.threads = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--peak-tflops") o.peak_flops = bench_parse_double(a, value()) * 1e12;
        else if (a == "--peak-gflops") o.peak_flops = bench_parse_double(a, value()) * 1e9;
        else if (a == "--profile") o.profile = true;
        else if (a == "--tp") o.tp = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--cp") o.cp = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--sequence-parallel") o.sequence_parallel = true;
        else fail("bench: unknown argument '{}' (see ctxengine bench --help)", a);
    }
    if (o.help) return o;
    if (!kConfigs.count(o.config)) {
        std::string names;
        for (const auto& [n, c] : kConfigs) names += (names.empty() ? "" : ", ") + n;
        fail("bench: unknown config '{}' (known: {})", o.config, names);
    }
    CTX_CHECK(o.steps > 0 && o.warmup >= 0, "bench: --steps must be > 0 and --warmup >= 0");
    CTX_CHECK(o.batch >= 0 && o.seq >= 0, "bench: --batch and --seq must be positive");
    CTX_CHECK(o.peak_flops >= 0, "bench: the peak must be positive");
    return o;
}

// The peak for MFU and where it comes from; 0 when unknown (MFU is then not reported).
double mfu_peak(const TrainArgs& o, const Backend& backend, int threads, std::string* note) {
    if (o.peak_flops > 0) {
        *note = "given on the command line";
        return o.peak_flops;
    }
    const DevicePeak p = device_peak(backend, threads);
    const bool bf16 = backend.precision() == Precision::Bf16;
    const double peak = bf16 ? p.bf16 : p.fp32;
    if (backend.kind() == DeviceKind::CPU) *note = p.source;
    else if (peak > 0)
        *note = fmt::format("{}, dense {}{}", p.source, bf16 ? "bf16 tensor-core" : "fp32 non-tensor",
                            p.estimated ? ", ESTIMATED" : "");
    else *note = p.source;
    return peak;
}

// The --profile table: per step, every op and shape by decreasing time, then the rest of the step:
// on the host clock what ran outside the backend (the trainer's host work: batch sampling, loss
// read-back, gradient-norm bookkeeping); on a device clock the time the device waited between
// ops (launches and host work it was not hidden behind).
void print_profile(const ProfilingBackend& prof, const ProfilingComm& comm,
                   const ProfilingGradReducer& reducer, double seconds, int64_t steps) {
    const double step_ms = 1e3 * seconds / static_cast<double>(steps);
    const bool device = prof.clock() == ProfileClock::Device;
    std::printf("profile: per step (%lld timed steps), %.3f ms in all; %s\n",
                static_cast<long long>(steps), step_ms,
                device ? "clock: device (two marks on the queue per op, no wait; "
                         "CTX_PROFILE_SYNC=1 waits after each op)"
                       : "clock: host (a device backend waits after each op)");
    std::printf("  %-30s %-34s %7s %9s %6s %8s\n", "op", "shape", "calls", "ms", "share",
                "GFLOP/s");
    auto row = [&](const std::string& op, const std::string& shape, double calls, double ms,
                   double flops_per_s) {
        std::printf("  %-30s %-34s %7.1f %9.3f %5.1f%% ", op.c_str(), shape.c_str(), calls, ms,
                    100.0 * ms / step_ms);
        if (flops_per_s > 0) std::printf("%8.1f\n", flops_per_s / 1e9);
        else std::printf("%8s\n", "-");
    };
    for (const OpProfileRow& r : prof.rows())
        row(r.op, r.shape, double(r.calls) / double(steps), 1e3 * r.seconds / double(steps),
            r.seconds > 0 ? r.flops / r.seconds : 0);
    double ops_ms = 1e3 * prof.total_seconds() / double(steps);
    // Data parallel under mpirun: the gradient reducer's calls (its all-reduce overlaps the
    // backward pass; these are what the step waits for) and the other collectives (loss, tokens).
    for (const auto* rows : {&reducer.rows(), &comm.rows()}) {
        for (const auto& [key, r] : *rows) {
            const double ms = 1e3 * r.seconds / double(steps);
            const size_t space = key.find(' ');
            row("comm: " + key.substr(0, space),
                space == std::string::npos ? "" : key.substr(space + 1),
                double(r.calls) / double(steps), ms, 0);
            ops_ms += ms;
        }
    }
    if (device)
        row("(device idle between ops)", "launches, host work not hidden", 0, step_ms - ops_ms, 0);
    else
        row("(outside the backend)", "host: sampling, bookkeeping", 0, step_ms - ops_ms, 0);
}

// Under mpirun every rank trains its own batches (data parallel, the gradient all-reduce of
// training); tokens/s and the peak are the world's, rank 0 prints.
int run_train_bench(const TrainArgs& o, PluginRegistry& registry, Comm& world) {
    const BenchConfig& bc = kConfigs.at(o.config);
    auto backend = open_bench_backend(o.device, o.precision, o.threads);
    const bool cpu = backend->kind() == DeviceKind::CPU;
    const int used_threads = o.threads > 0 ? o.threads : omp_get_max_threads();
    const int B = o.batch > 0 ? o.batch : bc.batch;
    const int T = o.seq > 0 ? o.seq : bc.seq;
    const std::string pe_name = o.pe.empty() ? bc.pe : o.pe;

    ModelConfig c;
    c.n_layer = bc.n_layer;
    c.d_model = bc.d_model;
    c.n_head = bc.n_head;
    c.vocab_size = bc.vocab;
    c.context_length = T;
    std::unique_ptr<PePlugin> pe;
    if (pe_name != "none") {
        ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                            c.n_layer, c.vocab_size, c.context_length};
        Options none;  // defaults
        pe = std::make_unique<PePlugin>(registry.get("pe/" + pe_name), info, none, 1);
    }
    // --profile: the model runs on a timing wrapper of the backend.
    std::unique_ptr<ProfilingBackend> profiler;
    if (o.profile) profiler = std::make_unique<ProfilingBackend>(*backend);
    Backend& model_backend = profiler ? static_cast<Backend&>(*profiler) : *backend;
    // --tp: the model split over tensor-parallel groups, data parallel over the rest
    ParallelGrid grid(world, GridShape{o.tp, o.cp});
    Model model(c, model_backend, std::move(pe), 1, o.tp > 1 ? &grid.tp_group() : nullptr);
    model.set_sequence_parallel(o.sequence_parallel);
    model.set_context_parallel(o.cp > 1 ? &grid.cp_group() : nullptr);
    model.set_attention_choice(o.attention);
    model.reserve(B, T);
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
    TokenStream batches(source, 1, grid.dp_rank());  // a tensor-parallel group shares rows
    // --profile: the data-parallel collectives run through a timing wrapper too.
    ProfilingComm profiled_comm(grid.dp_group());
    Comm& comm = o.profile ? static_cast<Comm&>(profiled_comm) : grid.dp_group();
    // The gradient reducer training would make, kept across the calls (and timed with --profile);
    // made on the backend itself, not its timing wrapper (NCCL's needs the CUDA backend's stream).
    // gradients are summed over every rank holding the same parameters (dp x cp)
    auto reducer = make_grad_reducer(*backend, grid.dp_cp_group(), GradReduceOptions{});
    ProfilingGradReducer profiled_reducer(*reducer);
    TrainOptions t;
    t.reducer = o.profile ? static_cast<GradReducer*>(&profiled_reducer) : reducer.get();
    t.batch_size = B;
    t.seq_len = T;
    t.log_every = 0;
    t.world = &world;
    if (o.warmup > 0) {
        t.steps = o.warmup;
        train(model, opt, batches, t, comm);
    }
    std::string note;
    // Every rank measures its cores at the same time (their FMA peaks add up).
    world.barrier();
    double peak = mfu_peak(o, *backend, used_threads, &note);
    if (world.size() > 1 && o.peak_flops <= 0) {
        world.allreduce_sum(&peak, 1);
        note = fmt::format("{} ranks, rank 0: {}", world.size(), note);
    }
    // Timed here rather than by train(): a GPU step's last kernels (AdamW) are still queued when
    // train() returns, so the clock stops after a synchronising copy of one parameter.
    float sync = 0;
    backend->copy_to_host(&sync, model.params().data(), 1);
    if (profiler) profiler->reset();
    profiled_comm.reset();
    profiled_reducer.reset();
    const auto t0 = std::chrono::steady_clock::now();
    t.steps = o.steps;
    const uint64_t waits0 = backend->host_waits();
    const TrainResult r = train(model, opt, batches, t, comm);
    const uint64_t waits = backend->host_waits() - waits0;
    backend->copy_to_host(&sync, model.params().data(), 1);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = static_cast<double>(o.steps) * B * T * grid.dp() / seconds;
    const double flops = tokens_per_s * model.flops_per_token(T);
    // per rank: this rank's part of the model state, and the largest peak RSS of any rank
    const double state_mib = 16.0 * static_cast<double>(model.layout().total()) / (1 << 20);
    double rss[1] = {0};
    const double my_rss = peak_rss_mib();
    std::vector<double> all_rss(world.size());
    world.allgather(&my_rss, sizeof my_rss, all_rss.data());
    for (double x : all_rss) rss[0] = std::max(rss[0], x);
    // the device peak of the busiest rank (the backends' allocations on its GPU)
    const double my_dev = static_cast<double>(backend->device_memory().peak) / double(1 << 20);
    std::vector<double> all_dev(world.size());
    world.allgather(&my_dev, sizeof my_dev, all_dev.data());
    const double dev_peak = *std::max_element(all_dev.begin(), all_dev.end());
    if (world.rank() != 0) return 0;

    std::printf("config=%s params=%zu L=%d C=%d H=%d V=%d T=%d B=%d pe=%s\n", o.config.c_str(),
                model.num_params(), c.n_layer, c.d_model, c.n_head, c.vocab_size, T, B,
                pe_name.c_str());
    std::printf("device=%s precision=%s attention=%s threads=%d ranks=%d steps=%lld warmup=%lld\n",
                backend->name().c_str(), precision_name(backend->precision()),
                attention_mode_name(model.attention_mode()), used_threads, world.size(),
                static_cast<long long>(o.steps), static_cast<long long>(o.warmup));
    std::printf("grid=%s%s\n", grid.describe().c_str(),
                model.sequence_parallel() ? ", sequence parallel" : "");
    if (!cpu && !o.precision_given)
        std::printf("hint: fp32 (the default) runs the matrix products without tensor cores or "
                    "TF32; --precision bf16 measures the tensor-core path (MFU then against the "
                    "bf16 peak)\n");
    std::printf("step_s=%.4f\n", seconds / static_cast<double>(o.steps));
    std::printf("tokens_per_s=%.1f\n", tokens_per_s);
    std::printf("flops_per_token=%.4g (6N + 6LCT)\n", model.flops_per_token(T));
    std::printf("gflops=%.2f\n", flops / 1e9);
    std::printf("tflops=%.4g\n", flops / 1e12);
    if (peak > 0)
        std::printf("mfu=%.4f (peak %.4g TFLOP/s: %s)\n", flops / peak, peak / 1e12, note.c_str());
    else
        std::printf("mfu=n/a (%s; pass --peak-tflops)\n", note.c_str());
    // Parameters, gradients and the two AdamW moments, fp32: 16 bytes per parameter.
    std::printf("model_state_mib=%.1f per rank (params, grads, AdamW m and v; whole model %.1f)\n",
                state_mib, 16.0 * static_cast<double>(model.num_params()) / (1 << 20));
    if (cpu)
        std::printf("peak_memory_mib=%.1f (largest process peak RSS of the ranks)\n", rss[0]);
    else
        std::printf("peak_memory_mib=%.1f (device: the backend's allocations at their peak, the "
                    "largest of the ranks; without the CUDA context and cuBLAS workspaces; host "
                    "peak RSS %.1f MiB)\n", dev_peak, rss[0]);
    std::printf("final_loss=%.4f\n", r.steps.back().loss);
    if (!cpu)  // rank 0's; the profile's own timing waits (CTX_PROFILE_SYNC) included
        std::printf("host_waits_per_step=%.1f (synchronisations and readbacks; a step needs 2: "
                    "its losses and the gradient norm)\n",
                    static_cast<double>(waits) / static_cast<double>(o.steps));
    if (profiler) print_profile(*profiler, profiled_comm, profiled_reducer, seconds, o.steps);
    return 0;
}

int run_bench_peak(const std::vector<std::string>& args) {
    std::string gpu;
    double cc = 0, clock = 0;
    int64_t sms = 0;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> std::string {
            CTX_CHECK(i + 1 < args.size(), "bench peak: {} needs a value", a);
            return args[++i];
        };
        if (a == "--help" || a == "-h") {
            peak_usage();
            return 0;
        } else if (a == "--gpu") gpu = value();
        else if (a == "--cc") cc = bench_parse_double(a, value());
        else if (a == "--sm") sms = bench_parse_int(a, value());
        else if (a == "--clock-mhz") clock = bench_parse_double(a, value());
        else fail("bench peak: unknown argument '{}' (see ctxengine bench peak --help)", a);
    }
    auto show = [](const DevicePeak& p) {
        std::printf("bf16_dense_tflops=%.1f fp32_tflops=%.1f (%s)\n", p.bf16 / 1e12, p.fp32 / 1e12,
                    p.source.c_str());
    };
    if (cc > 0 || sms > 0 || clock > 0) {
        CTX_CHECK(cc > 0 && sms > 0 && clock > 0,
                  "bench peak: an estimate needs --cc, --sm and --clock-mhz together");
        const int major = static_cast<int>(cc), minor = static_cast<int>(std::lround((cc - major) * 10));
        const DevicePeak p = gpu_peak_estimate(major, minor, static_cast<int>(sms), clock);
        CTX_CHECK(!p.source.empty(), "bench peak: no per-SM rates for compute capability {}.{}",
                  major, minor);
        show(p);
        return 0;
    }
    if (!gpu.empty()) {
        const DevicePeak p = gpu_peak_from_table(gpu);
        CTX_CHECK(!p.source.empty(), "bench peak: '{}' is not in the peak table (see bench peak; "
                  "estimate with --cc/--sm/--clock-mhz or pass --peak-tflops to bench)", gpu);
        show(p);
        return 0;
    }
    for (const char* name : {"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                             "NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB"}) {
        std::printf("%-24s ", name);
        show(gpu_peak_from_table(name));
    }
    return 0;
}

}  // namespace

int64_t bench_parse_int(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used == v.size()) return x;
    } catch (...) {
    }
    fail("{} expects an integer, got '{}'", flag, v);
}

double bench_parse_double(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used == v.size() && std::isfinite(x)) return x;
    } catch (...) {
    }
    fail("{} expects a number, got '{}'", flag, v);
}

std::vector<std::string> bench_split_list(const std::string& v) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= v.size()) {
        const size_t comma = v.find(',', start);
        const size_t end = comma == std::string::npos ? v.size() : comma;
        out.push_back(v.substr(start, end - start));
        CTX_CHECK(!out.back().empty(), "empty entry in the list '{}'", v);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

double peak_rss_mib() {
    rusage u{};
    if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
    return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

double cpu_peak_flops(int threads, std::string* note) {
    double mhz = 0;
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    const std::regex mhz_re(R"(^cpu MHz\s*:\s*([0-9.]+))");
    std::smatch m;
    while (mhz <= 0 && std::getline(cpuinfo, line))
        if (std::regex_search(line, m, mhz_re)) mhz = std::stod(m[1]);
    if (mhz <= 0) mhz = 2000;
    // What the cores really sustain: the nominal clock is often the base clock, far from the one
    // FMA chains run at (cpu_peak.h).
    const cpu::FmaPeak measured = cpu::measure_fma_peak(threads);
    if (measured.flops > 0) {
        if (note)
            *note = fmt::format("{} threads x {:.1f} GFLOP/s, measured {} FMA throughput ({:.2f} "
                                "GHz x {} FLOP/cycle; /proc/cpuinfo says {:.0f} MHz)",
                                threads, measured.per_thread / 1e9, measured.isa, measured.ghz,
                                measured.flops_per_cycle, mhz);
        return measured.flops;
    }
    // Nothing to measure means no AVX2 FMA (cpu_features): 4-lane SSE, a multiply and an add
    // pipe, 16 FP32 FLOPs per cycle per core.
    const double flops_per_cycle = 16;
    if (note)
        *note = fmt::format("{} threads x {:.0f} MHz x {} FLOP/cycle (SSE), clock estimate",
                            threads, mhz, flops_per_cycle);
    return threads * mhz * 1e6 * flops_per_cycle;
}

DevicePeak gpu_peak_from_table(const std::string& gpu_name) {
    // NVIDIA datasheets, dense (the sparsity figures halved), boost clock. Matched by substring
    // in this order, so the more specific names come first ("H100 PCIe" before "H100").
    struct Entry {
        const char* key;
        const char* label;
        double bf16_tflops, fp32_tflops;
    };
    static const Entry kTable[] = {
        {"H100 PCIe", "H100 PCIe", 756.0, 51.0},
        {"H100 NVL", "H100 NVL", 835.5, 60.0},
        {"GH200", "GH200 (H100 SXM class)", 989.4, 66.9},
        {"H200 NVL", "H200 NVL", 835.5, 60.0},
        {"H200", "H200 SXM (same compute as H100 SXM)", 989.4, 66.9},
        {"H100", "H100 SXM", 989.4, 66.9},
        {"A100", "A100", 312.0, 19.5},
    };
    DevicePeak p;
    for (const Entry& e : kTable)
        if (gpu_name.find(e.key) != std::string::npos) {
            p.bf16 = e.bf16_tflops * 1e12;
            p.fp32 = e.fp32_tflops * 1e12;
            p.source = fmt::format("datasheet: {}", e.label);
            return p;
        }
    return p;
}

DevicePeak gpu_peak_estimate(int cc_major, int cc_minor, int sm_count, double clock_mhz) {
    // Dense FLOP per clock per SM (an FMA is 2 FLOPs): bf16 tensor cores with fp32 accumulation,
    // and the fp32 FMA pipes. A100: 108 SMs x 1410 MHz x 2048 = 312 TFLOP/s; H100 SXM: 132 x
    // 1830 x 4096 = 989 TFLOP/s. GeForce parts of sm_86/sm_89 run bf16 at half the rate given.
    int bf16 = 0, fp32 = 0;
    const int cc = cc_major * 10 + cc_minor;
    if (cc == 70 || cc == 72 || cc == 75) fp32 = 128;  // no bf16 tensor cores
    else if (cc == 80) bf16 = 2048, fp32 = 128;
    else if (cc == 86 || cc == 87 || cc == 89) bf16 = 1024, fp32 = 256;
    else if (cc == 90) bf16 = 4096, fp32 = 256;
    else if (cc == 100) bf16 = 8192, fp32 = 256;
    DevicePeak p;
    if (fp32 == 0 || sm_count <= 0 || clock_mhz <= 0) return p;
    const double per_s = static_cast<double>(sm_count) * clock_mhz * 1e6;
    p.bf16 = per_s * bf16;
    p.fp32 = per_s * fp32;
    p.estimated = true;
    p.source = fmt::format("estimated: {} SMs x {:.0f} MHz x {}/{} FLOP/clock/SM (sm_{}{})",
                           sm_count, clock_mhz, bf16, fp32, cc_major, cc_minor);
    return p;
}

GpuIdentity parse_cuda_backend_name(const std::string& backend_name) {
    GpuIdentity id;
    static const std::regex re(R"(\((.*), sm_([0-9]+)([0-9]),)");
    std::smatch m;
    if (std::regex_search(backend_name, m, re)) {
        id.name = m[1];
        id.cc_major = std::stoi(m[2]);
        id.cc_minor = std::stoi(m[3]);
    }
    return id;
}

DevicePeak device_peak(const Backend& backend, int threads) {
    DevicePeak p;
    if (backend.kind() == DeviceKind::CPU) {
        p.fp32 = cpu_peak_flops(threads, &p.source);
        p.estimated = p.source.find("measured") == std::string::npos;
        return p;
    }
    const GpuIdentity id = parse_cuda_backend_name(backend.name());
    p = gpu_peak_from_table(id.name);
    if (p.source.empty())
        p.source = fmt::format("GPU '{}' (sm_{}{}) is not in the peak table, and the Backend "
                               "interface gives no SM count and clock to estimate it from",
                               id.name, id.cc_major, id.cc_minor);
    return p;
}

std::unique_ptr<Backend> open_bench_backend(DeviceChoice device, Precision precision,
                                            int threads) {
    const DeviceKind kind = resolve_device(device);
    check_precision(kind, precision);
    if (kind == DeviceKind::CUDA) return make_cuda_backend(cuda_device_for_this_rank(), precision);
    return make_cpu_backend(threads);
}

int run_bench(const std::vector<std::string>& args, PluginRegistry& registry, int threads,
              Comm& world) {
    if (!args.empty() && args[0] == "attention")
        return run_bench_attention({args.begin() + 1, args.end()}, registry, threads);
    TrainArgs o;
    try {
        if (!args.empty() && args[0] == "peak") return run_bench_peak({args.begin() + 1, args.end()});
        o = parse_train_args(args, threads);
    } catch (const Error& e) {
        std::fprintf(stderr, "ctxengine bench: %s\n", e.what());
        return kExitUsage;
    }
    if (o.help) {
        usage();
        return 0;
    }
    return run_train_bench(o, registry, world);
}

}  // namespace ctx
