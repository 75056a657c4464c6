// ctx module: PE specs, data and model userdata; ctx.model, ctx.train, ctx.evaluate.
#include <lua.hpp>
#include <spdlog/spdlog.h>


#include "core/error.h"
#include "lua/ctx_module.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/userdata.h"
#include "session/training.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <variant>

namespace ctx {

ModelHandle& check_model(lua_State* L, int index) {
    auto* ref = static_cast<ModelRef*>(luaL_checkudata(L, index, kModelType));
    return **ref;
}

namespace {

using lua::guarded;
using lua::OptSpec;
using lua::OptType;

constexpr const char* kPeSpecType = "ctx.PeSpec";

using lua::gc_userdata;
using lua::new_type;
using lua::new_userdata;
using lua::option_userdata;
using lua::test_userdata;


// ---- ctx.model
// The ModelConfig keys (model_config_fields) and these.
const std::vector<OptSpec> kModelExtraSchema = {
    {"style", OptType::String, false, "gpt2 | neox | bloom | llama: defaults for the other keys"},
    {"pe", OptType::Any, false, "positional encoding: a name or ctx.pe(name, options)"},
    {"seed", OptType::Integer, false, "initialisation seed"},
};

OptType opt_type_of(const ModelConfigField::Member& m) {
    switch (m.index()) {
        case 0: return OptType::Integer;
        case 1: return OptType::Number;
        case 2: return OptType::Bool;
        default: return OptType::String;  // activation
    }
}

// The ModelConfig fields of a ctx.model{} table over the style's defaults in c.
void read_model_config(const lua::Options& o, ModelConfig& c) {
    for (const ModelConfigField& f : model_config_fields()) {
        std::visit(
            [&](auto member) {
                using M = decltype(member);
                if constexpr (std::is_same_v<M, int ModelConfig::*>)
                    c.*member = static_cast<int>(o.integer(f.name, c.*member));
                else if constexpr (std::is_same_v<M, float ModelConfig::*>)
                    c.*member = static_cast<float>(o.number(f.name, c.*member));
                else if constexpr (std::is_same_v<M, bool ModelConfig::*>)
                    c.*member = o.boolean(f.name, c.*member);
                else
                    config_enum_parse(o.choice(f.name, config_enum_name(c.*member),
                                               config_enum_choices(c.*member)),
                                      c.*member);
            },
            f.member);
    }
}

int l_model(lua_State* L) {
    const std::string where = lua::caller_where(L);
    std::vector<OptSpec> schema = kModelExtraSchema;
    for (const ModelConfigField& f : model_config_fields())
        schema.push_back({f.name, opt_type_of(f.member), false, f.help});
    for (const OptSpec& s : device_option_specs()) schema.push_back(s);
    const auto o = lua::Options::parse(L, 1, schema, "ctx.model", where);
    const std::string style = o.choice("style", "gpt2", {"gpt2", "neox", "bloom", "llama"});
    ModelConfig c = ModelConfig::from_style(style);
    read_model_config(o, c);
    // attention_bias alone switches every attention bias, as HF's Llama config does; Qwen2's
    // q/k/v-only biases need attention_out_bias = false as well.
    if (o.has("attention_bias") && !o.has("attention_out_bias"))
        c.attention_out_bias = c.attention_bias;
    try {
        c.validate();
    } catch (const Error& e) {
        fail("{} ctx.model: {}", where, e.what());
    }
    const uint64_t seed = static_cast<uint64_t>(o.integer("seed", 1));
    const DeviceRequest device = parse_device_request(L, o);

    // The PE: a ctx.pe(...) spec, a plugin name, or the style's default.
    PeSpec* spec = nullptr;
    if (const lua::LuaRef* ref = o.ref("pe")) {
        ref->push();
        if (lua_type(L, -1) == LUA_TSTRING) {
            const std::string name = lua_tostring(L, -1);
            lua_pop(L, 1);
            spec = &make_pe_spec(L, name, 0, where);
        } else {
            spec = test_userdata<PeSpec>(L, -1, kPeSpecType);
            if (!spec) o.fail_key("pe", "expects a plugin name or ctx.pe(name, options)");
        }
    } else {
        spec = &make_pe_spec(L, default_pe(style), 0, where);
    }
    // The spec stays on the stack (anchored) while the model is built.

    *new_userdata<ModelRef>(L, kModelType) =
        build_model(lua_detail::engine(L), c, style, spec->plugin, spec->options, seed, device);
    return 1;
}

}  // namespace

std::vector<OptSpec> device_option_specs() {
    return {{"device", OptType::String, false, "auto | cpu | cuda (default: --device, auto)"},
            {"backend", OptType::String, false, "the older name of device"},
            {"precision", OptType::String, false, "fp32 | bf16 (default: --precision, fp32)"},
            {"attention", OptType::String, false, "auto | flash | materialised"}};
}

DeviceRequest parse_device_request(lua_State* L, const lua::Options& o) {
    EngineContext& engine = lua_detail::engine(L);
    DeviceRequest r;
    if (o.has("device") && o.has("backend"))
        o.fail_key("backend", "is the older name of device: give one of them");
    const char* key = o.has("backend") ? "backend" : "device";
    const std::string at = o.where().empty() ? std::string("ctx.model:") : o.where();
    r.device = o.has(key) ? device_choice_from_name(
                                o.choice(key, "auto", {"auto", "cpu", "cuda"}))
                          : engine.default_device;
    if (o.has(key) && engine.device_from_cli && r.device != engine.default_device)
        spdlog::warn("{} {} = \"{}\" overrides --device {}", at, key,
                     device_choice_name(r.device), device_choice_name(engine.default_device));
    r.precision = o.has("precision")
                      ? precision_from_name(o.choice("precision", "fp32", {"fp32", "bf16"}))
                      : engine.default_precision;
    if (o.has("precision") && engine.precision_from_cli && r.precision != engine.default_precision)
        spdlog::warn("{} precision = \"{}\" overrides --precision {}", at,
                     precision_name(r.precision), precision_name(engine.default_precision));
    r.attention = attention_choice_from_name(
        o.choice("attention", "auto", {"auto", "flash", "materialised"}));
    return r;
}

void push_model(lua_State* L, ModelRef model) {
    *new_userdata<ModelRef>(L, kModelType) = std::move(model);
}

namespace {

// ---- model methods
int m_num_params(lua_State* L) {
    lua_pushinteger(L, static_cast<lua_Integer>(check_model(L, 1).model->num_params()));
    return 1;
}

int m_config(lua_State* L) {
    const ModelHandle& h = check_model(L, 1);
    const ModelConfig& c = h.model->config();
    lua_newtable(L);
    auto seti = [&](const char* k, lua_Integer v) {
        lua_pushinteger(L, v);
        lua_setfield(L, -2, k);
    };
    auto setb = [&](const char* k, bool v) {
        lua_pushboolean(L, v);
        lua_setfield(L, -2, k);
    };
    auto sets = [&](const char* k, const std::string& v) {
        lua_pushstring(L, v.c_str());
        lua_setfield(L, -2, k);
    };
    sets("style", h.style);
    sets("pe", h.pe_name);
    for (const ModelConfigField& f : model_config_fields()) {
        std::visit(
            [&](auto member) {
                using M = decltype(member);
                if constexpr (std::is_same_v<M, int ModelConfig::*>) {
                    seti(f.name, c.*member);
                } else if constexpr (std::is_same_v<M, float ModelConfig::*>) {
                    lua_pushnumber(L, c.*member);
                    lua_setfield(L, -2, f.name);
                } else if constexpr (std::is_same_v<M, bool ModelConfig::*>) {
                    setb(f.name, c.*member);
                } else {
                    sets(f.name, config_enum_name(c.*member));
                }
            },
            f.member);
    }
    seti("ffn_hidden", c.ffn());               // resolved (0 means 4 * d_model)
    seti("trained_length", h.trained_length);  // Lt before any extend()
    sets("backend", h.model->backend().name());
    sets("device", h.model->backend().kind() == DeviceKind::CUDA ? "cuda" : "cpu");
    sets("precision", precision_name(h.model->backend().precision()));
    sets("attention", attention_mode_name(h.model->attention_mode()));
    return 1;
}

// model:extend(Le): Lt -> Le through the PE plugin (APE interpolation, ...).
// model:set_pe(ctx.pe(name, options) or a name): swaps a PE without parameters for another one
// (both must have none: a RoPE with another base or scaling, for base-frequency adjustment or a
// factor search; checkpoints and HF exports carry the new one).
int m_set_pe(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string where = lua::caller_where(L);
    const PeSpec* spec = nullptr;
    if (lua_type(L, 2) == LUA_TSTRING) {
        spec = &make_pe_spec(L, lua_tostring(L, 2), 0, where);  // a userdata on the stack
    } else {
        spec = static_cast<PeSpec*>(luaL_testudata(L, 2, kPeSpecType));
        CTX_CHECK(spec, "model:set_pe: expects ctx.pe(name, options) or a PE name, got a {}",
                  luaL_typename(L, 2));
    }
    const std::string old = h.pe_name;
    set_model_pe(lua_detail::engine(L), h, spec->plugin, spec->options);
    spdlog::info("model:set_pe: {} -> {} {}", old, h.pe_name, h.pe_options_json);
    return 0;
}

// model:set_activation("relu"): fine-tuning into ReLU form (contextual sparsity, docs/SPARSITY.md)
int m_set_activation(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string name = luaL_checkstring(L, 2);
    Activation act;
    try {
        act = activation_from_name(name);
    } catch (const Error& e) {
        fail("{} model:set_activation: {}", lua::caller_where(L), e.what());
    }
    const std::string old = activation_name(h.model->config().activation);
    h.model->set_activation(act);
    spdlog::info("model:set_activation: {} -> {}", old, name);
    return 0;
}

int m_extend(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const lua_Integer n = luaL_checkinteger(L, 2);
    CTX_CHECK(n > 0 && n <= (1 << 24), "model:extend: the new length must be in [1, 2^24], got {}",
              n);
    if (!lua_isnoneornil(L, 3)) {
        // model:extend(Le, {base = b}): base-frequency adjustment (ABF) of a RoPE, then extend
        const auto o = lua::Options::parse(
            L, 3, {{"base", OptType::Number, true, "the RoPE's new frequency base"}},
            "model:extend", lua::caller_where(L));
        CTX_CHECK(h.pe_name == "pe/rope", "model:extend: `base` applies to pe/rope, this model "
                  "has {}", h.pe_name);
        EngineContext& engine = lua_detail::engine(L);
        nlohmann::json j = nlohmann::json::parse(h.pe_options_json);
        j["base"] = o.number("base", 0);
        set_model_pe(engine, h, h.pe_name,
                     pe_options_from_json(*engine.registry, h.pe_name, j.dump(),
                                          lua::caller_where(L)));
        spdlog::info("model:extend: RoPE base {} (ABF)", o.number("base", 0));
    }
    const int old_len = h.model->config().context_length;
    extend_with_moments(*h.model, h.optimizer.get(), static_cast<int>(n));
    spdlog::info("extended the context {} -> {} ({})", old_len, n, h.pe_name);
    return 0;
}

// model:fingerprint() -> 16 hex digits over the bits of the parameters, the AdamW moments and
// the step: equal fingerprints mean bit-identical training states (to compare runs).
int m_fingerprint(lua_State* L) {
    const ModelHandle& h = check_model(L, 1);
    uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over 32-bit words
    auto mix = [&](const std::vector<float>& host) {
        for (float f : host) {
            uint32_t bits;
            std::memcpy(&bits, &f, sizeof bits);
            hash = (hash ^ bits) * 0x100000001b3ull;
        }
    };
    // The whole model's tensors (gathered under tensor parallelism: collective), so the same
    // state has the same fingerprint on every rank of any grid.
    mix(h.model->gather_full(h.model->params()));
    if (h.optimizer) {  // the whole moments (gathered when ZeRO-1 shards them: collective)
        std::vector<float> m, v;
        h.optimizer->gather_moments(m, v);
        m = h.model->gather_full_host(m.data());
        v = h.model->gather_full_host(v.data());
        for (const std::vector<float>* x : {&m, &v})
            for (float f : *x) {
                uint32_t bits;
                std::memcpy(&bits, &f, sizeof bits);
                hash = (hash ^ bits) * 0x100000001b3ull;
            }
        hash = (hash ^ static_cast<uint64_t>(h.optimizer->step())) * 0x100000001b3ull;
    }
    lua_pushstring(L, fmt::format("{:016x}", hash).c_str());
    return 1;
}

int m_tostring(lua_State* L) {
    const ModelHandle& h = check_model(L, 1);
    const ModelConfig& c = h.model->config();
    lua_pushfstring(L, "ctx.Model(%s, %s, L=%d, C=%d, H=%d, Lt=%d, %d params)", h.style.c_str(),
                    h.pe_name.c_str(), c.n_layer, c.d_model, c.n_head, c.context_length,
                    static_cast<int>(h.model->num_params()));
    return 1;
}

// ---- ctx.train / ctx.evaluate
const std::vector<OptSpec> kOptimizerSchema = {
    {"lr", OptType::Number, false, "peak learning rate"},
    {"min_lr", OptType::Number, false, "final learning rate"},
    {"warmup_steps", OptType::Integer, false, "linear warmup steps"},
    {"total_steps", OptType::Integer, false, "schedule length (default: this call's steps)"},
    {"schedule", OptType::String, false, "cosine | linear | constant"},
    {"beta1", OptType::Number, false, "AdamW beta1"},
    {"beta2", OptType::Number, false, "AdamW beta2"},
    {"eps", OptType::Number, false, "AdamW epsilon"},
    {"weight_decay", OptType::Number, false, "decoupled weight decay"},
    {"grad_clip", OptType::Number, false, "max global gradient norm (0: off)"},
};

OptimizerConfig parse_optimizer(lua_State* L, const lua::Options& train, int64_t steps) {
    OptimizerConfig c;
    c.total_steps = steps;
    const lua::LuaRef* ref = train.ref("optimizer");
    if (!ref) return c;
    ref->push();
    const auto o = lua::Options::parse(L, -1, kOptimizerSchema, "ctx.train optimizer",
                                       train.where());
    lua_pop(L, 1);
    c.lr = static_cast<float>(o.number("lr", c.lr));
    c.min_lr = static_cast<float>(o.number("min_lr", c.min_lr));
    c.warmup_steps = o.integer("warmup_steps", c.warmup_steps);
    c.total_steps = o.integer("total_steps", steps);
    c.schedule = lr_schedule_from_name(
        o.choice("schedule", lr_schedule_name(c.schedule), {"cosine", "linear", "constant"}));
    c.beta1 = static_cast<float>(o.number("beta1", c.beta1));
    c.beta2 = static_cast<float>(o.number("beta2", c.beta2));
    c.eps = static_cast<float>(o.number("eps", c.eps));
    c.weight_decay = static_cast<float>(o.number("weight_decay", c.weight_decay));
    c.grad_clip = static_cast<float>(o.number("grad_clip", c.grad_clip));
    try {
        c.validate();
    } catch (const Error& e) {
        fail("{} ctx.train optimizer: {}", train.where(), e.what());
    }
    return c;
}

void check_vocab(const lua::Options& o, const Model& model, const DataHandle& data) {
    if (data.vocab_size > model.config().vocab_size)
        o.fail_key("data", fmt::format("has vocabulary size {} but the model's is {}",
                                       data.vocab_size, model.config().vocab_size));
}

int l_train(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"model", OptType::Any, true, "ctx.model"},
         {"data", OptType::Any, true, "a ctx.data source"},
         {"steps", OptType::Integer, true, "optimizer steps"},
         {"batch_size", OptType::Integer, false, "rows per rank per step"},
         {"seq_len", OptType::Integer, false, "row length (default: context_length)"},
         {"optimizer", OptType::Table, false, "AdamW and schedule settings"},
         {"log_every", OptType::Integer, false, "progress line every N steps (0: none)"},
         {"out_dir", OptType::String, false, "write one metrics.jsonl line per step here"},
         {"grad_bucket_mb", OptType::Number, false,
          "data parallel: gradient all-reduce bucket size in MiB (default 25)"},
         {"reduce_precision", OptType::String, false, "data parallel: fp32 | bf16 on the wire"},
         {"deterministic", OptType::Bool, false,
          "data parallel: fixed summation order (bit-exact resume on the same rank count)"},
         {"zero", OptType::Integer, false,
          "data parallel: 1 shards the AdamW state over the ranks (ZeRO-1), 0 keeps it whole"},
         {"skip_nonfinite", OptType::Integer, false,
          "skip up to N steps in a row whose loss or gradient norm is not finite (default 0: "
          "stop at the first)"},
         {"checkpoint_dir", OptType::String, false,
          "on a stop signal, save here and exit 75; with resume, continue from here"},
         {"resume", OptType::String, false,
          "auto: continue this call from checkpoint_dir/latest when there is one"},
         {"checkpoint_every", OptType::Integer, false,
          "also save checkpoint_dir/step-N.h5 every this many optimizer steps"},
         {"keep_last", OptType::Integer, false,
          "with checkpoint_every: keep only the newest this many step checkpoints"}},
        "ctx.train", where);
    ModelHandle& h = *option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    DataRef data = option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source");
    check_vocab(o, *h.model, *data);
    TrainOptions t;
    t.steps = o.integer("steps", 0);
    if (t.steps <= 0) o.fail_key("steps", fmt::format("must be positive, got {}", t.steps));
    int fixed_B = 0, fixed_T = 0;
    const bool fixed = data->stream->fixed_shape(&fixed_B, &fixed_T);
    t.batch_size = static_cast<int>(o.integer("batch_size", fixed ? fixed_B : 8));
    t.seq_len = static_cast<int>(o.integer("seq_len", fixed ? fixed_T : h.model->config().context_length));
    if (fixed && (t.batch_size != fixed_B || t.seq_len != fixed_T))
        o.fail_key(t.batch_size != fixed_B ? "batch_size" : "seq_len",
                   fmt::format("differs from the data stream's rows ({} x {}): leave it out",
                               fixed_B, fixed_T));
    t.log_every = static_cast<int>(o.integer("log_every", 10));
    const int64_t skip = o.integer("skip_nonfinite", 0);
    if (skip < 0 || skip > 1000000)
        o.fail_key("skip_nonfinite", fmt::format("must be in [0, 1000000], got {}", skip));
    t.skip_nonfinite = static_cast<int>(skip);
    t.stop_on_signal = true;
    if (t.batch_size <= 0) o.fail_key("batch_size", fmt::format("must be positive, got {}", t.batch_size));
    if (t.seq_len <= 0) o.fail_key("seq_len", fmt::format("must be positive, got {}", t.seq_len));
    // A new optimizer table starts a new schedule at the current step (moments are kept); no
    // table continues the existing schedule.
    TrainRequest request;
    request.optimizer = parse_optimizer(L, o, t.steps);
    request.new_schedule = o.has("optimizer");
    request.out_dir = o.string("out_dir", "");
    const int64_t zero = o.integer("zero", 0);
    if (zero != 0 && zero != 1) o.fail_key("zero", fmt::format("must be 0 or 1, got {}", zero));
    request.zero = zero == 1;
    request.checkpoint_dir = o.string("checkpoint_dir", "");
    if (o.has("resume")) {
        o.choice("resume", "auto", {"auto"});
        if (request.checkpoint_dir.empty())
            o.fail_key("resume", "needs checkpoint_dir (where the checkpoints are)");
        request.resume = true;
    }
    request.checkpoint_every = o.integer("checkpoint_every", 0);
    request.keep_last = o.integer("keep_last", 0);
    if (request.checkpoint_every < 0)
        o.fail_key("checkpoint_every", fmt::format("must be >= 0, got {}", request.checkpoint_every));
    if (request.checkpoint_every > 0 && request.checkpoint_dir.empty())
        o.fail_key("checkpoint_every", "needs checkpoint_dir (where the checkpoints go)");
    if (request.keep_last < 0)
        o.fail_key("keep_last", fmt::format("must be >= 0, got {}", request.keep_last));
    if (request.keep_last > 0 && request.checkpoint_every == 0)
        o.fail_key("keep_last", "applies to periodic checkpoints: give checkpoint_every too");
    const double bucket_mb = o.number("grad_bucket_mb", 25.0);
    if (!(bucket_mb > 0 && bucket_mb <= 4096))
        o.fail_key("grad_bucket_mb", fmt::format("must be in (0, 4096], got {}", bucket_mb));
    t.reduce.bucket_bytes = static_cast<size_t>(bucket_mb * 1024 * 1024);
    t.reduce.precision =
        reduce_precision_from_name(o.choice("reduce_precision", "fp32", {"fp32", "bf16"}));
    t.reduce.deterministic = o.boolean("deterministic", false);
    request.train = t;
    const TrainResult r =
        train_model(lua_detail::engine(L), h, *data->stream, std::move(request), where);

    lua_newtable(L);
    lua_createtable(L, static_cast<int>(r.steps.size()), 0);
    for (size_t i = 0; i < r.steps.size(); ++i) {
        lua_pushnumber(L, r.steps[i].loss);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    lua_setfield(L, -2, "losses");
    // (no steps: a resumed call that had already finished; the losses are in its metrics)
    if (!r.steps.empty()) {
        lua_pushnumber(L, r.steps.front().loss);
        lua_setfield(L, -2, "first_loss");
        lua_pushnumber(L, r.steps.back().loss);
        lua_setfield(L, -2, "final_loss");
    }
    lua_pushinteger(L, h.optimizer->step());
    lua_setfield(L, -2, "step");
    lua_pushnumber(L, r.tokens_per_s);
    lua_setfield(L, -2, "tokens_per_s");
    lua_pushnumber(L, r.seconds);
    lua_setfield(L, -2, "seconds");
    lua_pushinteger(L, r.skipped);
    lua_setfield(L, -2, "skipped");
    return 1;
}

