// Op-by-op timing (profiling_backend.h).
#include "backend/profiling_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ctx {

const char* profile_clock_name(ProfileClock c) {
    return c == ProfileClock::Device ? "device" : "host";
}

namespace {
// CTX_PROFILE_SYNC: unset or 0, the device clock where the backend has one; 1, host time with a
// wait per op.
bool sync_per_op_requested() {
    const char* e = std::getenv("CTX_PROFILE_SYNC");
    if (e == nullptr || std::strcmp(e, "0") == 0) return false;
    CTX_CHECK(std::strcmp(e, "1") == 0, "CTX_PROFILE_SYNC={}: expected 0 or 1", e);
    return true;
}
}  // namespace

ProfilingBackend::ProfilingBackend(Backend& inner) : inner_(inner) {
    if (inner_.kind() == DeviceKind::CPU) return;
    if (inner_.device_timing() && !sync_per_op_requested())
        clock_ = ProfileClock::Device;
    else
        probe_ = inner_.alloc_floats(1);
}

ProfilingBackend::~ProfilingBackend() {
    if (probe_ != nullptr) inner_.free_floats(probe_);
    if (clock_ == ProfileClock::Device) {
        pending_.clear();
        inner_.release_timing_marks();
    }
}

void ProfilingBackend::sync() {
    if (probe_ != nullptr) (void)inner_.sum_squares(probe_, 1);
}

ProfilingBackend::Start ProfilingBackend::start() {
    if (clock_ == ProfileClock::Device) return {Clock::time_point{}, inner_.timing_mark()};
    return {Clock::now(), -1};
}

void ProfilingBackend::record(const char* op, std::string shape, Start s, double flops) {
    OpProfileRow& r = rows_[{op, shape}];
    if (r.calls == 0) {
        r.op = op;
        r.shape = std::move(shape);
    }
    r.calls++;
    r.flops += flops;
    if (clock_ == ProfileClock::Device) {
        pending_.push_back({&r, s.mark, inner_.timing_mark()});
        if (pending_.size() >= kMostPending) settle();
        return;
    }
    sync();
    r.seconds += std::chrono::duration<double>(Clock::now() - s.t).count();
}

void ProfilingBackend::settle() const {
    if (pending_.empty()) return;
    std::vector<Pending> todo;
    todo.swap(pending_);  // a failed read loses the rest rather than counting any op twice
    try {
        for (const Pending& p : todo) p.row->seconds += 1e-3 * inner_.timing_ms(p.from, p.to);
    } catch (...) {
        inner_.release_timing_marks();
        throw;
    }
    inner_.release_timing_marks();
}

void ProfilingBackend::reset() {
    if (clock_ == ProfileClock::Device) {
        pending_.clear();
        inner_.release_timing_marks();
    }
    rows_.clear();
}

std::vector<OpProfileRow> ProfilingBackend::rows() const {
    settle();
    std::vector<OpProfileRow> out;
    for (const auto& [key, r] : rows_) out.push_back(r);
    std::stable_sort(out.begin(), out.end(),
                     [](const OpProfileRow& a, const OpProfileRow& b) { return a.seconds > b.seconds; });
    return out;
}

double ProfilingBackend::total_seconds() const {
    settle();
    double s = 0;
    for (const auto& [key, r] : rows_) s += r.seconds;
    return s;
}

namespace {
// Causal attention's matrix-product FLOPs, FlashAttention-2's convention (docs/BENCHMARKS.md):
// forward 4 B H T^2 D / 2 = 2 B T^2 C; backward 2.5 x forward.
double attention_flops(int B, int T, int C) { return 2.0 * B * double(T) * T * C; }
}  // namespace

// Each op: start the clock, forward, record (on the host clock: after waiting for a device).
#define CTX_TIMED(op, shape, flops, call) \
    do {                                  \
        const Start s0_ = start();        \
        call;                             \
        record(op, shape, s0_, flops);    \
    } while (0)

