// CPU backend (private header): fp32 ops on host memory, OpenMP across rows / (batch, head) pairs,
// OpenBLAS sgemm for every matrix product. The op contract and its math live in backend/backend.h.
//
// Threading: the backend remembers omp_get_max_threads() at construction (threads_). Parallel
// regions that index per-thread scratch run with exactly threads_ threads, so the scratch sized by
// attention_scratch_floats() always matches. BLAS calls made inside an OpenMP region run
// single-threaded (OpenMP build of OpenBLAS); top-level BLAS calls use all threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/op_common.h"

namespace ctx::cpu {

// Row-block size of the attention kernels: queries are processed in blocks of this many rows,
// each against keys [window start of the block, end of the block), so causal attention does about
// half the work of a full (T, T) product and the per-thread scratch is (kAttnBlock, T).
inline constexpr int kAttnBlock = 64;
// kMaxT5Buckets (the per-(b, h) gradient slots are this big) and kMaxRotaryPairs (per-token
// cos/sin tables live on the stack) come from backend/op_common.h.

// The rotation of every token of a pass (cos, sin and the q / k scales of each pair), for the
// positions and spec it was computed from. All layers of a pass, forward and backward, rotate by
// the same positions: the tables are computed once (in double: the sin/cos were 6% of a
// recipe-base step when every layer recomputed them) and reused while positions and spec match.
struct RotaryCache {
    std::vector<float> positions;  // (N) the key: the positions ...
    std::vector<float> spec_key;   // ... and the spec's numbers (fields, inv_freq, amp_base)
    int half = 0;                  // pairs per token
    std::vector<float> tables;     // (N, 4, half): cos, sin, q scale, k scale
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int threads);

    DeviceKind kind() const override { return DeviceKind::CPU; }
    std::string name() const override;

    // ---- memory (cpu_backend.cpp)
    float* alloc_floats(size_t n) override;
    void free_floats(float* p) override;
    void copy_to_device(float* dst, const float* host_src, size_t n) override;
    void copy_to_host(float* host_dst, const float* src, size_t n) override;
    void zero(float* p, size_t n) override;

    // ---- elementwise (cpu_backend.cpp)
    void add(float* out, const float* a, const float* b, size_t n) override;
    void accumulate(float* y, const float* x, size_t n) override;
    void scale(float* x, float s, size_t n) override;
    double sum_squares(const float* x, size_t n) override;

    // ---- embedding, layernorm, matmul, activation (cpu_dense.cpp)
    void embedding_forward(float* out, const int32_t* tokens, const float* positions,
                           const float* wte, const float* wpe, int N, int C, int V,
                           int P, VocabShard shard = {}) override;
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            const float* positions, int N, int C, int V, int P, VocabShard shard = {}) override;
    void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int N, int C, float eps) override;
    void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, const float* mean,
                            const float* rstd, int N, int C) override;
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                         float eps) override;
    void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                          const float* w, const float* rstd, int N, int C) override;
    void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N,
                        int IC, int OC) override;
    void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                         const float* inp, const float* W, int N, int IC, int OC,
                         GradStore dinp_store = GradStore::Accumulate) override;
    void activation_forward(float* out, const float* inp, size_t n, Activation act) override;
    void activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                             Activation act,
                             GradStore store = GradStore::Accumulate) override;
    void swiglu_forward(float* out, const float* inp, int N, int F) override;
    void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                         GradStore store = GradStore::Accumulate) override;
    void kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                           int D) override;
    void kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                            int D) override;

    // ---- contextual sparsity (cpu_sparse.cpp)
    void matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                             const float* bias, const int32_t* idx, int N, int IC, int K,
                             int G) override;
    void matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                             const float* bias, const int32_t* idx, int N, int OC, int K,
                             int G) override;
    void select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                     float threshold) override;

    // ---- rotary, attention (cpu_attention.cpp)
    void rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                        const RotarySpec& spec) override;
    void rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                         const RotarySpec& spec) override;
    void attention_forward(float* out, float* saved, const float* qkv, const float* positions,
                           int B, int T, int C, int H, const AttentionOptions& opt) override;
    // attention across blocks of a row (cpu_attention_block.cpp)
    void attention_block_forward(float* out_b, float* lse_b, const float* q, const float* kv,
                                 const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                 int C, int H, const AttentionOptions& opt) override;
    void attention_block_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                               int B, int Tq, int C, int H) override;
    void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q,
                                  const float* kv, const float* out, const float* lse,
                                  const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                  int C, int H, const AttentionOptions& opt) override;
    void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* saved, const float* out, const float* positions, int B,
                            int T, int C, int H, const AttentionOptions& opt) override;
    size_t attention_scratch_floats(int B, int T, int C, int H,
                                    AttentionMode mode) const override;
    size_t attention_saved_floats(AttentionMode mode, int B, int T, int, int H) const override {
        return ctx::attention_saved_floats(mode, B, T, H);
    }
    bool attention_backward_reads_qkv(AttentionMode) const override { return true; }
    bool attention_fuses_rotary(AttentionMode, int, int, const RotarySpec&) const override {
        return false;
    }
    bool attention_mode_supported(AttentionMode mode, int C, int H) const override;
    AttentionMode attention_mode_auto(int T, int C, int H) const override;
    void attention_cached_forward(float* out, float* scratch, const float* qkv, const float* kc,
                                  const float* vc, const float* kpos, const int32_t* lens, int B,
                                  int Tq, int S, int C, int H,
                                  const AttentionOptions& opt) override;
    size_t attention_cached_scratch_floats(int S) const override;

    // ---- loss, optimizer (cpu_loss.cpp)
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
    void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                      const AdamWParams& hp) override;

private:
    // Flash mode of attention_forward / attention_backward / attention_scratch_floats
    // (cpu_attention_flash.cpp); the public ops check the arguments and dispatch on opt.mode.
    void flash_forward(float* out, float* lse, const float* qkv, const float* positions, int B,
                       int T, int C, int H, const AttentionOptions& opt);
    void flash_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* lse, const float* out, const float* positions, int B, int T,
                        int C, int H, const AttentionOptions& opt);
    size_t flash_scratch_floats(int B, int T, int H) const;

    // The rotation tables for these positions and spec (RotaryCache), computed when they differ
    // from the cached ones.
    const float* rotary_tables(const float* positions, int N, const RotarySpec& spec);

    int threads_;  // OpenMP threads of the regions that use per-thread scratch
    RotaryCache rotary_cache_;
    std::vector<float> attn_panels_;  // (threads_, D, T): the materialised forward's key panels
};

}  // namespace ctx::cpu
