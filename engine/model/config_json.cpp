#include "model/config_json.h"

#include <cmath>
#include <limits>
#include <set>
#include <type_traits>
#include <variant>

#include "core/error.h"

namespace ctx {
namespace {

using json = nlohmann::json;

// v as an integer of type T when it is one that fits (a float only with an integral value).
// get<T>() would instead truncate a fraction, wrap a wide integer, and give undefined behaviour
// for a float beyond T's range.
template <typename T>
bool integer_that_fits(const json& v, T& out) {
    using limits = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(limits::max())) return false;
    } else if (v.is_number_integer()) {
        if (v.get<int64_t>() < limits::min() || v.get<int64_t>() > limits::max()) return false;
    } else if (v.is_number_float()) {
        const double d = v.get<double>();
        // max() + 1, a power of two, is exact as a double (max() itself may not be)
        if (std::floor(d) != d || d < double(limits::min()) || d >= double(limits::max()) + 1.0)
            return false;
        out = static_cast<T>(d);
        return true;
    } else {
        return false;
    }
    out = v.get<T>();
    return true;
}

// Reads j[key] into out with the type of out; refuses wrong types. Missing keys keep defaults.
template <typename T>
void read(const json& j, const char* key, T& out, std::set<std::string>& seen) {
    seen.insert(key);
    auto it = j.find(key);
    if (it == j.end()) return;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        if (!it->is_number())
            fail("config key '{}' has the wrong type ({})", key, it->type_name());
        if (!integer_that_fits(*it, out))
            fail("config key '{}' must be an integer in [{}, {}], got {}", key,
                 std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), it->dump());
        return;
    }
    try {
        out = it->get<T>();
    } catch (const json::exception&) {
        fail("config key '{}' has the wrong type ({})", key, it->type_name());
    }
}

void refuse_unknown(const json& j, const std::set<std::string>& seen, const char* what) {
    CTX_CHECK(j.is_object(), "{} must be a JSON object", what);
    for (const auto& [k, v] : j.items())
        CTX_CHECK(seen.count(k), "{}: unknown key '{}' (written by a newer ctxengine?)", what, k);
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
    json j = json::object();
    // Fields added with the Llama block are written only when they say something an older
    // reader would get wrong, so checkpoints of the other styles stay readable by older builds.
    const std::string name_of_default[][2] = {{"n_kv_head", "0"}, {"norm", "layernorm"},
                                              {"sliding_window", "0"}};
    auto is_default = [&](const std::string& key, const json& v) {
        for (const auto& [k, d] : name_of_default)
            if (key == k) return (v.is_string() ? v.get<std::string>() : v.dump()) == d;
        return key == "attention_out_bias" && v.get<bool>() == c.attention_bias;
    };
    for (const ModelConfigField& f : model_config_fields()) {
        std::visit(
            [&](auto member) {
                using T = std::remove_cvref_t<decltype(c.*member)>;
                const json v = [&]() -> json {
                    if constexpr (std::is_enum_v<T>) return config_enum_name(c.*member);
                    else return c.*member;
                }();
                if (!is_default(f.name, v)) j[f.name] = v;
            },
            f.member);
    }
    return j;
}

ModelConfig model_config_from_json(const json& j) {
    ModelConfig c;
    std::set<std::string> seen;
    for (const ModelConfigField& f : model_config_fields()) {
        std::visit(
            [&](auto member) {
                using T = std::remove_cvref_t<decltype(c.*member)>;
                if constexpr (std::is_enum_v<T>) {
                    std::string name = config_enum_name(c.*member);
                    read(j, f.name, name, seen);
                    config_enum_parse(name, c.*member);
                } else {
                    read(j, f.name, c.*member, seen);
                }
            },
            f.member);
    }
    refuse_unknown(j, seen, "model config");
    // Checkpoints from before attention_out_bias had one switch for all attention biases.
    if (!j.contains("attention_out_bias")) c.attention_out_bias = c.attention_bias;
    c.validate();
    return c;
}

json optimizer_config_to_json(const OptimizerConfig& c) {
    return json{{"lr", c.lr},
                {"min_lr", c.min_lr},
                {"warmup_steps", c.warmup_steps},
                {"total_steps", c.total_steps},
                {"schedule_start", c.schedule_start},
                {"schedule", lr_schedule_name(c.schedule)},
                {"beta1", c.beta1},
                {"beta2", c.beta2},
                {"eps", c.eps},
                {"weight_decay", c.weight_decay},
                {"grad_clip", c.grad_clip}};
}

OptimizerConfig optimizer_config_from_json(const json& j) {
    OptimizerConfig c;
    std::set<std::string> seen;
    std::string schedule = lr_schedule_name(c.schedule);
    read(j, "lr", c.lr, seen);
    read(j, "min_lr", c.min_lr, seen);
    read(j, "warmup_steps", c.warmup_steps, seen);
    read(j, "total_steps", c.total_steps, seen);
    read(j, "schedule_start", c.schedule_start, seen);
    read(j, "schedule", schedule, seen);
    read(j, "beta1", c.beta1, seen);
    read(j, "beta2", c.beta2, seen);
    read(j, "eps", c.eps, seen);
    read(j, "weight_decay", c.weight_decay, seen);
    read(j, "grad_clip", c.grad_clip, seen);
    refuse_unknown(j, seen, "optimizer config");
    c.schedule = lr_schedule_from_name(schedule);
    c.validate();
    return c;
}

}  // namespace ctx
