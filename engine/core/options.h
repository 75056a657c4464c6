// Options: named values checked against a declared schema, the form every layer of the engine
// takes its settings in. A front end fills them (lua/options.h reads a recipe's table and checks
// it against the schema; a command line could do the same); plugin hosts hand them to plugins as
// the ABI's opaque ctx_options. No Lua here.
//
// Errors name where the options came from ("recipes/x.lua:7:"), the table ("ctx.model",
// "pe/rope options"), the key and what was expected.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"

namespace ctx {

enum class OptType {
    Number,      // any number
    Integer,     // an integer, or a float with an integral value
    Bool,
    String,
    NumberList,  // a sequence of numbers {1, 2.5, 3}
    Table,       // a nested table, kept by the front end for the caller to parse
    Any          // any value, kept by the front end (e.g. a model or plugin userdata)
};
const char* opt_type_name(OptType t);

struct OptSpec {
    std::string name;
    OptType type = OptType::Number;
    bool required = false;
    std::string help;
};

using OptValue = std::variant<double, int64_t, bool, std::string, std::vector<double>>;

class Options {
public:
    Options() = default;
    // where: the "file:line:" of the call that gave them; context: the table's name.
    Options(std::string where, std::string context)
        : where_(std::move(where)), context_(std::move(context)) {}

    void set(const std::string& key, OptValue value) { values_[key] = std::move(value); }

    bool has(const std::string& key) const;
    double number(const std::string& key, double dflt) const;
    int64_t integer(const std::string& key, int64_t dflt) const;
    bool boolean(const std::string& key, bool dflt) const;
    std::string string(const std::string& key, const std::string& dflt) const;
    std::vector<double> number_list(const std::string& key) const;  // empty if absent

    // Checks a string option against allowed values; throws naming where/context/key.
    std::string choice(const std::string& key, const std::string& dflt,
                       const std::vector<std::string>& allowed) const;

    // For error messages raised later by the caller about a specific key's value:
    // "<where> <context>: option '<key>' <message>".
    [[noreturn]] void fail_key(const std::string& key, const std::string& message) const;

    const std::string& where() const { return where_; }
    const std::string& context() const { return context_; }
    // "<where> <context>: ", the start of every message about these options.
    std::string message_prefix() const;
    // Keys present, in sorted order (for logging the effective configuration).
    std::vector<std::string> keys() const;

protected:
    // Table / Any options: the front end keeps their values; the keys count as present.
    std::set<std::string> held_keys_;

private:
    std::string where_, context_;
    std::map<std::string, OptValue> values_;
};

// A string as option messages quote it: "text", cut after 40 characters.
std::string quote_option_text(const std::string& s);
// An integral, exactly representable double as int64 (false otherwise).
bool integral_value(double d, int64_t* out);

}  // namespace ctx
