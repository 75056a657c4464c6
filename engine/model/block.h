// The transformer block (Megatron-Core's TransformerLayer, llm.c's explicit passes): the one
// layer body that training, evaluation and cached generation all run. What differs between those
// paths is only how attention sees the other tokens, so that is a parameter (AttentionStep,
// model/attention_step.h: full or windowed causal attention over whole rows, or new tokens over
// a key/value cache).
//
// Pre-norm, in the GPT-2 / NeoX / BLOOM / Llama styles of ModelConfig:
//   sequential: r = x + proj(attn(ln1(x)));  x_out = r + mlp(ln2(r))
//   parallel:   r = x + proj(attn(ln1(x)));  x_out = r + mlp(ln2(x))     (GPT-NeoX)
//   mlp(h) = fc_proj(act(fc(h)))  or, gated (SwiGLU), fc_proj(silu(gate(h)) * up(h))
//   ln = layernorm, or RMSNorm (Llama family)
// Grouped-query attention projects H query heads and Hkv key/value heads; the key/value heads
// are repeated to H (Backend::kv_repeat_forward) before the attention step, which therefore
// sees the (N, 3C) rows of every other style.
//
// Tensor parallelism (model/tensor_parallel.h, Megatron-LM): qkv and fc are column-parallel
// (this rank's heads and hidden units), proj and fc_proj row-parallel, so each branch costs one
// all-reduce of its (N, C) output in forward ("g") and one of its input gradient in backward
// ("f", the conjugate). Shapes below are this rank's: A = the attention width of its heads, F
// its hidden units (A = C and F = ffn() at tp = 1). With sequence parallelism the residual
// stream (x, x_out, res2) holds this rank's Nr = N / tp rows only, the norms run on them, and
// the all-reduces become an all-gather entering each region and a reduce-scatter leaving it;
// the norm weights' gradients (from this rank's rows) are then summed over the group.
#pragma once

#include "backend/backend.h"
#include "backend/operand.h"
#include "model/config.h"
#include "model/tensor_parallel.h"

