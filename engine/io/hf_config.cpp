// config.json <-> HfSpec for GPT-2, GPT-NeoX, BLOOM and the Llama family (Llama, Mistral, Qwen2). Missing keys take transformers' class
// defaults (what from_pretrained would use); settings ctxengine cannot reproduce are refused.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "build_info.h"
#include "core/error.h"
#include "io/hf_model.h"

namespace ctx {

using json = nlohmann::json;

namespace {

// Typed access to config.json keys; null counts as absent (e.g. GPT-2's "n_inner": null).
class Cfg {
public:
    Cfg(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}
    bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
    bool present(const char* k) const { return j_.contains(k); }  // null included
    const json& at(const char* k) const { return j_[k]; }
    int64_t integer(const char* k, int64_t dflt) const {
        if (!has(k)) return dflt;
        const json& v = j_[k];
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
            std::fabs(v.get<double>()) < 9e15)
            return static_cast<int64_t>(v.get<double>());
        fail("{}: \"{}\" must be an integer, got {}", origin_, k, v.dump());
    }
    int positive(const char* k, int64_t dflt) const {
        const int64_t v = integer(k, dflt);
        CTX_CHECK(v > 0 && v <= (1 << 30), "{}: \"{}\" must be a positive integer, got {}",
                  origin_, k, v);
        return static_cast<int>(v);
    }
    double number(const char* k, double dflt) const {
        if (!has(k)) return dflt;
        CTX_CHECK(j_[k].is_number(), "{}: \"{}\" must be a number, got {}", origin_, k,
                  j_[k].dump());
        return j_[k].get<double>();
    }
    bool boolean(const char* k, bool dflt) const {
        if (!has(k)) return dflt;
        CTX_CHECK(j_[k].is_boolean(), "{}: \"{}\" must be true or false, got {}", origin_, k,
                  j_[k].dump());
        return j_[k].get<bool>();
    }
    std::string string(const char* k, const std::string& dflt) const {
        if (!has(k)) return dflt;
        CTX_CHECK(j_[k].is_string(), "{}: \"{}\" must be a string, got {}", origin_, k,
                  j_[k].dump());
        return j_[k].get<std::string>();
    }
    // A boolean setting ctxengine supports only at one value.
    void require(const char* k, bool dflt, bool supported, const char* why) const {
        CTX_CHECK(boolean(k, dflt) == supported, "{}: \"{}\" = {} is not supported ({})",
                  origin_, k, supported ? "false" : "true", why);
    }
    const std::string& origin() const { return origin_; }

private:
    const json& j_;
    std::string origin_;
};

Activation activation_from_hf(const Cfg& c, const char* key, const std::string& dflt) {
    const std::string a = c.string(key, dflt);
    if (a == "gelu" || a == "gelu_python") return Activation::GeluErf;
    // gelu_fast is the same tanh form with the constant folded in.
    if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast")
        return Activation::GeluTanh;
    if (a == "relu") return Activation::Relu;
    fail("{}: \"{}\" = \"{}\" is not supported (gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, "
         "relu)", c.origin(), key, a);
}

void read_token_ids(const Cfg& c, HfSpec& s) {
    if (c.has("bos_token_id") && c.at("bos_token_id").is_number_integer())
        s.bos_token_id = c.integer("bos_token_id", -1);
    if (c.has("eos_token_id") && c.at("eos_token_id").is_number_integer())
        s.eos_token_id = c.integer("eos_token_id", -1);
}

HfSpec gpt2_spec(const Cfg& c) {
    HfSpec s;
    s.model_type = "gpt2";
    s.style = "gpt2";
    ModelConfig& m = s.config = ModelConfig::from_style("gpt2");
    m.vocab_size = c.positive("vocab_size", 50257);
    m.context_length = c.positive("n_positions", c.integer("n_ctx", 1024));  // n_ctx: old configs
    m.d_model = c.positive("n_embd", 768);
    m.n_layer = c.positive("n_layer", 12);
    m.n_head = c.positive("n_head", 12);
    m.ffn_hidden = c.has("n_inner") ? c.positive("n_inner", 0) : 0;
    m.activation = activation_from_hf(c, "activation_function", "gelu_new");
    m.norm_eps = static_cast<float>(c.number("layer_norm_epsilon", 1e-5));
    m.init_std = static_cast<float>(c.number("initializer_range", 0.02));
    m.tied_embeddings = c.boolean("tie_word_embeddings", true);
    c.require("scale_attn_weights", true, true, "attention is always scaled by 1/sqrt(head_dim)");
    c.require("scale_attn_by_inverse_layer_idx", false, false,
              "per-layer attention scaling is not implemented");
    c.require("add_cross_attention", false, false, "decoder-only models only");
    s.pe_plugin = "pe/learned";
    read_token_ids(c, s);
    return s;
}

// RoPE settings of a NeoX or Llama-family config: rotary_pct / rotary_emb_base / rope_theta /
// rope_scaling (legacy "type" or "rope_type"), or transformers 5's "rope_parameters".
// default_pct: the class's rotary fraction (NeoX 0.25; the Llama family rotates whole heads).
void read_rope(const Cfg& c, HfSpec& s, double default_pct) {
    const int head_dim = s.config.head_dim();
    double pct = c.number("rotary_pct", c.number("partial_rotary_factor", default_pct));
    double base = c.number("rotary_emb_base", c.number("rope_theta", 10000.0));
    if (c.has("rotary_emb_base") && c.has("rope_theta"))
        CTX_CHECK(c.number("rotary_emb_base", 0) == c.number("rope_theta", 0),
                  "{}: \"rotary_emb_base\" ({}) and \"rope_theta\" ({}) differ", c.origin(),
                  c.number("rotary_emb_base", 0), c.number("rope_theta", 0));
    json scaling;  // null: none
    if (c.has("rope_scaling")) {
        scaling = c.at("rope_scaling");
    } else if (c.has("rope_parameters")) {
        const json& p = c.at("rope_parameters");
        CTX_CHECK(p.is_object(), "{}: \"rope_parameters\" must be an object", c.origin());
        const Cfg rp(p, c.origin() + " rope_parameters");
        base = rp.number("rope_theta", base);
        pct = rp.number("partial_rotary_factor", pct);
        scaling = p;
    }
    CTX_CHECK(pct > 0 && pct <= 1, "{}: \"rotary_pct\" must be in (0, 1], got {}", c.origin(),
              pct);
    CTX_CHECK(base > 0 && std::isfinite(base), "{}: the rotary base must be positive, got {}",
              c.origin(), base);
    // transformers rotates int(head_dim * pct) dims; pe/rope the same, rounded down to even.
    const int dims = static_cast<int>(head_dim * pct);
    CTX_CHECK(dims >= 2 && dims % 2 == 0,
              "{}: rotary_pct {} gives {} rotary dims of head_dim {} (need an even number >= 2)",
              c.origin(), pct, dims, head_dim);
    json& o = s.pe_options;
    o["rotary_pct"] = pct;
    o["base"] = base;
    o["layout"] = "half";  // GPT-NeoX rotates dim k with k + dims/2
    const int max_pos = s.config.context_length;
    if (scaling.is_null()) return;
    CTX_CHECK(scaling.is_object(), "{}: \"rope_scaling\" must be an object or null", c.origin());
    const Cfg sc(scaling, c.origin() + " rope_scaling");
    const std::string type = sc.string("rope_type", sc.string("type", "default"));
    if (type == "default") return;
    const double factor = sc.number("factor", 1.0);
    CTX_CHECK(factor >= 1 && std::isfinite(factor),
              "{}: \"factor\" must be a number >= 1, got {}", sc.origin(), factor);
    const int64_t omp = sc.integer("original_max_position_embeddings", 0);
    if (type == "linear") {
        // Position interpolation: positions / factor. L only matters to a later extend().
        o["scaling"] = "linear";
        o["factor"] = factor;
        o["original_length"] =
            omp > 0 ? omp : std::max<int64_t>(1, std::llround(max_pos / factor));
    } else if (type == "dynamic") {
        // transformers scales the base once rows exceed max_position_embeddings (its L).
        o["scaling"] = "dynamic_ntk";
        o["factor"] = factor;
        o["original_length"] = max_pos;
    } else if (type == "yarn") {
        // transformers' YaRN (pe/rope hf_yarn): L0 is rope_scaling's
        // original_max_position_embeddings where present (later transformers), else
        // max_position_embeddings (transformers 4.49).
        o["scaling"] = "hf_yarn";
        o["factor"] = factor;
        o["original_length"] = omp > 0 ? omp : int64_t{max_pos};
        for (const auto& [key, opt] : {std::pair{"beta_fast", "yarn_beta_fast"},
                                       {"beta_slow", "yarn_beta_slow"},
                                       {"attention_factor", "attention_factor"},
                                       {"mscale", "mscale"},
                                       {"mscale_all_dim", "mscale_all_dim"}})
            if (sc.has(key)) o[opt] = sc.number(key, 0);
    } else if (type == "llama3") {
        CTX_CHECK(omp > 0, "{}: rope type \"llama3\" needs \"original_max_position_embeddings\"",
                  sc.origin());
        o["scaling"] = "llama3";
        o["factor"] = factor;
        o["original_length"] = omp;
        o["low_freq_factor"] = sc.number("low_freq_factor", 1.0);
        o["high_freq_factor"] = sc.number("high_freq_factor", 4.0);
    } else if (type == "longrope") {
        // L0: the config's top-level original_max_position_embeddings (transformers 4.49, which
        // then takes factor = max_position_embeddings / L0), or rope_scaling's.
        const int64_t top = c.integer("original_max_position_embeddings", 0);
        const int64_t L0 = top > 0 ? top : (omp > 0 ? omp : int64_t{max_pos});
        o["scaling"] = "longrope";
        o["original_length"] = L0;
        o["factor"] = top > 0 ? std::max(1.0, double(max_pos) / double(top)) : factor;
        for (const char* key : {"short_factor", "long_factor"}) {
            CTX_CHECK(sc.has(key) && sc.at(key).is_array(),
                      "{}: rope type \"longrope\" needs a list \"{}\"", sc.origin(), key);
            o[key] = sc.at(key);
        }
        if (sc.has("attention_factor")) o["attention_factor"] = sc.number("attention_factor", 0);
    } else {
        fail("{}: rope type \"{}\" is not supported (default, linear, dynamic, yarn, llama3 and "
             "longrope are)", sc.origin(), type);
    }
}

HfSpec neox_spec(const Cfg& c) {
    HfSpec s;
    s.model_type = "gpt_neox";
    s.style = "neox";
    ModelConfig& m = s.config = ModelConfig::from_style("neox");
    m.vocab_size = c.positive("vocab_size", 50432);
    m.context_length = c.positive("max_position_embeddings", 2048);
    m.d_model = c.positive("hidden_size", 6144);
    m.n_layer = c.positive("num_hidden_layers", 44);
    m.n_head = c.positive("num_attention_heads", 64);
    m.ffn_hidden = c.positive("intermediate_size", 24576);
    m.activation = activation_from_hf(c, "hidden_act", "gelu");
    m.norm_eps = static_cast<float>(c.number("layer_norm_eps", 1e-5));
    m.init_std = static_cast<float>(c.number("initializer_range", 0.02));
    m.parallel_residual = c.boolean("use_parallel_residual", true);
    m.tied_embeddings = c.boolean("tie_word_embeddings", false);
    m.attention_bias = m.attention_out_bias = c.boolean("attention_bias", true);
    CTX_CHECK(m.d_model % m.n_head == 0, "{}: hidden_size {} is not divisible by "
              "num_attention_heads {}", c.origin(), m.d_model, m.n_head);
    s.pe_plugin = "pe/rope";
    read_rope(c, s, 0.25);
    read_token_ids(c, s);
    return s;
}

// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM: one block style (RMSNorm, SwiGLU,
// grouped-query attention, RoPE on whole heads). Defaults are each class's in transformers 4.49.
HfSpec llama_family_spec(const Cfg& c, const std::string& type) {
    HfSpec s;
    s.model_type = type;
    s.style = "llama";
    const bool mistral = type == "mistral", qwen2 = type == "qwen2";
    ModelConfig& m = s.config = ModelConfig::from_style("llama");
    m.vocab_size = c.positive("vocab_size", qwen2 ? 151936 : 32000);
    m.d_model = c.positive("hidden_size", 4096);
    m.n_layer = c.positive("num_hidden_layers", 32);
    m.n_head = c.positive("num_attention_heads", 32);
    // transformers 4.49: absent means the class default (Mistral 8, Qwen2 32, Llama none), null
    // means one key/value head per query head
    const int kv_default = mistral ? 8 : qwen2 ? 32 : m.n_head;
    m.n_kv_head = c.present("num_key_value_heads") && !c.has("num_key_value_heads")
                      ? m.n_head
                      : c.positive("num_key_value_heads", kv_default);
    m.ffn_hidden = c.positive("intermediate_size", qwen2 ? 22016 : mistral ? 14336 : 11008);
    m.context_length = c.positive("max_position_embeddings", mistral ? 131072 : qwen2 ? 32768
                                                                                  : 2048);
    m.norm_eps = static_cast<float>(c.number("rms_norm_eps", 1e-6));
    m.init_std = static_cast<float>(c.number("initializer_range", 0.02));
    m.tied_embeddings = c.boolean("tie_word_embeddings", false);
    const std::string act = c.string("hidden_act", "silu");
    CTX_CHECK(act == "silu" || act == "swish", "{}: \"hidden_act\" = \"{}\" is not supported "
              "(the Llama family's gated MLP is SwiGLU: silu)", c.origin(), act);
    CTX_CHECK(m.d_model % m.n_head == 0, "{}: hidden_size {} is not divisible by "
              "num_attention_heads {}", c.origin(), m.d_model, m.n_head);
    CTX_CHECK(m.n_head % m.kv_heads() == 0, "{}: num_attention_heads {} is not a multiple of "
              "num_key_value_heads {}", c.origin(), m.n_head, m.kv_heads());
    if (c.has("head_dim"))
        CTX_CHECK(c.integer("head_dim", 0) == m.head_dim(), "{}: \"head_dim\" = {} differs "
                  "from hidden_size / num_attention_heads = {} (not supported)", c.origin(),
                  c.integer("head_dim", 0), m.head_dim());
    if (qwen2) {
        // q, k, v biases always; no output or MLP bias. sliding_window counts only with
        // use_sliding_window (the model's design; transformers 4.49's sdpa/eager mask applies it
        // regardless, which matters only past sliding_window tokens)
        m.attention_bias = true;
        c.require("use_sliding_window", false, false,
                  "Qwen2's per-layer windows (max_window_layers) are not implemented");
    } else if (mistral) {  // no biases at all; the window (absent: 4096, null: none)
        m.sliding_window = !c.present("sliding_window") ? 4096
                           : c.has("sliding_window")    ? c.positive("sliding_window", 0)
                                                        : 0;
    } else {
        m.attention_bias = m.attention_out_bias = c.boolean("attention_bias", false);
        m.mlp_bias = c.boolean("mlp_bias", false);
    }
    // pretraining_tp > 1 only changes how transformers slices its matmuls (same function).
    CTX_CHECK(c.integer("pretraining_tp", 1) >= 1, "{}: \"pretraining_tp\" must be >= 1",
              c.origin());
    s.pe_plugin = "pe/rope";
    read_rope(c, s, 1.0);
    CTX_CHECK(s.pe_options["rotary_pct"].get<double>() == 1.0, "{}: a rotary fraction below 1 "
              "(partial_rotary_factor / rotary_pct) is not part of {} (RoPE on whole heads)",
              c.origin(), type);
    read_token_ids(c, s);
    return s;
}

HfSpec bloom_spec(const Cfg& c) {
    HfSpec s;
    s.model_type = "bloom";
    s.style = "bloom";
    ModelConfig& m = s.config = ModelConfig::from_style("bloom");
    m.vocab_size = c.positive("vocab_size", 250880);
    m.d_model = c.positive("hidden_size", c.integer("n_embed", 64));
    m.n_layer = c.positive("n_layer", 2);
    m.n_head = c.positive("n_head", 8);
    CTX_CHECK(m.d_model <= INT32_MAX / 4, "{}: hidden_size {} is too large (BLOOM's MLP is 4 x "
              "hidden_size)", c.origin(), m.d_model);
    m.ffn_hidden = 4 * m.d_model;  // BLOOM's MLP is always 4 x hidden
    m.activation = Activation::GeluTanh;
    m.norm_eps = static_cast<float>(c.number("layer_norm_epsilon", 1e-5));
    m.init_std = static_cast<float>(c.number("initializer_range", 0.02));
    m.tied_embeddings = c.boolean("tie_word_embeddings", true);
    // ALiBi has no table: the context is only the length rows are trained and evaluated at.
    // BLOOM was trained at 2048; exports record the current one as "seq_length".
    m.context_length = c.positive("seq_length", 2048);
    c.require("apply_residual_connection_post_layernorm", false, false,
              "the residual is taken before the layernorm");
    s.pe_plugin = "pe/alibi";
    read_token_ids(c, s);
    return s;
}

std::string type_from_architectures(const Cfg& c) {
    if (!c.has("architectures") || !c.at("architectures").is_array()) return "";
    for (const json& a : c.at("architectures")) {
        if (!a.is_string()) continue;
        const std::string n = a.get<std::string>();
        if (n.rfind("GPT2", 0) == 0) return "gpt2";
        if (n.rfind("GPTNeoX", 0) == 0) return "gpt_neox";
        if (n.rfind("Bloom", 0) == 0) return "bloom";
        if (n.rfind("Llama", 0) == 0) return "llama";
        if (n.rfind("Mistral", 0) == 0) return "mistral";
        if (n.rfind("Qwen2", 0) == 0) return "qwen2";
    }
    return "";
}

// pe/rope's save_state bytes (documented in plugins/pe/rope/rope.c): u32 magic "ROPE", u32
// version 1, i32 scaling, u32 flags, f64 factor, i64 original_length.
struct RopeState {
    std::string scaling;
    double factor = 1;
    int64_t original_length = 0;
};
constexpr const char* kRopeScalings[] = {"none",          "linear",           "ntk",
                                         "dynamic_ntk",   "yarn",             "giraffe_power",
                                         "giraffe_truncated", "xpos",         "hf_yarn",
                                         "llama3",        "longrope"};
constexpr int kNumRopeScalings = int(sizeof kRopeScalings / sizeof kRopeScalings[0]);

bool decode_rope_state(const std::vector<uint8_t>& b, RopeState& out) {
    if (b.size() != 32) return false;
    uint32_t magic, version;
    int32_t scaling;
    std::memcpy(&magic, b.data(), 4);
    std::memcpy(&version, b.data() + 4, 4);
    std::memcpy(&scaling, b.data() + 8, 4);
    if (magic != 0x45504f52u || version != 1 || scaling < 0 || scaling >= kNumRopeScalings)
        return false;
    out.scaling = kRopeScalings[scaling];
    std::memcpy(&out.factor, b.data() + 16, 8);
    std::memcpy(&out.original_length, b.data() + 24, 8);
    return true;
}

// A float setting as the shortest decimal that reads back as the same float (1e-05, not
// 9.999999747378752e-06), which is also what config.json files hold.
double decimal(float x) { return std::stod(fmt::format("{}", x)); }

}  // namespace

