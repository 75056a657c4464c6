// The tensor mapping between HF checkpoints and our parameter views, and reading / writing
// checkpoint directories.
#include "io/hf_model.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace ctx {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// How an HF tensor becomes ours.
enum class Xform {
    Copy,
    Transpose,   // GPT-2's Conv1D stores (in, out); our matrices are (out, in)
    QkvPerHead,  // NeoX / BLOOM fused rows [h0: q k v, h1: q k v, ...] -> ours [q | k | v]
};

struct Rule {
    std::string hf;    // HF name without the model prefix ("h.0.attn.c_attn.weight")
    std::string ours;  // our view name
    std::vector<int64_t> hf_shape;
    Xform xform = Xform::Copy;
    bool head = false;  // lives outside the base model (lm_head / embed_out): never prefixed
    // A slice of ours: the HF tensor is rows [row0, row0 + hf_shape[0]) of a view of our_rows
    // rows (Llama's q/k/v_proj -> attn.qkv, gate/up_proj -> mlp.fc). 0: the whole view.
    int64_t row0 = 0, our_rows = 0;
};

struct Mapping {
    std::string prefix;      // the base model's name in the LM wrapper's state dict
    std::string head_name;   // the output projection's HF name
    std::vector<Rule> rules;
    std::vector<std::string> ignored_suffixes;  // buffers some checkpoints carry (masks, inv_freq)
};

