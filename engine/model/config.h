// The one configurable decoder (GPT-2, GPT-NeoX/Pythia, BLOOM and the Llama family are settings of
// it, not forks).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "backend/backend.h"

namespace ctx {

enum class NormKind { LayerNorm = 0, RMSNorm = 1 };

struct ModelConfig {
    int vocab_size = 256;
    int d_model = 128;
    int n_layer = 2;
    int n_head = 4;
    int n_kv_head = 0;         // key/value heads: grouped-query attention when < n_head, multi-query
                               // at 1; 0 means n_head
    int context_length = 128;  // Lt: rows the model trains on; extend() raises it
    int ffn_hidden = 0;        // 0 means 4 * d_model
    float norm_eps = 1e-5f;
    float init_std = 0.02f;    // N(0, init_std^2) for matrices; residual projections scaled by
                               // 1/sqrt(2 n_layer) (GPT-2)
    Activation activation = Activation::GeluTanh;  // SwiGLU: fc makes [gate | up], 2F rows
    NormKind norm = NormKind::LayerNorm;           // RMSNorm: Llama family (no bias, no centering)
    int sliding_window = 0;    // Mistral: a token attends its last sliding_window tokens (itself
                               // included) in training, evaluation and generation; 0 = full
    bool parallel_residual = false;    // GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    bool tied_embeddings = true;       // lm head shares wte (GPT-2, BLOOM); NeoX unties it
    bool embedding_layernorm = false;  // BLOOM: layernorm right after the embedding
    bool attention_bias = true;        // biases on q, k and v (Qwen2 keeps only these)
    bool attention_out_bias = true;    // bias on the attention output projection; readers that
                                       // are not given it take attention_bias's value
    bool mlp_bias = true;              // biases on both MLP matrices
    bool norm_bias = true;             // layernorm has a bias (beta)

    int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
    int head_dim() const { return d_model / n_head; }
    int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    bool grouped_kv() const { return kv_heads() != n_head; }
    // Rows of the q, k, v projection: [q (n_head D) | k (kv_heads D) | v (kv_heads D)].
    int qkv_rows() const { return (n_head + 2 * kv_heads()) * head_dim(); }
    // The window attention runs with: sliding_window and an extra limit (the windowed control),
    // whichever is tighter; 0 = full causal.
    int window_with(int extra) const {
        if (sliding_window == 0 || extra == 0) return sliding_window + extra;
        return sliding_window < extra ? sliding_window : extra;
    }
    bool gated_mlp() const { return activation == Activation::SwiGLU; }
    int fc_rows() const { return gated_mlp() ? 2 * ffn() : ffn(); }  // [gate | up] when gated
    // Fills in the defaults of a named style ("gpt2", "neox", "bloom", "llama"); throws on
    // unknown.
    static ModelConfig from_style(const std::string& style);
    void validate() const;  // throws ctx::Error naming the bad field
};

// Every field of ModelConfig once, in declaration order: the key that names it in ctx.model{},
// model:config() and the checkpoint's JSON, and the member it sets. Readers and writers of those
// forms loop over this table, so a new field is added here and nowhere else.
struct ModelConfigField {
    using Member = std::variant<int ModelConfig::*, float ModelConfig::*, bool ModelConfig::*,
                                Activation ModelConfig::*, NormKind ModelConfig::*>;
    const char* name;
    Member member;
    const char* help;
};
const std::vector<ModelConfigField>& model_config_fields();

// The enum-valued fields by name, for every reader and writer of ModelConfig.
const char* activation_name(Activation a);
Activation activation_from_name(const std::string& name);  // "gelu_tanh" | "gelu_erf" | "swiglu" | "relu"
const char* norm_name(NormKind n);
NormKind norm_from_name(const std::string& name);  // "layernorm" | "rmsnorm"
inline const char* config_enum_name(Activation a) { return activation_name(a); }
inline const char* config_enum_name(NormKind n) { return norm_name(n); }
inline void config_enum_parse(const std::string& s, Activation& out) { out = activation_from_name(s); }
inline void config_enum_parse(const std::string& s, NormKind& out) { out = norm_from_name(s); }
std::vector<std::string> config_enum_choices(Activation);
std::vector<std::string> config_enum_choices(NormKind);

}  // namespace ctx