HfSpec hf_spec_from_config(const json& config, const std::string& origin) {
    CTX_CHECK(config.is_object(), "{}: expected a JSON object", origin);
    const Cfg c(config, origin);
    std::string type = c.string("model_type", "");
    if (type.empty()) type = type_from_architectures(c);
    CTX_CHECK(!type.empty(), "{}: no \"model_type\" (and no known \"architectures\"); supported: "
              "{}", origin, kHfModelTypes);
    HfSpec s;
    if (type == "gpt2") s = gpt2_spec(c);
    else if (type == "gpt_neox") s = neox_spec(c);
    else if (type == "bloom") s = bloom_spec(c);
    else if (type == "llama" || type == "mistral" || type == "qwen2") s = llama_family_spec(c, type);
    else fail("{}: model_type \"{}\" is not supported (supported: {})", origin, type, kHfModelTypes);
    try {
        s.config.validate();
    } catch (const Error& e) {
        fail("{}: {}", origin, e.what());
    }
    return s;
}

HfSpec hf_spec_for_model(const ModelConfig& m, const std::string& style,
                         const std::string& pe_plugin, const json& pe_options,
                         const std::vector<uint8_t>& pe_state) {
    HfSpec s;
    s.config = m;
    s.style = style;
    s.pe_plugin = pe_plugin;
    std::vector<std::string> problems;
    auto need = [&](bool ok, const std::string& what) {
        if (!ok) problems.push_back(what);
    };
    // The Llama family's block (RMSNorm, SwiGLU, grouped-query attention, sliding window) has no
    // place in GPT-2, GPT-NeoX or BLOOM, and theirs (layernorm, GELU) none in the Llama family.
    const bool llama_block = m.norm == NormKind::RMSNorm || m.gated_mlp() || m.grouped_kv() ||
                             m.sliding_window > 0;
    auto need_classic_block = [&] {
        need(m.norm == NormKind::LayerNorm, "norm = rmsnorm (" + s.model_type + " uses layernorm)");
        need(!m.gated_mlp(), "activation = swiglu (" + s.model_type + "'s MLP is GELU)");
        need(!m.grouped_kv(), "n_kv_head < n_head (" + s.model_type + " has one key/value head "
             "per query head)");
        need(m.sliding_window == 0, "sliding_window > 0 (" + s.model_type + " attends every token)");
        need(m.attention_out_bias == m.attention_bias,
             "attention_out_bias != attention_bias (" + s.model_type + " has both or neither)");
        need(m.norm_bias, "norm_bias = false (the layernorms of " + s.model_type + " have biases)");
    };
    if (pe_plugin == "pe/learned") {
        s.model_type = "gpt2";
        need(!m.parallel_residual, "parallel_residual = true (GPT-2 is sequential)");
        need(!m.embedding_layernorm, "embedding_layernorm = true (GPT-2 has none)");
        need(m.attention_bias && m.mlp_bias, "attention_bias / mlp_bias = false (GPT-2 has biases)");
    } else if (pe_plugin == "pe/rope" && llama_block) {
        // Mistral has the window, Qwen2 the q/k/v-only biases; the rest is Llama.
        s.model_type = m.sliding_window > 0                            ? "mistral"
                       : m.attention_bias && !m.attention_out_bias ? "qwen2"
                                                                       : "llama";
        need(m.norm == NormKind::RMSNorm, "norm = layernorm (the Llama family uses RMSNorm)");
        need(m.gated_mlp(), std::string("activation = ") + activation_name(m.activation) +
                                " (the Llama family's MLP is SwiGLU)");
        need(!m.parallel_residual, "parallel_residual = true (the Llama family is sequential)");
        need(!m.embedding_layernorm, "embedding_layernorm = true (the Llama family has none)");
        if (s.model_type == "mistral")
            need(!m.attention_bias && !m.attention_out_bias && !m.mlp_bias,
                 "biases with sliding_window (Mistral has no biases; Qwen2's window is not "
                 "exported)");
        if (s.model_type == "qwen2")
            need(!m.mlp_bias, "mlp_bias = true with q/k/v-only biases (Qwen2's MLP has none)");
        if (s.model_type == "llama")
            need(m.attention_out_bias == m.attention_bias,
                 "attention_out_bias != attention_bias (LlamaForCausalLM has all four attention "
                 "biases or none; q/k/v only is Qwen2)");
    } else if (pe_plugin == "pe/rope") {
        s.model_type = "gpt_neox";
        need(!m.embedding_layernorm, "embedding_layernorm = true (GPT-NeoX has none)");
        need(m.mlp_bias, "mlp_bias = false (GPT-NeoX's MLP has biases)");
    } else if (pe_plugin == "pe/alibi") {
        s.model_type = "bloom";
        need(m.embedding_layernorm, "embedding_layernorm = false (BLOOM normalises embeddings)");
        need(!m.parallel_residual, "parallel_residual = true (BLOOM is sequential)");
        need(m.attention_bias && m.mlp_bias, "attention_bias / mlp_bias = false (BLOOM has biases)");
        need(m.activation == Activation::GeluTanh, std::string("activation = ") +
             activation_name(m.activation) + " (BLOOM uses tanh GELU)");
        need(m.ffn() == 4 * m.d_model, "ffn_hidden != 4 * d_model (BLOOM's MLP is 4x)");
    } else {
        fail("export: {} has no transformers equivalent (pe/learned -> GPT-2, pe/rope -> "
             "GPT-NeoX or the Llama family, pe/alibi -> BLOOM)",
             pe_plugin.empty() ? "a model without PE" : pe_plugin);
    }
    if (s.model_type == "gpt2" || s.model_type == "gpt_neox" || s.model_type == "bloom")
        need_classic_block();
    if (pe_plugin == "pe/rope") {
        const json& o = pe_options;
        const std::string layout = o.value("layout", std::string("half"));
        need(layout == "half", "pe/rope layout = \"" + layout + "\" (transformers rotates halves)");
        RopeState st;
        st.scaling = o.value("scaling", std::string("none"));
        st.factor = o.value("factor", 1.0);
        st.original_length = o.value("original_length", static_cast<int64_t>(m.context_length));
        if (!pe_state.empty())
            CTX_CHECK(decode_rope_state(pe_state, st), "export: the pe/rope state is not the "
                      "documented 32-byte version 1 layout (a newer plugin?)");
        const int dh = m.head_dim();
        const double pct = o.value("rotary_pct", 1.0);
        int dims = static_cast<int>(std::floor(pct * dh));
        dims -= dims % 2;
        if (s.model_type != "gpt_neox")
            need(dims == dh, "pe/rope rotary_pct < 1 (the Llama family rotates whole heads)");
        // transformers takes int(head_dim * rotary_pct) dims: give it a fraction that lands
        // exactly on ours.
        double hf_pct = static_cast<double>(dims) / dh;
        if (static_cast<int>(dh * hf_pct) != dims) hf_pct = (dims + 0.5) / dh;
        double base = o.value("base", 10000.0);
        json& out = s.pe_options;
        out["rotary_pct"] = hf_pct;
        out["layout"] = "half";
        if (st.scaling == "ntk") {
            // Static NTK-aware scaling is plain RoPE with a larger base: exact as rope_theta.
            base *= std::pow(st.factor, static_cast<double>(dims) / (dims - 2));
        } else if (st.scaling == "linear" || st.scaling == "dynamic_ntk") {
            out["scaling"] = st.scaling;
            out["factor"] = st.factor;
            out["original_length"] = st.original_length;
        } else if (st.scaling == "hf_yarn" || st.scaling == "llama3" ||
                   st.scaling == "longrope") {
            // transformers' own types: every option carries over (the state holds factor and L)
            for (const auto& [key, v] : o.items())
                if (key != "base" && key != "rotary_pct" && key != "layout") out[key] = v;
            out["factor"] = st.factor;
            out["original_length"] = st.original_length;
        } else if (st.scaling != "none") {
            problems.push_back("pe/rope scaling = " + st.scaling + " (transformers' RoPE "
                               "reproduces none, linear, ntk (as rope_theta), dynamic_ntk, "
                               "hf_yarn, llama3 and longrope; pe/rope's yarn is the paper's "
                               "form, which transformers does not compute)");
        }
        out["base"] = base;
    }
    if (!problems.empty()) {
        std::string list;
        for (const auto& p : problems) list += "\n  " + p;
        fail("export: this model cannot be written as {} ({}):{}", s.model_type, pe_plugin, list);
    }
    return s;
}

