// The attention steps a TransformerBlock runs (model/block.h): the three ways a block's
// attention sees the other tokens.
//   CausalAttention, window 0:  full causal attention over whole rows (training, evaluation)
//   CausalAttention, window W:  the same limited to the last W tokens (the windowed control)
//   CachedAttention:            new tokens over a key/value cache (generation)
// Rotary position embedding is part of the step: it needs the positions the step owns, and the
// cached step rotates each row by the spec of that row's length.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/block.h"

namespace ctx {

// A rotary spec with its arrays copied: a plugin may reuse its own arrays on its next call, and
// a pass (or a generation step) uses the spec after later plugin calls.
class OwnedRotarySpec {
public:
    OwnedRotarySpec() = default;
    explicit OwnedRotarySpec(const RotarySpec& s);
    OwnedRotarySpec(const OwnedRotarySpec& o) : OwnedRotarySpec(o.spec_) {}
    OwnedRotarySpec& operator=(const OwnedRotarySpec& o);
    const RotarySpec& spec() const { return spec_; }
    bool enabled() const { return spec_.rotary_dims > 0; }
    // Everything the rotation depends on, to tell whether two specs rotate alike.
    std::vector<float> signature() const;

private:
    RotarySpec spec_;
    std::vector<float> inv_freq_, amp_base_;
};

// Causal attention over B rows of T tokens, full (opt.window 0) or windowed. The model sets one
// up per forward pass; the backward pass of the same step reuses it, specs included.
class CausalAttention final : public AttentionStep {
public:
    CausalAttention(Backend& backend, int C, int H) : backend_(backend), C_(C), H_(H) {}
    CausalAttention(const CausalAttention&) = delete;  // opt_.rotary points into rotary_
    CausalAttention& operator=(const CausalAttention&) = delete;
    // positions (B, T) device memory; scratch: attention_scratch_floats(B, T, C, H, opt.mode).
    void begin(int B, int T, const float* positions, const RotarySpec& rotary,
               const AttentionOptions& opt, float* scratch);
    void forward(int layer, float* qkv, Operand out, float* saved) override;
    void backward(int layer, float* dqkv, const float* dout, const float* qkv, const float* saved,
                  Operand out, GradStore store) override;
    const AttentionOptions& options() const { return opt_; }

private:
    Backend& backend_;
    int C_, H_, B_ = 0, T_ = 0;
    const float* positions_ = nullptr;
    OwnedRotarySpec rotary_;
    bool separate_rotary_ = false;  // rotary_forward / _backward around the ops (not fused)
    AttentionOptions opt_;          // its rotary points into rotary_ when the ops fuse it
    float* scratch_ = nullptr;
};

// Per layer, rows x S slots: rotated keys and values (C each), and the slots' positions.
struct KvCache {
    std::vector<Arena> k, v;  // per layer (rows, S, C)
    Arena pos;                // (rows, S)
    int rows = 0, S = 0;
    KvCache(Backend& backend, int layers, int rows, int S, int C);
};

// New tokens over a KvCache: rows [r0, r0 + nb) each bring Tq tokens that already occupy their
// slots lens[r] - Tq .. lens[r] - 1 (positions written into cache.pos). Each layer's forward
// rotates q and k of the new tokens by their row's spec, writes k and v into the cache, and
// attends every cached slot j <= the query's (within the window).
class CachedAttention final : public AttentionStep {
public:
    CachedAttention(Backend& backend, int C, int H, KvCache& cache)
        : backend_(backend), C_(C), H_(H), cache_(cache) {}
    // lens: host (cache.rows), already advanced. positions (nb * Tq) device. rotary: per row of
    // the step (empty: no rotary). opt.bias: a Table bias is (nb, H, Tq, S). scratch:
    // attention_cached_scratch_floats(S) floats.
    void begin(int r0, int nb, int Tq, const int32_t* lens, const float* positions,
               const std::vector<OwnedRotarySpec>* rotary, const AttentionOptions& opt,
               float* scratch);
    void forward(int layer, float* qkv, Operand out, float* saved) override;
    // Contextual sparsity: the heads each new token runs in the next forward (AttentionOptions::
    // heads), or null for all.
    void set_heads(const int32_t* heads, int heads_k) {
        opt_.heads = heads;
        opt_.heads_k = heads_k;
    }

private:
    Backend& backend_;
    int C_, H_;
    KvCache& cache_;
    float* scratch_ = nullptr;
    int r0_ = 0, nb_ = 0, Tq_ = 0;
    const int32_t* lens_ = nullptr;
    const float* positions_ = nullptr;
    const std::vector<OwnedRotarySpec>* rotary_ = nullptr;
    AttentionOptions opt_;
};

}  // namespace ctx
