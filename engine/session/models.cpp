#include "session/models.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/model_state.h"
#include "model/config_json.h"
#include "plugin/pe_plugin.h"

namespace ctx {

using json = nlohmann::json;

std::string pe_plugin_name(const PluginRegistry& registry, const std::string& name) {
    std::string full = name.rfind("pe/", 0) == 0 ? name : "pe/" + name;
    // NoPE is the pe/none plugin when installed; without it, the engine's built-in "no PE".
    if (full == "pe/none" && !registry.find(full)) full = "none";
    return full;
}

std::string default_pe(const std::string& style) {
    if (style == "neox" || style == "llama") return "rope";
    if (style == "bloom") return "alibi";
    return "learned";
}

std::unique_ptr<PePlugin> make_pe(EngineContext& engine, const ModelConfig& c,
                                   const std::string& pe_plugin, const Options& pe_options,
                                   uint64_t seed) {
    if (pe_plugin == "none") return nullptr;
    ctx_model_info info{};
    info.struct_size = sizeof(info);
    info.d_model = c.d_model;
    info.n_head = c.n_head;
    info.head_dim = c.head_dim();
    info.n_layer = c.n_layer;
    info.vocab_size = c.vocab_size;
    info.context_length = c.context_length;
    return std::make_unique<PePlugin>(engine.registry->get(pe_plugin), info, pe_options, seed);
}

void set_model_pe(EngineContext& engine, ModelHandle& h, const std::string& pe_plugin,
                  const Options& pe_options) {
    h.model->replace_pe(make_pe(engine, h.model->config(), pe_plugin, pe_options, 0));
    h.pe_name = pe_plugin;
    h.pe_options_json = pe_options_to_json(*engine.registry, pe_plugin, pe_options);
}

ModelRef build_model(EngineContext& engine, const ModelConfig& c, const std::string& style,
                     const std::string& pe_plugin, const Options& pe_options, uint64_t seed,
                     const DeviceRequest& device) {
    std::unique_ptr<PePlugin> pe = make_pe(engine, c, pe_plugin, pe_options, seed);
    auto handle = std::make_shared<ModelHandle>();
    handle->style = style;
    handle->pe_name = pe_plugin;
    handle->trained_length = c.context_length;
    handle->pe_options_json = pe_options_to_json(*engine.registry, pe_plugin, pe_options);
    Backend& backend = engine.backend(device.device, device.precision);
    handle->model = std::make_unique<Model>(c, backend, std::move(pe), seed,
                                            engine.tensor_comm());
    if (engine.sequence_parallel && handle->model->tensor_parallel())
        handle->model->set_sequence_parallel(true);
    handle->model->set_context_parallel(engine.context_comm());
    handle->model->set_attention_choice(device.attention);
    return handle;
}

std::string pe_options_to_json(const PluginRegistry& registry, const std::string& plugin,
                               const Options& options) {
    json j = json::object();
    if (plugin == "none") return j.dump();
    const LoadedPlugin& lib = registry.get(plugin);
    for (const OptSpec& o : plugin_option_schema(*lib.descriptor)) {
        if (!options.has(o.name)) continue;
        switch (o.type) {
            case OptType::Integer: j[o.name] = options.integer(o.name, 0); break;
            case OptType::Bool: j[o.name] = options.boolean(o.name, false); break;
            case OptType::String: j[o.name] = options.string(o.name, ""); break;
            case OptType::NumberList: j[o.name] = options.number_list(o.name); break;
            default: j[o.name] = options.number(o.name, 0); break;
        }
    }
    return j.dump();
}

Options pe_options_from_json(const PluginRegistry& registry, const std::string& plugin,
                             const std::string& text, const std::string& where) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        fail("the PE options in the checkpoint are not valid JSON: {}", e.what());
    }
    CTX_CHECK(j.is_object(), "the PE options in the checkpoint must be a JSON object");
    const std::string full = pe_plugin_name(registry, plugin);
    Options out(where, full + " options");
    if (full == "none") {
        if (!j.empty()) out.fail_key(j.begin().key(), "is unknown (pe/none has no options)");
        return out;
    }
    const std::vector<OptSpec> schema = plugin_option_schema(*registry.get(full).descriptor);
    for (const auto& [key, v] : j.items()) {
        auto spec = std::find_if(schema.begin(), schema.end(),
                                 [&](const OptSpec& s) { return s.name == key; });
        if (spec == schema.end()) out.fail_key(key, "is unknown to " + full);
        int64_t i = 0;
        switch (spec->type) {
            case OptType::Number:
                if (!v.is_number()) out.fail_key(key, "expects a number, got " + v.dump());
                out.set(key, v.get<double>());
                break;
            case OptType::Integer:
                if (v.is_number_integer()) out.set(key, v.get<int64_t>());
                else if (v.is_number() && integral_value(v.get<double>(), &i)) out.set(key, i);
                else out.fail_key(key, "expects an integer, got " + v.dump());
                break;
            case OptType::Bool:
                if (!v.is_boolean()) out.fail_key(key, "expects a boolean, got " + v.dump());
                out.set(key, v.get<bool>());
                break;
            case OptType::String:
                if (!v.is_string()) out.fail_key(key, "expects a string, got " + v.dump());
                out.set(key, v.get<std::string>());
                break;
            case OptType::NumberList: {
                std::vector<double> list;
                if (!v.is_array()) out.fail_key(key, "expects a list of numbers, got " + v.dump());
                for (const json& x : v) {
                    if (!x.is_number()) out.fail_key(key, "expects a list of numbers");
                    list.push_back(x.get<double>());
                }
                out.set(key, std::move(list));
                break;
            }
            default: out.fail_key(key, "has a type a checkpoint cannot hold");
        }
    }
    return out;
}