// rope_scaling of the transformers rope types pe/rope implements exactly (hf_yarn, llama3,
// longrope), from its options. The attention factor is written whenever a type has one, so every
// transformers version uses our value instead of re-deriving it from lengths it may read
// differently.
static json hf_rope_scaling(const json& o, const std::string& scaling) {
    const double factor = o.value("factor", 1.0);
    const int64_t L0 = o.value("original_length", int64_t{0});
    if (scaling == "llama3")
        return {{"rope_type", "llama3"}, {"factor", factor},
                {"low_freq_factor", o.value("low_freq_factor", 1.0)},
                {"high_freq_factor", o.value("high_freq_factor", 4.0)},
                {"original_max_position_embeddings", L0}};
    if (scaling == "longrope") {
        json r = {{"rope_type", "longrope"}, {"factor", factor},
                  {"short_factor", o.at("short_factor")}, {"long_factor", o.at("long_factor")}};
        r["attention_factor"] = o.contains("attention_factor")
                                    ? o["attention_factor"].get<double>()
                                    : (factor <= 1.0 ? 1.0
                                                     : std::sqrt(1.0 + std::log(factor) /
                                                                           std::log(double(L0))));
        return r;
    }
    // hf_yarn: mscale / mscale_all_dim as given, or the attention factor (given or 0.1 ln s + 1)
    json r = {{"rope_type", "yarn"}, {"factor", factor},
              {"beta_fast", o.value("yarn_beta_fast", 32.0)},
              {"beta_slow", o.value("yarn_beta_slow", 1.0)},
              {"original_max_position_embeddings", L0}};
    const double ms = o.value("mscale", 0.0), msa = o.value("mscale_all_dim", 0.0);
    auto mscale = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
    r["attention_factor"] = o.contains("attention_factor") ? o["attention_factor"].get<double>()
                            : ms > 0 && msa > 0           ? mscale(ms) / mscale(msa)
                                                          : mscale(1.0);
    return r;
}

