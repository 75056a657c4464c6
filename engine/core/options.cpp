#include "core/options.h"

#include <algorithm>
#include <cmath>

namespace ctx {

const char* opt_type_name(OptType t) {
    switch (t) {
        case OptType::Number: return "number";
        case OptType::Integer: return "integer";
        case OptType::Bool: return "boolean";
        case OptType::String: return "string";
        case OptType::NumberList: return "list of numbers";
        case OptType::Table: return "table";
        case OptType::Any: return "any value";
    }
    return "?";
}

std::string quote_option_text(const std::string& s) {
    constexpr size_t kMax = 40;
    if (s.size() <= kMax) return "\"" + s + "\"";
    return "\"" + s.substr(0, kMax) + "...\"";
}

bool integral_value(double d, int64_t* out) {
    if (!std::isfinite(d) || std::floor(d) != d) return false;
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) return false;
    *out = static_cast<int64_t>(d);
    return true;
}

std::string Options::message_prefix() const {
    std::string p = where_;
    if (!context_.empty()) p += (p.empty() ? "" : " ") + context_;
    return p.empty() ? p : p + ": ";
}

bool Options::has(const std::string& key) const {
    return values_.count(key) != 0 || held_keys_.count(key) != 0;
}

// A getter of the wrong kind for a key is a bug in the caller's schema/getter pairing, still
// reported against the recipe's key so it is traceable.
double Options::number(const std::string& key, double dflt) const {
    auto it = values_.find(key);
    if (it == values_.end()) return dflt;
    if (auto* d = std::get_if<double>(&it->second)) return *d;
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
    fail_key(key, "is not a number");
}

int64_t Options::integer(const std::string& key, int64_t dflt) const {
    auto it = values_.find(key);
    if (it == values_.end()) return dflt;
    if (auto* i = std::get_if<int64_t>(&it->second)) return *i;
    int64_t out = 0;
    if (auto* d = std::get_if<double>(&it->second)) {
        if (integral_value(*d, &out)) return out;
        fail_key(key, "expects an integer, got " + fmt::format("{}", *d));
    }
    fail_key(key, "is not an integer");
}

bool Options::boolean(const std::string& key, bool dflt) const {
    auto it = values_.find(key);
    if (it == values_.end()) return dflt;
    if (auto* b = std::get_if<bool>(&it->second)) return *b;
    fail_key(key, "is not a boolean");
}

std::string Options::string(const std::string& key, const std::string& dflt) const {
    auto it = values_.find(key);
    if (it == values_.end()) return dflt;
    if (auto* s = std::get_if<std::string>(&it->second)) return *s;
    fail_key(key, "is not a string");
}

std::vector<double> Options::number_list(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return {};
    if (auto* l = std::get_if<std::vector<double>>(&it->second)) return *l;
    fail_key(key, "is not a list of numbers");
}

std::string Options::choice(const std::string& key, const std::string& dflt,
                            const std::vector<std::string>& allowed) const {
    std::string v = string(key, dflt);
    if (!has(key) || std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return v;
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", " : "") + allowed[i];
    fail_key(key, "must be one of " + list + "; got " + quote_option_text(v));
}

void Options::fail_key(const std::string& key, const std::string& message) const {
    throw Error(message_prefix() + "option '" + key + "' " + message);
}

std::vector<std::string> Options::keys() const {
    std::set<std::string> all(held_keys_.begin(), held_keys_.end());
    for (const auto& [k, v] : values_) all.insert(k);
    return {all.begin(), all.end()};
}

}  // namespace ctx
