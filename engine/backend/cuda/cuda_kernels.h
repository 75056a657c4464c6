// CUDA backend (private header): the kernel launchers the host side (cuda_*.cpp) calls. Plain C++
// declarations, so the host files compile with the C++ compiler and only the .cu files go through
// nvcc. Every launcher enqueues work on `stream` and returns cudaGetLastError() (launch errors;
// faults inside a kernel surface at the next synchronising call). All pointers are device memory
// unless a comment says otherwise; shapes follow backend.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/op_common.h"

namespace ctx::cuda {

// ---------------------------------------------------------------- constants shared with the host

// kMaxT5Buckets (backend/op_common.h) is also the number of gradient slots per (batch, head,
// row chunk) in attention_backward's partial sums.
// kT5LutSize (op_common.h): the largest T5 max_distance looked up in a table built on the host;
// larger ones evaluate the bucket formula on the device in double.
// Query rows per block of the bias-gradient kernel (one partial-sum slot per chunk of rows).
inline constexpr int kBiasGradRows = 32;

// Which keys a query may attend besides the causal rule (AttentionOptions): its last `window`
// (0: all) and, in packed rows, none before its document's first token doc_start (device, per
// query; null: one document per row). Launchers of one batch row take doc_start of that row.
struct KeyMask {
    int window = 0;
    const int32_t* doc_start = nullptr;
};

// Bias of attention logit (i, j), device view of a BiasSpec (backend.h). kind is BiasKind's value.
struct BiasArgs {
    int kind = 0;
    const float* a = nullptr;     // (H) or (H, nb) for T5, device
    const float* b = nullptr;     // (H), device
    int nb = 0, md = 0;           // T5 num_buckets, max_distance
    const int* lut = nullptr;     // T5 bucket of n = 0 .. md (md <= kT5LutSize), else null
    const float* table = nullptr; // Table: (B, H, T, T) (forward) / (B, H, Tq, S) (cached)
};

// A RotarySpec's device view: inv_freq and amp_base (dr / 2 each, amp_base may be null) device.
// layout is RotaryLayout's value (0 Half, 1 Interleaved).
struct RotaryArgs {
    int dr = 0, layout = 0;
    const float* inv_freq = nullptr;
    float position_scale = 1.0f, attention_factor = 1.0f;
    const float* amp_base = nullptr;
    float amp_scale_base = 512.0f;
};

// A launch_rotary_table table (B T, dr / 2) for kernels that rotate q and k themselves; null
// table: no rotation.
struct RotationTable {
    const float* table = nullptr;
    int dr = 0, layout = 0;
};

// ---------------------------------------------------------------- elementwise, reductions
cudaError_t launch_add(float* out, const float* a, const float* b, size_t n, cudaStream_t s);
cudaError_t launch_accumulate(float* y, const float* x, size_t n, cudaStream_t s);
// dst[r * dst_stride + c] = (+= when accumulate) src[r * src_stride + c], (rows, cols)
cudaError_t launch_copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride,
                           size_t rows, size_t cols, bool accumulate, cudaStream_t s);
cudaError_t launch_scale(float* x, float v, size_t n, cudaStream_t s);
// Number of double partial sums launch_sum_squares writes for n floats (a function of n only, so
// the reduction order and the result are the same on every run).
int sum_squares_partials(size_t n);
cudaError_t launch_sum_squares(double* partials, const float* x, size_t n, cudaStream_t s);

// ---------------------------------------------------------------- embedding
// out (N, C) = wte[tokens[n] - vocab_begin] (+ interp(wpe, positions[n]) when wpe != null);
// a token outside [vocab_begin, vocab_begin + V) (another vocabulary shard's) adds a zero row
cudaError_t launch_embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                     const float* wte, const float* wpe, int N, int C, int V,
                                     int P, int vocab_begin, cudaStream_t s);
// Deterministic scatter-add: groups g = 0 .. G-1; group g adds sum over k in
// [start[g], start[g+1]) of weight[k] * dout[row[k]] (weight null: 1) into dst[target[g]].
// Every target appears in one group only, so no two blocks write the same row.
cudaError_t launch_grouped_row_add(float* dst, const float* dout, const int32_t* target,
                                   const int32_t* start, const int32_t* row, const float* weight,
                                   int G, int C, cudaStream_t s);

