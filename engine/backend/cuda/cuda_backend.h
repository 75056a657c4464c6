// CUDA backend (private header): fp32 ops on device memory, one CUDA stream and one cuBLAS handle
// per backend. The op contract and its math live in backend/backend.h; the kernels in
// cuda_dense.cu, cuda_attention.cu and cuda_attention_block.cu (launchers declared in
// cuda_kernels.h); the host side (validation, cuBLAS calls, staging of host inputs) in
// cuda_backend.cpp, cuda_dense_ops.cpp, cuda_attention_ops.cpp and
// cuda_attention_block_ops.cpp. docs/CUDA.md describes the design.
//
// Streams: every op enqueues its work on stream_ and returns without waiting, except the ops that
// hand data to the host (copy_to_host, sum_squares) and the few that must read a device input on
// the host to validate it or to plan a deterministic scatter (see each op). Set CTX_CUDA_SYNC=1 to
// synchronise after every op, so a fault inside a kernel is reported with the op that caused it.
//
// The batch: stage_batch uploads a pass's checked tokens, targets, positions and mask once and
// keeps a host copy of tokens and positions; ops given the staged pointers neither check them
// again nor copy them back (embedding backward groups rows from the host copy).
//
// Host inputs: the contract's device pointers may, for the integer and small parameter inputs,
// also be host memory, because op callers may keep token ids and targets on the host and fixed
// ALiBi slopes live in the plugin: tokens, targets (int32), bias parameters a and b, and the rotary
// tables (host by contract) are copied to device scratch when they are host memory. Every upload
// goes through a page-locked ring (PinnedUploads, cuda_upload.h): it queues on stream_ without
// waiting for the work before it, and callers may reuse their host buffers at once. The host
// waits only where an op hands data to the host; Backend::host_waits counts the waits.
//
// Scratch: the buffers an op needs beyond the caller's scratch (staged inputs, reduction
// partials) are members that grow on demand and never shrink, so a steady-state training step
// allocates nothing. Growing frees the old buffer (cudaFree synchronises the device first).
//
// Not thread-safe: one host thread drives a backend (as the CPU backend).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_blaslt.h"  // BlasLt (products with fused epilogues)
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_flash.h"   // FlashAttention (attention in flash mode)
#include "backend/cuda/cuda_upload.h"  // PinnedUploads (host-to-device copies)

namespace ctx::cuda {

// A device buffer of T that grows to the largest size asked for; never shrinks.
template <class T>
class DeviceScratch {
public:
    DeviceScratch() = default;
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    ~DeviceScratch() { release(); }
    // At least n elements (n = 0 gives a valid 1-element buffer); `op` names the op in errors.
    T* ensure(size_t n, const char* op);
    void release();

private:
    T* p_ = nullptr;
    size_t cap_ = 0;
};

// cudaMalloc / cudaFree that keep the per-device totals Backend::device_memory reports (every
// buffer and scratch of the CUDA backends goes through them; the NCCL reducer's staging does
// not).
cudaError_t tracked_malloc(void** p, size_t bytes);
cudaError_t tracked_free(void* p);

// Throws ctx::Error "cuda backend: <op>: <error string> (<name>)" unless e is cudaSuccess.
void check_cuda(cudaError_t e, const char* op);
// Device or managed memory (false for host memory and null).
bool is_device_memory(const void* p);

// Bias parameters as device views for the attention kernels (materialised and flash): host
// parameters (fixed ALiBi slopes a plugin computes) copied into staging buffers on `stream`
// through `uploads`, the T5 bucket table built on the host with t5_bucket (op_common.h) and
// cached per (num_buckets, max_distance); gradients and the Table bias must already be device
// memory.
class BiasStaging {
public:
    explicit BiasStaging(PinnedUploads& uploads) : uploads_(uploads) {}
    BiasArgs stage(const BiasSpec& bs, int H, cudaStream_t stream, const char* op);
    void release();  // frees the device buffers (while the right device is current)

private:
    const float* device_view(const float* p, size_t n, DeviceScratch<float>& buf,
                             cudaStream_t stream, const char* op);
    PinnedUploads& uploads_;
    DeviceScratch<float> a_, b_;
    DeviceScratch<int32_t> lut_;
    std::vector<int32_t> h_lut_;
    int lut_nb_ = -1, lut_md_ = -1;  // the (num_buckets, max_distance) lut_ holds
};

class CudaBackend final : public Backend {
public:
    CudaBackend(int device, Precision precision);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    DeviceKind kind() const override { return DeviceKind::CUDA; }
    std::string name() const override { return name_; }
    Precision precision() const override { return precision_; }  // bf16 block below

