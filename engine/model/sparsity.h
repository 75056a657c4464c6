// Contextual sparsity (Deja Vu, Liu et al., ICML 2023): for each token only a few MLP hidden
// units and attention heads matter, and a cheap predictor can say which, one layer ahead.
//
// Predictors, per layer l, low rank (two products, no nonlinearity, as in the paper):
//   z_l = ln1 output of layer l - 1 (l >= 1; layer 0 reads its own ln1 output)    (N, C)
//   units:  s = (z_l A_u^T) B_u^T + b_u     A_u (r_u, C), B_u (F, r_u), b_u (F)
//   heads:  s = (z_l A_h^T) B_h^T + b_h     A_h (r_h, C), B_h (H, r_h), b_h (H)
// The lookahead (layer l reads layer l - 1's input) lets a decode step predict layer l's
// selection while layer l - 1 still runs. They are trained with binary cross-entropy on the
// model's own activations (collect_sparsity_data): a unit's label is 1 when it is active
// (ReLU: output > 0, where skipping inactive units is exact) or, for GELU and SwiGLU, when |its
// output| is among the largest `label_units` fraction of the token's units (approximate); a
// head's label is 1 when the norm of its contribution to the attention output (its columns of
// the output projection times its output) is among the largest `label_heads` fraction.
//
// Decoding with sparsity (KvGenerator, model/generate.h) keeps the top-k scores of each token,
// k = (1 - sparsity) x units (or heads), or for ReLU models optionally every unit whose score
// is positive (predicted active). Keys and values are still computed for every head, so the
// cache stays right for later tokens whichever heads they select.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/config.h"

namespace ctx {

class Model;

struct PredictorShape {
    int unit_rank = 64;   // r_u
    int head_rank = 32;   // r_h
    float label_units = 0.25f;  // GELU / SwiGLU: the largest fraction labelled 1 (ReLU: active)
    float label_heads = 0.5f;
};

// The predictors of every layer in one arena (llm.c): layers.<l>.units.{a,b,bias},
// layers.<l>.heads.{a,b,bias}; a layer's six tensors are contiguous.
class SparsityPredictors {
public:
    SparsityPredictors(const ModelConfig& config, Backend& backend, const PredictorShape& shape,
                       uint64_t seed);
    const ModelConfig& config() const { return config_; }
    const PredictorShape& shape() const { return shape_; }
    const ArenaLayout& layout() const { return layout_; }
    Arena& params() { return params_; }
    const Arena& params() const { return params_; }
    Backend& backend() const { return *backend_; }
    // [begin, end) of layer l's tensors in the arena
    std::pair<size_t, size_t> layer_range(int l) const;

    // scores (N, F) of layer l's units, (N, H) of its heads, from z (N, C). u: (N, max rank)
    // scratch. Device memory of the backend.
    void unit_scores(int l, const float* z, float* scores, float* u, int N) const;
    void head_scores(int l, const float* z, float* scores, float* u, int N) const;

private:
    ModelConfig config_;
    Backend* backend_;
    PredictorShape shape_;
    ArenaLayout layout_;
    Arena params_;
};

// What the predictors learn from: per layer, on the host, for Ntok tokens of real text.
struct SparsityData {
    int tokens = 0;                       // Ntok
    std::vector<std::vector<float>> z;    // per layer (Ntok, C): the predictor's input
    std::vector<std::vector<float>> unit_out;  // per layer (Ntok, F): the units' outputs
    std::vector<std::vector<float>> head_norm;  // per layer (Ntok, H): contribution norms
};

// Runs the model (as a KV-cache prefill, the blocks of generation) over each row and keeps what
// the predictors need. Rows: token ids with positions 0 .. n-1. Not under tensor parallelism.
SparsityData collect_sparsity_data(Model& model, const std::vector<std::vector<int32_t>>& rows);

// Labels of layer l per PredictorShape (1 or 0), host (Ntok, F) and (Ntok, H).
std::vector<float> unit_labels(const SparsityData& d, int l, const ModelConfig& c,
                               float label_units);
std::vector<float> head_labels(const SparsityData& d, int l, int H, float label_heads);

struct PredictorTraining {
    int epochs = 20;
    int batch = 256;   // tokens per step
    float lr = 1e-2f;
    float weight_decay = 0.0f;
    uint64_t seed = 1;
};

struct PredictorLosses {
    std::vector<double> units_first, units_last;  // per layer: mean BCE of the first and last epoch
    std::vector<double> heads_first, heads_last;
};

// AdamW on binary cross-entropy, layer by layer, over `train`'s tokens.
PredictorLosses train_predictors(SparsityPredictors& p, const SparsityData& train,
                                 const PredictorTraining& opt);

// How well the predictors find what matters, on held-out tokens: recall of the true top-k
// (by |output| for units, by contribution norm for heads) among the predicted top-k, k = keep
// x units (heads); for ReLU models also the recall of the active units by the units with a
// positive score, and the fraction of units that selects.
struct PredictorRecall {
    std::vector<double> units, heads;  // per layer, mean over tokens
    std::vector<double> active_recall, active_selected;  // ReLU only (else empty)
    double mean_units() const;
    double mean_heads() const;
};
PredictorRecall predictor_recall(const SparsityPredictors& p, const SparsityData& held_out,
                                 float keep_units, float keep_heads);

// Keep counts: max(1, round(keep x total)).
int keep_count(float keep, int total);

}  // namespace ctx
