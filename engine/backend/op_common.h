// What every backend shares on the host: the argument checks it applies before running an op (so
// a bad call fails the same way, same ctx::Error message, on the CPU and on a GPU), the limits,
// and the T5 bucket formula its lookup tables are built from.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace ctx {

inline constexpr int kMaxT5Buckets = 512;     // per head, T5 relative-position buckets
inline constexpr int kMaxRotaryPairs = 1024;  // rotary_dims / 2
// T5 max_distance up to which a backend looks buckets up in a table built with t5_bucket().
inline constexpr int kT5LutSize = 4096;

// T5 bucket of a distance d = p_i - p_j (METHODS.md 1.6): n = max(0, floor(d)), exact buckets
// below num_buckets / 2, logarithmic ones up to max_distance. In double.
int t5_bucket(double d, int num_buckets, int max_distance);

// Every token in [0, V); with positions, every position in [0, P - 1] (the learned table).
void check_embedding_tokens(const int32_t* tokens, const float* positions, int N, int V, int P);
// Every target of a trained row (mask != 0; a null mask trains every row) in [0, V). Serial,
// before any parallel region, so no exception is thrown from inside one.
void check_targets(const int32_t* targets, const float* mask, int N, int V);
// rotary_dims even, within the head dimension and kMaxRotaryPairs; inv_freq present.
void check_rotary(int C, int H, const RotarySpec& spec);
// T >= 1, heads divide d_model, window >= 0, and the bias family's parameters present and valid;
// opt.rotary only where the op applies it (rotary_fused: Backend::attention_fuses_rotary).
void check_attention(int T, int C, int H, const AttentionOptions& opt, bool rotary_fused = false);
// Attention over a KV cache: the above, packed rows refused, and its head subset (opt.heads).
void check_attention_cached(int S, int C, int H, const AttentionOptions& opt);
// The contextual-sparsity ops' shapes: matmul_rows_* (N, K >= 0, groups of G >= 1 rows) and
// select_topk (1 <= K <= M).
void check_rows_op(const char* op, int N, int K, int G);
void check_topk(int N, int M, int K);

// Backend::lm_head_loss's chunks: the budget in floats, `default_mib` MiB of fp32 logits unless
// CTX_LM_HEAD_CHUNK_MIB says otherwise (a positive integer, else ctx::Error naming it); the most
// rows of `row_floats` floats it holds (at least 1); the rows per chunk for N rows (the N rows
// in equal chunks of at most `most`; never more than min(N, most), which sizes the scratch for
// every N up to the reserved one).
size_t lm_head_chunk_budget_floats(size_t default_mib);
int lm_head_most_rows(size_t row_floats, size_t budget_floats);
int lm_head_rows_for(int N, int most);
// Backend::lm_head_loss's arguments: shapes, training needs both dinp and dW.
void check_lm_head(int N, int C, int V, const float* dinp, const float* dW);
// The MLP ops' width: SwiGLU's pre is [gate | up], so its OC = 2F must be even.
void check_swiglu_width(const char* op, int OC, Activation act);
// Backend::activation_matmul_backward's arguments (shapes, an even OC for SwiGLU, a dpre of
// its own), named as `op`.
void check_activation_matmul_backward(const char* op, float* dpre, const float* dact,
                                      const void* pre, int N, int IC, int OC, Activation act);
// Its first half on any backend: dpre (N, OC) = the activation's backward of dact at pre
// (activation_backward, or swiglu_backward for SwiGLU), written.
void activation_backward_rows(Backend& be, float* dpre, const float* dact, const float* pre,
                              int N, int OC, Activation act);

}  // namespace ctx