// ---------------------------------------------------------------- layernorm, column sums
// mean == nullptr selects RMS norm in all three (no centering; forward writes no mean, b unused;
// params: dw += sum_n inp rstd dout, db must be null).
cudaError_t launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C, float eps,
                                     cudaStream_t s);
// The same with out in bf16 (bit patterns; rounded to nearest even from the fp32 result).
cudaError_t launch_layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C, float eps,
                                     cudaStream_t s);
cudaError_t launch_layernorm_backward_dinp(float* dinp, const float* dout, const float* inp,
                                           const float* w, const float* mean, const float* rstd,
                                           int N, int C, cudaStream_t s);
// Layer norm (mean given) or RMS norm (mean null, db null) backward in one pass over the rows
// (cuda_norm.cu), for C <= kNormOnePassMaxC: dinp += dx, dw (C) += sum_n (inp - mean) rstd
// dout, db (C) += sum_n dout (may be null). partials: 2 * norm_backward_chunks(N) * C floats.
inline constexpr int kNormOnePassMaxC = 1024;
int norm_backward_chunks(int N);
cudaError_t launch_norm_backward(float* dinp, float* dw, float* db, float* partials,
                                 const float* dout, const float* inp, const float* w,
                                 const float* mean, const float* rstd, int N, int C,
                                 cudaStream_t s);
// Row chunks of the two-stage column reductions (a function of N only: deterministic).
int column_chunks(int N);
// The column sums' first-stage block: kColTile columns x kColLanes row lanes (the kernels that
// take column sums in the same order share it, so they give the same bits).
inline constexpr int kColTile = 32, kColLanes = 8;
// dw (C) += sum_n (inp - mean) rstd dout; db (C) += sum_n dout (db may be null).
// partials: 2 * column_chunks(N) * C floats.
cudaError_t launch_layernorm_backward_params(float* dw, float* db, float* partials,
                                             const float* dout, const float* inp,
                                             const float* mean, const float* rstd, int N, int C,
                                             cudaStream_t s);
// out (C) += the column sums of partials (G, C) in chunk order: the second stage of the column
// sums (launch_round_rows_colsum_bf16 runs its own first stage).
cudaError_t launch_column_finish_add(float* out, const float* partials, int G, int C,
                                     cudaStream_t s);
// out (C) += column sums of x (N, C). partials: column_chunks(N) * C floats.
cudaError_t launch_column_sum_add(float* out, float* partials, const float* x, int N, int C,
                                  cudaStream_t s);
// out (N, C) rows = bias (C)
cudaError_t launch_broadcast_rows(float* out, const float* bias, int N, int C, cudaStream_t s);

// ---------------------------------------------------------------- activation (act: Activation)
cudaError_t launch_activation_forward(float* out, const float* inp, size_t n, int act,
                                      cudaStream_t s);
// out in bf16, as layernorm's; inp16 (not null): inp rounded to bf16 as well
cudaError_t launch_activation_forward(uint16_t* out, const float* inp, size_t n, int act,
                                      cudaStream_t s, uint16_t* inp16 = nullptr);
// dinp (n) += act'(inp) dout, or = when !accumulate (GradStore::Overwrite)
cudaError_t launch_activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                                       int act, bool accumulate, cudaStream_t s);

// SwiGLU over inp (N, 2F) = [gate | up]: out (N, F) = silu(gate) up (writes; in fp32 or bf16);
// backward: dinp (N, 2F) += the gradient (= when !accumulate).
cudaError_t launch_swiglu_forward(float* out, const float* inp, int N, int F, cudaStream_t s);
cudaError_t launch_swiglu_forward(uint16_t* out, const float* inp, int N, int F, cudaStream_t s,
                                  uint16_t* inp16 = nullptr);
cudaError_t launch_swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                                   bool accumulate, cudaStream_t s);

// Grouped-query key/value heads (Backend::kv_repeat_*): dqkv == nullptr: qkv (N, 3HD) = grouped
// (N, (H + 2Hkv) D) with key/value heads repeated (writes); else dgrouped += dqkv summed back.
cudaError_t launch_kv_repeat(float* qkv, float* dgrouped, const float* grouped,
                             const float* dqkv, int N, int H, int Hkv, int D, cudaStream_t s);

