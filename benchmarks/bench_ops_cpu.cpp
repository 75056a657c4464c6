// Google Benchmark micro-benchmarks of the CPU backend's hot ops at the cpu-ref model's sizes
// (4 layers, C = 256, H = 8, vocab 4096, T = 256, B = 8, so N = B*T = 2048 rows).
//   bench_ops_cpu --benchmark_counters_tabular=true
// Times and rates are wall-clock (UseRealTime: the ops are multi-threaded).
// FLOP/s counters count useful multiply-adds as 2 FLOPs (causal attention: the lower triangle).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace {

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> backend = ctx::make_cpu_backend(0);  // all cores
    return *backend;
}

std::vector<float> randn(size_t n, float stddev = 1.0f, uint64_t seed = 1) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

void set_rate(benchmark::State& state, double flops_per_iter, double bytes_per_iter,
              int64_t items_per_iter) {
    state.counters["FLOP/s"] =
        benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate,
                           benchmark::Counter::kIs1000);
    state.SetBytesProcessed(int64_t(bytes_per_iter) * state.iterations());
    state.SetItemsProcessed(items_per_iter * state.iterations());
}

// ---------------------------------------------------------------- matmul (N, IC) @ (OC, IC)^T

void BM_MatmulForward(benchmark::State& state) {
    const int N = int(state.range(0)), IC = int(state.range(1)), OC = int(state.range(2));
    const auto inp = randn(size_t(N) * IC), W = randn(size_t(OC) * IC, 0.02f), bias = randn(OC);
    std::vector<float> out(size_t(N) * OC);
    for (auto _ : state) {
        cpu().matmul_forward(out.data(), inp.data(), W.data(), bias.data(), N, IC, OC);
        benchmark::DoNotOptimize(out.data());
    }
    set_rate(state, 2.0 * N * IC * OC, 4.0 * (double(N) * IC + double(OC) * IC + double(N) * OC),
             N);
}

void BM_MatmulBackward(benchmark::State& state) {
    const int N = int(state.range(0)), IC = int(state.range(1)), OC = int(state.range(2));
    const auto inp = randn(size_t(N) * IC), W = randn(size_t(OC) * IC, 0.02f),
               dout = randn(size_t(N) * OC);
    std::vector<float> dinp(size_t(N) * IC), dW(size_t(OC) * IC), dbias(OC);
    for (auto _ : state) {
        cpu().matmul_backward(dinp.data(), dW.data(), dbias.data(), dout.data(), inp.data(),
                              W.data(), N, IC, OC);
        benchmark::DoNotOptimize(dW.data());
    }
    set_rate(state, 4.0 * N * IC * OC,
             4.0 * (2.0 * N * IC + 2.0 * OC * IC + double(N) * OC), N);
}

// the cpu-ref layer's four dense layers and the LM head (weight-tied, vocab 4096)
#define MATMUL_SHAPES                                                                          \
    Args({2048, 256, 768})->Args({2048, 256, 256})->Args({2048, 256, 1024})                    \
        ->Args({2048, 1024, 256})->Args({2048, 256, 4096})->ArgNames({"N", "IC", "OC"})        \
        ->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(BM_MatmulForward)->MATMUL_SHAPES;
BENCHMARK(BM_MatmulBackward)->MATMUL_SHAPES;

// ---------------------------------------------------------------- attention

struct AttentionData {
    int B, T, C, H;
    std::vector<float> qkv, positions, out, att, dout, dqkv, scratch, a, b, da, db;
    ctx::AttentionOptions opt;  // att: the saved buffer (probabilities, or lse in flash mode)