Mapping mapping_for(const HfSpec& s) {
    const ModelConfig& m = s.config;
    const int64_t C = m.d_model, F = m.ffn(), V = m.vocab_size, P = m.context_length;
    Mapping mp;
    auto add = [&](std::string hf, std::string ours, std::vector<int64_t> shape,
                   Xform x = Xform::Copy) {
        mp.rules.push_back({std::move(hf), std::move(ours), std::move(shape), x, false});
    };
    // layernorm of ours `n` from HF `h`
    auto ln = [&](const std::string& h, const std::string& n) {
        add(h + ".weight", n + ".weight", {C});
        add(h + ".bias", n + ".bias", {C});
    };
    auto linear = [&](const std::string& h, const std::string& n, int64_t out, int64_t in,
                      bool bias, Xform x) {
        add(h + ".weight", n + ".weight",
            x == Xform::Transpose ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in},
            x);
        if (bias) add(h + ".bias", n + ".bias", {out}, x == Xform::QkvPerHead ? x : Xform::Copy);
    };
    if (s.model_type == "gpt2") {
        mp.prefix = "transformer.";
        mp.head_name = "lm_head.weight";
        add("wte.weight", "wte", {V, C});
        add("wpe.weight", "pe.wpe", {P, C});
        for (int l = 0; l < m.n_layer; ++l) {
            const std::string h = fmt::format("h.{}.", l), o = fmt::format("layers.{}.", l);
            ln(h + "ln_1", o + "ln1");
            linear(h + "attn.c_attn", o + "attn.qkv", 3 * C, C, true, Xform::Transpose);
            linear(h + "attn.c_proj", o + "attn.proj", C, C, true, Xform::Transpose);
            ln(h + "ln_2", o + "ln2");
            linear(h + "mlp.c_fc", o + "mlp.fc", F, C, true, Xform::Transpose);
            linear(h + "mlp.c_proj", o + "mlp.proj", C, F, true, Xform::Transpose);
        }
        ln("ln_f", "lnf");
        mp.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};  // causal-mask buffers
    } else if (s.model_type == "gpt_neox") {
        mp.prefix = "gpt_neox.";
        mp.head_name = "embed_out.weight";
        add("embed_in.weight", "wte", {V, C});
        for (int l = 0; l < m.n_layer; ++l) {
            const std::string h = fmt::format("layers.{}.", l), o = fmt::format("layers.{}.", l);
            ln(h + "input_layernorm", o + "ln1");
            linear(h + "attention.query_key_value", o + "attn.qkv", 3 * C, C, m.attention_bias,
                   Xform::QkvPerHead);
            linear(h + "attention.dense", o + "attn.proj", C, C, m.attention_bias, Xform::Copy);
            ln(h + "post_attention_layernorm", o + "ln2");
            linear(h + "mlp.dense_h_to_4h", o + "mlp.fc", F, C, true, Xform::Copy);
            linear(h + "mlp.dense_4h_to_h", o + "mlp.proj", C, F, true, Xform::Copy);
        }
        ln("final_layer_norm", "lnf");
        mp.ignored_suffixes = {".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"};
    } else if (s.model_type == "bloom") {
        mp.prefix = "transformer.";
        mp.head_name = "lm_head.weight";
        add("word_embeddings.weight", "wte", {V, C});
        ln("word_embeddings_layernorm", "emb_ln");
        for (int l = 0; l < m.n_layer; ++l) {
            const std::string h = fmt::format("h.{}.", l), o = fmt::format("layers.{}.", l);
            ln(h + "input_layernorm", o + "ln1");
            linear(h + "self_attention.query_key_value", o + "attn.qkv", 3 * C, C, true,
                   Xform::QkvPerHead);
            linear(h + "self_attention.dense", o + "attn.proj", C, C, true, Xform::Copy);
            ln(h + "post_attention_layernorm", o + "ln2");
            linear(h + "mlp.dense_h_to_4h", o + "mlp.fc", F, C, true, Xform::Copy);
            linear(h + "mlp.dense_4h_to_h", o + "mlp.proj", C, F, true, Xform::Copy);
        }
        ln("ln_f", "lnf");
    } else if (s.model_type == "llama" || s.model_type == "mistral" || s.model_type == "qwen2") {
        // Separate q/k/v and gate/up projections: slices of our fused views.
        mp.prefix = "model.";
        mp.head_name = "lm_head.weight";
        const int64_t D = m.head_dim(), QD = int64_t{m.n_head} * D, KD = int64_t{m.kv_heads()} * D;
        const int64_t Q = m.qkv_rows();
        auto part = [&](std::string hf, std::string ours, int64_t rows, int64_t cols, int64_t row0,
                        int64_t total) {
            std::vector<int64_t> shape{rows};
            if (cols > 0) shape.push_back(cols);
            mp.rules.push_back({std::move(hf), std::move(ours), shape, Xform::Copy, false, row0,
                                total});
        };
        add("embed_tokens.weight", "wte", {V, C});
        for (int l = 0; l < m.n_layer; ++l) {
            const std::string h = fmt::format("layers.{}.", l), o = fmt::format("layers.{}.", l);
            add(h + "input_layernorm.weight", o + "ln1.weight", {C});
            const std::pair<const char*, int64_t> qkv[] = {{"q_proj", 0}, {"k_proj", QD},
                                                           {"v_proj", QD + KD}};
            for (const auto& [name, row0] : qkv) {
                const int64_t rows = row0 == 0 ? QD : KD;
                part(h + "self_attn." + name + ".weight", o + "attn.qkv.weight", rows, C, row0, Q);
                if (m.attention_bias)
                    part(h + "self_attn." + name + ".bias", o + "attn.qkv.bias", rows, 0, row0, Q);
            }
            linear(h + "self_attn.o_proj", o + "attn.proj", C, C, m.attention_out_bias,
                   Xform::Copy);
            add(h + "post_attention_layernorm.weight", o + "ln2.weight", {C});
            part(h + "mlp.gate_proj.weight", o + "mlp.fc.weight", F, C, 0, 2 * F);
            part(h + "mlp.up_proj.weight", o + "mlp.fc.weight", F, C, F, 2 * F);
            if (m.mlp_bias) {
                part(h + "mlp.gate_proj.bias", o + "mlp.fc.bias", F, 0, 0, 2 * F);
                part(h + "mlp.up_proj.bias", o + "mlp.fc.bias", F, 0, F, 2 * F);
            }
            linear(h + "mlp.down_proj", o + "mlp.proj", C, F, m.mlp_bias, Xform::Copy);
        }
        add("norm.weight", "lnf.weight", {C});
        mp.ignored_suffixes = {"rotary_emb.inv_freq"};
    } else {
        fail("unknown model type \"{}\" (supported: {})", s.model_type, kHfModelTypes);
    }
    if (!m.tied_embeddings) mp.rules.push_back({mp.head_name, "lm_head.weight", {V, C},
                                                Xform::Copy, true});
    return mp;
}

// Row r of the fused per-head layout is head r / 3D, part (r % 3D) / D, dim r % D; ours puts
// part s, head h, dim d at row s*C + h*D + d.
int64_t qkv_our_row(int64_t hf_row, int64_t C, int64_t D) {
    const int64_t h = hf_row / (3 * D), s = (hf_row % (3 * D)) / D, d = hf_row % D;
    return s * C + h * D + d;
}