void ProfilingBackend::copy_to_device(float* dst, const float* src, size_t n) {
    CTX_TIMED("copy_to_device", "", 0, inner_.copy_to_device(dst, src, n));
}
void ProfilingBackend::copy_to_host(float* dst, const float* src, size_t n) {
    CTX_TIMED("copy_to_host", "", 0, inner_.copy_to_host(dst, src, n));
}
void ProfilingBackend::zero(float* p, size_t n) { CTX_TIMED("zero", "", 0, inner_.zero(p, n)); }
void ProfilingBackend::copy(float* dst, const float* src, size_t n) {
    CTX_TIMED("copy", "", 0, inner_.copy(dst, src, n));
}
void ProfilingBackend::copy_2d(float* dst, size_t dst_stride, const float* src,
                               size_t src_stride, size_t rows, size_t cols, bool accumulate) {
    CTX_TIMED("copy_2d", fmt::format("rows={} cols={}", rows, cols), 0,
              inner_.copy_2d(dst, dst_stride, src, src_stride, rows, cols, accumulate));
}
BatchInputs ProfilingBackend::stage_batch(const BatchInputs& host) {
    BatchInputs staged;
    CTX_TIMED("stage_batch", fmt::format("N={}", host.N), 0, staged = inner_.stage_batch(host));
    return staged;
}
void ProfilingBackend::add(float* out, const float* a, const float* b, size_t n) {
    CTX_TIMED("add", fmt::format("n={}", n), 0, inner_.add(out, a, b, n));
}
void ProfilingBackend::accumulate(float* y, const float* x, size_t n) {
    CTX_TIMED("accumulate", fmt::format("n={}", n), 0, inner_.accumulate(y, x, n));
}
void ProfilingBackend::scale(float* x, float s, size_t n) {
    CTX_TIMED("scale", fmt::format("n={}", n), 0, inner_.scale(x, s, n));
}
double ProfilingBackend::sum_squares(const float* x, size_t n) {
    double r = 0;
    CTX_TIMED("sum_squares", fmt::format("n={}", n), 0, r = inner_.sum_squares(x, n));
    return r;
}
void ProfilingBackend::embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                         const float* wte, const float* wpe, int N, int C, int V,
                                         int P, VocabShard shard) {
    CTX_TIMED("embedding_forward", fmt::format("N={} C={} V={}", N, C, V), 0,
              inner_.embedding_forward(out, tokens, positions, wte, wpe, N, C, V, P, shard));
}
void ProfilingBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                          const int32_t* tokens, const float* positions, int N,
                                          int C, int V, int P, VocabShard shard) {
    CTX_TIMED("embedding_backward", fmt::format("N={} C={} V={}", N, C, V), 0,
              inner_.embedding_backward(dwte, dwpe, dout, tokens, positions, N, C, V, P, shard));
}
void ProfilingBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C, float eps) {
    CTX_TIMED("layernorm_forward", fmt::format("N={} C={}", N, C), 0,
              inner_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps));
}
void ProfilingBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
    CTX_TIMED("swiglu_forward", fmt::format("N={} F={}", N, F), 0,
              inner_.swiglu_forward(out, inp, N, F));
}
// Selected rows: 2 flops per weight read, K G rows of IC (or OC) per row of N.
void ProfilingBackend::matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                           const float* bias, const int32_t* idx, int N, int IC,
                                           int K, int G) {
    CTX_TIMED("matmul_rows_forward", fmt::format("N={} IC={} K={} G={}", N, IC, K, G),
              2.0 * N * K * G * IC,
              inner_.matmul_rows_forward(out, ldo, inp, W, bias, idx, N, IC, K, G));
}
void ProfilingBackend::matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                           const float* bias, const int32_t* idx, int N, int OC,
                                           int K, int G) {
    CTX_TIMED("matmul_rows_project", fmt::format("N={} OC={} K={} G={}", N, OC, K, G),
              2.0 * N * K * G * OC,
              inner_.matmul_rows_project(out, h, ldh, Wt, bias, idx, N, OC, K, G));
}
void ProfilingBackend::select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                                   float threshold) {
    CTX_TIMED("select_topk", fmt::format("N={} M={} K={}", N, M, K), 0,
              inner_.select_topk(idx, scores, N, M, K, threshold));
}
void ProfilingBackend::kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                                         int D) {
    CTX_TIMED("kv_repeat_forward", fmt::format("N={} H={} Hkv={} D={}", N, H, Hkv, D), 0,
              inner_.kv_repeat_forward(qkv, grouped, N, H, Hkv, D));
}
void ProfilingBackend::kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H,
                                          int Hkv, int D) {
    CTX_TIMED("kv_repeat_backward", fmt::format("N={} H={} Hkv={} D={}", N, H, Hkv, D), 0,
              inner_.kv_repeat_backward(dgrouped, dqkv, N, H, Hkv, D));
}
void ProfilingBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int N,
                                       int F, GradStore store) {
    CTX_TIMED("swiglu_backward", fmt::format("N={} F={}", N, F), 0,
              inner_.swiglu_backward(dinp, inp, dout, N, F, store));
}
void ProfilingBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                       int N, int C, float eps) {
    CTX_TIMED("rmsnorm_forward", fmt::format("N={} C={}", N, C), 0,
              inner_.rmsnorm_forward(out, rstd, inp, w, N, C, eps));
}
void ProfilingBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout,
                                        const float* inp, const float* w, const float* rstd, int N,
                                        int C) {
    CTX_TIMED("rmsnorm_backward", fmt::format("N={} C={}", N, C), 0,
              inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C));
}
void ProfilingBackend::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                          const float* inp, const float* w, const float* mean,
                                          const float* rstd, int N, int C) {
    CTX_TIMED("layernorm_backward", fmt::format("N={} C={}", N, C), 0,
              inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}
void ProfilingBackend::matmul_forward(float* out, const float* inp, const float* W,
                                      const float* bias, int N, int IC, int OC) {
    CTX_TIMED("matmul_forward", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC, inner_.matmul_forward(out, inp, W, bias, N, IC, OC));
}
void ProfilingBackend::matmul_residual_forward(float* out, const float* residual,
                                               const float* inp, const float* W,
                                               const float* bias, int N, int IC, int OC) {
    CTX_TIMED("matmul_residual_forward", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC,
              inner_.matmul_residual_forward(out, residual, inp, W, bias, N, IC, OC));
}
void ProfilingBackend::matmul_activation_forward(float* pre, float* out, const float* inp,
                                                 const float* W, const float* bias, int N,
                                                 int IC, int OC, Activation act) {
    CTX_TIMED("matmul_activation_forward", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC,
              inner_.matmul_activation_forward(pre, out, inp, W, bias, N, IC, OC, act));
}
void ProfilingBackend::matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                                       const float* inp, const float* W, int N, int IC, int OC,
                                       GradStore dinp_store) {
    CTX_TIMED("matmul_backward", fmt::format("N={} IC={} OC={}", N, IC, OC),
              (dinp != nullptr ? 4.0 : 2.0) * N * double(IC) * OC,
              inner_.matmul_backward(dinp, dW, dbias, dout, inp, W, N, IC, OC, dinp_store));
}
void ProfilingBackend::activation_matmul_backward(float* dinp, float* dW, float* dbias,
                                                  float* dpre, const float* dact,
                                                  const float* pre, const float* inp,
                                                  const float* W, int N, int IC, int OC,
                                                  Activation act, GradStore dinp_store) {
    CTX_TIMED("activation_matmul_backward", fmt::format("N={} IC={} OC={}", N, IC, OC),
              (dinp != nullptr ? 4.0 : 2.0) * N * double(IC) * OC,
              inner_.activation_matmul_backward(dinp, dW, dbias, dpre, dact, pre, inp, W, N, IC,
                                                OC, act, dinp_store));
}
void ProfilingBackend::activation_forward(float* out, const float* inp, size_t n, Activation act) {
    CTX_TIMED("activation_forward", fmt::format("n={}", n), 0,
              inner_.activation_forward(out, inp, n, act));
}
void ProfilingBackend::activation_backward(float* dinp, const float* inp, const float* dout,
                                           size_t n, Activation act, GradStore store) {
    CTX_TIMED("activation_backward", fmt::format("n={}", n), 0,
              inner_.activation_backward(dinp, inp, dout, n, act, store));
}
void ProfilingBackend::rotary_forward(float* qkv, const float* positions, int B, int T, int C,
                                      int H, const RotarySpec& spec) {
    CTX_TIMED("rotary_forward", fmt::format("B={} T={} C={} H={}", B, T, C, H), 0,
              inner_.rotary_forward(qkv, positions, B, T, C, H, spec));
}
void ProfilingBackend::rotary_backward(float* dqkv, const float* positions, int B, int T, int C,
                                       int H, const RotarySpec& spec) {
    CTX_TIMED("rotary_backward", fmt::format("B={} T={} C={} H={}", B, T, C, H), 0,
              inner_.rotary_backward(dqkv, positions, B, T, C, H, spec));
}
void ProfilingBackend::attention_forward(float* out, float* saved, const float* qkv,
                                         const float* positions, int B, int T, int C, int H,
                                         const AttentionOptions& opt) {
    CTX_TIMED("attention_forward",
              fmt::format("B={} T={} C={} H={} {}", B, T, C, H, attention_mode_name(opt.mode)),
              attention_flops(B, T, C),
              inner_.attention_forward(out, saved, qkv, positions, B, T, C, H, opt));
}
void ProfilingBackend::attention_backward(float* dqkv, float* scratch, const float* dout,
                                          const float* qkv, const float* saved, const float* out,
                                          const float* positions, int B, int T, int C, int H,
                                          const AttentionOptions& opt) {
    CTX_TIMED("attention_backward",
              fmt::format("B={} T={} C={} H={} {}", B, T, C, H, attention_mode_name(opt.mode)),
              2.5 * attention_flops(B, T, C),
              inner_.attention_backward(dqkv, scratch, dout, qkv, saved, out, positions, B, T, C,
                                        H, opt));
}
void ProfilingBackend::attention_forward_bf16(Bf16* out, float* saved, const float* qkv,
                                              const float* positions, int B, int T, int C, int H,
                                              const AttentionOptions& opt) {
    CTX_TIMED("attention_forward_bf16",
              fmt::format("B={} T={} C={} H={} {}", B, T, C, H, attention_mode_name(opt.mode)),
              attention_flops(B, T, C),
              inner_.attention_forward_bf16(out, saved, qkv, positions, B, T, C, H, opt));
}
void ProfilingBackend::attention_backward_bf16(float* dqkv, float* scratch, const float* dout,
                                               const float* qkv, const float* saved,
                                               const Bf16* out, const float* positions, int B,
                                               int T, int C, int H, const AttentionOptions& opt) {
    CTX_TIMED("attention_backward_bf16",
              fmt::format("B={} T={} C={} H={} {}", B, T, C, H, attention_mode_name(opt.mode)),
              2.5 * attention_flops(B, T, C),
              inner_.attention_backward_bf16(dqkv, scratch, dout, qkv, saved, out, positions, B, T,
                                             C, H, opt));
}
void ProfilingBackend::attention_cached_forward(float* out, float* scratch, const float* qkv,
                                                const float* kc, const float* vc,
                                                const float* kpos, const int32_t* lens, int B,
                                                int Tq, int S, int C, int H,
                                                const AttentionOptions& opt) {
    CTX_TIMED("attention_cached_forward", fmt::format("B={} Tq={} S={} C={} H={}", B, Tq, S, C, H),
              0, inner_.attention_cached_forward(out, scratch, qkv, kc, vc, kpos, lens, B, Tq, S, C,
                                                 H, opt));
}
void ProfilingBackend::crossentropy_forward(float* losses, const float* logits,
                                            const int32_t* targets, const float* mask, int N,
                                            int V) {
    CTX_TIMED("crossentropy_forward", fmt::format("N={} V={}", N, V), 0,
              inner_.crossentropy_forward(losses, logits, targets, mask, N, V));
}
void ProfilingBackend::crossentropy_forward_backward(float* logits_to_dlogits, float* losses,
                                                     const int32_t* targets, const float* mask,
                                                     int N, int V, float grad_scale) {
    CTX_TIMED("crossentropy_forward_backward", fmt::format("N={} V={}", N, V), 0,
              inner_.crossentropy_forward_backward(logits_to_dlogits, losses, targets, mask, N, V,
                                                   grad_scale));
}
// The head's products (2 N C V forward, 4 N C V more in training) and the loss between them.
void ProfilingBackend::lm_head_loss(float* losses, float* dinp, float* dW, float* scratch,
                                    const float* inp, const float* W, const int32_t* targets,
                                    const float* mask, int N, int C, int V, float grad_scale) {
    CTX_TIMED("lm_head_loss",
              fmt::format("N={} C={} V={} chunk={}", N, C, V, inner_.lm_head_chunk_rows(N, V)),
              (dinp != nullptr ? 6.0 : 2.0) * N * double(C) * V,
              inner_.lm_head_loss(losses, dinp, dW, scratch, inp, W, targets, mask, N, C, V,
                                  grad_scale));
}
// bf16 activation storage: the same ops with one operand in bf16, timed under their own names.
void ProfilingBackend::layernorm_forward_bf16(Bf16* out, float* mean, float* rstd,
                                              const float* inp, const float* w, const float* b,
                                              int N, int C, float eps) {
    CTX_TIMED("layernorm_forward_bf16", fmt::format("N={} C={}", N, C), 0,
              inner_.layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C, eps));
}
void ProfilingBackend::rmsnorm_forward_bf16(Bf16* out, float* rstd, const float* inp,
                                            const float* w, int N, int C, float eps) {
    CTX_TIMED("rmsnorm_forward_bf16", fmt::format("N={} C={}", N, C), 0,
              inner_.rmsnorm_forward_bf16(out, rstd, inp, w, N, C, eps));
}
void ProfilingBackend::activation_forward_bf16(Bf16* out, const float* inp, size_t n,
                                               Activation act) {
    CTX_TIMED("activation_forward_bf16", fmt::format("n={}", n), 0,
              inner_.activation_forward_bf16(out, inp, n, act));
}
void ProfilingBackend::swiglu_forward_bf16(Bf16* out, const float* inp, int N, int F) {
    CTX_TIMED("swiglu_forward_bf16", fmt::format("N={} F={}", N, F), 0,
              inner_.swiglu_forward_bf16(out, inp, N, F));
}
void ProfilingBackend::matmul_forward_bf16(float* out, const Bf16* inp, const float* W,
                                           const float* bias, int N, int IC, int OC) {
    CTX_TIMED("matmul_forward_bf16", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC, inner_.matmul_forward_bf16(out, inp, W, bias, N, IC, OC));
}
void ProfilingBackend::matmul_residual_forward_bf16(float* out, const float* residual,
                                                    const Bf16* inp, const float* W,
                                                    const float* bias, int N, int IC, int OC) {
    CTX_TIMED("matmul_residual_forward_bf16", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC,
              inner_.matmul_residual_forward_bf16(out, residual, inp, W, bias, N, IC, OC));
}
void ProfilingBackend::matmul_activation_forward_bf16(Bf16* pre, Bf16* out, const Bf16* inp,
                                                      const float* W, const float* bias, int N,
                                                      int IC, int OC, Activation act) {
    CTX_TIMED("matmul_activation_forward_bf16", fmt::format("N={} IC={} OC={}", N, IC, OC),
              2.0 * N * double(IC) * OC,
              inner_.matmul_activation_forward_bf16(pre, out, inp, W, bias, N, IC, OC, act));
}
void ProfilingBackend::matmul_backward_bf16(float* dinp, float* dW, float* dbias,
                                            const float* dout, const Bf16* inp, const float* W,
                                            int N, int IC, int OC, GradStore dinp_store) {
    CTX_TIMED("matmul_backward_bf16", fmt::format("N={} IC={} OC={}", N, IC, OC),
              (dinp != nullptr ? 4.0 : 2.0) * N * double(IC) * OC,
              inner_.matmul_backward_bf16(dinp, dW, dbias, dout, inp, W, N, IC, OC, dinp_store));
}
void ProfilingBackend::activation_matmul_backward_bf16(float* dinp, float* dW, float* dbias,
                                                       float* dpre, const float* dact,
                                                       const Bf16* pre, const Bf16* inp,
                                                       const float* W, int N, int IC, int OC,
                                                       Activation act, GradStore dinp_store) {
    CTX_TIMED("activation_matmul_backward_bf16", fmt::format("N={} IC={} OC={}", N, IC, OC),
              (dinp != nullptr ? 4.0 : 2.0) * N * double(IC) * OC,
              inner_.activation_matmul_backward_bf16(dinp, dW, dbias, dpre, dact, pre, inp, W, N,
                                                     IC, OC, act, dinp_store));
}
void ProfilingBackend::mlp_backward_bf16(const MlpBackwardBf16& m) {
    const int OA = m.OA();
    // fc_proj's two products, fc's one or two
    const double flops =
        4.0 * m.N * double(OA) * m.OP + (m.dinp != nullptr ? 4.0 : 2.0) * m.N * double(m.IC) * m.OC;
    CTX_TIMED("mlp_backward_bf16", fmt::format("N={} IC={} OC={} OP={}", m.N, m.IC, m.OC, m.OP),
              flops, inner_.mlp_backward_bf16(m));
}
void ProfilingBackend::lm_head_loss_bf16(float* losses, float* dinp, float* dW, float* scratch,
                                         const Bf16* inp, const float* W,
                                         const int32_t* targets, const float* mask, int N, int C,
                                         int V, float grad_scale) {
    CTX_TIMED("lm_head_loss_bf16",
              fmt::format("N={} C={} V={} chunk={}", N, C, V, inner_.lm_head_chunk_rows(N, V)),
              (dinp != nullptr ? 6.0 : 2.0) * N * double(C) * V,
              inner_.lm_head_loss_bf16(losses, dinp, dW, scratch, inp, W, targets, mask, N, C, V,
                                       grad_scale));
}
void ProfilingBackend::attention_block_forward(float* out_b, float* lse_b, const float* q,
                                               const float* kv, const AttnBlockRows& qrows,
                                               const AttnBlockRows& krows, int B, int C, int H,
                                               const AttentionOptions& opt) {
    CTX_TIMED("attention_block_forward",
              fmt::format("B={} Tq={} Tk={} C={} H={}", B, qrows.T, krows.T, C, H), 0,
              inner_.attention_block_forward(out_b, lse_b, q, kv, qrows, krows, B, C, H, opt));
}
void ProfilingBackend::attention_block_merge(float* out, float* lse, const float* out_b,
                                             const float* lse_b, int B, int Tq, int C, int H) {
    CTX_TIMED("attention_block_merge", fmt::format("B={} Tq={} C={} H={}", B, Tq, C, H), 0,
              inner_.attention_block_merge(out, lse, out_b, lse_b, B, Tq, C, H));
}
void ProfilingBackend::attention_block_backward(float* dq, float* dkv, const float* dout,
                                                const float* q, const float* kv,
                                                const float* out, const float* lse,
                                                const AttnBlockRows& qrows,
                                                const AttnBlockRows& krows, int B, int C, int H,
                                                const AttentionOptions& opt) {
    CTX_TIMED("attention_block_backward",
              fmt::format("B={} Tq={} Tk={} C={} H={}", B, qrows.T, krows.T, C, H), 0,
              inner_.attention_block_backward(dq, dkv, dout, q, kv, out, lse, qrows, krows, B, C,
                                              H, opt));
}
void ProfilingBackend::crossentropy_shard_stats(float* stats, const float* logits,
                                                const int32_t* targets, int N, int V,
                                                VocabShard shard) {
    CTX_TIMED("crossentropy_shard_stats", fmt::format("N={} V={}", N, V), 0,
              inner_.crossentropy_shard_stats(stats, logits, targets, N, V, shard));
}
void ProfilingBackend::crossentropy_shard_finish(float* losses, float* logits_to_dlogits,
                                                 const float* all_stats, int S,
                                                 const int32_t* targets, const float* mask,
                                                 int N, int V, VocabShard shard,
                                                 float grad_scale) {
    CTX_TIMED("crossentropy_shard_finish", fmt::format("N={} V={} S={}", N, V, S), 0,
              inner_.crossentropy_shard_finish(losses, logits_to_dlogits, all_stats, S, targets,
                                               mask, N, V, shard, grad_scale));
}
void ProfilingBackend::adamw_update(float* params, const float* grads, float* m, float* v,
                                    size_t n, const AdamWParams& hp) {
    CTX_TIMED("adamw_update", fmt::format("n={}", n), 0,
              inner_.adamw_update(params, grads, m, v, n, hp));
}

void ProfilingBackend::adamw_update_segments(float* params, const float* grads, float* m,
                                             float* v, const std::vector<AdamWSegment>& segments,
                                             const AdamWParams& hp) {
    size_t n = 0;
    for (const AdamWSegment& s : segments) n += s.n;
    CTX_TIMED("adamw_update_segments", fmt::format("segments={} n={}", segments.size(), n), 0,
              inner_.adamw_update_segments(params, grads, m, v, segments, hp));
}

#undef CTX_TIMED

}  // namespace ctx