    AttentionData(int B_, int T_, int C_, int H_, ctx::BiasKind kind,
                  ctx::AttentionMode mode = ctx::AttentionMode::Materialised)
        : B(B_), T(T_), C(C_), H(H_) {
        qkv = randn(size_t(B) * T * 3 * C);
        dout = randn(size_t(B) * T * C, 1.0f, 2);
        positions.resize(size_t(B) * T);
        for (int i = 0; i < B * T; i++) positions[i] = float(i % T);
        out.resize(size_t(B) * T * C);
        att.resize(ctx::attention_saved_floats(mode, B, T, H));
        dqkv.resize(qkv.size());
        scratch.resize(cpu().attention_scratch_floats(B, T, C, H, mode));
        opt.mode = mode;
        opt.bias.kind = kind;
        const int na = kind == ctx::BiasKind::T5 ? H * opt.bias.num_buckets : H;
        a.assign(na, 0.1f);
        b.assign(H, 0.5f);
        da.assign(na, 0.0f);
        db.assign(H, 0.0f);
        if (kind != ctx::BiasKind::None) {
            opt.bias.a = a.data();
            opt.bias.b = b.data();
            opt.bias.da = da.data();
            opt.bias.db = db.data();
        }
    }
    void forward() {
        cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H,
                                opt);
    }
    void backward() {
        cpu().attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                                 out.data(), positions.data(), B, T, C, H, opt);
    }
    // q.k and P.v over the causal lower triangle, 2 FLOPs per multiply-add
    double forward_flops() const { return 2.0 * 2.0 * B * H * (double(T) * (T + 1) / 2) * (C / H); }
};

void BM_AttentionForward(benchmark::State& state) {
    AttentionData d(8, 256, 256, 8, ctx::BiasKind(state.range(0)));
    for (auto _ : state) {
        d.forward();
        benchmark::DoNotOptimize(d.out.data());
    }
    set_rate(state, d.forward_flops(), 4.0 * (d.qkv.size() + d.att.size() + d.out.size()),
             int64_t(d.B) * d.T);
}

void BM_AttentionForwardBackward(benchmark::State& state) {
    AttentionData d(8, 256, 256, 8, ctx::BiasKind(state.range(0)));
    for (auto _ : state) {
        d.forward();
        d.backward();
        benchmark::DoNotOptimize(d.dqkv.data());
    }
    // backward does twice the forward's products (dP, dV, dQ, dK)
    set_rate(state, 3.0 * d.forward_flops(),
             4.0 * (2.0 * d.qkv.size() + 2.0 * d.att.size() + 2.0 * d.out.size()),
             int64_t(d.B) * d.T);
}

// range(0): ctx::BiasKind (0 none, 1 linear/ALiBi, 2 KERPLE log, 3 KERPLE power, 4 T5)
BENCHMARK(BM_AttentionForward)->DenseRange(0, 4)->ArgName("bias")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionForwardBackward)
    ->DenseRange(0, 4)
    ->ArgName("bias")
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// Materialised vs flash mode at long context: B = 1, H = 8, D = 64 (C = 512), ALiBi bias.
// range(0): ctx::AttentionMode (0 materialised, 1 flash), range(1): T. Flash trades the
// (B, H, T, T) saved probabilities for recomputing q k^T and the exponentials in backward.
void BM_AttentionModeForward(benchmark::State& state) {
    AttentionData d(1, int(state.range(1)), 512, 8, ctx::BiasKind::Linear,
                    ctx::AttentionMode(state.range(0)));
    for (auto _ : state) {
        d.forward();
        benchmark::DoNotOptimize(d.out.data());
    }
    set_rate(state, d.forward_flops(), 4.0 * (d.qkv.size() + d.att.size() + d.out.size()),
             int64_t(d.B) * d.T);
}

void BM_AttentionModeForwardBackward(benchmark::State& state) {
    AttentionData d(1, int(state.range(1)), 512, 8, ctx::BiasKind::Linear,
                    ctx::AttentionMode(state.range(0)));
    for (auto _ : state) {
        d.forward();
        d.backward();
        benchmark::DoNotOptimize(d.dqkv.data());
    }
    set_rate(state, 3.0 * d.forward_flops(),
             4.0 * (2.0 * d.qkv.size() + 2.0 * d.att.size() + 2.0 * d.out.size()),
             int64_t(d.B) * d.T);
}