// HF tensor data (in hf_shape) -> our view data; `inverse` goes the other way.
std::vector<float> convert(const Rule& r, const std::vector<float>& in, const ModelConfig& m,
                           bool inverse) {
    std::vector<float> out(in.size());
    switch (r.xform) {
        case Xform::Copy: return in;
        case Xform::Transpose: {
            // HF (a, b) -> ours (b, a); the inverse is the same operation on ours (b, a).
            const int64_t a = inverse ? r.hf_shape[1] : r.hf_shape[0];
            const int64_t b = inverse ? r.hf_shape[0] : r.hf_shape[1];
            for (int64_t i = 0; i < a; ++i)
                for (int64_t j = 0; j < b; ++j) out[j * a + i] = in[i * b + j];
            return out;
        }
        case Xform::QkvPerHead: {
            const int64_t C = m.d_model, D = m.head_dim(), rows = 3 * C;
            const int64_t cols = static_cast<int64_t>(in.size()) / rows;
            for (int64_t row = 0; row < rows; ++row) {
                const int64_t ours = qkv_our_row(row, C, D);
                const float* src = in.data() + (inverse ? ours : row) * cols;
                std::copy(src, src + cols, out.data() + (inverse ? row : ours) * cols);
            }
            return out;
        }
    }
    return out;
}

std::vector<int64_t> our_shape(const Rule& r) {
    if (r.xform == Xform::Transpose) return {r.hf_shape[1], r.hf_shape[0]};
    std::vector<int64_t> s = r.hf_shape;
    if (r.our_rows > 0) s[0] = r.our_rows;
    return s;
}

// Floats per row of a rule's tensor (1 for vectors).
int64_t row_floats(const Rule& r) { return r.hf_shape.size() > 1 ? r.hf_shape[1] : 1; }

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// "a, b, c and 12 more"
std::string list_names(const std::vector<std::string>& names, size_t max = 12) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > max) out += fmt::format(" and {} more", names.size() - max);
    return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

HostTensors hf_tensors_to_ours(const HfSpec& spec, const SafetensorsSet& set) {
    const Mapping mp = mapping_for(spec);
    // Checkpoints of the bare base model (GPT2Model, BloomModel, ...) have no prefix.
    const std::string& first = mp.rules.front().hf;
    const std::string prefix = set.has(mp.prefix + first) ? mp.prefix : "";
    std::vector<std::string> missing, wrong_shape, unexpected;
    std::set<std::string> used;
    HostTensors out;
    for (const Rule& r : mp.rules) {
        const std::string name = r.head ? r.hf : prefix + r.hf;
        if (!set.has(name)) {
            missing.push_back(name);
            continue;
        }
        used.insert(name);
        const StTensor& t = set.info(name);
        if (t.shape != r.hf_shape) {
            wrong_shape.push_back(fmt::format("{} is {} (expected {})", name, shape_str(t.shape),
                                              shape_str(r.hf_shape)));
            continue;
        }
        std::vector<float> data = convert(r, set.read_f32(name), spec.config, false);
        if (r.our_rows > 0) {  // a slice: the view is assembled from its parts
            HostTensor& t = out[r.ours];
            if (t.data.empty()) t = HostTensor{our_shape(r), std::vector<float>(
                                                   size_t(r.our_rows * row_floats(r)))};
            std::copy(data.begin(), data.end(), t.data.begin() + r.row0 * row_floats(r));
        } else {
            out[r.ours] = HostTensor{our_shape(r), std::move(data)};
        }
    }
    // A tied head may still be stored (older savers): accept it only if it is the embedding.
    if (spec.config.tied_embeddings && set.has(mp.head_name)) {
        used.insert(mp.head_name);
        const std::string emb = prefix + mp.rules.front().hf;
        if (set.has(emb) && set.info(mp.head_name).shape == set.info(emb).shape) {
            CTX_CHECK(set.read_f32(mp.head_name) == set.read_f32(emb),
                      "{}: {} differs from {} but config.json ties them (tie_word_embeddings)",
                      set.origin(), mp.head_name, emb);
        } else if (set.has(emb)) {
            wrong_shape.push_back(fmt::format("{} is {} (expected the embedding's {})",
                                              mp.head_name, shape_str(set.info(mp.head_name).shape),
                                              shape_str(set.info(emb).shape)));
        }
    }
    for (const std::string& name : set.names()) {
        if (used.count(name)) continue;
        bool ignored = false;
        for (const std::string& sfx : mp.ignored_suffixes) ignored = ignored || ends_with(name, sfx);
        if (!ignored) unexpected.push_back(name);
    }
    if (!missing.empty() || !wrong_shape.empty() || !unexpected.empty()) {
        const ModelConfig& m = spec.config;
        std::string msg = fmt::format(
            "{}: the tensors do not match config.json ({}: {} layers, hidden {}, {} heads, ffn {}, "
            "vocab {}, context {}):", set.origin(), spec.model_type, m.n_layer, m.d_model,
            m.n_head, m.ffn(), m.vocab_size, m.context_length);
        if (!missing.empty())
            msg += fmt::format("\n  missing ({}): {}", missing.size(), list_names(missing));
        if (!wrong_shape.empty())
            msg += fmt::format("\n  wrong shape: {}", list_names(wrong_shape, 6));
        if (!unexpected.empty())
            msg += fmt::format("\n  unexpected ({}): {}", unexpected.size(), list_names(unexpected));
        fail("{}", msg);
    }
    return out;
}