// ---------------------------------------------------------------- loss, optimizer
// Softmax cross-entropy over logit rows (N rows, stride ldl), columns [0, V) (the
// crossentropy_* ops, and Backend::lm_head_loss's chunks; cuda_lm_head.cu): losses (N) written;
// mask may be null (all ones); with a gradient buffer, either
// dl_f32 (may alias logits, ldd == ldl) or dl_bf16 (bf16 bit patterns), (N, ldd) =
// grad_scale * mask * (softmax - onehot), zero in columns [V, ldd).
cudaError_t launch_xent_rows(float* losses, float* dl_f32, uint16_t* dl_bf16, int ldd,
                             const float* logits, int ldl, const int32_t* targets,
                             const float* mask, int N, int V, float grad_scale, cudaStream_t s);
// Vocabulary-parallel cross-entropy (Backend::crossentropy_shard_stats / _finish).
cudaError_t launch_crossentropy_shard_stats(float* stats, const float* logits,
                                            const int32_t* targets, int N, int V,
                                            int vocab_begin, cudaStream_t s);
cudaError_t launch_crossentropy_shard_finish(float* losses, float* dlogits,
                                             const float* all_stats, int S,
                                             const int32_t* targets, const float* mask, int N,
                                             int V, int vocab_begin, float grad_scale,
                                             cudaStream_t s);
// AdamW's numbers as the kernels take them: the bias corrections 1 / (1 - beta^t) computed,
// grad_scale applied to each gradient first (AdamWParams::grad_scale).
struct AdamWArgs {
    float lr, beta1, beta2, eps, wd, inv_bc1, inv_bc2, grad_scale;
};
cudaError_t launch_adamw(float* params, const float* grads, float* m, float* v, size_t n,
                         const AdamWArgs& a, cudaStream_t s);
// Multi-tensor AdamW (Backend::adamw_update_segments): one block per chunk, a piece of at most
// kAdamWChunk floats of one segment at `offset` of the arrays; wd where `decay`, else 0.
inline constexpr uint32_t kAdamWChunk = 32768;
struct AdamWChunk {
    uint64_t offset;
    uint32_t n, decay;
    bool operator==(const AdamWChunk& o) const {
        return offset == o.offset && n == o.n && decay == o.decay;
    }
};
cudaError_t launch_adamw_chunks(float* params, const float* grads, float* m, float* v,
                                const AdamWChunk* chunks, size_t count, const AdamWArgs& a,
                                cudaStream_t s);

// ---------------------------------------------------------------- rotary, attention
// In place on the q and k thirds of qkv (B*T tokens of 3C). sign +1: forward map, -1: its
// transpose.
cudaError_t launch_rotary(float* qkv, const float* positions, int BT, int C, int H,
                          const RotaryArgs& r, float sign, cudaStream_t s);
// table (BT, dr / 2) of PairRotation (cuda_rotary.cuh: 4 floats c, s, sq, sk, 16-byte aligned):
// every token's rotation of every pair, for the kernels that rotate as they go.
cudaError_t launch_rotary_table(float* table, const float* positions, int BT, const RotaryArgs& r,
                                cudaStream_t s);
// att (B, H, T, T) holds q.k / sqrt(D) on entry; adds the bias, masks, and turns every row into
// softmax probabilities (0 above the diagonal and outside the window).
cudaError_t launch_attention_softmax(float* att, const float* positions, int B, int H, int T,
                                     KeyMask mask, const BiasArgs& bias, cudaStream_t s);
// One batch row b: dS (H, T, T) holds dP on entry and dlogits on exit (0 outside the mask);
// dtable_b (H, T, T) += dS inside the mask when non-null. att_b (H, T, T).
cudaError_t launch_attention_dlogits(float* ds, const float* att_b, float* dtable_b, int H, int T,
                                     KeyMask mask_b, cudaStream_t s);
// One batch row b: partials[((b * H + h) * chunks + c) * kMaxT5Buckets + x] = sum over rows of
// chunk c of d(loss)/d(parameter slot x) of head h, from dS (H, T, T). pos_b (T).
cudaError_t launch_attention_bias_grad_partials(float* partials, const float* ds,
                                                const float* pos_b, int b, int H, int T,
                                                KeyMask mask_b, const BiasArgs& bias,
                                                cudaStream_t s);
// da, db += the partials summed over b and chunks in a fixed order (da/db may be null).
cudaError_t launch_attention_bias_grad_reduce(float* da, float* db, const float* partials, int B,
                                              int H, int T, int kind, int nb, cudaStream_t s);