int l_evaluate(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"model", OptType::Any, true, "ctx.model"},
         {"data", OptType::Any, true, "a ctx.data source"},
         {"batch_size", OptType::Integer, false, "rows per batch"},
         {"seq_len", OptType::Integer, false, "row length (default: context_length)"},
         {"batches", OptType::Integer, false, "batches to average"},
         {"seed", OptType::Integer, false, "row sampling seed"}},
        "ctx.evaluate", where);
    ModelHandle& h = *option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    DataRef data = option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source");
    check_vocab(o, *h.model, *data);
    const int B = static_cast<int>(o.integer("batch_size", 8));
    const int T = static_cast<int>(o.integer("seq_len", h.model->config().context_length));
    const int batches = static_cast<int>(o.integer("batches", 4));
    if (B <= 0) o.fail_key("batch_size", fmt::format("must be positive, got {}", B));
    if (T <= 0) o.fail_key("seq_len", fmt::format("must be positive, got {}", T));
    if (batches <= 0) o.fail_key("batches", fmt::format("must be positive, got {}", batches));
    if (!data->tokens)
        o.fail_key("data", "must be an in-memory source (ctx.data.text, tokens or synthetic)");
    std::shared_ptr<TokenSource> tokens = data->tokens;
    BatchFn sample = [tokens](BatchBuffers& out, int b, int t, Rng& rng) {
        tokens->sample(out, b, t, rng);
    };
    const double loss = evaluate_loss(*h.model, sample, batches, B, T,
                                      static_cast<uint64_t>(o.integer("seed", 1234)),
                                      lua_detail::engine(L).data_comm());
    lua_pushnumber(L, loss);
    return 1;
}

