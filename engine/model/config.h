// The one configurable decoder (GPT-2, GPT-NeoX/Pythia and BLOOM are settings of it, not forks).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "backend/backend.h"

namespace ctx {

struct ModelConfig {
    int vocab_size = 256;
    int d_model = 128;
    int n_layer = 2;
    int n_head = 4;
    int context_length = 128;  // Lt: rows the model trains on; extend() raises it
    int ffn_hidden = 0;        // 0 means 4 * d_model
    float norm_eps = 1e-5f;
    float init_std = 0.02f;    // N(0, init_std^2) for matrices; residual projections scaled by
                               // 1/sqrt(2 n_layer) (GPT-2)
    Activation activation = Activation::GeluTanh;
    bool parallel_residual = false;    // GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    bool tied_embeddings = true;       // lm head shares wte (GPT-2, BLOOM); NeoX unties it
    bool embedding_layernorm = false;  // BLOOM: layernorm right after the embedding
    bool attention_bias = true;        // biases on qkv and the attention output projection
    bool mlp_bias = true;              // biases on both MLP matrices
    bool norm_bias = true;             // layernorm has a bias (beta)

    int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
    int head_dim() const { return d_model / n_head; }
    // Fills in the defaults of a named style ("gpt2", "neox", "bloom"); throws on unknown.
    static ModelConfig from_style(const std::string& style);
    void validate() const;  // throws ctx::Error naming the bad field
};

// Every field of ModelConfig once, in declaration order: the key that names it in ctx.model{},
// model:config() and the checkpoint's JSON, and the member it sets. Readers and writers of those
// forms loop over this table, so a new field is added here and nowhere else.
struct ModelConfigField {
    using Member = std::variant<int ModelConfig::*, float ModelConfig::*, bool ModelConfig::*,
                                Activation ModelConfig::*>;
    const char* name;
    Member member;
    const char* help;
};
const std::vector<ModelConfigField>& model_config_fields();

const char* activation_name(Activation a);
Activation activation_from_name(const std::string& name);  // "gelu_tanh" | "gelu_erf"

}  // namespace ctx