// Attention of Tq new queries per row over a key/value cache (backend.h), online softmax: no
// scratch. lens (B) device. heads (B * Tq, HS) device: the heads each query runs (-1: none),
// or null with HS = H: every head.
cudaError_t launch_attention_cached(float* out, const float* qkv, const float* kc,
                                    const float* vc, const float* kpos, const int32_t* lens, int B,
                                    int Tq, int S, int C, int H, int window, const BiasArgs& bias,
                                    const int32_t* heads, int HS, cudaStream_t s);

// ---------------------------------------------------------------- contextual sparsity
// Backend::matmul_rows_forward, matmul_rows_project, select_topk (cuda_sparse.cu).
cudaError_t launch_matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                       const float* bias, const int32_t* idx, int N, int IC,
                                       int K, int G, cudaStream_t s);
cudaError_t launch_matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                       const float* bias, const int32_t* idx, int N, int OC,
                                       int K, int G, cudaStream_t s);
cudaError_t launch_select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                               float threshold, cudaStream_t s);

// ---------------------------------------------------------------- attention across blocks
// Backend::attention_block_* (cuda_attention_block.cu). qrows, krows: the blocks' tokens with
// index, positions and doc_start in device memory; bias.table (B, H, Tq, Tk) for a Table bias.
// out_b (B, Tq, C), lse_b (B, H, Tq) (writes); q (B, Tq, 3C) (its q part), kv (B, Tk, 2C).
cudaError_t launch_attention_block_forward(float* out_b, float* lse_b, const float* q,
                                           const float* kv, const AttnBlockRows& qrows,
                                           const AttnBlockRows& krows, int B, int C, int H,
                                           int window, const BiasArgs& bias, cudaStream_t s);
// (out, lse) (B, Tq, C), (B, H, Tq) <- their log-sum-exp merge with (out_b, lse_b).
cudaError_t launch_attention_block_merge(float* out, float* lse, const float* out_b,
                                         const float* lse_b, int B, int Tq, int C, int H,
                                         cudaStream_t s);
// Doubles of the bias-parameter partial sums of launch_attention_block_backward: one slot per
// parameter (2, or nb for T5) per (b, h, tile of 32 queries).
size_t attention_block_partials(int B, int Tq, int H, int kind, int nb);
// dq (B, Tq, 3C; q part) +=, dkv (B, Tk, 2C) +=, dtable (B, H, Tq, Tk) += when non-null; with
// partials (attention_block_partials doubles, any contents) also da, db += (either may be null);
// partials null: no parameter gradients. out, lse: the merged forward results.
cudaError_t launch_attention_block_backward(float* dq, float* dkv, double* partials, float* da,
                                            float* db, float* dtable, const float* dout,
                                            const float* q, const float* kv, const float* out,
                                            const float* lse, const AttnBlockRows& qrows,
                                            const AttnBlockRows& krows, int B, int C, int H,
                                            int window, const BiasArgs& bias, cudaStream_t s);

// ---------------------------------------------------------------- wgmma (sm_90a only)

// C (M x N) (+)= A (M x K) B^T (B: N x K; with b_n_major A B, B: K x N), bf16 in, fp32 out,
// through wgmma (cuda_wgmma_sm90a.cu): the layout check behind backend.h cuda_wgmma_gemm.
// M % 64, N % n_tile (64 or 128) and K % 16 are the caller's to check; compute capability 9.0.
cudaError_t launch_wgmma_gemm(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                              int n_tile, bool a_from_registers, bool b_n_major, bool accumulate,
                              cudaStream_t s);
// The same with A and B brought in by TMA (tensor maps of cuda_tma.h: A K x M with 64 x 64
// boxes; B K x N with 64 x n_tile boxes, or N x K with 64 x K boxes when b_n_major; all with
// the 128-byte swizzle) and read through swizzled descriptors. K % 64 and K <= 256 are the
// caller's to check; M may be any count (rows past it read as zeros and are not stored).
cudaError_t launch_wgmma_gemm_tma(float* C, const CUtensorMap& a, const CUtensorMap& b, int M,
                                  int N, int K, int n_tile, bool a_from_registers, bool b_n_major,
                                  bool accumulate, cudaStream_t s);

}  // namespace ctx::cuda