int data_len(lua_State* L) {
    auto* d = static_cast<DataRef*>(luaL_checkudata(L, 1, kDataType));
    lua_pushinteger(L, (*d)->tokens ? static_cast<lua_Integer>((*d)->tokens->tokens().size()) : 0);
    return 1;
}

int data_num_windows(lua_State* L) {
    auto* d = static_cast<DataRef*>(luaL_checkudata(L, 1, kDataType));
    lua_pushinteger(L, static_cast<lua_Integer>((*d)->stream->num_windows()));
    return 1;
}

int pe_tostring(lua_State* L) {
    auto* s = static_cast<PeSpec*>(luaL_checkudata(L, 1, kPeSpecType));
    lua_pushfstring(L, "ctx.PeSpec(%s)", s->plugin.c_str());
    return 1;
}

}  // namespace

void register_ctx_types(lua_State* L) {
    new_type(L, kPeSpecType, gc_userdata<PeSpec>, nullptr, guarded<pe_tostring>, nullptr);
    const luaL_Reg data_methods[] = {{"num_windows", guarded<data_num_windows>},
                                     {nullptr, nullptr}};
    new_type(L, kDataType, gc_userdata<DataRef>, data_methods, nullptr, guarded<data_len>);
    const luaL_Reg model_methods[] = {{"num_params", guarded<m_num_params>},
                                      {"config", guarded<m_config>},
                                      {"extend", guarded<m_extend>},
                                      {"set_pe", guarded<m_set_pe>},
                                      {"set_activation", guarded<m_set_activation>},
                                      {"fingerprint", guarded<m_fingerprint>},
                                      {"logprobs", guarded<model_logprobs>},
                                      {"generate", guarded<model_generate>},
                                      {"train_predictors", guarded<model_train_predictors>},
                                      {"save_predictors", guarded<model_save_predictors>},
                                      {"load_predictors", guarded<model_load_predictors>},
                                      {"decode_score", guarded<model_decode_score>},
                                      {nullptr, nullptr}};
    new_type(L, kModelType, gc_userdata<ModelRef>, model_methods, guarded<m_tostring>, nullptr);
}