std::vector<HfTensor> ours_to_hf_tensors(const HfSpec& spec, const HostTensors& ours) {
    const Mapping mp = mapping_for(spec);
    std::vector<HfTensor> out;
    std::set<std::string> used;
    for (const Rule& r : mp.rules) {
        auto it = ours.find(r.ours);
        CTX_CHECK(it != ours.end(), "export: the model has no parameter '{}' (needed for {})",
                  r.ours, r.hf);
        CTX_CHECK(it->second.shape == our_shape(r), "export: parameter '{}' is {} but {} needs {}",
                  r.ours, shape_str(it->second.shape), r.hf, shape_str(our_shape(r)));
        used.insert(r.ours);
        std::vector<float> data = it->second.data;
        if (r.our_rows > 0) {  // this rule's rows of the view
            const auto first = data.begin() + r.row0 * row_floats(r);
            data = std::vector<float>(first, first + r.hf_shape[0] * row_floats(r));
        }
        out.push_back({r.head ? r.hf : mp.prefix + r.hf, r.hf_shape,
                       convert(r, data, spec.config, true)});
    }
    for (const auto& [name, t] : ours)
        CTX_CHECK(used.count(name), "export: parameter '{}' has no place in a {} checkpoint", name,
                  spec.model_type);
    return out;
}

HfCheckpoint read_hf_checkpoint(const std::string& dir) {
    const std::string cfg_path = (fs::path(dir) / "config.json").string();
    std::error_code ec;
    CTX_CHECK(fs::is_directory(dir, ec), "{}: not a directory (expected an HF model directory "
              "with config.json and model.safetensors)", dir);
    std::ifstream in(cfg_path, std::ios::binary);
    CTX_CHECK(in, "{}: cannot read (an HF model directory needs config.json)", cfg_path);
    std::stringstream text;
    text << in.rdbuf();
    // nlohmann parses any depth, but dump() (in messages) and copies recurse per level: a deeply
    // nested value would overflow the stack. No config.json comes close to this depth.
    constexpr int kMaxDepth = 128;
    auto limit_depth = [&](int depth, json::parse_event_t, json&) {
        if (depth > kMaxDepth) fail("{}: JSON nested deeper than {} levels", cfg_path, kMaxDepth);
        return true;
    };
    json cfg;
    try {
        cfg = json::parse(text.str(), limit_depth);
    } catch (const json::exception& e) {
        fail("{}: not valid JSON: {}", cfg_path, e.what());
    }
    HfCheckpoint ck;
    ck.spec = hf_spec_from_config(cfg, cfg_path);
    const SafetensorsSet set = SafetensorsSet::open_dir(dir);
    ck.tensors = hf_tensors_to_ours(ck.spec, set);
    return ck;
}

namespace {

// Tokenizer files HF loaders look for, copied when present.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json", "vocab.json",
                                           "merges.txt", "added_tokens.json"};