ModelRef model_from_checkpoint(EngineContext& engine, const TrainingState& s,
                               const std::string& path, const DeviceRequest& device) {
    ModelConfig c;
    json meta;
    try {
        c = model_config_from_json(json::parse(s.model_config_json));
        meta = json::parse(s.metadata_json);
    } catch (const json::exception& e) {
        fail("{}: the model configuration is not valid JSON: {}", path, e.what());
    } catch (const Error& e) {
        fail("{}: {}", path, e.what());
    }
    const std::string style = meta.value("style", std::string("gpt2"));
    const bool nope = s.pe_plugin == "none" || s.pe_plugin.empty();
    const std::string plugin = nope ? "none" : pe_plugin_name(*engine.registry, s.pe_plugin);
    const Options options = nope ? Options() : pe_options_from_json(*engine.registry, plugin,
                                                                     s.pe_options_json, path + ":");
    ModelRef h = build_model(engine, c, style, plugin, options, 1, device);
    h->trained_length = meta.value("trained_length", c.context_length);
    h->tokens_seen = s.tokens_seen;
    if (h->model->pe()) h->model->pe()->load_state(s.pe_state);
    if (!s.optimizer_config_json.empty()) {
        try {
            h->optimizer = std::make_unique<Optimizer>(
                *h->model, optimizer_config_from_json(json::parse(s.optimizer_config_json)));
        } catch (const json::exception& e) {
            fail("{}: the optimizer configuration is not valid JSON: {}", path, e.what());
        }
    }
    try {
        restore_model(*h->model, h->optimizer.get(), s);
    } catch (const Error& e) {
        fail("{}: {}", path, e.what());
    }
    return h;
}