namespace ctx {

// Views of one block's parameters, or of their gradients (same layout). Shapes per TensorShard:
// C = d_model, A = attention width, F = MLP hidden units, Q = qkv rows (3A without
// grouped-query attention), F2 = fc rows (2F when gated: rows [gate | up]). Biases and norm
// biases are null when the config has none.
struct BlockWeights {
    float *ln1_w, *ln1_b;              // (C)
    float *qkv_w, *qkv_b;              // (Q, C), (Q)   rows [q | k | v]
    float *attn_proj_w, *attn_proj_b;  // (C, A), (C)
    float *ln2_w, *ln2_b;              // (C)
    float *fc_w, *fc_b;                // (F2, C), (F2)
    float *fc_proj_w, *fc_proj_b;      // (C, F), (C)
};

// One block's activations for N tokens. Training keeps a set per layer for the backward pass;
// generation points every layer at the same buffers (ln1 and ln2 may then be one buffer).
// ln1, ln2 and fch_act are read by products only, fch by the activation's derivative, atty by
// the output projection and the attention backward: stored in bf16 when the model's pass keeps
// activations in bf16 (Backend::bf16_activations, atty where Backend::attention_out_bf16; not
// with tensor parallelism nor in generation).
struct BlockActs {
    Operand ln1;                 // (N, C) (sequence parallel: gathered from every rank's rows)
    float *ln1_mean, *ln1_rstd;  // (Nr)  (mean unused by RMSNorm)
    float* qkv;                  // (N, 3A)  q, k as the attention step left them (rotated)
    Operand atty;                // (N, A)   attention output before the projection
    float* att;                  // what the attention step saves for backward (or nullptr)
    float* res2;                 // (Nr, C)  x + attn
    Operand ln2;                 // (N, C)
    float *ln2_mean, *ln2_rstd;  // (Nr)
    Operand fch;                 // (N, F2)  the MLP's pre-activation
    Operand fch_act;             // (N, F)
    float* qkv_grouped;          // (N, Q) grouped-query only (else null): the projection before
                                 // kv_repeat, scratch that every layer reuses
};

// Contextual sparsity of one block in a generation step (model/sparsity.h): per token, the
// MLP hidden units and the heads to run. The others are skipped: a unit's fc row and fc_proj
// column, a head's q rows, attention and output-projection columns. Keys and values are still
// projected for every head, so the cache stays right for later tokens. Device memory; the
// attention step is told the same heads (CachedAttention::set_heads). Null lists: all.
struct BlockSparsity {
    const int32_t* units = nullptr;  // (N, units_k) unit indices, -1: none
    int units_k = 0;
    const int32_t* heads = nullptr;  // (N, heads_k) head indices, -1: none
    int heads_k = 0;
    const float* fc_proj_t = nullptr;    // (F, C) fc_proj weight transposed (rows are units)
    const float* attn_proj_t = nullptr;  // (A, C) attention projection transposed
    float* kv = nullptr;                 // (N, 2 Hkv D) scratch: every head's keys and values
};

// Activation gradients of one backward pass through a block, reused by every layer.
struct BlockGradBuffers {
    float* dln;       // (N, C)
    float* dln2;      // (N, C)  parallel residual: the MLP branch's layernorm gradient
    float* datty;     // (N, A)
    float* dqkv;      // (N, 3A)
    float* dfch;      // (N, F2)
    float* dfch_act;  // (N, F)
    float* dqkv_grouped;  // (N, Q) grouped-query only (else null); may be BlockActs::qkv_grouped
    float* dx_full;   // (N, C) sequence parallel only (else null): every rank's rows of dx
    float* norm_scratch;  // (2C) sequence parallel only: one norm's weight gradients
};

// The style's normalisation over rows of C: layernorm (mean and rstd saved, bias optional) or
// RMSNorm (rstd saved; mean and b unused). The final norm and both block norms run these.
void norm_forward(Backend& be, const ModelConfig& c, Operand out, float* mean, float* rstd,
                  const float* inp, const float* w, const float* b, int N);
// dinp (N, C) +=, dw +=, db += (db null for RMSNorm)
void norm_backward(Backend& be, const ModelConfig& c, float* dinp, float* dw, float* db,
                   const float* dout, const float* inp, const float* w, const float* mean,
                   const float* rstd, int N);

// norm_backward over `rows` rows of this rank. Under sequence parallelism each rank's rows give
// a share of dw, db: they are computed into scratch (2C), summed over the group and then
// accumulated, so what dw and db held before is not summed again.
void norm_backward_rows(Backend& be, const ModelConfig& c, TensorGroup& tp, float* scratch,
                        float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int rows);

// How a block's attention sees the other tokens: q, k, v in, the attention output out.
class AttentionStep {
public:
    virtual ~AttentionStep() = default;
    // qkv (N, 3A) as projected; may be rotated in place (backward reads it as left). out (N, A)
    // (writes). saved: the step's buffer for backward, per layer (null where there is none).
    virtual void forward(int layer, float* qkv, Operand out, float* saved) = 0;
    // dqkv (N, 3A) += the gradient of the unrotated qkv, from dout (N, A) and what forward kept
    // (= with GradStore::Overwrite). Steps that only run forward (generation) refuse.
    virtual void backward(int layer, float* dqkv, const float* dout, const float* qkv,
                          const float* saved, Operand out, GradStore store);
};

class TransformerBlock {
public:
    // config, shard and tp must outlive the block (the model owns them all).
    TransformerBlock(const ModelConfig& config, const TensorShard& shard, TensorGroup& tp,
                     Backend& backend)
        : config_(config), shard_(shard), tp_(tp), backend_(backend) {}

    // x_out (Nr, C) = block(x (Nr, C)) (writes; x_out must not alias x). tmp (N, C) scratch.
    // N: the pass's rows (Nr = N without sequence parallelism). sparse: generation with
    // contextual sparsity (not with tensor parallelism), else null.
    void forward(const BlockWeights& w, const float* x, float* x_out, const BlockActs& a,
                 float* tmp, int N, int layer, AttentionStep& attention,
                 const BlockSparsity* sparse = nullptr) const;
    // dx (Nr, C): d(loss)/d(x_out) in, d(loss)/d(x) out. Parameter gradients ACCUMULATE into g;
    // x and a are the forward's input and activations.
    void backward(const BlockWeights& w, const BlockWeights& g, const float* x,
                  const BlockActs& a, float* dx, const BlockGradBuffers& d, int N, int layer,
                  AttentionStep& attention) const;

private:
    const ModelConfig& config_;
    const TensorShard& shard_;
    TensorGroup& tp_;
    Backend& backend_;
};

}  // namespace ctx
