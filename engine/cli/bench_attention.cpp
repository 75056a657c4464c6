// `ctxengine bench attention`: times attention_forward / attention_backward (with the PE's rotary
// and bias work) through the Backend interface on random q, k, v, and reports ms, TFLOP/s in the
// FlashAttention-2 convention and each PE's overhead over no PE. docs/BENCHMARKS.md.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "backend/operand.h"
#include "cli/bench.h"
#include "core/error.h"
#include "core/options.h"
#include "core/rng.h"
#include "plugin/pe_plugin.h"

namespace ctx {
namespace {

constexpr int kExitUsage = 2;

void usage() {
    std::printf(
        "usage: ctxengine bench attention [--device auto|cpu|cuda] [--head-dim D[,D...]]\n"
        "           [--T T[,T...]] [--pe NAME[,NAME...]] [--mode auto|flash|materialised[,...]]\n"
        "           [--batch B] [--heads H] [--steps N] [--warmup N] [--repeats N] [--threads N]\n"
        "           [--precision fp32|bf16]\n\n"
        "Times causal attention forward and backward through the backend on random q, k, v\n"
        "(B, T, 3 H D), for every head dim x T x mode x PE. A PE adds its rotation (rope:\n"
        "inside the attention calls where the backend fuses it, else rotary_forward /\n"
        "rotary_backward) or its bias (alibi: fixed slopes; kerple_log: learned, with\n"
        "parameter gradients) exactly as the model calls them. FLOPs (FlashAttention-2\n"
        "convention, causal): fwd = 4 B H T^2 D / 2, bwd = 2.5 x fwd, fwd+bwd = 3.5 x fwd.\n"
        "Defaults on CUDA: --head-dim 64,128 --T 1024,2048,4096,8192,16384, B = 16384 / T,\n"
        "H = 2048 / D (16k tokens of d_model 2048, as in the FlashAttention-2 paper),\n"
        "--steps 10. On the CPU: --head-dim 64 --T 256,512 --batch 1 --heads 4 --steps 3.\n"
        "--pe defaults to none,rope,alibi,kerple_log,t5_bias; --mode to auto (the backend's "
        "choice).\n"
        "--precision bf16 (CUDA): the bf16 backend, whose flash kernels run on tensor cores.\n"
        "Times are the best of --repeats (3) loops of --steps calls, per phase.\n");
}

struct AttnArgs {
    DeviceChoice device = DeviceChoice::Auto;
    std::vector<int> head_dims, Ts;
    std::vector<std::string> pes{"none", "rope", "alibi", "kerple_log", "t5_bias"};
    std::vector<std::string> modes{"auto"};
    int batch = 0, heads = 0;  // 0: per-device default
    int64_t steps = 0, warmup = 1;  // steps 0: per-device default
    int repeats = 3;
    int threads = 0;
    Precision precision = Precision::Fp32;
    bool help = false;
};

std::vector<int> parse_int_list(const std::string& flag, const std::string& v) {
    std::vector<int> out;
    for (const std::string& s : bench_split_list(v)) {
        const int64_t x = bench_parse_int(flag, s);
        CTX_CHECK(x > 0 && x <= (1 << 20), "{} expects positive sizes, got {}", flag, x);
        out.push_back(static_cast<int>(x));
    }
    return out;
}

AttnArgs parse_args(const std::vector<std::string>& args, int threads) {
    AttnArgs o;
    o.threads = threads;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> std::string {
            CTX_CHECK(i + 1 < args.size(), "bench attention: {} needs a value", a);
            return args[++i];
        };
        if (a == "--help" || a == "-h") o.help = true;
        else if (a == "--device") o.device = device_choice_from_name(value());
        else if (a == "--head-dim") o.head_dims = parse_int_list(a, value());
        else if (a == "--T") o.Ts = parse_int_list(a, value());
        else if (a == "--pe") o.pes = bench_split_list(value());
        else if (a == "--mode") o.modes = bench_split_list(value());
        else if (a == "--batch") o.batch = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--heads") o.heads = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--steps") o.steps = bench_parse_int(a, value());
        else if (a == "--warmup") o.warmup = bench_parse_int(a, value());
        else if (a == "--repeats") o.repeats = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--threads") o.threads = static_cast<int>(bench_parse_int(a, value()));
        else if (a == "--precision") o.precision = precision_from_name(value());
        else fail("bench attention: unknown argument '{}' (see ctxengine bench attention --help)", a);
    }
    for (const std::string& m : o.modes)
        CTX_CHECK(m == "auto" || m == "flash" || m == "materialised",
                  "bench attention: unknown --mode '{}' (expected auto, flash or materialised)", m);
    CTX_CHECK(o.batch >= 0 && o.heads >= 0, "bench attention: --batch and --heads must be positive");
    CTX_CHECK(o.steps >= 0 && o.warmup >= 0, "bench attention: --steps and --warmup must be >= 0");
    CTX_CHECK(o.repeats > 0, "bench attention: --repeats must be > 0");
    return o;
}