TrainingState model_checkpoint_state(EngineContext& engine, const ModelHandle& h,
                                     BatchSource* data, const json& metadata) {
    TrainingState s;
    capture_model(*h.model, h.optimizer.get(), s);
    s.recipe_text = engine.recipe_text;
    s.pe_plugin = h.pe_name;
    s.pe_options_json = h.pe_options_json;
    if (h.model->pe()) s.pe_state = h.model->pe()->save_state();
    s.tokens_seen = h.tokens_seen;
    if (data) data->save(s, engine.data_comm());
    json meta = {{"style", h.style}, {"trained_length", h.trained_length},
                 {"world_size", engine.data_comm().size()}};
    for (const auto& [k, v] : metadata.items()) meta[k] = v;
    s.metadata_json = meta.dump();
    return s;
}

void on_rank0(Comm& comm, const std::function<void()>& what) {
    std::string error;
    if (comm.rank() == 0) {
        try {
            what();
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    uint64_t len = error.size();
    comm.broadcast(&len, sizeof(len), 0);
    error.resize(len);
    if (len) comm.broadcast(error.data(), len, 0);
    if (!error.empty()) throw Error(error);
}

void write_checkpoint(EngineContext& engine, const std::string& path, const TrainingState& s) {
    on_rank0(*engine.comm, [&] {
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) std::filesystem::create_directories(parent);
        save_checkpoint(path, s);
        spdlog::info("saved checkpoint {} (step {}, {} tokens)", path, s.step, s.tokens_seen);
    });
}

ModelRef model_from_hf(EngineContext& engine, const std::string& dir, const DeviceRequest& device,
                       const std::string& where) {
    HfCheckpoint ck = read_hf_checkpoint(dir);
    const std::string plugin = pe_plugin_name(*engine.registry, ck.spec.pe_plugin);
    const Options options =
        pe_options_from_json(*engine.registry, plugin, ck.spec.pe_options.dump(), where);
    ModelRef h = build_model(engine, ck.spec.config, ck.spec.style, plugin, options, 1, device);
    set_model_params(*h->model, ck.tensors, dir);
    const ModelConfig& c = h->model->config();
    spdlog::info("loaded {} ({}: {} layers, d_model {}, {} heads, context {}, {} params, {})", dir,
                 ck.spec.model_type, c.n_layer, c.d_model, c.n_head, c.context_length,
                 h->model->num_params(), h->pe_name);
    return h;
}

HfSpec hf_spec_of(const ModelHandle& h) {
    json options;
    try {
        options = json::parse(h.pe_options_json);
    } catch (const json::exception& e) {
        fail("export: the model's PE options are not valid JSON: {}", e.what());
    }
    std::vector<uint8_t> state;
    if (h.model->pe()) state = h.model->pe()->save_state();
    return hf_spec_for_model(h.model->config(), h.style, h.pe_name, options, state);
}

void save_hf_model(Comm& comm, const ModelHandle& h, const std::string& dir,
                   const std::string& tokenizer_source, const Tokenizer* tok) {
    // every rank: the whole tensors (gathered under tensor parallelism); rank 0 writes
    const HostTensors tensors = model_tensors(*h.model, h.model->params());
    on_rank0(comm, [&] { write_hf_model(h, dir, tensors, tokenizer_source, tok); });
}

void write_hf_model(const ModelHandle& h, const std::string& dir, const HostTensors& tensors,
                    const std::string& tokenizer_source, const Tokenizer* tok) {
    HfSpec spec = hf_spec_of(h);
    if (tok) {
        if (auto id = tok->bos_id()) spec.bos_token_id = *id;
        if (auto id = tok->eos_id()) spec.eos_token_id = *id;
        CTX_CHECK(tok->vocab_size() <= spec.config.vocab_size,
                  "save_hf: the tokenizer has {} tokens but the model only {}", tok->vocab_size(),
                  spec.config.vocab_size);
    }
    write_hf_checkpoint(dir, spec, tensors, tokenizer_source);
    spdlog::info("wrote {} as {} (context {}{})", dir, spec.model_type,
                 h.model->config().context_length,
                 tokenizer_source.empty() ? ", no tokenizer files" : "");
}

}  // namespace ctx
