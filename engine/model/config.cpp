#include "model/config.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace ctx {

ModelConfig ModelConfig::from_style(const std::string& style) {
    ModelConfig c;
    if (style == "gpt2") {
        return c;  // pre-LN, learned positions (the PE plugin), tied head, biases everywhere
    }
    if (style == "neox") {  // GPT-NeoX / Pythia
        c.parallel_residual = true;
        c.tied_embeddings = false;
        c.activation = Activation::GeluErf;
        return c;
    }
    if (style == "bloom") {
        c.embedding_layernorm = true;
        return c;
    }
    if (style == "llama") {  // Llama / Mistral / Qwen2: RMSNorm, SwiGLU, no biases, untied head
        c.norm = NormKind::RMSNorm;
        c.activation = Activation::SwiGLU;
        c.tied_embeddings = false;
        c.attention_bias = c.attention_out_bias = c.mlp_bias = c.norm_bias = false;
        c.norm_eps = 1e-6f;
        return c;
    }
    fail("unknown model style '{}' (expected gpt2, neox, bloom or llama)", style);
}

void ModelConfig::validate() const {
    CTX_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
    CTX_CHECK(d_model > 0, "d_model must be positive, got {}", d_model);
    CTX_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
    CTX_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
    CTX_CHECK(d_model % n_head == 0, "d_model ({}) must be divisible by n_head ({})", d_model,
              n_head);
    CTX_CHECK(n_kv_head >= 0 && n_kv_head <= n_head && n_head % kv_heads() == 0,
              "n_kv_head ({}) must divide n_head ({}) (0 means n_head)", n_kv_head, n_head);
    CTX_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0: full causal), got {}",
              sliding_window);
    CTX_CHECK(norm != NormKind::RMSNorm || !norm_bias,
              "norm = rmsnorm has no bias: set norm_bias = false");
    CTX_CHECK(norm != NormKind::RMSNorm || !embedding_layernorm,
              "embedding_layernorm (BLOOM) is a layernorm: it does not combine with norm = rmsnorm");
    CTX_CHECK(context_length > 0, "context_length must be positive, got {}", context_length);
    CTX_CHECK(ffn_hidden >= 0, "ffn_hidden must be >= 0 (0 means 4*d_model), got {}", ffn_hidden);
    // ffn(), fc_rows() (up to 2 * ffn) and qkv_rows() (up to 3 * d_model) are ints as well.
    const int64_t ffn_rows = ffn_hidden > 0 ? ffn_hidden : 4 * int64_t{d_model};
    CTX_CHECK(2 * ffn_rows <= INT32_MAX && 3 * int64_t{d_model} <= INT32_MAX,
              "d_model ({}) and ffn_hidden ({}) are too large: the layer sizes they give exceed "
              "32-bit integers", d_model, ffn_hidden);
    // Non-finite values would also not survive the JSON a checkpoint keeps them in (null).
    CTX_CHECK(norm_eps > 0 && std::isfinite(norm_eps),
              "norm_eps must be positive and finite, got {}", norm_eps);
    CTX_CHECK(init_std > 0 && std::isfinite(init_std),
              "init_std must be positive and finite, got {}", init_std);
}

const std::vector<ModelConfigField>& model_config_fields() {
    using C = ModelConfig;
    static const std::vector<ModelConfigField> fields = {
        {"vocab_size", &C::vocab_size, "vocabulary size"},
        {"d_model", &C::d_model, "model width"},
        {"n_layer", &C::n_layer, "transformer blocks"},
        {"n_head", &C::n_head, "attention heads"},
        {"n_kv_head", &C::n_kv_head, "key/value heads (0: n_head; fewer: grouped-query)"},
        {"context_length", &C::context_length, "training context Lt"},
        {"ffn_hidden", &C::ffn_hidden, "MLP width (0: 4*d_model)"},
        {"norm_eps", &C::norm_eps, "layernorm epsilon"},
        {"init_std", &C::init_std, "init standard deviation"},
        {"activation", &C::activation, "gelu_tanh | gelu_erf | swiglu"},
        {"norm", &C::norm, "layernorm | rmsnorm"},
        {"sliding_window", &C::sliding_window, "attend the last N tokens only (0: full)"},
        {"parallel_residual", &C::parallel_residual, "GPT-NeoX residual"},
        {"tied_embeddings", &C::tied_embeddings, "lm head shares the token embedding"},
        {"embedding_layernorm", &C::embedding_layernorm, "BLOOM's layernorm after the embedding"},
        {"attention_bias", &C::attention_bias, "biases on q, k, v"},
        {"attention_out_bias", &C::attention_out_bias,
         "bias on the attention output (default: attention_bias)"},
        {"mlp_bias", &C::mlp_bias, "biases in the MLP"},
        {"norm_bias", &C::norm_bias, "layernorm bias"},
    };
    return fields;
}

const char* activation_name(Activation a) {
    switch (a) {
        case Activation::GeluTanh: return "gelu_tanh";
        case Activation::GeluErf: return "gelu_erf";
        case Activation::SwiGLU: return "swiglu";
        case Activation::Relu: return "relu";
    }
    return "?";
}

Activation activation_from_name(const std::string& name) {
    if (name == "gelu_tanh") return Activation::GeluTanh;
    if (name == "gelu_erf" || name == "gelu") return Activation::GeluErf;
    if (name == "swiglu") return Activation::SwiGLU;
    if (name == "relu") return Activation::Relu;
    fail("unknown activation '{}' (expected gelu_tanh, gelu_erf, swiglu or relu)", name);
}

std::vector<std::string> config_enum_choices(Activation) {
    return {"gelu_tanh", "gelu_erf", "swiglu", "relu"};
}

const char* norm_name(NormKind n) { return n == NormKind::RMSNorm ? "rmsnorm" : "layernorm"; }

NormKind norm_from_name(const std::string& name) {
    if (name == "layernorm") return NormKind::LayerNorm;
    if (name == "rmsnorm") return NormKind::RMSNorm;
    fail("unknown norm '{}' (expected layernorm or rmsnorm)", name);
}

std::vector<std::string> config_enum_choices(NormKind) { return {"layernorm", "rmsnorm"}; }

}  // namespace ctx