// One device buffer, freed on every exit (a case that runs out of memory frees what it had).
struct DeviceBuffer {
    Backend* be = nullptr;
    float* p = nullptr;
    size_t n = 0;
    DeviceBuffer(Backend& backend, size_t count) : be(&backend), n(count) {
        p = be->alloc_floats(n);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() {
        if (p) be->free_floats(p);
    }
};

// Random N(0, 1) values onto the device.
void fill_normal(Backend& be, float* dst, size_t n, Rng& rng) {
    std::vector<float> host(n);
    for (float& x : host) x = static_cast<float>(rng.normal());
    be.copy_to_device(dst, host.data(), n);
}

// What a PE contributes to attention, set up as the model does it (decoder.cpp bias_spec):
// plugin parameters on the device with gradient buffers, fixed slopes as the plugin's host array.
struct PeSetup {
    std::unique_ptr<PePlugin> plugin;
    std::vector<std::unique_ptr<DeviceBuffer>> params, grads;
    bool rotary = false;
    RotarySpec rot;
    BiasSpec bias;
};

std::unique_ptr<PeSetup> make_pe(const std::string& name, PluginRegistry& registry, Backend& be,
                                 int T, int D, int H) {
    auto s = std::make_unique<PeSetup>();
    if (name == "none") return s;
    ctx_model_info info{sizeof(ctx_model_info), H * D, H, D, 1, 256, T};
    Options none;  // the plugin's defaults
    s->plugin = std::make_unique<PePlugin>(registry.get("pe/" + name), info, none, 1);
    PePlugin& pe = *s->plugin;
    // Parameters: initialised on the host by the plugin's declarations, then copied.
    std::vector<std::vector<float>> host;
    std::vector<ctx_tensor> tensors;
    for (const PeParamDecl& d : pe.params()) {
        size_t n = 1;
        for (int64_t e : d.shape) n *= static_cast<size_t>(e);
        host.emplace_back(n, 0.0f);
        ctx_tensor t{};
        t.dtype = CTX_F32;
        t.ndim = static_cast<int32_t>(d.shape.size());
        for (int i = 0; i < 4; ++i) t.shape[i] = i < t.ndim ? d.shape[i] : 1;
        tensors.push_back(t);
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = host[i].data();  // host is final
    Rng rng(7);
    pe.init_params(tensors, rng);
    for (const auto& h : host) {
        s->params.push_back(std::make_unique<DeviceBuffer>(be, h.size()));
        be.copy_to_device(s->params.back()->p, h.data(), h.size());
        s->grads.push_back(std::make_unique<DeviceBuffer>(be, h.size()));
    }
    if (pe.has(CTX_PE_HOOK_ROTARY)) {
        s->rotary = true;
        s->rot = pe.rotary_spec(T);
    }
    if (pe.has(CTX_PE_HOOK_BIAS)) {
        const ctx_bias_spec c = pe.bias_spec(T);
        CTX_CHECK(c.kind != CTX_BIAS_GENERIC,
                  "bench attention: pe/{} has a generic bias (a (B, H, T, T) table the host "
                  "builds through the plugin); only the backend's bias kinds are benchmarked",
                  name);
        s->bias.kind = static_cast<BiasKind>(c.kind);
        s->bias.num_buckets = c.num_buckets;
        s->bias.max_distance = c.max_distance;
        auto param = [&](int32_t i) { return i >= 0 ? s->params.at(i)->p : nullptr; };
        auto grad = [&](int32_t i) { return i >= 0 ? s->grads.at(i)->p : nullptr; };
        s->bias.a = c.param_a >= 0 ? param(c.param_a) : c.slopes;
        s->bias.da = grad(c.param_a);
        s->bias.b = param(c.param_b);
        s->bias.db = grad(c.param_b);
    }
    return s;
}

// Buffers of one (B, T, H, D, mode) shape, shared by the PEs run on it.
struct CaseBuffers {
    DeviceBuffer qkv, dqkv, out, dout, saved, scratch, positions;
    CaseBuffers(Backend& be, int B, int T, int C, int H, AttentionMode mode)
        : qkv(be, size_t(B) * T * 3 * C),   // (B, T, 3C)
          dqkv(be, size_t(B) * T * 3 * C),  // (B, T, 3C)
          out(be, size_t(B) * T * C),       // (B, T, C)
          dout(be, size_t(B) * T * C),      // (B, T, C)
          saved(be, be.attention_saved_floats(mode, B, T, C, H)),
          scratch(be, be.attention_scratch_floats(B, T, C, H, mode)),
          positions(be, size_t(B) * T) {}  // (B, T)
    double mib() const {
        const size_t n = qkv.n + dqkv.n + out.n + dout.n + saved.n + scratch.n + positions.n;
        return static_cast<double>(n) * sizeof(float) / (1 << 20);
    }
};

// One PE's calls on one shape, as a training step makes them: the rotation inside the attention
// calls where the backend fuses it (opt.rotary), else rotary ops in place on qkv (a rotation: the
// values stay bounded however often they run), the output in bf16 where the
// backend keeps it so (Backend::attention_out_bf16, as the model does), the backward writes dqkv
// (GradStore::Overwrite, as the model's layers ask) and adds into the bias gradients.
struct Case {
    Backend& be;
    CaseBuffers& buf;
    const PeSetup& pe;
    AttentionOptions opt;
    int B, T, C, H;
    bool separate_rotary;  // pe.rotary and not fused (opt.rotary null)
    void forward() {
        const float* pos = buf.positions.p;
        if (separate_rotary) be.rotary_forward(buf.qkv.p, pos, B, T, C, H, pe.rot);
        attention_forward(be, out(), buf.saved.p, buf.qkv.p, pos, B, T, C, H, opt);
    }
    void backward() {
        const float* pos = buf.positions.p;
        attention_backward(be, buf.dqkv.p, buf.scratch.p, buf.dout.p, buf.qkv.p, buf.saved.p, out(),
                           pos, B, T, C, H, opt);
        if (separate_rotary) be.rotary_backward(buf.dqkv.p, pos, B, T, C, H, pe.rot);
    }
    Operand out() {
        return be.attention_out_bf16(opt.mode)
                   ? Operand::in_bf16(reinterpret_cast<Bf16*>(buf.out.p))
                   : Operand(buf.out.p);
    }
    // A synchronisation point: CUDA ops return before their kernels finish, copy_to_host waits
    // for the backend's stream.
    void sync() {
        float sink = 0;
        be.copy_to_host(&sink, buf.out.p, 1);
    }
    // Mean ms of `steps` forward calls, then of `steps` backward calls on the last forward's
    // results, each loop between two synchronisation points.
    std::pair<double, double> time(int64_t steps) {
        using clock = std::chrono::steady_clock;
        auto ms = [](clock::time_point a, clock::time_point b) {
            return std::chrono::duration<double, std::milli>(b - a).count();
        };
        be.zero(buf.dqkv.p, buf.dqkv.n);  // another PE's gradients (and NaNs) must not carry over
        sync();
        const auto t0 = clock::now();
        for (int64_t s = 0; s < steps; ++s) forward();
        sync();
        const auto t1 = clock::now();
        for (int64_t s = 0; s < steps; ++s) backward();
        sync();
        const auto t2 = clock::now();
        return {ms(t0, t1) / double(steps), ms(t1, t2) / double(steps)};
    }
    // The results must be numbers: a kernel that wrote NaN or skipped work would time too well.
    bool finite() {
        return std::isfinite(be.sum_squares(buf.out.p, buf.out.n)) &&
               std::isfinite(be.sum_squares(buf.dqkv.p, buf.dqkv.n));
    }
};

AttentionMode mode_of(const std::string& m, const Backend& be, int T, int C, int H) {
    if (m == "flash") return AttentionMode::Flash;
    if (m == "materialised") return AttentionMode::Materialised;
    return be.attention_mode_auto(T, C, H);
}

// The PEs of one shape and mode: each set up and warmed up, then timed round-robin `repeats`
// times (so every PE sees the same load on a shared machine) keeping each phase's best mean.
// Prints one row per PE; returns the number of failed rows.
template <class RowPrefix>
int run_group(Backend& be, PluginRegistry& registry, CaseBuffers& buf, const AttnArgs& a,
              AttentionMode mode, int B, int T, int D, int H, int64_t steps,
              const RowPrefix& row_prefix) {
    const int C = H * D;
    const size_t n = a.pes.size();
    std::vector<std::unique_ptr<PeSetup>> pes(n);
    std::vector<std::unique_ptr<Case>> cases(n);
    std::vector<std::string> errors(n);
    std::vector<double> fwd(n, INFINITY), bwd(n, INFINITY);
    std::vector<char> finite(n, 1);
    auto guarded = [&](size_t i, auto&& f) {
        if (!errors[i].empty()) return;
        try {
            f();
        } catch (const Error& e) {
            errors[i] = e.what();
        }
    };
    for (size_t i = 0; i < n; ++i)
        guarded(i, [&] {
            pes[i] = make_pe(a.pes[i], registry, be, T, D, H);
            AttentionOptions opt;
            opt.mode = mode;
            opt.bias = pes[i]->bias;
            opt.dqkv_store = GradStore::Overwrite;
            const PeSetup& pe = *pes[i];
            const bool fused = pe.rotary && be.attention_fuses_rotary(mode, C, H, pe.rot);
            if (fused) opt.rotary = &pe.rot;
            cases[i] =
                std::make_unique<Case>(Case{be, buf, pe, opt, B, T, C, H, pe.rotary && !fused});
            for (int64_t s = 0; s < a.warmup; ++s) cases[i]->forward(), cases[i]->backward();
        });
    for (int rep = 0; rep < a.repeats; ++rep)
        for (size_t i = 0; i < n; ++i)
            guarded(i, [&] {
                const auto [f, b] = cases[i]->time(steps);
                fwd[i] = std::min(fwd[i], f);
                bwd[i] = std::min(bwd[i], b);
                if (rep + 1 == a.repeats) finite[i] = cases[i]->finite();
            });
    const double fwd_flops = 4.0 * B * H * double(T) * T * D / 2.0;
    double none_ms = 0;
    for (size_t i = 0; i < n; ++i)
        if (a.pes[i] == "none" && errors[i].empty()) none_ms = fwd[i] + bwd[i];
    int failures = 0;
    for (size_t i = 0; i < n; ++i) {
        row_prefix(a.pes[i]);
        if (!errors[i].empty()) {
            ++failures;
            std::printf("error: %s\n", errors[i].c_str());
            continue;
        }
        const double total = fwd[i] + bwd[i];
        const std::string vs = a.pes[i] == "none" || none_ms <= 0
                                   ? "-"
                                   : fmt::format("{:+.1f}%", 100.0 * (total / none_ms - 1));
        std::printf("%9.3f %9.3f %9.3f %8.4g %8.4g %8.4g %8s %9.1f%s\n", fwd[i], bwd[i], total,
                    fwd_flops / (fwd[i] * 1e9), 2.5 * fwd_flops / (bwd[i] * 1e9),
                    3.5 * fwd_flops / (total * 1e9), vs.c_str(), buf.mib(),
                    finite[i] ? "" : "  NON-FINITE RESULTS");
        if (!finite[i]) ++failures;
    }
    std::fflush(stdout);
    return failures;
}

int run(const AttnArgs& a, PluginRegistry& registry) {
    auto backend = open_bench_backend(a.device, a.precision, a.threads);
    Backend& be = *backend;
    const bool cpu = be.kind() == DeviceKind::CPU;
    const std::vector<int> head_dims = !a.head_dims.empty() ? a.head_dims
                                       : cpu ? std::vector<int>{64} : std::vector<int>{64, 128};
    const std::vector<int> Ts = !a.Ts.empty() ? a.Ts
                                : cpu ? std::vector<int>{256, 512}
                                      : std::vector<int>{1024, 2048, 4096, 8192, 16384};
    const int64_t steps = a.steps > 0 ? a.steps : (cpu ? 3 : 10);
    for (const std::string& p : a.pes) {  // unknown names fail before any timing
        if (p == "none") continue;
        try {
            (void)registry.get("pe/" + p);
        } catch (const Error& e) {
            std::fprintf(stderr, "ctxengine bench attention: --pe: %s\n", e.what());
            return kExitUsage;
        }
    }

    const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
    const DevicePeak peak = device_peak(be, threads);
    std::printf("attention benchmark: device=%s%s steps=%lld repeats=%d warmup=%lld (ms: best "
                "of the repeats' means)\n", be.name().c_str(),
                cpu ? fmt::format(" threads={}", threads).c_str() : "",
                static_cast<long long>(steps), a.repeats, static_cast<long long>(a.warmup));
    if (peak.fp32 > 0)
        std::printf("device peak: fp32 %.2f TFLOP/s, bf16 dense %s (%s)\n", peak.fp32 / 1e12,
                    peak.bf16 > 0 ? fmt::format("{:.1f} TFLOP/s", peak.bf16 / 1e12).c_str() : "n/a",
                    peak.source.c_str());
    else
        std::printf("device peak: unknown (%s)\n", peak.source.c_str());
    std::printf("FLOPs (FlashAttention-2 convention, causal): fwd = 4*B*H*T^2*D/2, bwd = 2.5 x "
                "fwd, fwd+bwd = 3.5 x fwd; rotary and bias work is not counted (it shows as "
                "lower TFLOP/s and as the overhead over none). Attention runs in %s.\n",
                be.precision() == Precision::Bf16
                    ? "bf16 (tensor cores; fp32 accumulation and softmax)"
                    : "fp32");
    std::printf("%-13s %4s %6s %4s %4s  %-12s %9s %9s %9s %8s %8s %8s %8s %9s\n", "mode", "D", "T",
                "B", "H", "pe", "fwd_ms", "bwd_ms", "total_ms", "fwd_TF", "bwd_TF", "total_TF",
                "vs_none", "alloc_MiB");
    int failures = 0;
    for (const int D : head_dims)
        for (const int T : Ts) {
            const int H = a.heads > 0 ? a.heads : (cpu ? 4 : std::max(1, 2048 / D));
            const int B = a.batch > 0 ? a.batch : (cpu ? 1 : std::max(1, 16384 / T));
            const int C = H * D;
            for (const std::string& mname : a.modes) {
                const AttentionMode mode = mode_of(mname, be, T, C, H);
                const char* mlabel = attention_mode_name(mode);
                auto row_prefix = [&](const std::string& pe) {
                    std::printf("%-13s %4d %6d %4d %4d  %-12s ", mlabel, D, T, B, H, pe.c_str());
                };
                if (!be.attention_mode_supported(mode, C, H)) {
                    for (const std::string& p : a.pes) {
                        row_prefix(p);
                        std::printf("unsupported by this backend for head dim %d\n", D);
                    }
                    continue;
                }
                std::unique_ptr<CaseBuffers> buf;
                try {
                    buf = std::make_unique<CaseBuffers>(be, B, T, C, H, mode);
                    Rng rng(1234);
                    fill_normal(be, buf->qkv.p, buf->qkv.n, rng);
                    fill_normal(be, buf->dout.p, buf->dout.n, rng);
                    std::vector<float> pos(size_t(B) * T);  // (B, T): 0 .. T-1 per row
                    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<float>(i % T);
                    be.copy_to_device(buf->positions.p, pos.data(), pos.size());
                } catch (const Error& e) {
                    ++failures;
                    row_prefix("(all)");
                    std::printf("error: %s\n", e.what());
                    continue;
                }
                failures += run_group(be, registry, *buf, a, mode, B, T, D, H, steps, row_prefix);
            }
        }
    if (cpu) std::printf("peak_memory_mib=%.1f (process peak RSS)\n", peak_rss_mib());
    else
        std::printf("peak_memory_mib=%.1f (device: the backend's allocations at their peak over "
                    "all cases, scratch included; alloc_MiB is what this benchmark allocated per "
                    "case)\n", static_cast<double>(be.device_memory().peak) / double(1 << 20));
    return failures == 0 ? 0 : 1;
}

}  // namespace

int run_bench_attention(const std::vector<std::string>& args, PluginRegistry& registry,
                        int threads) {
    AttnArgs a;
    try {
        a = parse_args(args, threads);
    } catch (const Error& e) {
        std::fprintf(stderr, "ctxengine bench attention: %s\n", e.what());
        return kExitUsage;
    }
    if (a.help) {
        usage();
        return 0;
    }
    return run(a, registry);
}

}  // namespace ctx
