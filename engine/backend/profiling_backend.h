// A Backend that forwards every op to another one and times it: where a training step's
// milliseconds go, op by op and shape by shape (`ctxengine bench --profile`).
//
// CPU ops are synchronous, so each op's wall time is its cost (ProfileClock::Host). A device
// backend queues its kernels; with a device clock (Backend::device_timing) each op is timed by
// two marks on the queue and the times are read when the rows are asked for, so the queue runs
// as it does unprofiled (ProfileClock::Device: the device's time from an op's first mark to its
// last, so gaps between ops are left out; when the queue runs dry, an op's own launches and host
// work fall inside its span). One profiler per backend: the marks are the backend's.
// CTX_PROFILE_SYNC=1, or a device backend without a clock, ends every op with a one-float
// read-back (sum_squares) instead and takes host time, which serialises the stream: each op's
// own time plus its launch and host work.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ctx {

enum class ProfileClock { Host, Device };
const char* profile_clock_name(ProfileClock c);  // "host" | "device"

struct OpProfileRow {
    std::string op;     // "matmul_forward"
    std::string shape;  // "N=2048 IC=256 OC=768"
    long calls = 0;
    double seconds = 0;
    double flops = 0;   // the op's arithmetic (matrix products and attention only; 0 otherwise)
};

class ProfilingBackend : public Backend {
public:
    explicit ProfilingBackend(Backend& inner);
    ~ProfilingBackend() override;
    ProfilingBackend(const ProfilingBackend&) = delete;  // rows_ is pointed into by pending_
    ProfilingBackend& operator=(const ProfilingBackend&) = delete;

    void reset();  // forgets what was timed so far (e.g. after warm-up steps)
    // Rows by decreasing time (on the device clock: waits for the queued ops first).
    std::vector<OpProfileRow> rows() const;
    double total_seconds() const;  // the sum over rows
    ProfileClock clock() const { return clock_; }

    DeviceKind kind() const override { return inner_.kind(); }
    std::string name() const override { return inner_.name(); }
    Precision precision() const override { return inner_.precision(); }

