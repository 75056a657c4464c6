#include "model/config.h"

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
    fail("unknown model style '{}' (expected gpt2, neox or bloom)", style);
}

void ModelConfig::validate() const {
    CTX_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
    CTX_CHECK(d_model > 0, "d_model must be positive, got {}", d_model);
    CTX_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
    CTX_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
    CTX_CHECK(d_model % n_head == 0, "d_model ({}) must be divisible by n_head ({})", d_model,
              n_head);
    CTX_CHECK(context_length > 0, "context_length must be positive, got {}", context_length);
    CTX_CHECK(ffn_hidden >= 0, "ffn_hidden must be >= 0 (0 means 4*d_model), got {}", ffn_hidden);
    CTX_CHECK(norm_eps > 0, "norm_eps must be positive, got {}", norm_eps);
    CTX_CHECK(init_std > 0, "init_std must be positive, got {}", init_std);
}

const std::vector<ModelConfigField>& model_config_fields() {
    using C = ModelConfig;
    static const std::vector<ModelConfigField> fields = {
        {"vocab_size", &C::vocab_size, "vocabulary size"},
        {"d_model", &C::d_model, "model width"},
        {"n_layer", &C::n_layer, "transformer blocks"},
        {"n_head", &C::n_head, "attention heads"},
        {"context_length", &C::context_length, "training context Lt"},
        {"ffn_hidden", &C::ffn_hidden, "MLP width (0: 4*d_model)"},
        {"norm_eps", &C::norm_eps, "layernorm epsilon"},
        {"init_std", &C::init_std, "init standard deviation"},
        {"activation", &C::activation, "gelu_tanh | gelu_erf"},
        {"parallel_residual", &C::parallel_residual, "GPT-NeoX residual"},
        {"tied_embeddings", &C::tied_embeddings, "lm head shares the token embedding"},
        {"embedding_layernorm", &C::embedding_layernorm, "BLOOM's layernorm after the embedding"},
        {"attention_bias", &C::attention_bias, "biases in attention"},
        {"mlp_bias", &C::mlp_bias, "biases in the MLP"},
        {"norm_bias", &C::norm_bias, "layernorm bias"},
    };
    return fields;
}

const char* activation_name(Activation a) {
    return a == Activation::GeluTanh ? "gelu_tanh" : "gelu_erf";
}

Activation activation_from_name(const std::string& name) {
    if (name == "gelu_tanh") return Activation::GeluTanh;
    if (name == "gelu_erf" || name == "gelu") return Activation::GeluErf;
    fail("unknown activation '{}' (expected gelu_tanh or gelu_erf)", name);
}

}  // namespace ctx