    // ---- memory (cuda_backend.cpp)
    float* alloc_floats(size_t n) override;
    void free_floats(float* p) override;
    void copy_to_device(float* dst, const float* host_src, size_t n) override;
    void copy_to_host(float* host_dst, const float* src, size_t n) override;
    void zero(float* p, size_t n) override;
    void copy(float* dst, const float* src, size_t n) override;
    void copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t rows,
                 size_t cols, bool accumulate) override;
    BatchInputs stage_batch(const BatchInputs& host) override;
    uint64_t input_readbacks() const override { return input_readbacks_; }
    uint64_t host_waits() const override { return host_wait_count(); }
    DeviceMemory device_memory() const override;
    bool device_timing() const override { return true; }
    int timing_mark() override;
    double timing_ms(int from, int to) override;
    void release_timing_marks() override;

    // ---- elementwise (cuda_backend.cpp)
    void add(float* out, const float* a, const float* b, size_t n) override;
    void accumulate(float* y, const float* x, size_t n) override;
    void scale(float* x, float s, size_t n) override;
    double sum_squares(const float* x, size_t n) override;

    // ---- embedding, layernorm, matmul, activation, loss, optimizer (cuda_dense_ops.cpp)
    void embedding_forward(float* out, const int32_t* tokens, const float* positions,
                           const float* wte, const float* wpe, int N, int C, int V,
                           int P, VocabShard shard = {}) override;
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            const float* positions, int N, int C, int V, int P,
                            VocabShard shard = {}) override;
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
    void activation_matmul_backward(float* dinp, float* dW, float* dbias, float* dpre,
                                    const float* dact, const float* pre, const float* inp,
                                    const float* W, int N, int IC, int OC, Activation act,
                                    GradStore dinp_store = GradStore::Accumulate) override;
    void matmul_activation_forward(float* pre, float* out, const float* inp, const float* W,
                                   const float* bias, int N, int IC, int OC,
                                   Activation act) override;
    void matmul_residual_forward(float* out, const float* residual, const float* inp,
                                 const float* W, const float* bias, int N, int IC,
                                 int OC) override;
    void activation_forward(float* out, const float* inp, size_t n, Activation act) override;
    void activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                             Activation act,
                             GradStore store = GradStore::Accumulate) override;
    void swiglu_forward(float* out, const float* inp, int N, int F) override;
    void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                         GradStore store = GradStore::Accumulate) override;
    // contextual sparsity (fp32 at either precision: decode products are small)
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
    // one launch: a block per chunk of at most kAdamWChunk floats of a segment
    void adamw_update_segments(float* params, const float* grads, float* m, float* v,
                               const std::vector<AdamWSegment>& segments,
                               const AdamWParams& hp) override;

    // ---- the language-model head fused with its loss (cuda_lm_head_ops.cpp): logit rows
    // padded to a multiple of 64 columns (aligned for cuBLAS), bf16 gradients straight from the
    // loss kernel in Precision::Bf16
    void lm_head_loss(float* losses, float* dinp, float* dW, float* scratch, const float* inp,
                      const float* W, const int32_t* targets, const float* mask, int N, int C,
                      int V, float grad_scale) override;
    int lm_head_chunk_rows(int N, int V) const override;
    size_t lm_head_scratch_floats(int N, int V) const override;

    // ---- rotary, attention (cuda_attention_ops.cpp)
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
                                    AttentionMode mode) const override;
    size_t attention_saved_floats(AttentionMode mode, int B, int T, int C, int H) const override;
    bool attention_backward_reads_qkv(AttentionMode mode) const override;
    bool attention_fuses_rotary(AttentionMode mode, int C, int H,
                                const RotarySpec& spec) const override;
    bool attention_out_bf16(AttentionMode mode) const override;
    void attention_forward_bf16(Bf16* out, float* saved, const float* qkv, const float* positions,
                                int B, int T, int C, int H, const AttentionOptions& opt) override;
    void attention_backward_bf16(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* saved, const Bf16* out, const float* positions, int B,
                                 int T, int C, int H, const AttentionOptions& opt) override;
    bool attention_mode_supported(AttentionMode mode, int C, int H) const override;
    AttentionMode attention_mode_auto(int T, int C, int H) const override;
    void attention_cached_forward(float* out, float* scratch, const float* qkv, const float* kc,
                                  const float* vc, const float* kpos, const int32_t* lens, int B,
                                  int Tq, int S, int C, int H,
                                  const AttentionOptions& opt) override;
    size_t attention_cached_scratch_floats(int S) const override;

    // ---- attention across blocks of a row (context parallelism; cuda_attention_block_ops.cpp)
    void attention_block_forward(float* out_b, float* lse_b, const float* q, const float* kv,
                                 const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                 int C, int H, const AttentionOptions& opt) override;
    void attention_block_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                               int B, int Tq, int C, int H) override;
    void attention_block_backward(float* dq, float* dkv, const float* dout, const float* q,
                                  const float* kv, const float* out, const float* lse,
                                  const AttnBlockRows& qrows, const AttnBlockRows& krows, int B,
                                  int C, int H, const AttentionOptions& opt) override;

    // ---- bf16 activation storage (Precision::Bf16 unless CTX_BF16_ACTIVATIONS=0;
    //      cuda_bf16_ops.cpp)
    bool bf16_activations() const override { return bf16_activations_; }
    void layernorm_forward_bf16(Bf16* out, float* mean, float* rstd, const float* inp,
                                const float* w, const float* b, int N, int C,
                                float eps) override;
    void rmsnorm_forward_bf16(Bf16* out, float* rstd, const float* inp, const float* w, int N,
                              int C, float eps) override;
    void activation_forward_bf16(Bf16* out, const float* inp, size_t n, Activation act) override;
    void swiglu_forward_bf16(Bf16* out, const float* inp, int N, int F) override;
    void matmul_residual_forward_bf16(float* out, const float* residual, const Bf16* inp,
                                      const float* W, const float* bias, int N, int IC,
                                      int OC) override;
    void matmul_forward_bf16(float* out, const Bf16* inp, const float* W, const float* bias,
                             int N, int IC, int OC) override;
    void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                              const Bf16* inp, const float* W, int N, int IC, int OC,
                              GradStore dinp_store = GradStore::Accumulate) override;
    void matmul_activation_forward_bf16(Bf16* pre, Bf16* out, const Bf16* inp, const float* W,
                                        const float* bias, int N, int IC, int OC,
                                        Activation act) override;
    void activation_matmul_backward_bf16(float* dinp, float* dW, float* dbias, float* dpre,
                                         const float* dact, const Bf16* pre, const Bf16* inp,
                                         const float* W, int N, int IC, int OC, Activation act,
                                         GradStore dinp_store = GradStore::Accumulate) override;
    void mlp_backward_bf16(const MlpBackwardBf16& m) override;
    void lm_head_loss_bf16(float* losses, float* dinp, float* dW, float* scratch,
                           const Bf16* inp, const float* W, const int32_t* targets,
                           const float* mask, int N, int C, int V, float grad_scale) override;

    cudaStream_t stream() const { return stream_; }  // for parallel/nccl_reducer.cpp
    int device() const { return device_; }           // for parallel/nccl_reducer.cpp