PeSpec& make_pe_spec(lua_State* L, const std::string& name, int opts_index,
                     const std::string& where) {
    EngineContext& engine = lua_detail::engine(L);
    const std::string full = pe_plugin_name(*engine.registry, name);
    // opts_index 0: no options table; parse an explicit nil then.
    if (opts_index == 0) lua_pushnil(L);
    const int idx = opts_index == 0 ? lua_gettop(L) : opts_index;
    PeSpec spec;
    spec.plugin = full;
    if (full == "none") {
        spec.options = lua::Options::parse(L, idx, {}, "pe/none options", where);
    } else {
        const LoadedPlugin* lib = engine.registry->find(full);
        if (!lib) {
            try {
                engine.registry->get(full);  // throws the helpful "available: ..." message
            } catch (const Error& e) {
                fail("{} {}", where, e.what());
            }
        }
        spec.options = lua::Options::parse(L, idx, plugin_option_schema(*lib->descriptor),
                                           full + " options", where);
    }
    if (opts_index == 0) lua_pop(L, 1);
    PeSpec* ud = new_userdata<PeSpec>(L, kPeSpecType);
    *ud = std::move(spec);
    return *ud;
}

void push_data(lua_State* L, std::shared_ptr<TokenSource> data, uint64_t seed) {
    auto h = std::make_shared<DataHandle>();
    h->vocab_size = data->vocab_size();
    h->stream = std::make_unique<TokenStream>(data, seed,
                                              lua_detail::engine(L).data_comm().rank());
    h->tokens = std::move(data);
    push_data_handle(L, std::move(h));
}

void push_data_handle(lua_State* L, DataRef data) {
    *new_userdata<DataRef>(L, kDataType) = std::move(data);
}

void register_model_functions(lua_State* L) {
    const luaL_Reg fns[] = {{"model", guarded<l_model>},
                            {"train", guarded<l_train>},
                            {"evaluate", guarded<l_evaluate>},
                            {nullptr, nullptr}};
    luaL_setfuncs(L, fns, 0);
}

}  // namespace ctx