    float* alloc_floats(size_t n) override { return inner_.alloc_floats(n); }
    void free_floats(float* p) override { inner_.free_floats(p); }
    void copy_to_device(float* dst, const float* src, size_t n) override;
    void copy_to_host(float* dst, const float* src, size_t n) override;
    void zero(float* p, size_t n) override;
    void copy(float* dst, const float* src, size_t n) override;
    void copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t rows,
                 size_t cols, bool accumulate) override;
    BatchInputs stage_batch(const BatchInputs& host) override;
    uint64_t input_readbacks() const override { return inner_.input_readbacks(); }
    uint64_t host_waits() const override { return inner_.host_waits(); }
    DeviceMemory device_memory() const override { return inner_.device_memory(); }

    void add(float* out, const float* a, const float* b, size_t n) override;
    void accumulate(float* y, const float* x, size_t n) override;
    void scale(float* x, float s, size_t n) override;
    double sum_squares(const float* x, size_t n) override;
    void embedding_forward(float* out, const int32_t* tokens, const float* positions,
                           const float* wte, const float* wpe, int N, int C, int V,
                           int P, VocabShard shard = {}) override;
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            const float* positions, int N, int C, int V, int P,
                            VocabShard shard = {}) override;
    void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                           const float* w, const float* b, int N, int C, float eps) override;
    void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, const float* mean,
                            const float* rstd, int N, int C) override;
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override;
    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override;
    void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N,
                        int IC, int OC) override;
    void matmul_residual_forward(float* out, const float* residual, const float* inp,
                                 const float* W, const float* bias, int N, int IC,
                                 int OC) override;
    void matmul_activation_forward(float* pre, float* out, const float* inp, const float* W,
                                   const float* bias, int N, int IC, int OC,
                                   Activation act) override;
    void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                         const float* inp, const float* W, int N, int IC, int OC,
                         GradStore dinp_store = GradStore::Accumulate) override;
    void activation_matmul_backward(float* dinp, float* dW, float* dbias, float* dpre,
                                    const float* dact, const float* pre, const float* inp,
                                    const float* W, int N, int IC, int OC, Activation act,
                                    GradStore dinp_store = GradStore::Accumulate) override;
    void activation_forward(float* out, const float* inp, size_t n, Activation act) override;
    void activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                             Activation act,
                             GradStore store = GradStore::Accumulate) override;
    void swiglu_forward(float* out, const float* inp, int N, int F) override;
    void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                         GradStore store = GradStore::Accumulate) override;
    void matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                             const float* bias, const int32_t* idx, int N, int IC, int K,
                             int G) override;
    void matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                             const float* bias, const int32_t* idx, int N, int OC, int K,
                             int G) override;
    void select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                     float threshold) override;
    void kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                           int D) override;
    void kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                            int D) override;
    void rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                        const RotarySpec& spec) override;
    void rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                         const RotarySpec& spec) override;
    void attention_forward(float* out, float* saved, const float* qkv, const float* positions,
                           int B, int T, int C, int H, const AttentionOptions& opt) override;
    void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* saved, const float* out, const float* positions, int B,
                            int T, int C, int H, const AttentionOptions& opt) override;
    size_t attention_scratch_floats(int B, int T, int C, int H,
                                    AttentionMode mode) const override {
        return inner_.attention_scratch_floats(B, T, C, H, mode);
    }
    size_t attention_saved_floats(AttentionMode mode, int B, int T, int C, int H) const override {
        return inner_.attention_saved_floats(mode, B, T, C, H);
    }
    bool attention_backward_reads_qkv(AttentionMode mode) const override {
        return inner_.attention_backward_reads_qkv(mode);
    }
    bool attention_fuses_rotary(AttentionMode mode, int C, int H,
                                const RotarySpec& spec) const override {
        return inner_.attention_fuses_rotary(mode, C, H, spec);
    }
    bool attention_mode_supported(AttentionMode mode, int C, int H) const override {
        return inner_.attention_mode_supported(mode, C, H);
    }
    AttentionMode attention_mode_auto(int T, int C, int H) const override {
        return inner_.attention_mode_auto(T, C, H);
    }
    void attention_block_forward(float* out_b, float* lse_b, const float* q, const float* kv,
                                 const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                 int C, int H, const AttentionOptions& opt) override;
    void attention_block_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                               int B, int Tq, int C, int H) override;
    void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q,
                                  const float* kv, const float* out, const float* lse,
                                  const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                  int C, int H, const AttentionOptions& opt) override;
    void attention_cached_forward(float* out, float* scratch, const float* qkv, const float* kc,
                                  const float* vc, const float* kpos, const int32_t* lens, int B,
                                  int Tq, int S, int C, int H,
                                  const AttentionOptions& opt) override;
    size_t attention_cached_scratch_floats(int S) const override {
        return inner_.attention_cached_scratch_floats(S);
    }
    void crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                              const float* mask, int N, int V) override;
    void crossentropy_forward_backward(float* logits_to_dlogits, float* losses,
                                       const int32_t* targets, const float* mask, int N, int V,
                                       float grad_scale) override;
    void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets,
                                  int N, int V, VocabShard shard) override;
    void crossentropy_shard_finish(float* losses, float* logits_to_dlogits,
                                   const float* all_stats, int S, const int32_t* targets,
                                   const float* mask, int N, int V, VocabShard shard,
                                   float grad_scale) override;
    void lm_head_loss(float* losses, float* dinp, float* dW, float* scratch, const float* inp,
                      const float* W, const int32_t* targets, const float* mask, int N, int C,
                      int V, float grad_scale) override;
    int lm_head_chunk_rows(int N, int V) const override {
        return inner_.lm_head_chunk_rows(N, V);
    }
    size_t lm_head_scratch_floats(int N, int V) const override {
        return inner_.lm_head_scratch_floats(N, V);
    }
    void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                      const AdamWParams& hp) override;
    void adamw_update_segments(float* params, const float* grads, float* m, float* v,
                               const std::vector<AdamWSegment>& segments,
                               const AdamWParams& hp) override;
    bool bf16_activations() const override { return inner_.bf16_activations(); }
    bool attention_out_bf16(AttentionMode mode) const override {
        return inner_.attention_out_bf16(mode);
    }
    void attention_forward_bf16(Bf16* out, float* saved, const float* qkv, const float* positions,
                                int B, int T, int C, int H, const AttentionOptions& opt) override;
    void attention_backward_bf16(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* saved, const Bf16* out, const float* positions, int B,
                                 int T, int C, int H, const AttentionOptions& opt) override;
    void layernorm_forward_bf16(Bf16* out, float* mean, float* rstd, const float* inp,
                                const float* w, const float* b, int N, int C,
                                float eps) override;
    void rmsnorm_forward_bf16(Bf16* out, float* rstd, const float* inp, const float* w, int N,
                              int C, float eps) override;
    void activation_forward_bf16(Bf16* out, const float* inp, size_t n, Activation act) override;
    void swiglu_forward_bf16(Bf16* out, const float* inp, int N, int F) override;
    void matmul_forward_bf16(float* out, const Bf16* inp, const float* W, const float* bias,
                             int N, int IC, int OC) override;
    void matmul_residual_forward_bf16(float* out, const float* residual, const Bf16* inp,
                                      const float* W, const float* bias, int N, int IC,
                                      int OC) override;
    void matmul_activation_forward_bf16(Bf16* pre, Bf16* out, const Bf16* inp, const float* W,
                                        const float* bias, int N, int IC, int OC,
                                        Activation act) override;
    void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                              const Bf16* inp, const float* W, int N, int IC, int OC,
                              GradStore dinp_store = GradStore::Accumulate) override;
    void activation_matmul_backward_bf16(float* dinp, float* dW, float* dbias, float* dpre,
                                         const float* dact, const Bf16* pre, const Bf16* inp,
                                         const float* W, int N, int IC, int OC, Activation act,
                                         GradStore dinp_store = GradStore::Accumulate) override;
    void mlp_backward_bf16(const MlpBackwardBf16& m) override;
    void lm_head_loss_bf16(float* losses, float* dinp, float* dW, float* scratch,
                           const Bf16* inp, const float* W, const int32_t* targets,
                           const float* mask, int N, int C, int V, float grad_scale) override;

private:
    using Clock = std::chrono::steady_clock;
    struct Start {  // when an op began: host time, or the index of its first device mark
        Clock::time_point t;
        int mark = -1;
    };
    // An op timed on the device clock whose marks have not been read yet.
    struct Pending {
        OpProfileRow* row;
        int from, to;
    };
    static constexpr size_t kMostPending = 8192;  // ops; then their marks are read and reused

    // Waits for the inner backend's queued work (device backends only).
    void sync();
    Start start();
    void record(const char* op, std::string shape, Start s, double flops = 0);
    // Reads the pending ops' device times into their rows and releases the marks.
    void settle() const;

    Backend& inner_;
    ProfileClock clock_ = ProfileClock::Host;
    float* probe_ = nullptr;  // one device float to read back (sync)
    mutable std::map<std::pair<std::string, std::string>, OpProfileRow> rows_;
    mutable std::vector<Pending> pending_;
};

}  // namespace ctx