// max_position_embeddings, rope_theta and rope_scaling from pe/rope's options (GPT-NeoX and the
// Llama family read them alike).
static void write_rope(json& j, const json& o, const ModelConfig& m) {
    const std::string scaling = o.value("scaling", std::string("none"));
    const double base = o.value("base", 10000.0);
    // transformers' dynamic NTK (and 4.49's YaRN) take max_position_embeddings as the original
    // length L.
    const int64_t max_pos = scaling == "dynamic_ntk" || scaling == "hf_yarn"
                                ? o.value("original_length", int64_t{m.context_length})
                                : m.context_length;
    j["max_position_embeddings"] = max_pos;
    j["rope_theta"] = base;
    j["rope_scaling"] = nullptr;
    if (scaling == "linear") {
        j["rope_scaling"] = {{"rope_type", "linear"}, {"type", "linear"},
                             {"factor", o.value("factor", 1.0)}};
    } else if (scaling == "dynamic_ntk") {
        j["rope_scaling"] = {{"rope_type", "dynamic"}, {"type", "dynamic"},
                             {"factor", o.value("factor", 1.0)},
                             {"original_max_position_embeddings", max_pos}};
    } else if (scaling == "hf_yarn" || scaling == "llama3" || scaling == "longrope") {
        j["rope_scaling"] = hf_rope_scaling(o, scaling);
        // transformers 4.49 reads longrope's L0 from the top level
        if (scaling == "longrope")
            j["original_max_position_embeddings"] = o.value("original_length", int64_t{0});
    }
}

