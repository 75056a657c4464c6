// The model's activation buffers (private to model/decoder*.cpp).
#pragma once

#include "data/batch.h"
#include "model/arena.h"
#include "model/decoder.h"

namespace ctx {

// ---------------------------------------------------------------- activations
// One backend buffer holds everything the backward pass needs; offsets are computed for the
// reserved (B, T). Per-layer buffers are stacked by layer.
struct Model::Acts {
    Arena buffer;
    // ln1, ln2, fch_act and lnf feed products only, fch (the MLP's pre-activation) only the
    // activation's derivative: stored in bf16 (half the floats each) when the backend keeps
    // activations in bf16 (Backend::bf16_activations) and the model is not tensor-parallel
    // (whose gathers and head move fp32 rows). Read them through operand().
    bool bf16 = false;
    // Floats of one layer's saved attention state, and whether qkv is kept for every layer (the
    // attention step's backward reads it) or is one layer's buffer reused by each layer's
    // forward (the bf16 flash kernels keep their own packed q, k, v in `saved`).
    size_t saved_floats = 0;
    bool qkv_layers = true;
    // The attention output in bf16 too (Backend::attention_out_bf16: flash on the bf16 kernels).
    bool atty_bf16 = false;
    Operand operand(float* slot, size_t elems = 0) const {
        return bf16 ? Operand::in_bf16(reinterpret_cast<Bf16*>(slot) + elems)
                    : Operand(slot + elems);
    }
    float* encoded;      // (B, T, C)     embedding (+ input PE), before the embedding layernorm
    float* emb_ln;       // (B, T, C)     after the embedding layernorm (BLOOM), else unused
    float *emb_ln_mean, *emb_ln_rstd;  // (B, T)
    // per layer, stacked as (L, ...)
    float* ln1;          // (L, B, T, C)
    float *ln1_mean, *ln1_rstd;  // (L, B, T)
    // Widths are this rank's (tensor parallelism): A attention, F and F2 MLP, V vocabulary.
    float* qkv;          // (L, B, T, 3A)  q, k after rotary; one layer's (B, T, 3A) when the
                         //                attention step's backward does not read it (qkv_layers)
    float* qkv_grouped;  // (B, T, Q)      grouped-query only: the projection before kv_repeat,
                         //                and its gradient in the backward pass
    float* atty;         // (L, B, T, A)
    float* att;          // (L, saved): the backend's attention_saved_floats a layer: (B, H, T, T)
                         //   probabilities, or (B, H, T) lse in flash mode (+ what it keeps)
    float* res2;         // (L, B, T, C)   x + attn (sequential residual only)
    float* ln2;          // (L, B, T, C)
    float *ln2_mean, *ln2_rstd;  // (L, B, T)
    float* fch;          // (L, B, T, F2)   F2 = 2F when gated ([gate | up])
    float* fch_act;      // (L, B, T, F)
    float* resid;        // (L+1, B, T, C) residual stream entering each block (and the final)
    float* lnf;          // (B, T, C)
    float *lnf_mean, *lnf_rstd;  // (B, T)
    float* logits;       // (B, T, V)      becomes dlogits in the backward pass
    float* losses;       // (B, T)
    float* tmp;          // (B, T, C)      attention / mlp branch output before the residual add
    // gradients of activations (reused by every layer)
    float* dx;           // (B, T, C)  gradient of the residual stream
    float* dln;          // (B, T, C)
    float* dln2;         // (B, T, C)  parallel residual: the MLP branch's layernorm gradient
    float* datty;        // (B, T, A)
    float* dqkv;         // (B, T, 3A)
    float* dfch;         // (B, T, F2)
    float* dfch_act;     // (B, T, F)
    float* demb;         // (B, T, C)
    float* attn_scratch;
    // generic bias (CTX_BIAS_GENERIC) only, else empty: shared by every layer
    float* bias_table;   // (B, H, T, T)  f_h(p_i - p_j, p_i) for j <= i
    float* dbias_table;  // (B, H, T, T)  d(loss)/d(bias), summed over layers
    // vocabulary-parallel cross-entropy (tensor parallelism) only: per-row statistics of this
    // rank's logits, and every rank's (Backend::crossentropy_shard_stats)
    float* xent_stats;      // (B, T, 3)
    float* xent_stats_all;  // (tp, B, T, 3)
    // sequence parallelism only: every rank's rows of dx, one norm's weight gradients
    float* dx_full;       // (B, T, C)
    float* norm_scratch;  // (2C)
    // the batch of the current pass where the ops read it (Backend::stage_batch): tokens,
    // targets, positions, loss mask, (B, T) each
    BatchInputs batch;
};

}  // namespace ctx