void copy_tokenizer_files(const std::string& source, const fs::path& dir) {
    std::error_code ec;
    std::vector<std::pair<fs::path, std::string>> copies;  // (from, name in dir)
    fs::path from_dir = source;
    if (!fs::is_directory(source, ec)) {
        CTX_CHECK(fs::is_regular_file(source, ec), "export: tokenizer '{}' is neither a directory "
                  "nor a file", source);
        const fs::path src(source);
        from_dir = src.has_parent_path() ? src.parent_path() : fs::path(".");
        const std::string name = src.filename().string();
        if (name == "vocab.json" || ends_with(name, "-vocab.json")) {
            // GPT-2's vocab.json with merges.txt (or X-vocab.json with X-merges.txt) beside it
            const std::string merges = name == "vocab.json"
                                           ? "merges.txt"
                                           : name.substr(0, name.size() - 10) + "merges.txt";
            copies.push_back({src, "vocab.json"});
            copies.push_back({from_dir / merges, "merges.txt"});
        } else {
            copies.push_back({src, "tokenizer.json"});
        }
        for (const char* f : {"tokenizer_config.json", "special_tokens_map.json"})
            if (fs::is_regular_file(from_dir / f, ec)) copies.push_back({from_dir / f, f});
    } else {
        for (const char* f : kTokenizerFiles)
            if (fs::is_regular_file(from_dir / f, ec)) copies.push_back({from_dir / f, f});
        CTX_CHECK(!copies.empty(), "export: {} holds no tokenizer files (tokenizer.json, or "
                  "vocab.json + merges.txt)", source);
    }
    for (const auto& [from, name] : copies) {
        const fs::path to = dir / name;
        if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) continue;  // exporting in place
        fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
        CTX_CHECK(!ec, "export: cannot copy {} to {}: {}", from.string(), to.string(), ec.message());
    }
}

}  // namespace

void write_hf_checkpoint(const std::string& dir, const HfSpec& spec, const HostTensors& ours,
                         const std::string& tokenizer_source) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    CTX_CHECK(!ec && fs::is_directory(dir, ec), "export: cannot create directory {}: {}", dir,
              ec.message());
    const std::vector<HfTensor> tensors = ours_to_hf_tensors(spec, ours);
    std::vector<StWriteTensor> w;
    for (const HfTensor& t : tensors) w.push_back({t.name, t.shape, t.data.data()});
    write_safetensors((fs::path(dir) / "model.safetensors").string(), w, {{"format", "pt"}});
    // A sharded index left from an earlier export would shadow nothing (model.safetensors is read
    // first) but would confuse other tools: remove it.
    fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
    write_file_atomic((fs::path(dir) / "config.json").string(), hf_config_json(spec).dump(2) + "\n");
    if (!tokenizer_source.empty()) copy_tokenizer_files(tokenizer_source, dir);
}

HostTensors model_tensors(const Model& model, const Arena& arena) {
    const std::vector<float> whole = model.gather_full(arena);  // collective under tp
    HostTensors out;
    for (const ParamView& v : model.full_layout().views()) {
        HostTensor t{v.shape, std::vector<float>(whole.begin() + v.offset,
                                                 whole.begin() + v.offset + v.numel)};
        out.emplace(v.name, std::move(t));
    }
    return out;
}

void set_model_params(Model& model, const HostTensors& tensors, const std::string& origin) {
    std::vector<std::string> problems;
    const ArenaLayout& layout = model.full_layout();
    std::vector<float> whole(layout.total(), 0.0f);
    for (const ParamView& v : layout.views()) {
        auto it = tensors.find(v.name);
        if (it == tensors.end()) {
            problems.push_back("no tensor for '" + v.name + "'");
        } else if (it->second.shape != v.shape) {
            problems.push_back(fmt::format("'{}' is {}, the model needs {}", v.name,
                                           shape_str(it->second.shape), shape_str(v.shape)));
        } else {
            std::copy(it->second.data.begin(), it->second.data.end(), whole.begin() + v.offset);
        }
    }
    for (const auto& [name, t] : tensors)
        if (!layout.find(name)) problems.push_back("'" + name + "' is not a parameter");
    if (!problems.empty())
        fail("{}: the tensors do not fit the model: {}", origin, list_names(problems, 8));
    model.scatter_full(whole.data(), model.params());  // this rank's part under tp
}

}  // namespace ctx