json hf_config_json(const HfSpec& s) {
    const ModelConfig& m = s.config;
    json j;
    const char* gelu = m.activation == Activation::GeluTanh ? "gelu_new"
                       : m.activation == Activation::Relu   ? "relu"
                                                            : "gelu";
    if (s.model_type == "gpt2") {
        j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"},
             {"vocab_size", m.vocab_size}, {"n_positions", m.context_length},
             {"n_ctx", m.context_length}, {"n_embd", m.d_model}, {"n_layer", m.n_layer},
             {"n_head", m.n_head}, {"n_inner", m.ffn()}, {"activation_function", gelu},
             {"layer_norm_epsilon", decimal(m.norm_eps)},
             {"initializer_range", decimal(m.init_std)}, {"scale_attn_weights", true},
             {"tie_word_embeddings", m.tied_embeddings}};
    } else if (s.model_type == "gpt_neox") {
        const json& o = s.pe_options;
        const double base = o.value("base", 10000.0);
        j = {{"architectures", {"GPTNeoXForCausalLM"}}, {"model_type", "gpt_neox"},
             {"vocab_size", m.vocab_size},
             {"hidden_size", m.d_model}, {"num_hidden_layers", m.n_layer},
             {"num_attention_heads", m.n_head}, {"intermediate_size", m.ffn()},
             {"hidden_act", gelu}, {"layer_norm_eps", decimal(m.norm_eps)},
             {"initializer_range", decimal(m.init_std)},
             {"use_parallel_residual", m.parallel_residual},
             {"tie_word_embeddings", m.tied_embeddings}, {"attention_bias", m.attention_bias},
             {"rotary_pct", o.value("rotary_pct", 1.0)}, {"rotary_emb_base", base}};
        write_rope(j, o, m);
    } else if (s.model_type == "llama" || s.model_type == "mistral" || s.model_type == "qwen2") {
        const char* arch = s.model_type == "llama"     ? "LlamaForCausalLM"
                           : s.model_type == "mistral" ? "MistralForCausalLM"
                                                       : "Qwen2ForCausalLM";
        j = {{"architectures", {arch}}, {"model_type", s.model_type},
             {"vocab_size", m.vocab_size}, {"hidden_size", m.d_model},
             {"num_hidden_layers", m.n_layer}, {"num_attention_heads", m.n_head},
             {"num_key_value_heads", m.kv_heads()}, {"head_dim", m.head_dim()},
             {"intermediate_size", m.ffn()}, {"hidden_act", "silu"},
             {"rms_norm_eps", decimal(m.norm_eps)}, {"initializer_range", decimal(m.init_std)},
             {"tie_word_embeddings", m.tied_embeddings}};
        if (s.model_type == "llama") {
            j["attention_bias"] = m.attention_bias;
            j["mlp_bias"] = m.mlp_bias;
        } else if (s.model_type == "mistral") {
            j["sliding_window"] = m.sliding_window;
        } else {  // no window: null, which every transformers version reads as none
            j["use_sliding_window"] = false;
            j["sliding_window"] = nullptr;
        }
        write_rope(j, s.pe_options, m);
    } else if (s.model_type == "bloom") {
        j = {{"architectures", {"BloomForCausalLM"}}, {"model_type", "bloom"},
             {"vocab_size", m.vocab_size}, {"hidden_size", m.d_model}, {"n_layer", m.n_layer},
             {"n_head", m.n_head}, {"layer_norm_epsilon", decimal(m.norm_eps)},
             {"initializer_range", decimal(m.init_std)},
             {"apply_residual_connection_post_layernorm", false},
             {"tie_word_embeddings", m.tied_embeddings}, {"seq_length", m.context_length}};
    } else {
        fail("export: unknown model type \"{}\"", s.model_type);
    }
    if (s.bos_token_id >= 0) j["bos_token_id"] = s.bos_token_id;
    if (s.eos_token_id >= 0) j["eos_token_id"] = s.eos_token_id;
    j["torch_dtype"] = "float32";
    j["ctxengine_version"] = CTX_VERSION_STRING;
    return j;
}

}  // namespace ctx