private:
    // ---- errors and bookkeeping (cuda_backend.cpp)
    void activate() const;                            // makes device_ current for this thread
    void check(cudaError_t e, const char* op) const;  // throws ctx::Error naming op
    void check_blas(cublasStatus_t st, const char* op) const;
    void done(cudaError_t launch, const char* op);    // check + optional CTX_CUDA_SYNC wait
    void sync(const char* op);

    // ---- host/device views of inputs (cuda_backend.cpp)
    bool on_device(const void* p) const;  // device or managed memory
    // p (n) as device memory: p itself, or its copy in stage.
    template <class T>
    const T* device_view(const T* p, size_t n, DeviceScratch<T>& stage, const char* op);
    // p (n) as host memory: p itself, or its copy (waits for the stream) in stage.
    template <class T>
    const T* host_view(const T* p, size_t n, std::vector<T>& stage, const char* op);
    void upload(void* dst, const void* src, size_t bytes, const char* op);

    // ---- cuBLAS, row-major: C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C
    void gemm(const char* op, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
              int lda, const float* B, int ldb, float beta, float* C, int ldc);
    void gemm_batched(const char* op, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float* A, int lda, long long sa, const float* B, int ldb,
                      long long sb, float beta, float* C, int ldc, long long sc, int batch);

    // ---- bf16 mixed precision (Precision::Bf16: matmul_forward / matmul_backward here;
    //      cuda_backend.cpp, cuda_dense_ops.cpp, kernels in cuda_bf16.cu; flash attention on
    //      tensor cores through flash_) -------------------------------------------------------
    // x (n floats, device) rounded to bf16 (round-to-nearest-even) into buf; returns the bf16
    // bit patterns. Operands are rounded on every call: no cache of bf16 weights, because the
    // optimizer (and scale/accumulate/copy) update the fp32 masters in place.
    const uint16_t* round_to_bf16(const float* x, size_t n, DeviceScratch<uint16_t>& buf,
                                  const char* op);
    // x (rows, cols) rounded into buf as (rows, ld) rows, zeros in columns [cols, ld).
    const uint16_t* round_rows_to_bf16(const float* x, int rows, int cols, int ld,
                                       DeviceScratch<uint16_t>& buf, const char* op);
    // gemm (same row-major convention) with bf16 A, B (bit patterns), fp32 accumulation and an
    // fp32 C (cublasGemmEx, CUBLAS_COMPUTE_32F: tensor cores).
    void gemm_bf16(const char* op, bool ta, bool tb, int M, int N, int K, float alpha,
                   const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                   int ldc);
    // The operands of a product as cuBLAS takes them (bf16: rounded into bf16_act_ and
    // bf16_weight_), and the product through cuBLASLt with its bias (and GELU) epilogue: false
    // when that path is off or has no algorithm, having run nothing (cuda_dense_ops.cpp).
    // residual: (N, OC) added to the product (beta 1), or null.
    bool lt_forward(float* out, float* pre, const float* inp, const float* W, const float* bias,
                    int N, int IC, int OC, const char* op, const float* residual = nullptr);
    // out (N, OC) = a (N, IC) @ bf16(W)^T (+ bias) (+ residual), a already bf16 (either
    // storage's forward).
    void forward_bf16(float* out, const uint16_t* a, const float* W, const float* bias, int N,
                      int IC, int OC, const char* op, const float* residual = nullptr);
    // ... with W already rounded (w: bf16(W), (OC, IC)).
    void forward_bf16_rounded(float* out, const uint16_t* a, const uint16_t* w, const float* bias,
                              int N, int IC, int OC, const char* op,
                              const float* residual = nullptr);
    // Before a product added to out with beta 1: out = residual (+ bias in every row), or the
    // bias alone; returns the beta (0 when there is neither).
    float start_output(float* out, const float* residual, const float* bias, int N, int OC,
                       const char* op);
    // matmul_backward's bf16 products with inp already bf16 (either storage).
    void backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                       const uint16_t* inp, const float* W, int N, int IC, int OC,
                       GradStore dinp_store, const char* op);
    // bf16(dout) (N, bf16_grad_ld(OC)) in bf16_grad_, and dbias (OC) += colsum(dout) in the
    // same pass unless dbias is null.
    const uint16_t* round_grad_bf16(float* dbias, const float* dout, int N, int OC, const char* op);
    // Its two products from g = bf16(dout) (N, ldg), zeros past OC in each row.
    void backward_bf16_products(float* dinp, float* dW, const uint16_t* g, int ldg,
                                const uint16_t* a, const float* W, int N, int IC, int OC,
                                GradStore dinp_store, const char* op);
    // activation_matmul_backward in bf16 with inp already bf16 (either storage): the
    // activation's backward straight into bf16(dpre), then the two products.
    // pre in fp32 (pre16 null) or bf16 (pre null).
    void activation_products_bf16(float* dinp, float* dW, float* dbias, const float* dact,
                                  const float* pre, const uint16_t* pre16, const uint16_t* a,
                                  const float* W, int N, int IC, int OC, Activation act,
                                  GradStore dinp_store, const char* op);
    void check_attention_bf16(const char* op, int T, int C, int H,
                              const AttentionOptions& opt) const;
    void flash_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* saved, const float* out, const uint16_t* out16,
                        const float* positions, int B, int T, int C, int H,
                        const AttentionOptions& opt, const char* op);
    // lm_head_loss with x as fp32 (inp) or, bf16 activation storage, as bf16 (inp16).
    void lm_head(float* losses, float* dinp, float* dW, float* scratch, const float* inp,
                 const uint16_t* inp16, const float* W, const int32_t* targets,
                 const float* mask, int N, int C, int V, float grad_scale, const char* op);
    // The *_bf16 ops' precondition: this backend stores activations in bf16.
    void require_bf16_activations(const char* op) const;
    BlasLt lt_;
    Precision precision_ = Precision::Fp32;
    bool bf16_activations_ = false;  // Bf16, and CTX_BF16_ACTIVATIONS is not 0
    // bf16 storage: the MLP's GELU (tanh) in cuBLASLt's epilogue, which writes pre and out in
    // bf16; CTX_MLP_GELU=kernel: the fp32 product, then the activation kernel rounds both
    bool mlp_gelu_epilogue_ = false;
    // grow-only bf16 copies of the operands of one matmul call: activation (N, IC), weight
    // (OC, IC), output gradient (N, OC)
    DeviceScratch<uint16_t> bf16_act_, bf16_weight_, bf16_grad_;
    // matmul_activation_forward_bf16's fp32 product (N, OC), before the activation kernel
    // rounds it into the stored bf16 pre-activation and applies the activation
    DeviceScratch<float> mlp_pre_;
    // mlp_backward_bf16's epilogue path: the epilogue's fc bias gradient (OC), added to the
    // caller's
    DeviceScratch<float> lt_bias_grad_;
    // ---- end of the bf16 block

    // ---- rotary (sign +1 forward, -1 the transpose) and attention helpers
    void rotary_apply(float* x, const float* positions, int B, int T, int C, int H,
                      const RotarySpec& spec, float sign, const char* op);
    // spec's device view: [inv_freq | amp_base] uploaded into d_rotary_
    RotaryArgs stage_rotary(const RotarySpec& spec, const char* op);
    // The checks of attention_forward / _backward in flash mode when opt.rotary is set (the
    // kernels fuse it, else ctx::Error), and its table of the B T tokens' pair rotations in
    // d_rotation_ (none without opt.rotary).
    RotationTable flash_rotation(const float* positions, int B, int T, int C, int H,
                                 const AttentionOptions& opt, const char* op);
    BiasArgs bias_args(const BiasSpec& bs, int H, const char* op) {
        return bias_staging_.stage(bs, H, stream_, op);
    }

    int device_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    bool sync_each_op_ = false;

    // the batch of the current pass (stage_batch): device copies the ops read, and the host
    // copy that embedding_backward groups by, so no op copies batch data back
    BatchInputs staged_;
    uint64_t input_readbacks_ = 0;  // host_view copies (see Backend::input_readbacks)
    DeviceScratch<int32_t> d_batch_tokens_, d_batch_targets_, d_batch_doc_start_;
    DeviceScratch<float> d_batch_positions_, d_batch_mask_;
    std::vector<int32_t> h_batch_tokens_;
    std::vector<float> h_batch_positions_;
    bool is_staged_tokens(const int32_t* p) const { return p != nullptr && p == staged_.tokens; }

    // staged inputs and reduction partials (grow on demand)
    DeviceScratch<int32_t> d_tokens_, d_targets_, d_lens_, d_groups_, d_groups_pe_;
    DeviceScratch<float> d_weights_pe_, d_rotary_, d_partials_;
    DeviceScratch<float> d_rotation_;  // flash_rotation's table (B T, dr / 2, 4 floats)
    DeviceScratch<double> d_sumsq_;
    DeviceScratch<double> d_block_partials_;  // attention_block_backward's bias partial sums
    // adamw_update_segments' chunk table: this call's, the one on the device (AdamWChunk as
    // two 64-bit words each)
    std::vector<AdamWChunk> adamw_chunks_, adamw_chunks_on_device_;
    DeviceScratch<uint64_t> d_adamw_chunks_;
    std::vector<int32_t> h_ints_, h_groups_, h_groups_pe_;
    std::vector<float> h_floats_, h_mask_, h_weights_pe_, h_rotary_;
    std::vector<double> h_sumsq_;
    std::vector<int> h_order_;
    // timing marks (timing_mark): events created on first use and reused after
    // release_timing_marks, so a profiled step allocates none once the pool is large enough
    std::vector<cudaEvent_t> timing_events_;
    size_t timing_used_ = 0;
    PinnedUploads uploads_;  // every host-to-device copy (upload)
    BiasStaging bias_staging_{uploads_};
    // attention in AttentionMode::Flash (cuda_flash.h): runs on stream_, stages its bias
    // parameters through bias_staging_ (declared before it); the bf16 tensor-core kernels, with
    // their operands packed in flash_packed_, when precision_ (declared before it) is Bf16
    DeviceScratch<uint16_t> flash_packed_;
    FlashAttention flash_{bias_staging_,
                          precision_ == Precision::Bf16 ? &flash_packed_ : nullptr};
};

}  // namespace ctx::cuda
