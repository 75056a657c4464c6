// RULER's needle-in-a-haystack prompts and variable tracking (METHODS.md 5.4), free of any host
// so tests can compile niah_prompt.cpp directly with their own token counter and essay text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../common/haystack.h"

namespace niah {

enum class Variant { Single, MultiKey, MultiValue, MultiQuery, VariableTracking };
enum class HaystackKind { Noise, Essay, Needle };
enum class ValueType { Numbers, Words, Uuids };

// Names as options and records spell them; parse_* return false for an unknown name.
const char* variant_name(Variant v);
const char* haystack_name(HaystackKind h);
const char* value_type_name(ValueType t);
bool parse_variant(std::string_view name, Variant* out);
bool parse_haystack(std::string_view name, HaystackKind* out);
bool parse_value_type(std::string_view name, ValueType* out);

struct Spec {
    Variant variant = Variant::Single;
    HaystackKind haystack = HaystackKind::Noise;
    ValueType value_type = ValueType::Numbers;
};

// Needle and distractor counts (RULER's defaults for these variants).
constexpr int kMultiKeyDistractors = 3;  // multikey: 1 asked + 3 other keys
constexpr int kMultiValues = 4;          // multivalue: 4 values for the asked key
constexpr int kMultiQueries = 4;         // multiquery: 4 keys, all asked
constexpr int kChainHops = 4;            // variable tracking: VAR X = n, then 4 hops

// The special-magic needle sentence and a value of the given type.
std::string needle_sentence(ValueType t, const std::string& key, const std::string& value);
std::string random_value(ValueType t, uint64_t rng[4]);
std::string random_key(uint64_t rng[4]);  // "adjective-noun"

struct NiahPrompt {
    std::string text;               // the whole prompt, chat template and answer prefix included
    std::vector<std::string> gold;  // values (or variable names) the answer must contain
    std::string tf_answer;          // teacher-forced continuation (" value"); "" when not scored
    std::vector<std::string> keys;  // asked keys (variable tracking: the value)
    int64_t tokens = 0;
    double needle_depth = 0;  // measured depth of the first gold needle
    size_t gold_offset = 0;   // its byte offset in text
};

// A prompt of the largest token count <= target_tokens with the first gold needle at `depth`
// (other needles at depths drawn from RULER's 40-point grid; a variable chain's hops at grid
// depths after its first statement). Everything random comes from `seed`. essay: the essay
// stream for HaystackKind::Essay (else unused, may be null).
NiahPrompt make_prompt(const Spec& spec, int64_t target_tokens, double depth, uint64_t seed,
                       const std::string& chat_template, const ctx_retrieval::CountTokens& count,
                       ctx_retrieval::Haystack* essay);

// RULER's string_match_all: the fraction of gold values that occur in the output, ignoring
// ASCII case.
double score_output(std::string_view output, const std::vector<std::string>& gold);

}  // namespace niah