#define ATTENTION_MODE_SHAPES                                                                   \
    ArgsProduct({{0, 1}, {512, 2048}})->ArgNames({"mode", "T"})->Unit(benchmark::kMillisecond)  \
        ->UseRealTime()
BENCHMARK(BM_AttentionModeForward)->ATTENTION_MODE_SHAPES;
BENCHMARK(BM_AttentionModeForwardBackward)->ATTENTION_MODE_SHAPES;

// ---------------------------------------------------------------- rotary, loss, layernorm, GELU

void BM_RotaryForward(benchmark::State& state) {
    const int B = 8, T = 256, C = 256, H = 8, dr = 32;
    auto qkv = randn(size_t(B) * T * 3 * C);
    std::vector<float> positions(size_t(B) * T), inv_freq(dr / 2);
    for (int i = 0; i < B * T; i++) positions[i] = float(i % T);
    for (int k = 0; k < dr / 2; k++) inv_freq[k] = float(std::pow(10000.0, -2.0 * k / dr));
    ctx::RotarySpec spec;
    spec.rotary_dims = dr;
    spec.inv_freq = inv_freq.data();
    for (auto _ : state) {
        cpu().rotary_forward(qkv.data(), positions.data(), B, T, C, H, spec);
        benchmark::DoNotOptimize(qkv.data());
    }
    state.SetBytesProcessed(int64_t(8.0 * B * T * 2 * C) * state.iterations());
    state.SetItemsProcessed(int64_t(B) * T * state.iterations());
}
BENCHMARK(BM_RotaryForward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CrossEntropyForwardBackward(benchmark::State& state) {
    const int N = int(state.range(0)), V = int(state.range(1));
    const auto logits = randn(size_t(N) * V, 2.0f);
    std::vector<float> work(logits.size()), losses(N), mask(N, 1.0f);
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; n++) targets[n] = (n * 7919) % V;
    for (auto _ : state) {
        state.PauseTiming();
        work = logits;
        state.ResumeTiming();
        cpu().crossentropy_forward_backward(work.data(), losses.data(), targets.data(),
                                            mask.data(), N, V, 1.0f / N);
        benchmark::DoNotOptimize(work.data());
    }
    state.SetBytesProcessed(int64_t(8.0 * N * V) * state.iterations());
    state.SetItemsProcessed(int64_t(N) * state.iterations());
}
BENCHMARK(BM_CrossEntropyForwardBackward)
    ->Args({2048, 4096})
    ->ArgNames({"N", "V"})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNormForwardBackward(benchmark::State& state) {
    const int N = 2048, C = 256;
    const auto inp = randn(size_t(N) * C), w = randn(C), b = randn(C), dout = randn(size_t(N) * C);
    std::vector<float> out(inp.size()), mean(N), rstd(N), dinp(inp.size()), dw(C), db(C);
    for (auto _ : state) {
        cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                b.data(), N, C, 1e-5f);
        cpu().layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                 w.data(), mean.data(), rstd.data(), N, C);
        benchmark::DoNotOptimize(dinp.data());
    }
    state.SetBytesProcessed(int64_t(4.0 * 5 * N * C) * state.iterations());
    state.SetItemsProcessed(int64_t(N) * state.iterations());
}
BENCHMARK(BM_LayerNormForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GeluForwardBackward(benchmark::State& state) {
    const size_t n = size_t(2048) * 1024;
    const auto inp = randn(n), dout = randn(n);
    std::vector<float> out(n), dinp(n);
    for (auto _ : state) {
        cpu().activation_forward(out.data(), inp.data(), n, ctx::Activation::GeluTanh);
        cpu().activation_backward(dinp.data(), inp.data(), dout.data(), n,
                                  ctx::Activation::GeluTanh);
        benchmark::DoNotOptimize(dinp.data());
    }
    state.SetBytesProcessed(int64_t(4.0 * 5 * n) * state.iterations());
    state.SetItemsProcessed(int64_t(n) * state.iterations());
}
BENCHMARK(BM_GeluForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
